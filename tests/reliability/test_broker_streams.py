"""Fault matrix, cross-node streams through the broker (agent owned by node A, callers entering
node B, private PostgreSQL and Redis): what crosses Redis is numbered, so a stream either
delivers every event in order or ends with an explicit terminal error event -- never
"normally" with events missing -- and large events cross in bounded pieces, so callers that
stop reading never trip Redis's pub/sub output-buffer limit (its default,
``client-output-buffer-limit pubsub 32mb 8mb 60``)."""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time

import httpx
import orjson
import pytest
import redis

from tests.faults import sse_events as _events
from tests.reliability.conftest import register
from tests.servers import answer_lifespan, read_body, serve_app, watch_disconnect

pytestmark = pytest.mark.timeout(240)


class NumberedAgent:
    """``message/stream``: ``count`` events numbered from 0, ``delay`` s apart, each padded to
    ``pad`` bytes (the first to ``first`` bytes when given), then the stream's end (with
    ``hold``: only once :attr:`release` is set); ``held``: a small JSON-RPC result once
    :attr:`release` is set; ``large``: a result padded to ``size`` bytes; any other method: a
    small JSON-RPC result. Parameters come in the request's ``params``."""

    def __init__(self) -> None:
        self.open = 0
        self.release = threading.Event()

    async def _released(self) -> None:
        deadline = time.monotonic() + 30
        while not self.release.is_set() and time.monotonic() < deadline:
            await asyncio.sleep(0.02)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            await answer_lifespan(receive, send)
            return
        payload = orjson.loads(await read_body(receive))
        rpc_id = payload.get("id")
        params = payload.get("params") or {}
        if payload.get("method") != "message/stream":
            result = "ok"
            if payload.get("method") == "held":
                await self._released()
            elif payload.get("method") == "large":
                result = "x" * int(params.get("size", 0))
            body = orjson.dumps({"jsonrpc": "2.0", "id": rpc_id, "result": result})
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"application/json")]})
            await send({"type": "http.response.body", "body": body})
            return
        count, delay = int(params.get("count", 10)), float(params.get("delay", 0.05))
        pad, first = int(params.get("pad", 16)), int(params.get("first", 0))
        closed, watcher = watch_disconnect(receive)
        self.open += 1
        try:
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"text/event-stream")]})
            for n in range(count):
                if closed.is_set():
                    return
                size = first if n == 0 and first else pad
                event = b"data: " + orjson.dumps(
                    {"jsonrpc": "2.0", "id": rpc_id, "result": {"n": n, "pad": "x" * size}}
                ) + b"\n\n"
                await send({"type": "http.response.body", "body": event, "more_body": True})
                await asyncio.sleep(delay)
            if params.get("hold"):
                await self._released()
            await send({"type": "http.response.body", "body": b""})
        finally:
            watcher.cancel()
            self.open -= 1


def _stream_body(rpc_id: str, **params) -> dict:
    return {"jsonrpc": "2.0", "id": rpc_id, "method": "message/stream", "params": params}




def _read_stream(url: str, auth: dict, body: dict, results: list, on_event=None) -> None:
    """Read one stream through to its end; append (numbers relayed, terminal error or None)."""
    numbers: list[int] = []
    error = None
    try:
        with httpx.stream("POST", url, json=body, headers=auth, timeout=90) as response:
            assert response.status_code == 200, response.read()
            for event in _events(response):
                if "error" in event:
                    error = event["error"]
                    break
                numbers.append(event["result"]["n"])
                if on_event is not None:
                    on_event(len(numbers))
    except httpx.HTTPError as exc:  # a cut connection is not an explicit ending
        error = {"cut": repr(exc)}
    results.append((numbers, error))


def _cluster(start_node, tokens, agent_url: str, **env):
    """Node A owns the agent; node B has learned its route. (A, B, agent id, auth headers)."""
    owner = start_node(**env)
    entry = start_node(**env)
    auth = {"Authorization": f"Bearer {tokens['caller']}"}
    agent_id = register(owner.url, tokens["admin"], agent_url)
    deadline = time.monotonic() + 20
    while True:
        ok = httpx.post(f"{entry.url}/a2a/{agent_id}", headers=auth, timeout=10,
                        json={"jsonrpc": "2.0", "id": "probe", "method": "ping"})
        if ok.status_code == 200 and ok.json().get("result") == "ok":
            break
        assert time.monotonic() < deadline, ok.text
        time.sleep(0.2)
    return owner, entry, agent_id, auth


