"""The gateway's request path against scripted agents: validation, auth, header rules, errors
and Executed, limits, timeouts, metrics, both error profiles.

Agents here are small raw-ASGI servers (uvicorn on loopback) whose behaviour each request picks
with ``params.mode``; they record what arrived, so tests assert what reached the agent as well
as what the caller got. Registration goes through ``registry.services`` like the API does.
The local fast path and the broker path (``A2A_LOCAL_FAST_PATH`` off: through the Channels
layer, in-memory or Redis) are both exercised where the path matters.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson
import pytest

from registry import services
from registry.permissions import SYSTEM
from tests.conftest import make_client
from tests.servers import read_body, serve_app, watch_disconnect

# Every test runs with both outbound clients (tests/gateway/conftest.py).
pytestmark = pytest.mark.usefixtures("outbound_client")

# --- a scripted agent ----------------------------------------------------------------------


@dataclass
class Arrived:
    path: str
    headers: dict[str, list[str]]
    body: bytes

    @property
    def payload(self) -> dict[str, Any]:
        return orjson.loads(self.body)

    def header(self, name: str) -> str | None:
        values = self.headers.get(name.lower())
        return values[0] if values else None


@dataclass
class ScriptedAgent:
    """A raw ASGI agent. ``params.mode`` of each JSON-RPC request picks the answer:

    echo (default; sse for an empty message/stream) | slow (``delay``) |
    status (``status``, ``body``, ``content_type``) | text |
    big (``size``; no Content-Length when ``chunked``) |
    sse (``events``, ``delay``, ``event_size``) | sse_silent (``delay`` before first event)
    """

    arrived: list[Arrived] = field(default_factory=list)
    active: int = 0
    max_active: int = 0
    streams_open: int = 0
    streams_closed: list[float] = field(default_factory=list)
    #: How each stream ended on the agent's side: "complete", or "disconnect" (the gateway
    #: closed the connection first).
    stream_ends: list[str] = field(default_factory=list)
    #: ``gated`` streams: events sent so far, and how many the test has released.
    sent_events: int = 0
    released: int = 0
    url: str = ""

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                else:
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        body = await read_body(receive)
        headers: dict[str, list[str]] = {}
        for name, value in scope["headers"]:
            headers.setdefault(name.decode("latin-1"), []).append(value.decode("latin-1"))
        self.arrived.append(Arrived(scope["path"], headers, body))
        try:
            payload = orjson.loads(body)
        except orjson.JSONDecodeError:
            payload = {}
        params = payload.get("params") if isinstance(payload, dict) else None
        params = params if isinstance(params, dict) else {}
        streaming = isinstance(payload, dict) and payload.get("method") == "message/stream"
        mode = params.get("mode", "sse" if streaming else "echo")
        rpc_id = payload.get("id") if isinstance(payload, dict) else None
        self.active += 1
        self.max_active = max(self.max_active, self.active)
        try:
            await getattr(self, f"_{mode}")(params, rpc_id, receive, send, headers, payload)
        finally:
            self.active -= 1

    @staticmethod
    async def _answer(send, status: int, body: bytes, content_type: bytes = b"application/json",
                      extra: list | None = None) -> None:
        await send({"type": "http.response.start", "status": status, "headers": [
            (b"content-type", content_type), (b"content-length", str(len(body)).encode()),
            *(extra or []),
        ]})
        await send({"type": "http.response.body", "body": body})

    async def _echo(self, params, rpc_id, receive, send, headers, payload) -> None:
        result = {"method": payload.get("method"), "params": params}
        await self._answer(send, 200, orjson.dumps({"jsonrpc": "2.0", "id": rpc_id,
                                                    "result": result}),
                           extra=[(b"x-agent-extra", b"kept"), (b"set-cookie", b"s=1")])

    async def _slow(self, params, rpc_id, receive, send, headers, payload) -> None:
        await asyncio.sleep(float(params.get("delay", 1)))
        await self._echo(params, rpc_id, receive, send, headers, payload)

    async def _status(self, params, rpc_id, receive, send, headers, payload) -> None:
        await self._answer(send, int(params["status"]), params.get("body", "").encode(),
                           params.get("content_type", "application/json").encode())

    async def _text(self, params, rpc_id, receive, send, headers, payload) -> None:
        await self._answer(send, 200, b"plain \xff bytes, not JSON", b"text/plain")

    async def _big(self, params, rpc_id, receive, send, headers, payload) -> None:
        size = int(params["size"])
        if not params.get("chunked"):
            await self._answer(send, 200, b"x" * size, b"application/octet-stream")
            return
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json")]})
        sent = 0
        while sent < size:
            piece = min(65536, size - sent)
            await send({"type": "http.response.body", "body": b"x" * piece, "more_body": True})
            sent += piece
        await send({"type": "http.response.body", "body": b""})

    async def _sse(self, params, rpc_id, receive, send, headers, payload) -> None:
        await self._stream(params, rpc_id, receive, send, initial_delay=0.0)

    async def _sse_silent(self, params, rpc_id, receive, send, headers, payload) -> None:
        await self._stream(params, rpc_id, receive, send,
                           initial_delay=float(params.get("delay", 60)))

    async def _stream(self, params, rpc_id, receive, send, *, initial_delay: float) -> None:
        events = int(params.get("events", 3))
        delay = float(params.get("delay", 0.2))
        event_size = int(params.get("event_size", 0))
        self.streams_open += 1
        closed, watcher = watch_disconnect(receive)
        try:
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"text/event-stream"),
                                    (b"cache-control", b"no-cache")]})
            if initial_delay:
                await asyncio.wait_for(closed.wait(), initial_delay)
            ending = "complete"
            for i in range(events):
                if params.get("gated"):
                    # Event i goes out only once the test released it (after it received
                    # event i - 1): delivery order is observable without a clock.
                    while self.released < i and not closed.is_set():
                        await asyncio.sleep(0.005)
                data = {"jsonrpc": "2.0", "id": rpc_id, "result": {"seq": i,
                                                                  "pad": "p" * event_size}}
                event = b"event: message\ndata: " + orjson.dumps(data) + b"\n\n"
                self.sent_events += 1  # counted before it leaves: the caller cannot be ahead
                await send({"type": "http.response.body", "body": event, "more_body": True})
                try:
                    await asyncio.wait_for(closed.wait(), delay)
                    ending = "disconnect"
                    break
                except TimeoutError:
                    pass
            self.stream_ends.append(ending)
            await send({"type": "http.response.body", "body": b""})
        except TimeoutError:
            pass
        finally:
            watcher.cancel()
            self.streams_open -= 1
            self.streams_closed.append(time.monotonic())


@pytest.fixture
def agent() -> ScriptedAgent:
    upstream = ScriptedAgent()
    with serve_app(upstream) as server:
        upstream.url = server.url + "/rpc"
        yield upstream


def register(agent_id: str, url: str, **kwargs):
    card = {"name": agent_id, "description": "scripted", "url": url, "version": "1",
            "protocolVersion": "0.3.0", "capabilities": {"streaming": True},
            "defaultInputModes": ["text/plain"], "defaultOutputModes": ["text/plain"],
            "skills": []}
    return services.agent_register(actor=SYSTEM, agent_id=agent_id, url=url, card=card, **kwargs)


def new_id(prefix: str = "ag") -> str:
    return f"{prefix}-{os.urandom(3).hex()}"


@pytest.fixture
def token(live_server_url) -> str:
    return make_client(["call"])[1]


def rpc(method: str = "message/send", rpc_id: Any = 1, **params) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rpc_id, "method": method, "params": params}


@pytest.fixture
def gw(live_server_url, token):
    with httpx.Client(base_url=live_server_url, timeout=30,
                      headers={"Authorization": f"Bearer {token}"}) as client:
        yield client


@pytest.fixture(params=["local", "broker"])
def path_mode(request, settings) -> str:
    """Run a test over the local fast path and over the Channels layer."""
    settings.A2A_LOCAL_FAST_PATH = request.param == "local"
    return request.param


def error_of(response: httpx.Response) -> dict[str, Any]:
    body = response.json()
    assert "result" not in body, body
    return body["error"]


# --- validation ------------------------------------------------------------------------------


def test_validation_answers(gw: httpx.Client, agent):
    register("val-agent", agent.url)
    url = "/a2a/val-agent"
    # A body that is not JSON: -32700 with id null, whatever the Content-Type; the message
    # says when the declared media type was not JSON either.
    r = gw.post(url, content=b"{invalid json!!!", headers={"Content-Type": "application/json"})
    assert r.status_code == 200 and error_of(r)["code"] == -32700
    assert r.json()["id"] is None and r.headers["x-a2a-executed"] == "false"
    assert error_of(r)["message"] == "parse error: invalid JSON"
    r = gw.post(url, content=b"\xff\xfe\x00garbage", headers={"Content-Type": "application/json"})
    assert r.status_code == 200 and error_of(r)["code"] == -32700
    r = gw.post(url, content=b"not json", headers={"Content-Type": "text/plain; charset=utf-8"})
    assert error_of(r)["code"] == -32700
    assert error_of(r)["message"] == \
        "parse error: invalid JSON (Content-Type text/plain is not JSON)"
    r = gw.post(url, content=b"[1,", headers={"Content-Type": "application/vnd.a2a+json"})
    assert error_of(r)["message"] == "parse error: invalid JSON"
    # not one JSON object with a string method: -32600
    for bad in ([rpc()], [], "str", {"jsonrpc": "2.0", "id": 7},
                {"jsonrpc": "2.0", "id": 7, "method": 5},
                {"jsonrpc": "2.0", "id": 7, "method": ""}):
        r = gw.post(url, json=bad)
        assert r.status_code == 200, bad
        error = error_of(r)
        assert error["code"] == -32600, bad
        assert error["data"] == {"executed": False, "retryable": False,
                                 "kind": "invalid_request", "agent_id": None}
    assert gw.post(url, json={"jsonrpc": "2.0", "id": 7}).json()["id"] == 7
    # bad and reserved agent ids: -32600
    for bad_id in ("Bad_Id", "x", "_AGENTS_.val-agent", "-lead", "a" * 64):
        r = gw.post(f"/a2a/{bad_id}", json=rpc())
        assert error_of(r)["code"] == -32600, bad_id
    # GET on the RPC endpoint: 405
    r = gw.get(url)
    assert r.status_code == 405 and "POST" in r.headers["allow"]
    assert agent.arrived == []  # nothing reached the agent


def test_large_bodies_are_validated_as_small_ones(gw: httpx.Client, agent, path_mode):
    """Bodies above gateway.jsonrpc.LAZY_ABOVE_BYTES take the lazy parse: the same -32700 and
    -32600 answers, the last of duplicate keys, the caller's timeout, and the body forwarded
    byte for byte."""
    register("large-agent", agent.url)
    url = "/a2a/large-agent"
    pad = b"p" * 300_000

    def post(body: bytes) -> httpx.Response:
        return gw.post(url, content=body, headers={"Content-Type": "application/json"})

    for invalid in (b'{"jsonrpc":"2.0","id":1,"method":"m","x":"\xff' + pad + b'"}',  # UTF-8
                    b'{"jsonrpc":"2.0","id":1,"method":"m","x":"' + pad + b'"',  # truncated
                    b"\xef\xbb\xbf" + orjson.dumps(rpc(pad=pad.decode()))):  # a BOM
        r = post(invalid)
        assert r.status_code == 200 and error_of(r)["code"] == -32700, invalid[:60]
        assert r.json()["id"] is None and r.headers["x-a2a-executed"] == "false"
    r = post(b"[" + orjson.dumps(rpc(pad=pad.decode())) + b"]")
    assert error_of(r)["code"] == -32600
    assert error_of(r)["data"]["kind"] == "invalid_request"
    assert "batch" in error_of(r)["message"]
    # duplicate keys: the last one counts, as for the agent's own parser
    r = post(b'{"jsonrpc":"2.0","id":3,"method":"message/send","pad":"' + pad
             + b'","method":""}')
    assert error_of(r)["code"] == -32600 and r.json()["id"] == 3
    assert agent.arrived == []
    forwarded = b'{"jsonrpc":"2.0","id":4,"method":"","pad":"' + pad \
        + b'","method":"message/send","params":{"n":1}}'
    r = post(forwarded)
    assert r.status_code == 200 and r.json()["result"] == {"method": "message/send",
                                                           "params": {"n": 1}}
    assert agent.arrived[-1].body == forwarded
    # the caller's timeout is read from a large body too
    slow = rpc(rpc_id="t", mode="slow", delay=5, pad=pad.decode())
    slow["params"]["configuration"] = {"timeout": 1}
    started = time.monotonic()
    r = post(orjson.dumps(slow))
    assert error_of(r)["data"]["kind"] == "timeout" and r.json()["id"] == "t"
    assert time.monotonic() - started < 4


def test_what_the_agent_would_accept_is_forwarded_unchanged(gw: httpx.Client, agent):
    """The gateway checks only what it needs (a JSON object with a string method): a missing
    or non-JSON Content-Type, another jsonrpc version or an unusual id reach the agent as sent,
    and the agent's own answer comes back."""
    register("lenient-agent", agent.url)
    url = "/a2a/lenient-agent"
    bodies = [
        (b'{"jsonrpc":"2.0","id":1,"method":"no/content-type"}', None),
        (b'{"jsonrpc":"2.0","id":2,"method":"text/plain"}', "text/plain"),
        (b'{"jsonrpc":"2.0","id":3,"method":"substring"}', "application/x-notjson"),
        (b'{"jsonrpc":"1.0","id":4,"method":"old/version"}', "application/json"),
        (b'{"jsonrpc":"2.0","id":{"x":1},"method":"object/id"}', "application/json"),
    ]
    for body, content_type in bodies:
        headers = {"Content-Type": content_type} if content_type else {}
        request = gw.build_request("POST", url, content=body, headers=headers)
        assert content_type is not None or "content-type" not in request.headers
        r = gw.send(request)
        assert r.status_code == 200 and r.headers["x-a2a-executed"] == "true", body
        assert r.json()["result"]["method"] == orjson.loads(body)["method"]
    assert [a.body for a in agent.arrived] == [body for body, _ in bodies]
    assert agent.arrived[0].header("content-type") is None
    assert agent.arrived[1].header("content-type") == "text/plain"


