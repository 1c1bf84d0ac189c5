"""Gateway auth hardening against a live node and real SDK agents.

* token-less and bad-token floods are rate limited per client address before authentication,
  while a good caller at the same address keeps its own allowance;
* a bad token costs at most one database lookup per cache period, a foreign-format one none;
* a revoked client's open stream ends within the cache delay, with a terminal error event;
* with anonymous access on, credentials not in this platform's format are ignored (and never
  reach the agent); a well-formed unknown or revoked platform token still gets 401.
"""

from __future__ import annotations

import os
import threading
import time

import httpx
import orjson
import pytest
from django.db.backends.signals import connection_created

from registry import services
from tests.a2a_agents import EchoAgent

pytestmark = pytest.mark.timeout(120)


def _send(text: str = "hi", rpc_id: str = "1", method: str = "message/send") -> dict:
    return {
        "jsonrpc": "2.0",
        "id": rpc_id,
        "method": method,
        "params": {
            "message": {
                "role": "user",
                "messageId": os.urandom(4).hex(),
                "parts": [{"kind": "text", "text": text}],
            }
        },
    }


class TokenLookups:
    """Counts queries on the API client table, from every thread and connection (instrumented
    through Django's ``connection_created`` signal and ``execute_wrapper``)."""

    def __init__(self) -> None:
        self.count = 0
        self._lock = threading.Lock()

    def _wrapper(self, execute, sql, params, many, context):
        if "registry_apiclient" in sql:
            with self._lock:
                self.count += 1
        return execute(sql, params, many, context)

    def _on_connection(self, sender, connection, **kwargs) -> None:
        connection.execute_wrappers.append(self._wrapper)

    def __enter__(self) -> TokenLookups:
        connection_created.connect(self._on_connection)
        return self

    def __exit__(self, *exc) -> None:
        connection_created.disconnect(self._on_connection)


@pytest.fixture
def agent():
    with EchoAgent(steps=60, step_delay=0.1) as running:
        yield running


def test_token_less_and_bad_token_floods_get_429_by_address(
    live_server_url,
    settings,
    register_agent,
    make_caller,
    agent,
):
    settings.A2A_RATE_LIMIT_PER_SECOND = 5
    settings.A2A_RATE_LIMIT_BURST = 5
    registered = register_agent(agent)
    good = make_caller()
    url = f"{live_server_url}/a2a/{registered.agent_id}"
    statuses = []
    with httpx.Client(timeout=10) as client:
        assert client.post(url, json=_send(), headers=good.auth).status_code == 200
        for n in range(60):
            headers = {} if n % 2 else {"Authorization": f"Bearer BADBADBA.{n:032d}"}
            statuses.append(client.post(url, json=_send(), headers=headers).status_code)
        assert set(statuses) <= {401, 429}
        assert statuses.count(401) <= 10  # the burst (plus refill during the run)
        assert statuses.count(429) >= 45
        limited = client.post(url, json=_send(), headers={})
        assert limited.status_code == 429
        assert limited.headers["retry-after"] == "1"
        assert limited.json()["error"]["data"]["kind"] == "rate_limited"
        # A good caller (verified before) behind the same address is not refused with the flood.
        ok = client.post(url, json=_send(rpc_id="good"), headers=good.auth)
        assert ok.status_code == 200, ok.text
        assert ok.json()["id"] == "good"


def test_bad_tokens_cost_no_lookup_per_call(
    live_server_url,
    settings,
    register_agent,
    agent,
):
    settings.A2A_AUTH_CACHE_SECONDS = 60
    registered = register_agent(agent)
    url = f"{live_server_url}/a2a/{registered.agent_id}"
    unknown = "Bearer ABCDEFGH." + "x" * 32  # platform format, not a client
    foreign = "Bearer sk-live-not-one-of-ours"
    with TokenLookups() as lookups, httpx.Client(timeout=10) as client:
        for _ in range(30):
            assert (
                client.post(url, json=_send(), headers={"Authorization": unknown}).status_code
                == 401
            )
        assert lookups.count <= 1  # the first call looked it up; the rest hit the negative cache
        before = lookups.count
        for n in range(30):
            response = client.post(url, json=_send(), headers={"Authorization": f"{foreign}{n}"})
            assert response.status_code == 401
        assert lookups.count == before  # not in the platform's format: never looked up


