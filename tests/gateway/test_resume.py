"""Resumable streams (docs/streams.md): a caller whose connection drops mid-stream reconnects with
Last-Event-ID and gets every event exactly once, in order; the window expiring cancels the
agent's stream; another client cannot resume; the replay buffer is bounded.

Over the local fast path and through the Channels layer (``gateway_path`` / ``path_mode``), with
a real a2a-sdk agent streaming 1,000 artifact events, and the scripted agent of test_proxy (which
records when its side of a stream is closed).
"""

from __future__ import annotations

import time

import httpx
import orjson
import pytest

from outbound.http1_wire import HIGH_WATER_BYTES
from tests.gateway import test_cluster
from tests.gateway import test_proxy as proxy
from tests.gateway.test_proxy import _metric, register, rpc
from tests.servers import kernel_buffer_bytes

agent, gw, path_mode, token = proxy.agent, proxy.gw, proxy.path_mode, proxy.token
node_b = test_cluster.node_b  # the second serve node (distributed mode)

STEPS = 1000


class EventReader:
    """Reads SSE events off a streamed httpx response: (id, data) per event, comments skipped."""

    def __init__(self, response: httpx.Response) -> None:
        self.response = response
        self.chunks = response.iter_raw()
        self.buffer = b""

    def read(self, limit: int | None = None) -> list[tuple[str | None, bytes]]:
        out: list[tuple[str | None, bytes]] = []
        while True:
            while b"\n\n" in self.buffer:
                block, self.buffer = self.buffer.split(b"\n\n", 1)
                event_id, data = None, []
                for line in block.split(b"\n"):
                    if line.startswith(b"id: "):
                        event_id = line[4:].decode()
                    elif line.startswith(b"data: "):
                        data.append(line[6:])
                if data:
                    out.append((event_id, b"\n".join(data)))
                    if limit is not None and len(out) >= limit:
                        return out
            try:
                self.buffer += next(self.chunks)
            except StopIteration:
                return out


def task_request(text: str) -> dict:
    return rpc(
        "message/stream",
        rpc_id="r1",
        message={
            "role": "user",
            "messageId": f"m-{time.monotonic_ns()}",
            "parts": [{"kind": "text", "text": text}],
        },
    )


def drop_mid_stream(client: httpx.Client, url: str, body: dict, limit: int):
    """POST ``body`` (a stream), read ``limit`` events, then drop the caller's TCP connection
    mid-stream: (the stream's id, the events read)."""
    with client.stream("POST", url, json=body) as first:
        stream_id = first.headers["x-a2a-stream-id"]
        events = EventReader(first).read(limit=limit)
        first.close()
    return stream_id, events


def wait_until(predicate, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.02)


def artifact_texts(events: list[tuple[str | None, bytes]]) -> list[str]:
    texts = []
    for _, data in events:
        result = orjson.loads(data).get("result") or {}
        artifact = result.get("artifact")
        if artifact:
            texts.append(artifact["parts"][0]["text"])
    return texts


@pytest.fixture
def resumable(settings):
    settings.A2A_SSE_RESUME_SECONDS = 30
    return settings


def test_dropped_caller_resumes_every_event_exactly_once_in_order(
    resumable, live_server_url, echo_agent_factory, register_agent, caller, gateway_path
):
    echo = echo_agent_factory(steps=STEPS, step_delay=0.002)
    target = register_agent(echo)
    url = f"{live_server_url}/a2a/{target.agent_id}"
    with httpx.Client(timeout=30, headers=caller.auth) as client:
        with client.stream("POST", url, json=task_request("task resume")) as first:
            assert first.status_code == 200
            stream_id = first.headers["x-a2a-stream-id"]
            before = EventReader(first).read(limit=300)
            first.close()  # the caller's TCP connection drops mid-stream
        assert len(before) == 300
        last_id = before[-1][0]
        assert last_id == f"{stream_id}:{300}"
        with client.stream(
            "GET", f"{url}/stream/{stream_id}", headers={"Last-Event-ID": last_id}
        ) as again:
            assert again.status_code == 200, again.read()
            assert again.headers["content-type"].startswith("text/event-stream")
            after = EventReader(again).read()
    events = before + after
    # Every event exactly once and in order: the ids count 1..n without gap or repeat...
    assert [event_id for event_id, _ in events] == [
        f"{stream_id}:{n}" for n in range(1, len(events) + 1)
    ]
    # ... and so do the agent's own events: all 1,000 artifacts, then the task completes.
    assert artifact_texts(events) == [f"chunk {i}: task resume" for i in range(STEPS)]
    final = orjson.loads(events[-1][1])["result"]
    assert final["status"]["state"] in ("completed", "TASK_STATE_COMPLETED")
    assert len(echo.recorder.rpc("message/stream")) == 1  # the agent was asked once