@pytest.mark.parametrize("size", ["small", "large"])
def test_kubemq_profile_refuses_what_kubemq_refuses(gw: httpx.Client, agent, settings, size):
    """Profile kubemq: a non-JSON Content-Type (KubeMQ's -32700, id null) and a ``jsonrpc``
    other than "2.0" (-32600, the caller's id) are refused before anything reaches the agent,
    for small bodies and for large ones (the lazy parse); JSON media types pass."""
    settings.A2A_ERROR_PROFILE = "kubemq"
    register("strict-agent", agent.url)
    url = "/a2a/strict-agent"
    pad = "p" * (300_000 if size == "large" else 10)

    def post(payload: dict, content_type: str | None = "application/json") -> httpx.Response:
        headers = {"Content-Type": content_type} if content_type else {}
        request = gw.build_request("POST", url, content=orjson.dumps(payload), headers=headers)
        assert content_type is not None or "content-type" not in request.headers
        return gw.send(request)

    for content_type in ("text/plain", "application/x-www-form-urlencoded",
                         "application/x-notjson", None):
        r = post(rpc(rpc_id=9, pad=pad), content_type)
        assert r.status_code == 200 and r.headers["x-a2a-executed"] == "false", content_type
        assert r.json()["id"] is None
        assert error_of(r) == {"code": -32700,
                               "message": "parse error: Content-Type must be application/json",
                               "data": {"executed": False, "retryable": False,
                                        "kind": "parse_error", "agent_id": None}}
    for version in ("1.0", 2.0, None):
        payload = {**rpc(rpc_id="v", pad=pad), "jsonrpc": version}
        if version is None:
            del payload["jsonrpc"]
        r = post(payload)
        assert r.status_code == 200 and r.headers["x-a2a-executed"] == "false", version
        assert r.json()["id"] == "v"
        assert error_of(r)["code"] == -32600
        assert error_of(r)["message"] == 'invalid request: jsonrpc must be "2.0"'
    assert agent.arrived == []
    for content_type in ("application/json", "Application/JSON; charset=utf-8",
                         "application/vnd.a2a+json"):
        r = post(rpc(pad=pad), content_type)
        assert r.headers["x-a2a-executed"] == "true" and "result" in r.json(), content_type
    assert len(agent.arrived) == 3