def _events(response: httpx.Response):
    buffer = b""
    for chunk in response.iter_raw():
        buffer += chunk.replace(b"\r\n", b"\n")  # agents may end lines with CRLF
        while b"\n\n" in buffer:
            block, buffer = buffer.split(b"\n\n", 1)
            for line in block.split(b"\n"):
                if line.startswith(b"data: "):
                    yield orjson.loads(line[6:])


def test_revoked_client_stream_ends_within_the_cache_delay(
    live_server_url,
    settings,
    register_agent,
    make_caller,
    agent,
):
    settings.A2A_AUTH_CACHE_SECONDS = 0.5
    registered = register_agent(agent)
    caller = make_caller()
    url = f"{live_server_url}/a2a/{registered.agent_id}"
    events = []
    with (
        httpx.Client(timeout=30) as client,
        client.stream(
            "POST",
            url,
            json=_send("task long", rpc_id="s1", method="message/stream"),
            headers=caller.auth,
        ) as response,
    ):
        assert response.status_code == 200
        stream = _events(response)
        events.append(next(stream))
        services.api_client_update(client_id=caller.client_id, revoked=True)
        revoked_at = time.monotonic()
        events.extend(stream)
        ended_after = time.monotonic() - revoked_at
    last = events[-1]
    assert last["error"]["data"]["kind"] == "unauthenticated"
    assert "revoked" in last["error"]["message"]
    assert last["id"] == "s1"
    # The agent would stream for 6 s; the revocation ended it within a few cache periods.
    assert ended_after < 4.0
    assert len(events) < 40
    # ...and the next call is refused at once.
    again = httpx.post(url, json=_send(), headers=caller.auth, timeout=10)
    assert again.status_code == 401


def test_anonymous_mode_ignores_foreign_credentials(
    live_server_url,
    settings,
    register_agent,
    make_caller,
    agent,
):
    settings.A2A_ALLOW_ANONYMOUS = True
    registered = register_agent(agent)
    url = f"{live_server_url}/a2a/{registered.agent_id}"
    revoked = make_caller()
    services.api_client_update(client_id=revoked.client_id, revoked=True)
    with httpx.Client(timeout=10) as client:
        for n, header in enumerate(
            ["Bearer sk-agent-own-key", "Basic dXNlcjpwYXNz", "Token abc", "Bearer"]
        ):
            response = client.post(
                url, json=_send(rpc_id=f"a{n}"), headers={"Authorization": header}
            )
            assert response.status_code == 200, (header, response.text)
            assert response.json()["id"] == f"a{n}"
        for header in ["Bearer ABCDEFGH." + "y" * 32, f"Bearer {revoked.token}"]:
            response = client.post(url, json=_send(), headers={"Authorization": header})
            assert response.status_code == 401, header
            assert response.json()["error"]["data"]["kind"] == "unauthenticated"
        # The registry API reads credentials the same way.
        listed = client.get(
            f"{live_server_url}/api/v1/agents", headers={"Authorization": "Bearer sk-agent-own-key"}
        )
        assert listed.status_code == 200
        refused = client.get(
            f"{live_server_url}/api/v1/agents",
            headers={"Authorization": "Bearer ABCDEFGH." + "y" * 32},
        )
        assert refused.status_code == 401
    calls = [r for r in agent.requests if r.http_method == "POST"]
    assert len(calls) == 4
    for request in calls:  # stripped: never forwarded; the caller is anonymous
        assert request.header("authorization") is None
        assert request.header("x-kubemq-caller-id") == "anonymous"