def test_query_parameter_resume_for_clients_without_headers(
    resumable, live_server_url, agent, token, path_mode
):
    register("qp-agent", agent.url)
    url = f"{live_server_url}/a2a/qp-agent"
    headers = {"Authorization": f"Bearer {token}"}
    with httpx.Client(timeout=10, headers=headers) as client:
        with client.stream(
            "POST", url, json=rpc("message/stream", mode="sse", events=20, delay=0.05)
        ) as first:
            stream_id = first.headers["x-a2a-stream-id"]
            before = EventReader(first).read(limit=5)
        with client.stream(
            "GET", f"{url}/stream/{stream_id}", params={"last_event_id": before[-1][0]}
        ) as again:
            after = EventReader(again).read()
    seqs = [orjson.loads(d)["result"]["seq"] for _, d in before + after]
    assert seqs == list(range(20))


def test_window_expiry_cancels_the_agents_stream(
    settings, live_server_url, agent, token, path_mode
):
    settings.A2A_SSE_RESUME_SECONDS = 1.0
    register("exp-agent", agent.url)
    url = f"{live_server_url}/a2a/exp-agent"
    headers = {"Authorization": f"Bearer {token}"}
    with httpx.Client(timeout=10, headers=headers) as client:
        stream_id, before = drop_mid_stream(
            client, url, rpc("message/stream", mode="sse", events=200, delay=0.05), 2
        )
        dropped = time.monotonic()
        # Within the window the agent's stream stays open (it is being kept for a resume)...
        time.sleep(0.4)
        assert agent.streams_open == 1 and agent.stream_ends == []
        # ... after it, the stream is cancelled as a disconnect always was.
        wait_until(lambda: agent.streams_open == 0)
        assert time.monotonic() - dropped >= 0.9
        assert agent.stream_ends == ["disconnect"]
        wait_until(
            lambda: (
                _metric(
                    client.get(f"{live_server_url}/metrics").text,
                    "kubemq_a2a_in_flight",
                    agent_id="exp-agent",
                )
                == 0
            )
        )
        late = client.get(f"{url}/stream/{stream_id}", headers={"Last-Event-ID": before[-1][0]})
    assert late.status_code == 404
    error = late.json()["error"]
    assert error["data"]["kind"] == "stream_not_found" and error["code"] == -32062


def test_another_client_cannot_resume(
    resumable, live_server_url, agent, token, make_caller, path_mode
):
    register("own-agent", agent.url)
    url = f"{live_server_url}/a2a/own-agent"
    other = make_caller()
    with httpx.Client(timeout=10, headers={"Authorization": f"Bearer {token}"}) as client:
        stream_id, before = drop_mid_stream(
            client, url, rpc("message/stream", mode="sse", events=50, delay=0.05), 2
        )
        stolen = httpx.get(
            f"{url}/stream/{stream_id}",
            headers={**other.auth, "Last-Event-ID": before[-1][0]},
            timeout=10,
        )
        assert stolen.status_code == 404
        assert stolen.json()["error"]["data"]["kind"] == "stream_not_found"
        unknown = client.get(f"{url}/stream/nosuchstream", headers={"Last-Event-ID": "0"})
        assert unknown.status_code == 404
        bad = client.get(f"{url}/stream/{stream_id}", headers={"Last-Event-ID": "other:3"})
        assert bad.json()["error"]["data"]["kind"] == "invalid_request"
        # the owner still can
        with client.stream(
            "GET", f"{url}/stream/{stream_id}", headers={"Last-Event-ID": before[-1][0]}
        ) as again:
            after = EventReader(again).read()
    seqs = [orjson.loads(d)["result"]["seq"] for _, d in before + after]
    assert seqs == list(range(50))