def test_unknown_and_deregistered_agent(gw: httpx.Client, agent):
    r = gw.post("/a2a/nobody-here", json=rpc(rpc_id="abc"))
    assert r.status_code == 200
    body = r.json()
    assert body["id"] == "abc"
    assert body["error"]["code"] == -32050
    assert body["error"]["message"] == "agent not found: nobody-here"
    assert body["error"]["data"] == {"executed": False, "retryable": False,
                                     "kind": "agent_not_found", "agent_id": "nobody-here"}
    register("gone-agent", agent.url)
    assert "result" in gw.post("/a2a/gone-agent/", json=rpc()).json()
    services.agent_deregister(actor=SYSTEM, agent_id="gone-agent")
    assert error_of(gw.post("/a2a/gone-agent", json=rpc()))["data"]["kind"] == "agent_not_found"


def test_expired_agent_is_not_found(gw: httpx.Client, agent):
    register("short-lived", agent.url, ttl_seconds=1)
    assert "result" in gw.post("/a2a/short-lived", json=rpc()).json()
    time.sleep(1.1)
    services.agents_expire()
    assert error_of(gw.post("/a2a/short-lived", json=rpc()))["data"]["kind"] == "agent_not_found"


# --- the happy path, headers ---------------------------------------------------------------


def test_relay_and_header_rules(gw: httpx.Client, agent, path_mode, settings):
    register("hdr-agent", agent.url)
    caller_client, caller_token = make_client(["call"], name=f"caller-{path_mode}")
    request = rpc(rpc_id="r-1", text="hello")
    body = orjson.dumps(request)
    sent_headers = {
        "Authorization": f"Bearer {caller_token}",
        "Content-Type": "application/json",
        "A2A-Version": "1.0",
        "A2A-Extensions": "https://ext.example/a",
        "X-A2A-Extensions": "https://ext.example/b",
        "X-Custom-Thing": "custom-value",
        "X-KubeMQ-Caller-ID": "spoofed-identity",
        "Cookie": "session=secret",
        "X-Forwarded-For": "10.9.9.9",
        "X-Real-IP": "10.9.9.9",
        "Proxy-Authorization": "Basic Zm9vOmJhcg==",
        "Te": "trailers",
        "Trailer": "X-Foo",
        "Connection": "keep-alive, X-Hop",
        "X-Hop": "hop-by-hop",
    }
    r = gw.post("/a2a/hdr-agent", content=body, headers=sent_headers)
    assert r.status_code == 200
    assert r.headers["x-a2a-executed"] == "true"
    assert r.headers["x-a2a-agent-status"] == "200"
    assert r.headers["x-agent-extra"] == "kept"
    assert "set-cookie" not in r.headers
    assert r.json()["result"]["params"]["text"] == "hello" and r.json()["id"] == "r-1"
    arrived = agent.arrived[-1]
    assert arrived.body == body  # bytes unchanged
    assert arrived.path == "/rpc"
    assert arrived.header("a2a-version") == "1.0"
    assert arrived.header("a2a-extensions") == "https://ext.example/a"
    assert arrived.header("x-a2a-extensions") == "https://ext.example/b"
    assert arrived.header("x-custom-thing") == "custom-value"
    assert arrived.headers["x-kubemq-caller-id"] == [caller_client.client_id]
    for dropped in ("authorization", "cookie", "x-forwarded-for", "x-real-ip",
                    "proxy-authorization", "te", "trailer", "x-hop", "transfer-encoding"):
        assert dropped not in arrived.headers, dropped
    assert arrived.header("host") == agent.url.split("/")[2]  # the agent's own, not ours
    assert arrived.header("content-length") == str(len(body))


