"""Resumable HTTP+JSON streams (docs/streams.md "Resumable streams"): a REST caller whose
connection drops mid-stream reconnects with ``GET /a2a/{agent_id}/stream/{stream_id}`` and
Last-Event-ID and gets every event exactly once, in order, in the binding's form -- for a stream
forwarded to the agent's own HTTP+JSON interface and for one translated to the agent's JSON-RPC
(the replay buffer holds the agent's JSON-RPC events; the reconnect translates them as the live
stream does). Another client cannot resume; an unknown stream is answered in REST form.

Real a2a-sdk agents (tests/a2a_agents.py), over the local fast path and the Channels layer, and
across two nodes in the distributed mode.
"""

from __future__ import annotations

import time

import httpx
import orjson
import pytest

from tests.gateway import test_cluster
from tests.gateway.test_rest_binding import rest_agent, rest_error
from tests.gateway.test_resume import EventReader, wait_until

node_b = test_cluster.node_b  # the second serve node (distributed mode)

STEPS = 200
V10 = {"A2A-Version": "1.0"}
# the caller's protocol version -> (its route under the agent's base, its headers)
ROUTES = {
    "1.0": ("message:stream", V10),
    "0.3": ("v1/message:stream", {}),
}


@pytest.fixture
def resumable(settings):
    settings.A2A_SSE_RESUME_SECONDS = 30
    return settings


def send_body(text: str, version: str = "1.0") -> dict:
    """A SendMessageRequest in the ProtoJSON of the caller's version (0.3's parts: ``content``)."""
    return {"message": {"messageId": f"m-{time.monotonic_ns()}", "role": "ROLE_USER",
                        "parts" if version == "1.0" else "content": [{"text": text}]}}


def rest_texts(events: list[tuple[str | None, bytes]]) -> list[str]:
    """The artifact texts of REST-form stream events (ProtoJSON ``StreamResponse``s)."""
    texts = []
    for _, data in events:
        event = orjson.loads(data)
        assert "jsonrpc" not in event, event  # the binding's form, never the agent's JSON-RPC
        update = event.get("artifactUpdate")
        if update:
            texts.append(update["artifact"]["parts"][0]["text"])
    return texts


def final_state(events: list[tuple[str | None, bytes]]) -> str:
    return orjson.loads(events[-1][1])["statusUpdate"]["status"]["state"]


def drop_and_resume(client: httpx.Client, entry: str, again_base: str, route: str,
                    headers: dict, text: str, limit: int):
    """Open a REST stream at ``entry``, read ``limit`` events, drop the TCP connection, resume
    at ``again_base``: (stream id, events before, events after)."""
    version = "1.0" if headers == V10 else "0.3"
    with client.stream("POST", f"{entry}/{route}", json=send_body(text, version),
                       headers=headers) as first:
        assert first.status_code == 200, first.read()
        stream_id = first.headers["x-a2a-stream-id"]
        before = EventReader(first).read(limit=limit)
        first.close()  # the caller's TCP connection drops mid-stream
    assert len(before) == limit
    with client.stream("GET", f"{again_base}/stream/{stream_id}",
                       headers={**headers, "Last-Event-ID": before[-1][0]}) as again:
        assert again.status_code == 200, again.read()
        assert again.headers["content-type"].startswith("text/event-stream")
        assert again.headers["x-a2a-stream-id"] == stream_id
        after = EventReader(again).read()
    return stream_id, before, after


def assert_exactly_once(stream_id: str, events: list, text: str, steps: int = STEPS) -> None:
    # every event once, in order: the ids count 1..n without gap or repeat...
    assert [event_id for event_id, _ in events] == [
        f"{stream_id}:{n}" for n in range(1, len(events) + 1)]
    # ... and so do the agent's own events, in the binding's form
    assert rest_texts(events) == [f"chunk {i}: {text}" for i in range(steps)]
    assert final_state(events) in ("TASK_STATE_COMPLETED", "completed")


@pytest.mark.parametrize("version", list(ROUTES))
def test_translated_rest_stream_resumes_in_rest_form(
    resumable, gateway_path, live_server_url, echo_agent_factory, register_agent, caller,
    version,
):
    """An agent with only JSON-RPC: the replayed events are its JSON-RPC events, translated on
    the reconnect exactly as live (the stream id names the caller's and agent's versions)."""
    echo = echo_agent_factory(card_shape="both", steps=STEPS, step_delay=0.002)
    target = register_agent(echo)
    base = f"{live_server_url}/a2a/{target.agent_id}"
    route, headers = ROUTES[version]
    with httpx.Client(timeout=30, headers=caller.auth) as client:
        stream_id, before, after = drop_and_resume(client, base, base, route, headers,
                                                   "task rest resume", 60)
    assert stream_id.startswith("t11." if version == "1.0" else "t01.")
    assert_exactly_once(stream_id, before + after, "task rest resume")
    assert len(echo.recorder.rpc()) == 1  # the agent was asked once