def _complete_or_explicit(numbers: list[int], error, count: int) -> None:
    """The promise: the events relayed are 0, 1, 2, ... without a hole; a stream that
    relayed fewer than ``count`` ended with an explicit terminal error event."""
    assert numbers == list(range(len(numbers))), f"relayed around a gap: {numbers}"
    if len(numbers) < count:
        assert error is not None and "cut" not in error, (len(numbers), error)
        assert error["data"]["executed"] is True, error


def test_a_reply_lost_by_the_owner_ends_the_stream_with_stream_gap(services, tokens,
                                                                    start_node):
    """The owner's publishing connection is killed while a PUBLISH of the stream waits in
    Redis (CLIENT PAUSE WRITE holds it there): that event is lost, the entry node's own
    subscription never broke (so ``broker_lost`` cannot tell), and the next event crosses.
    The entry node sees the missing number and ends the stream with ``stream_gap`` instead of
    relaying around it."""
    agent = NumberedAgent()
    admin = redis.Redis.from_url(services["redis_url"])
    with serve_app(agent, lifespan="off") as server:
        owner, entry, agent_id, auth = _cluster(start_node, tokens, server.url + "/")
        results: list = []
        seen = threading.Event()
        count = 60
        reader = threading.Thread(target=_read_stream, args=(
            f"{entry.url}/a2a/{agent_id}", auth,
            _stream_body("gap-1", count=count, delay=0.05), results,
            lambda n: n == 10 and seen.set()))
        reader.start()
        assert seen.wait(30)
        # The owner's next event waits in Redis and is lost.
        _lose_the_owners_next_publish(admin, lambda: None)
        reader.join(60)
        assert not reader.is_alive()
    numbers, error = results[0]
    _complete_or_explicit(numbers, error, count)
    assert len(numbers) < count, "nothing was lost: the test did not lose a reply"
    assert error["data"]["kind"] == "stream_gap", error
    assert error["code"] == -32067 and error["data"]["retryable"] is True
    assert error["message"].startswith("stream gap: "), error
    assert "Redis subscriber connection lost" not in entry.log_path.read_text(errors="replace")


def _lose_the_owners_next_publish(admin: redis.Redis, then) -> None:
    """Hold every PUBLISH in Redis (CLIENT PAUSE WRITE), call ``then`` (which makes the owner
    publish), and kill the connections whose last command was a PUBLISH: what they published
    meanwhile is lost."""
    admin.client_pause(3000, all=False)
    try:
        then()
        time.sleep(0.5)  # the owner's publish is now waiting in Redis
        killed = 0
        for client in admin.client_list():
            if client["cmd"] == "publish" and "P" not in client["flags"]:
                admin.client_kill_filter(_id=client["id"])
                killed += 1
        assert killed >= 1
    finally:
        admin.client_unpause()