def test_caller_id_header_is_configurable_and_anonymous(live_server_url, agent, settings):
    settings.A2A_ALLOW_ANONYMOUS = True
    settings.A2A_CALLER_ID_HEADER = "X-Caller"
    register("anon-agent", agent.url)
    r = httpx.post(f"{live_server_url}/a2a/anon-agent", json=rpc(),
                   headers={"X-Caller": "me-myself", "X-KubeMQ-Caller-ID": "passes-through"})
    assert "result" in r.json()
    arrived = agent.arrived[-1]
    assert arrived.headers["x-caller"] == ["anonymous"]
    assert arrived.header("x-kubemq-caller-id") == "passes-through"


# --- auth ------------------------------------------------------------------------------------


def test_authentication_and_authorization(live_server_url, agent, settings):
    register("auth-agent", agent.url)
    register("other-agent", agent.url)
    url = f"{live_server_url}/a2a/auth-agent"
    r = httpx.post(url, json=rpc(rpc_id=3))
    assert r.status_code == 401 and r.headers["x-a2a-executed"] == "false"
    assert r.json()["id"] == 3 and r.json()["error"]["data"]["kind"] == "unauthenticated"
    r = httpx.post(url, json=rpc(), headers={"Authorization": "Bearer nope.nope"})
    assert r.status_code == 401
    r = httpx.post(url, json=rpc(), headers={"Authorization": "Basic abc"})
    assert r.status_code == 401
    _, register_only = make_client(["register"])
    r = httpx.post(url, json=rpc(), headers={"Authorization": f"Bearer {register_only}"})
    assert r.status_code == 403 and r.json()["error"]["data"]["kind"] == "forbidden"
    _, limited = make_client(["call"], agents=["other-agent"])
    r = httpx.post(url, json=rpc(), headers={"Authorization": f"Bearer {limited}"})
    assert r.status_code == 403
    r = httpx.post(f"{live_server_url}/a2a/other-agent", json=rpc(),
                   headers={"Authorization": f"Bearer {limited}"})
    assert r.status_code == 200 and "result" in r.json()
    # a restricted caller learns nothing about agents it may not call
    r = httpx.post(f"{live_server_url}/a2a/no-such-agent", json=rpc(),
                   headers={"Authorization": f"Bearer {limited}"})
    assert r.status_code == 403
    assert len(agent.arrived) == 1