def test_detached_stream_is_bounded_by_the_replay_buffer(
    settings, live_server_url, agent, token, path_mode
):
    # Nobody reads: the owner keeps at most the replay buffer (plus one read of the agent),
    # then stops reading the agent rather than drop an event; a resume still gets them all.
    settings.A2A_SSE_RESUME_SECONDS = 30
    settings.A2A_SSE_RESUME_BUFFER_BYTES = replay = 8 * 1024 * 1024
    settings.A2A_SSE_BUFFER_BYTES = 4096
    # More than the owner may hold (the replay buffer, the outbound client's read-ahead) plus
    # what the kernel holds between agent and owner: a stream that fits in those completes
    # on the agent's side however little the owner reads.
    size = 8000
    total = max(4000, (replay + HIGH_WATER_BYTES + kernel_buffer_bytes()) // size + 500)
    register("cap-agent", agent.url)
    url = f"{live_server_url}/a2a/cap-agent"
    headers = {"Authorization": f"Bearer {token}"}
    with httpx.Client(timeout=30, headers=headers) as client:
        with client.stream(
            "POST",
            url,
            json=rpc("message/stream", mode="sse", events=total, delay=0, event_size=size),
        ) as first:
            stream_id = first.headers["x-a2a-stream-id"]
            before = EventReader(first).read(limit=1)
            first.close()
        # Wait until the agent's sending settles (the owner stopped reading it)...
        sent, deadline = -1, time.monotonic() + 20
        while agent.sent_events != sent and agent.streams_open and time.monotonic() < deadline:
            sent = agent.sent_events
            time.sleep(0.5)
        assert agent.sent_events == sent < total and agent.streams_open == 1
        with client.stream(
            "GET", f"{url}/stream/{stream_id}", headers={"Last-Event-ID": before[-1][0]}
        ) as again:
            assert again.status_code == 200
            after = EventReader(again).read()
    events = before + after
    assert [orjson.loads(d)["result"]["seq"] for _, d in events] == list(range(total))
    assert [event_id for event_id, _ in events] == [f"{stream_id}:{n}" for n in range(1, total + 1)]


@pytest.mark.parametrize("resume_on", ["entry", "owner"])
def test_cross_node_resume_every_event_exactly_once_in_order(
    resumable, live_server_url, node_b, echo_agent_factory, register_agent, caller, resume_on
):
    """The agent is owned by this process's node (A); the caller enters node B, drops, and
    reconnects through B (the broker to the owner again) or straight to the owner."""
    echo = echo_agent_factory(steps=STEPS, step_delay=0.002)
    target = register_agent(echo)  # through node A's API: node A owns it
    entry = f"{node_b.url}/a2a/{target.agent_id}"
    probe = {**task_request("hi"), "method": "message/send"}
    wait_until(  # node B learns the route from the discovery group
        lambda: "result" in httpx.post(entry, headers=caller.auth, json=probe).json(),
        timeout=10,
    )
    echo.recorder.clear()
    again_base = entry if resume_on == "entry" else f"{live_server_url}/a2a/{target.agent_id}"
    with httpx.Client(timeout=30, headers=caller.auth) as client:
        with client.stream("POST", entry, json=task_request("task far")) as first:
            assert first.status_code == 200
            stream_id = first.headers["x-a2a-stream-id"]
            before = EventReader(first).read(limit=300)
            first.close()
        with client.stream(
            "GET", f"{again_base}/stream/{stream_id}", headers={"Last-Event-ID": before[-1][0]}
        ) as again:
            assert again.status_code == 200, again.read()
            after = EventReader(again).read()
    events = before + after
    assert [event_id for event_id, _ in events] == [
        f"{stream_id}:{n}" for n in range(1, len(events) + 1)
    ]
    assert artifact_texts(events) == [f"chunk {i}: task far" for i in range(STEPS)]
    assert len(echo.recorder.rpc("message/stream")) == 1


def test_a_resumed_stream_resumes_again(resumable, live_server_url, agent, token, path_mode):
    register("twice-agent", agent.url)
    url = f"{live_server_url}/a2a/twice-agent"
    with httpx.Client(timeout=10, headers={"Authorization": f"Bearer {token}"}) as client:
        stream_id, events = drop_mid_stream(
            client, url, rpc("message/stream", mode="sse", events=30, delay=0.03), 5
        )
        with client.stream(
            "GET", f"{url}/stream/{stream_id}", headers={"Last-Event-ID": events[-1][0]}
        ) as second:
            assert second.headers["x-a2a-stream-id"] == stream_id
            events += EventReader(second).read(limit=5)
            second.close()
        with client.stream(
            "GET", f"{url}/stream/{stream_id}", headers={"Last-Event-ID": events[-1][0]}
        ) as third:
            events += EventReader(third).read()
    assert [orjson.loads(d)["result"]["seq"] for _, d in events] == list(range(30))
    assert [event_id for event_id, _ in events] == [f"{stream_id}:{n}" for n in range(1, 31)]


@pytest.mark.parametrize("profile, code", [("a2a", -32062), ("kubemq", -32002)])
def test_unknown_stream_error_per_profile(
    resumable, settings, live_server_url, agent, token, path_mode, profile, code
):
    settings.A2A_ERROR_PROFILE = profile
    register("gone-agent", agent.url)
    r = httpx.get(
        f"{live_server_url}/a2a/gone-agent/stream/abc",
        headers={"Authorization": f"Bearer {token}", "Last-Event-ID": "abc:3"},
        timeout=10,
    )
    assert r.status_code == 404 and r.headers["x-a2a-executed"] == "false"
    error = r.json()["error"]
    assert error["code"] == code and error["data"]["kind"] == "stream_not_found"
    assert error["message"] == "stream not found: unknown or expired stream"


def test_kubemq_profile_stream_cancel_after_the_window(
    settings, live_server_url, agent, token, path_mode
):
    settings.A2A_ERROR_PROFILE = "kubemq"
    settings.A2A_SSE_RESUME_SECONDS = 0.8
    register("kq-resume", agent.url)
    with httpx.Client(timeout=10, headers={"Authorization": f"Bearer {token}"}) as client:
        with client.stream(
            "POST",
            f"{live_server_url}/a2a/kq-resume",
            json=rpc("message/stream", rpc_id="kq-1", mode="sse", events=100, delay=0.05),
        ) as first:
            EventReader(first).read(limit=1)
            first.close()
    dropped = time.monotonic()

    def cancels():
        return [a for a in agent.arrived if a.payload.get("method") == "stream_cancel"]

    time.sleep(0.3)
    assert cancels() == []  # kept for a resume: no notice yet
    wait_until(lambda: cancels() != [])
    assert time.monotonic() - dropped >= 0.7
    assert cancels()[0].payload["params"]["id"] == "kq-1"