@pytest.mark.parametrize("resumable", [False, True], ids=["plain", "resumable"])
def test_a_lost_last_reply_ends_the_call_with_stream_gap_at_once(services, tokens, start_node,
                                                                 resumable):
    """The *last* reply messages of a stream (its end) and of a sync call (its whole answer)
    are lost with the owner's publishing connection: no later number shows the gap, yet the
    entry node learns within a few seconds where the owner ended each call (its ``a2a.ended``
    notice, sent again after the connection is back) and ends both with ``stream_gap``, not
    with ``owner_lost`` after the keepalive window (the owner is alive) nor a timeout. With
    resumable streams on, the stream is re-attached instead and ends normally, complete."""
    agent = NumberedAgent()
    admin = redis.Redis.from_url(services["redis_url"])
    extra = {"A2A_SSE_KEEPALIVE_SECONDS": "5"}  # without the notice: owner_lost after 20 s
    if resumable:
        extra["A2A_SSE_RESUME_SECONDS"] = "30"
    with serve_app(agent, lifespan="off") as server:
        owner, entry, agent_id, auth = _cluster(start_node, tokens, server.url + "/", **extra)
        results: list = []
        seen = threading.Event()
        count = 20
        reader = threading.Thread(target=_read_stream, args=(
            f"{entry.url}/a2a/{agent_id}", auth,
            _stream_body("tail-1", count=count, delay=0.01, hold=True), results,
            lambda n: n == count and seen.set()))
        answers: list = []

        def call_held() -> None:
            try:
                answers.append(httpx.post(f"{entry.url}/a2a/{agent_id}", headers=auth,
                                          timeout=60, json={"jsonrpc": "2.0", "id": "h",
                                                            "method": "held"}))
            except httpx.HTTPError as exc:
                answers.append(exc)

        caller = threading.Thread(target=call_held)
        reader.start()
        caller.start()
        assert seen.wait(30)
        time.sleep(1.0)  # the sync call was acknowledged: it waits for its answer
        _lose_the_owners_next_publish(admin, agent.release.set)
        lost_at = time.monotonic()
        reader.join(30)
        caller.join(30)
        ended_after = time.monotonic() - lost_at
        assert not reader.is_alive() and not caller.is_alive()
        log = entry.log_path.read_text(errors="replace")
    numbers, error = results[0]
    assert numbers == list(range(count))
    assert ended_after < 8, ended_after  # the keepalive rule would take 20 s
    answer = answers[0]
    assert isinstance(answer, httpx.Response), answer
    failure = answer.json().get("error")
    assert failure is not None and failure["data"]["kind"] == "stream_gap", answer.text
    if resumable:
        assert error is None, error
        assert "re-attached after event" in log
    else:
        assert error is not None and error["data"]["kind"] == "stream_gap", error
        assert error["code"] == -32067 and error["data"]["executed"] is True
    assert "Redis subscriber connection lost" not in log


def test_a_resumable_stream_is_reattached_after_a_lost_reply(services, tokens, start_node):
    """Resumable streams on: the same lost reply, and the entry node re-attaches to the
    owner's replay buffer after the last event it relayed -- the caller gets every event
    exactly once, in order, and the stream's normal end."""
    agent = NumberedAgent()
    admin = redis.Redis.from_url(services["redis_url"])
    with serve_app(agent, lifespan="off") as server:
        owner, entry, agent_id, auth = _cluster(start_node, tokens, server.url + "/",
                                                A2A_SSE_RESUME_SECONDS="30")
        results: list = []
        seen = threading.Event()
        count = 60
        reader = threading.Thread(target=_read_stream, args=(
            f"{entry.url}/a2a/{agent_id}", auth,
            _stream_body("gap-2", count=count, delay=0.05), results,
            lambda n: n == 10 and seen.set()))
        reader.start()
        assert seen.wait(30)
        _lose_the_owners_next_publish(admin, lambda: None)  # the stream publishes by itself
        reader.join(60)
        assert not reader.is_alive()
    numbers, error = results[0]
    assert error is None, error
    assert numbers == list(range(count))
    assert "re-attached after event" in entry.log_path.read_text(errors="replace")


def test_streams_through_a_redis_restart_never_end_normally_with_events_missing(
        services, tokens, start_node):
    """Redis killed and started again ~4 s later while cross-node streams run: each stream
    delivers every event in order, or ends with an explicit terminal error event."""
    agent = NumberedAgent()
    with serve_app(agent, lifespan="off") as server:
        owner, entry, agent_id, auth = _cluster(start_node, tokens, server.url + "/")
        results: list = []
        count = 80
        started = threading.Barrier(5)
        readers = [threading.Thread(target=_read_stream, args=(
            f"{entry.url}/a2a/{agent_id}", auth,
            _stream_body(f"restart-{k}", count=count, delay=0.1), results,
            lambda n: n == 5 and started.wait(30))) for k in range(4)]
        for reader in readers:
            reader.start()
        started.wait(30)
        services["redis"].kill()
        try:
            time.sleep(4)
        finally:
            services["redis"].start()
        for reader in readers:
            reader.join(90)
        assert not any(reader.is_alive() for reader in readers)
    assert len(results) == 4
    for numbers, error in results:
        _complete_or_explicit(numbers, error, count)