def test_rate_limit(gw: httpx.Client, agent, settings):
    from gateway import runtime

    settings.A2A_RATE_LIMIT_PER_SECOND = 1
    settings.A2A_RATE_LIMIT_BURST = 3
    register("rl-agent", agent.url)
    now = [1000.0]
    runtime.current_node().limiter.clock = lambda: now[0]  # time stands still unless moved
    statuses = [gw.post("/a2a/rl-agent", json=rpc()).status_code for _ in range(6)]
    assert statuses == [200, 200, 200, 429, 429, 429]  # the burst, then nothing refills
    r = gw.post("/a2a/rl-agent", json=rpc(rpc_id=9))
    assert r.status_code == 429 and r.headers["retry-after"] == "1"
    assert r.json()["error"]["data"]["kind"] == "rate_limited" and r.json()["id"] == 9
    assert r.headers["x-a2a-executed"] == "false"
    now[0] += 1.0  # one second: one token at 1/s
    assert gw.post("/a2a/rl-agent", json=rpc()).status_code == 200
    assert gw.post("/a2a/rl-agent", json=rpc()).status_code == 429
    assert len(agent.arrived) == 4


# --- transport and application errors ----------------------------------------------------------


def test_agent_errors_relayed_or_mapped(gw: httpx.Client, agent, path_mode):
    register("err-agent", agent.url)
    url = "/a2a/err-agent"
    app_error = '{"jsonrpc":"2.0","id":5,"error":{"code":-32000,"message":"boom"}}'
    r = gw.post(url, json=rpc(rpc_id=5, mode="status", status=500, body=app_error))
    assert r.status_code == 500  # the agent's answer, relayed unchanged
    assert r.text == app_error
    assert r.headers["x-a2a-executed"] == "true" and r.headers["x-a2a-agent-status"] == "500"
    r = gw.post(url, json=rpc(mode="status", status=404, body="nope", content_type="text/plain"))
    assert r.status_code == 404 and r.text == "nope" and r.headers["x-a2a-executed"] == "true"
    for status, kind, code in ((502, "upstream_unavailable", -32054),
                               (503, "upstream_unavailable", -32054),
                               (504, "timeout", -32053)):
        r = gw.post(url, json=rpc(rpc_id=f"s{status}", mode="status", status=status,
                                  body="<html>gateway</html>", content_type="text/html"))
        assert r.status_code == 200, status
        assert r.headers["x-a2a-executed"] == "false"
        assert r.headers["x-a2a-agent-status"] == str(status)
        body = r.json()
        assert body["id"] == f"s{status}"
        assert body["error"]["code"] == code
        assert body["error"]["data"] == {"executed": False, "retryable": True, "kind": kind,
                                         "agent_id": "err-agent"}
        if kind == "upstream_unavailable":
            assert body["error"]["message"] == f"agent unavailable: HTTP {status}"
        else:
            assert body["error"]["message"] == "agent timeout: err-agent"
    r = gw.post(url, json=rpc(mode="text"))
    assert r.status_code == 200 and r.content == b"plain \xff bytes, not JSON"
    assert r.headers["content-type"] == "text/plain"