def test_forwarded_rest_stream_resumes(
    resumable, gateway_path, live_server_url, echo_agent_factory, register_agent, caller,
):
    """An agent with its own HTTP+JSON interface: its events are relayed as they are, with the
    owner's ids, and replayed so."""
    echo = rest_agent(echo_agent_factory, steps=STEPS, step_delay=0.002)
    target = register_agent(echo)
    base = f"{live_server_url}/a2a/{target.agent_id}"
    with httpx.Client(timeout=30, headers=caller.auth) as client:
        stream_id, before, after = drop_and_resume(client, base, base, "message:stream", V10,
                                                   "task rest forwarded", 60)
    assert stream_id.startswith("r.")
    assert_exactly_once(stream_id, before + after, "task rest forwarded")
    assert [r.path for r in echo.requests if r.path.startswith("/rest")] == \
        ["/rest/message:stream"]


@pytest.mark.parametrize("forwarded", [False, True], ids=["translated", "forwarded"])
def test_another_client_cannot_resume_a_rest_stream(
    resumable, live_server_url, echo_agent_factory, register_agent, caller, make_caller,
    forwarded,
):
    echo = rest_agent(echo_agent_factory, steps=STEPS, step_delay=0.005) if forwarded \
        else echo_agent_factory(card_shape="both", steps=STEPS, step_delay=0.005)
    target = register_agent(echo)
    base = f"{live_server_url}/a2a/{target.agent_id}"
    other = make_caller()
    with httpx.Client(timeout=30, headers=caller.auth) as client:
        with client.stream("POST", f"{base}/message:stream", json=send_body("task mine"),
                           headers=V10) as first:
            stream_id = first.headers["x-a2a-stream-id"]
            before = EventReader(first).read(limit=5)
            first.close()
        stolen = httpx.get(f"{base}/stream/{stream_id}", timeout=10,
                           headers={**other.auth, "Last-Event-ID": before[-1][0]})
        # the REST binding's error (google.rpc.Status), the same 404 as for an unknown stream
        assert rest_error(stolen) == (404, "NOT_FOUND", "stream_not_found")
        assert stolen.headers["x-a2a-executed"] == "false"
        form = stream_id.split(".", 1)[0]
        unknown = client.get(f"{base}/stream/{form}.nosuchstream",
                             headers={"Last-Event-ID": "0"})
        assert rest_error(unknown) == (404, "NOT_FOUND", "stream_not_found")
        assert unknown.json()["error"]["message"] == \
            "stream not found: unknown or expired stream"
        bad = client.get(f"{base}/stream/{stream_id}", headers={"Last-Event-ID": "other:3"})
        assert rest_error(bad) == (400, "INVALID_ARGUMENT", "invalid_request")
        # the owner still can
        with client.stream("GET", f"{base}/stream/{stream_id}",
                           headers={"Last-Event-ID": before[-1][0]}) as again:
            after = EventReader(again).read()
    assert_exactly_once(stream_id, before + after, "task mine")


def test_cross_node_rest_resume(
    resumable, live_server_url, node_b, echo_agent_factory, register_agent, caller,
):
    """The agents are owned by this process's node (A); the REST caller enters node B, drops,
    and reconnects through B (the broker to the owner again): a translated stream and a
    forwarded one (one node B for both: starting one takes seconds)."""
    for forwarded in (False, True):
        echo = rest_agent(echo_agent_factory, steps=STEPS, step_delay=0.002) if forwarded \
            else echo_agent_factory(card_shape="both", steps=STEPS, step_delay=0.002)
        target = register_agent(echo)  # through node A's API: node A owns it
        entry = f"{node_b.url}/a2a/{target.agent_id}"
        wait_until(  # node B learns the route from the discovery group
            lambda entry=entry: httpx.post(f"{entry}/message:send", json=send_body("hi"),
                                           headers={**caller.auth, **V10}).status_code == 200,
            timeout=10,
        )
        with httpx.Client(timeout=30, headers=caller.auth) as client:
            stream_id, before, after = drop_and_resume(client, entry, entry, "message:stream",
                                                       V10, "task rest far", 60)
        assert stream_id.startswith("r." if forwarded else "t11.")
        assert_exactly_once(stream_id, before + after, "task rest far")

def test_resume_off_rest_streams_carry_no_ids(
    settings, live_server_url, echo_agent_factory, register_agent, caller,
):
    """``A2A_SSE_RESUME_SECONDS=0`` (the default): nothing to resume, no stream id, no ids."""
    settings.A2A_SSE_RESUME_SECONDS = 0
    echo = echo_agent_factory(card_shape="both", steps=3, step_delay=0)
    target = register_agent(echo)
    with httpx.Client(timeout=30, headers=caller.auth) as client:
        with client.stream("POST", f"{target.gateway_base}message:stream",
                           json=send_body("task plain"), headers=V10) as response:
            assert response.status_code == 200
            assert "x-a2a-stream-id" not in response.headers
            events = EventReader(response).read()
    assert rest_texts(events) == [f"chunk {i}: task plain" for i in range(3)]
    assert [event_id for event_id, _ in events] == [None] * len(events)