def test_resumable_streams_through_a_redis_restart_lose_nothing(services, tokens, start_node):
    """Resumable streams on: Redis killed and started again ~3 s later while cross-node
    streams run; the entry node re-attaches each to the owner's replay buffer once the broker
    is back, and every caller gets every event exactly once, in order, and the normal end."""
    agent = NumberedAgent()
    with serve_app(agent, lifespan="off") as server:
        owner, entry, agent_id, auth = _cluster(start_node, tokens, server.url + "/",
                                                A2A_SSE_RESUME_SECONDS="60")
        results: list = []
        count = 80
        started = threading.Barrier(4)
        readers = [threading.Thread(target=_read_stream, args=(
            f"{entry.url}/a2a/{agent_id}", auth,
            _stream_body(f"resume-restart-{k}", count=count, delay=0.1), results,
            lambda n: n == 5 and started.wait(30))) for k in range(3)]
        for reader in readers:
            reader.start()
        started.wait(30)
        services["redis"].kill()
        try:
            time.sleep(3)
        finally:
            services["redis"].start()
        for reader in readers:
            reader.join(90)
        assert not any(reader.is_alive() for reader in readers)
        log = entry.log_path.read_text(errors="replace")
    assert len(results) == 3
    for numbers, error in results:
        assert error is None, (error, len(numbers), log[-3000:])
        assert numbers == list(range(count))
    assert "re-attached after event" in log


def _ping(client: httpx.Client, url: str, failures: list) -> None:
    """One small cross-node call (the agent's ``ping``); what went wrong into ``failures``."""
    rpc_id = os.urandom(4).hex()
    try:
        r = client.post(url, json={"jsonrpc": "2.0", "id": rpc_id, "method": "ping"})
        if r.status_code != 200 or r.json() != {"jsonrpc": "2.0", "id": rpc_id, "result": "ok"}:
            failures.append(r.text[:300])
    except httpx.HTTPError as exc:
        failures.append(repr(exc))