def test_unreachable_agent(gw: httpx.Client, path_mode):
    from tests.servers import free_port

    register("down-agent", f"http://127.0.0.1:{free_port()}/")
    # Refused at once: answered long before the request's 300 s timeout (the client would
    # give up after 10 s).
    r = gw.post("/a2a/down-agent", json=rpc(rpc_id=11), timeout=10)
    body = r.json()
    assert r.status_code == 200 and r.headers["x-a2a-executed"] == "false"
    assert "x-a2a-agent-status" not in r.headers
    assert body["id"] == 11 and body["error"]["code"] == -32052
    assert body["error"]["message"].startswith("agent unreachable: ")
    assert body["error"]["data"]["kind"] == "unreachable"
    assert body["error"]["data"]["retryable"] is True


def test_owner_node_without_subscriber_is_unreachable(gw: httpx.Client, agent, settings):
    """An agent owned by a node that is not there (in embedded mode: any other node) is
    answered `unreachable` at once in embedded mode, after the ack timeout through Redis."""
    register("elsewhere", agent.url, node_id="some-other-node")
    started = time.monotonic()
    r = gw.post("/a2a/elsewhere", json=rpc())
    assert error_of(r)["data"]["kind"] == "unreachable"
    assert time.monotonic() - started < 5
    assert agent.arrived == []


# --- limits ----------------------------------------------------------------------------------


def test_size_caps(gw: httpx.Client, agent, settings, path_mode):
    settings.A2A_MAX_REQUEST_BYTES = 4096
    settings.A2A_MAX_RESPONSE_BYTES = 300_000
    register("size-agent", agent.url)
    url = "/a2a/size-agent"
    r = gw.post(url, json=rpc(pad="x" * 5000))
    assert r.status_code == 413 and r.headers["x-a2a-executed"] == "false"
    assert r.json()["error"]["data"]["kind"] == "request_too_large"

    def chunks():  # no Content-Length: counted while reading
        yield orjson.dumps(rpc())[:-1]
        for _ in range(10):
            yield b" " * 1000
        yield b"}"

    r = gw.post(url, content=chunks(), headers={"Content-Type": "application/json"})
    assert r.status_code == 413
    assert agent.arrived == []
    for chunked in (False, True):
        r = gw.post(url, json=rpc(rpc_id=2, mode="big", size=300_001, chunked=chunked))
        assert r.status_code == 200
        # the agent received the request and answered: executed, whatever came of the answer
        assert r.headers["x-a2a-executed"] == "true"
        assert r.json()["error"]["data"]["executed"] is True
        assert r.json()["error"]["data"]["kind"] == "response_too_large"
        assert r.json()["error"]["message"] == "response too large"
        r = gw.post(url, json=rpc(mode="big", size=299_000, chunked=chunked))
        assert r.status_code == 200 and r.content == b"x" * 299_000


def test_concurrency_cap_rejects_at_once(live_server_url, agent, token, path_mode):
    register("cap-agent", agent.url, max_concurrency=100)
    finished: list[int] = []  # request numbers in the order their answers came back

    async def burst():
        limits = httpx.Limits(max_connections=200, max_keepalive_connections=200)
        async with httpx.AsyncClient(timeout=30, limits=limits) as client:
            async def one(i: int):
                r = await client.post(f"{live_server_url}/a2a/cap-agent",
                                      json=rpc(rpc_id=i, mode="slow", delay=2),
                                      headers={"Authorization": f"Bearer {token}"})
                finished.append(i)
                return r

            return await asyncio.gather(*(one(i) for i in range(101)))

    results = asyncio.run(burst())
    busy = [r for r in results if "error" in r.json()]
    served = [r for r in results if "result" in r.json()]
    assert busy, "the 101st concurrent request must be rejected"
    assert len(busy) + len(served) == 101
    for r in busy:
        error = r.json()["error"]
        assert error["data"]["kind"] == "busy" and error["code"] == -32051
        assert error["message"] == "server busy: concurrency limit reached"
        assert r.headers["x-a2a-executed"] == "false"
    # Answered at once, not queued behind the slow ones: every busy answer came back before
    # the first served one (each of which the agent held for its whole delay).
    busy_ids = {r.json()["id"] for r in busy}
    assert set(finished[:len(busy_ids)]) == busy_ids
    assert agent.max_active <= 100
    assert len(agent.arrived) == len(served)


def test_timeout_from_params(gw: httpx.Client, agent, path_mode):
    register("slow-agent", agent.url)
    request = rpc(rpc_id="t", mode="slow", delay=5)
    request["params"]["configuration"] = {"timeout": 1}
    r = gw.post("/a2a/slow-agent", json=request)
    # The caller's 1 s applied: the answer came while the agent still works on its 5 s.
    assert agent.active == 1 and len(agent.arrived) == 1
    body = r.json()
    assert body["id"] == "t" and body["error"]["data"]["kind"] == "timeout"
    # the request reached the agent before the timeout: executed (ARCHITECTURE, "Executed")
    assert body["error"]["code"] == -32053 and r.headers["x-a2a-executed"] == "true"
    assert body["error"]["data"]["executed"] is True


def test_timeout_setting_defaults():
    from gateway.conf import NodeSettings
    from gateway.limits import request_timeout

    node_settings = NodeSettings.from_django().but(A2A_DEFAULT_TIMEOUT_SECONDS=300,
                                                   A2A_MAX_TIMEOUT_SECONDS=3600)

    def timeout(payload: dict) -> float:
        return request_timeout(payload, node_settings)

    assert timeout({}) == 300
    assert timeout({"params": {"configuration": {"timeout": "5"}}}) == 300
    assert timeout({"params": {"configuration": {"timeout": True}}}) == 300
    assert timeout({"params": {"configuration": {"timeout": -1}}}) == 300
    assert timeout({"params": {"configuration": {"timeout": 2.5}}}) == 2.5
    assert timeout({"params": {"configuration": {"timeout": 99999}}}) == 3600
    assert request_timeout({}, node_settings.but(A2A_MAX_TIMEOUT_SECONDS=60)) == 60


# --- profiles, metrics, hostile input -----------------------------------------------------------


def test_kubemq_error_profile(gw: httpx.Client, agent, settings):
    settings.A2A_ERROR_PROFILE = "kubemq"
    register("kq-agent", agent.url)
    r = gw.post("/a2a/kq-missing", json=rpc())
    assert error_of(r)["code"] == -32002
    r = gw.post("/a2a/kq-agent", json=rpc(mode="status", status=503))
    assert error_of(r)["code"] == -32603
    r = gw.post("/a2a/kq-agent", json=rpc(mode="status", status=504))
    assert error_of(r)["code"] == -32001
    assert error_of(r)["message"] == "agent timeout: kq-agent"
    r = gw.post("/a2a/kq-agent", content=b"nope", headers={"Content-Type": "application/json"})
    assert error_of(r)["code"] == -32700


def _metric(text: str, name: str, **labels: str) -> float:
    for line in text.splitlines():
        if not line.startswith(name + "{"):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_metrics(gw: httpx.Client, agent):
    register("met-agent", agent.url)
    before = gw.get("/metrics").text
    for method in ("message/send", "SendMessage", "tasks/send", "made/up"):
        gw.post("/a2a/met-agent", json=rpc(method))
    gw.post("/a2a/met-agent", json=rpc("made/up-too"))
    r = gw.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    after = r.text

    def delta(name: str, **labels: str) -> float:
        return _metric(after, name, **labels) - _metric(before, name, **labels)

    total = "kubemq_a2a_requests_total"
    assert delta(total, agent_id="met-agent", method="message/send") == 1
    assert delta(total, agent_id="met-agent", method="SendMessage") == 1
    assert delta(total, agent_id="met-agent", method="tasks/send") == 1
    assert delta(total, agent_id="met-agent", method="unknown") == 2
    assert delta("kubemq_a2a_request_duration_seconds_count", agent_id="met-agent",
                 outcome="ok") == 5
    assert _metric(after, "kubemq_a2a_in_flight", agent_id="met-agent") == 0
    assert "kubemq_a2a_sse_streams_active" in after
    assert "kubemq_a2a_busy_rejections_total" in after or "kubemq_a2a_busy_rejections" in after