def test_non_reading_callers_never_trip_the_pubsub_buffer_limit(services, tokens, start_node):
    """20 callers stop reading cross-node streams of 64 KiB events, and 3 more stop reading
    streams whose first event is 34 MiB (one message above Redis's 32 MiB hard limit, were it
    sent whole); meanwhile unrelated cross-node calls all succeed, and the entry node's
    subscription to Redis is never closed (same client id, no reconnect logged)."""
    agent = NumberedAgent()
    admin = redis.Redis.from_url(services["redis_url"])
    assert admin.config_get("client-output-buffer-limit")["client-output-buffer-limit"] \
        .endswith("pubsub 33554432 8388608 60")  # Redis's default
    big = 34 * 1024 * 1024
    with serve_app(agent, lifespan="off") as server:
        owner, entry, agent_id, auth = _cluster(
            start_node, tokens, server.url + "/", A2A_MAX_RESPONSE_BYTES=str(64 * 1024 * 1024))
        subscribers = {c["id"] for c in admin.client_list() if "P" in c["flags"]}
        sent_before = admin.info("stats")["total_net_output_bytes"]
        callers = []
        token = tokens["caller"]
        for k in range(23):
            params = {"count": 100_000, "delay": 0, "pad": 64 * 1024}
            if k >= 20:
                params.update(first=big, count=3)
            body = orjson.dumps(_stream_body(f"stalled-{k}", **params))
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.connect(("127.0.0.1", entry.port))
            sock.sendall(
                f"POST /a2a/{agent_id} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                f"Authorization: Bearer {token}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
            callers.append(sock)
        failures: list = []
        calls = 0
        try:
            # At least 25 s of non-reading callers, at least 50 unrelated calls and until the
            # large events have crossed (a loaded machine is slower at both), at most 120 s.
            started = time.monotonic()
            crossed = 3 * big + 20 * 1024 * 1024
            sent = 0
            with httpx.Client(headers=auth, timeout=15) as client:
                while time.monotonic() - started < 25 or (
                        (calls < 50 or sent <= crossed) and time.monotonic() - started < 120):
                    if calls % 10 == 0:
                        sent = admin.info("stats")["total_net_output_bytes"] - sent_before
                    _ping(client, f"{entry.url}/a2a/{agent_id}", failures)
                    calls += 1
            after = {c["id"] for c in admin.client_list() if "P" in c["flags"]}
            sent = admin.info("stats")["total_net_output_bytes"] - sent_before
        finally:
            for sock in callers:
                sock.close()
    assert calls >= 50 and failures == [], (calls, failures[:5])
    assert after == subscribers, "a node's Redis subscription was closed and reopened"
    assert sent > crossed, sent  # the large events did cross, in pieces
    for node in (owner, entry):
        log = node.log_path.read_text(errors="replace")
        assert "Redis subscriber connection lost" not in log, log[-3000:]
        assert "broker lost" not in log, log[-3000:]


def test_concurrent_large_sync_answers_stay_within_the_entry_nodes_budget(services, tokens,
                                                                          start_node):
    """24 callers at once ask for 8 MiB sync answers through the entry node, again and again
    (about 190 MiB at a time, much more than Redis's pubsub limit of 32 MiB and faster than one
    node reads): the owner publishes their pieces only as the entry node grants them from its
    node-wide budget (A2A_BROKER_INFLIGHT_BYTES), so the entry node's subscription is never
    closed, every large answer arrives whole, and unrelated cross-node calls never fail."""
    agent = NumberedAgent()
    admin = redis.Redis.from_url(services["redis_url"])
    assert admin.config_get("client-output-buffer-limit")["client-output-buffer-limit"] \
        .endswith("pubsub 33554432 8388608 60")  # Redis's default
    size = 8 * 1024 * 1024
    with serve_app(agent, lifespan="off") as server:
        owner, entry, agent_id, auth = _cluster(start_node, tokens, server.url + "/")
        subscribers = {c["id"] for c in admin.client_list() if "P" in c["flags"]}
        stop = time.monotonic() + 10
        large: list = []
        failures: list = []

        def ask_large(k: int) -> None:
            with httpx.Client(headers=auth, timeout=60) as client:
                while time.monotonic() < stop:
                    rpc_id = f"large-{k}-{os.urandom(2).hex()}"
                    try:
                        r = client.post(f"{entry.url}/a2a/{agent_id}", json={
                            "jsonrpc": "2.0", "id": rpc_id, "method": "large",
                            "params": {"size": size}})
                        result = r.json().get("result")
                        large.append(r.status_code == 200 and isinstance(result, str)
                                     and len(result) == size or r.text[:300])
                    except httpx.HTTPError as exc:
                        large.append(repr(exc))

        askers = [threading.Thread(target=ask_large, args=(k,)) for k in range(24)]
        for asker in askers:
            asker.start()
        calls = 0
        held = 0  # the most Redis held for a subscriber (its output buffer)
        with httpx.Client(headers=auth, timeout=15) as client:
            while time.monotonic() < stop:
                held = max([held] + [int(c["omem"]) for c in admin.client_list()
                                     if "P" in c["flags"]])
                _ping(client, f"{entry.url}/a2a/{agent_id}", failures)
                calls += 1
                time.sleep(0.05)
        for asker in askers:
            asker.join(90)
        after = {c["id"] for c in admin.client_list() if "P" in c["flags"]}
    print(f"{len(large)} large answers, {calls} other calls, at most {held} bytes held")
    assert calls >= 5 and failures == [], (calls, failures[:5])  # slow on a loaded machine
    losses = [line for node in (owner, entry)
              for line in node.log_path.read_text(errors="replace").splitlines()
              if " lost" in line or "mailbox" in line]
    assert len(large) >= 24 and all(ok is True for ok in large), \
        ([ok for ok in large if ok is not True][:5], losses[:10])
    assert after == subscribers, "a node's Redis subscription was closed and reopened"
    # the budget (8 MiB), the first piece of each answer in flight, the small messages
    assert held < 12 * 1024 * 1024, held
    for node in (owner, entry):
        log = node.log_path.read_text(errors="replace")
        assert "Redis subscriber connection lost" not in log, log[-3000:]
        assert "broker lost" not in log, log[-3000:]