def test_hostile_input_never_500(gw: httpx.Client, agent, live_server_url, token):
    import socket
    from urllib.parse import urlsplit

    register("tough-agent", agent.url)
    parts = urlsplit(live_server_url)
    raw_requests = [
        # non-UTF-8 header values and a lying Content-Length
        b"POST /a2a/tough-agent HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Authorization: Bearer " + token.encode() + b"\r\nX-Weird: \xff\xfe\r\n"
        b"Content-Length: 2\r\n\r\n{}",
        b"POST /a2a/tough-agent HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: abc\r\n\r\n",
        b"POST /a2a/%00%ff HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
        b"POST /a2a/tough-agent/extra/path HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
    ]
    for raw in raw_requests:
        with socket.create_connection((parts.hostname, parts.port), timeout=5) as sock:
            sock.sendall(raw)
            reply = sock.recv(65536)
        status_line = reply.split(b"\r\n", 1)[0]
        assert b" 500 " not in status_line, (raw, reply)
        assert b"Traceback" not in reply
    r = gw.post("/a2a/tough-agent", json=rpc(), headers={"X-Long": "v" * 7000})
    assert r.status_code == 200
    assert agent.arrived[-1].header("x-long") == "v" * 7000


# --- agents that are not well-behaved HTTP servers --------------------------------------------


@pytest.fixture
def raw_agent():
    """A bare TCP server whose reply bytes each test scripts (``reply`` None: close at once)."""
    import socket
    import threading

    state = {"reply": b"", "requests": 0}
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(2)
                try:
                    data = conn.recv(65536)
                    while b"\r\n\r\n" not in data:
                        data += conn.recv(65536)
                except OSError:
                    continue
                state["requests"] += 1
                if state["reply"]:
                    conn.sendall(state["reply"])

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    state["url"] = f"http://127.0.0.1:{listener.getsockname()[1]}/"
    yield state
    listener.close()


def test_close_delimited_and_broken_agents(gw: httpx.Client, raw_agent):
    register("raw-agent", raw_agent["url"])
    body = b'{"jsonrpc":"2.0","id":1,"result":"no length, ends at close"}'
    raw_agent["reply"] = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n" \
                         b"Connection: close\r\n\r\n" + body
    r = gw.post("/a2a/raw-agent", json=rpc())
    assert r.status_code == 200 and r.content == body
    assert r.headers["x-a2a-executed"] == "true"
    raw_agent["reply"] = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\n" \
                         b"Content-Length: 2\r\nConnection: close\r\n\r\n{}"
    r = gw.post("/a2a/raw-agent", json=rpc())
    assert r.status_code == 201 and r.content == b"{}"
    for broken in (b"", b"NOT HTTP AT ALL\r\n\r\n",
                   b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\ntruncated"):
        raw_agent["reply"] = broken
        r = gw.post("/a2a/raw-agent", json=rpc(rpc_id="b"))
        assert r.status_code == 200, broken
        assert r.json()["error"]["data"]["kind"] == "unreachable", broken
        assert r.json()["id"] == "b"


def test_broker_down_is_unreachable_at_once(gw: httpx.Client, agent, settings):
    """A Channels layer whose Redis is not there: send() fails fast, the caller gets
    `unreachable` at once (never queued, never a 500)."""
    from channels_redis.pubsub import RedisPubSubChannelLayer

    from gateway import runtime
    from tests.servers import free_port

    settings.A2A_LOCAL_FAST_PATH = False  # every request through the broker
    register("brokerless", agent.url)
    node = runtime.current_node()
    dead = RedisPubSubChannelLayer(hosts=[{"address": f"redis://127.0.0.1:{free_port()}/0",
                                           "socket_connect_timeout": 0.5}])
    real, node.layer = node.layer, dead
    try:
        r = gw.post("/a2a/brokerless", json=rpc(rpc_id="nb"))
        assert r.status_code == 200 and r.headers["x-a2a-executed"] == "false"
        assert r.json()["error"]["data"]["kind"] == "unreachable"
        # The failed send() answered it, not the wait for an ack that never comes.
        assert r.json()["error"]["message"].startswith("agent unreachable: broker unavailable")
        assert r.json()["id"] == "nb"
    finally:
        node.layer = real
    assert agent.arrived == []
