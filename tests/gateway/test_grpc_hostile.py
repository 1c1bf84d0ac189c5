"""The gRPC listener's bounds against hostile callers, on a running node.

One ``manage.py serve`` subprocess (so its RSS is its own) with its gRPC listener on, small
caps (request, response, streams per connection, stall timeout) so each bound is reached in
well under a second; callers are stock grpcio channels in the test process. The agent is a raw
0.3 JSON-RPC agent whose answer the request's text picks: an echo, an oversized reply, a
stream held open until the caller leaves, or a flood of large events as fast as the node reads
them; a second agent serves its own gRPC interface (the node passes calls through) with the
same streams. Each test checks what the caller got, what reached the agent, and that the node serves
the next call.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass, field

import grpc
import httpx
import orjson
import pytest
from a2a.types import AgentInterface, a2a_pb2
from a2a.types import a2a_pb2_grpc as grpc10

from gateway.grpc_binding.server import MAX_METADATA_BYTES
from tests.a2a_agents import build_card, card_json
from tests.gateway.test_backpressure import (
    NOT_READ_ON_BYTES,
    STALLED_STREAM_MIB,
    Node,
    register_on,
    running_node,
)
from tests.gateway.test_grpc_binding import status_of
from tests.servers import answer_lifespan, free_port, read_body, serve_agent, watch_disconnect

pytestmark = pytest.mark.one_pass("embedded")

REQUEST_CAP = 64 * 1024
RESPONSE_CAP = 1024 * 1024
MAX_STREAMS = 2
STALL_SECONDS = 4.0
EVENT_PAD = 64 * 1024
SSE_BUFFER_BYTES = 1024 * 1024  # the node's A2A_SSE_BUFFER_BYTES (its default)
#: The agent stops a flood after this much (a node reading through it is unbounded).
FLOOD_LIMIT = 256 * 1024 * 1024


@dataclass
class HostileAgent:
    """A 0.3 JSON-RPC agent. ``message/send``: "big" answers more than ``RESPONSE_CAP``,
    anything else an echo. ``message/stream``: "hold" sends one event and waits for the caller
    to leave; "flood" sends 64 KiB events as fast as the node reads them."""

    texts: list[str] = field(default_factory=list)
    sent: dict[int, int] = field(default_factory=dict)
    open: int = 0
    url: str = ""

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            await answer_lifespan(receive, send)
            return
        payload = orjson.loads(await read_body(receive))
        text = payload["params"]["message"]["parts"][0]["text"]
        self.texts.append(text)
        rid = payload.get("id")
        if payload["method"] != "message/stream":
            reply = "x" * (RESPONSE_CAP + 1024) if text == "big" else f"echo: {text}"
            body = orjson.dumps({"jsonrpc": "2.0", "id": rid, "result": message(reply)})
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"application/json")]})
            await send({"type": "http.response.body", "body": body})
            return
        number = len(self.sent)
        self.sent[number] = 0
        self.open += 1
        closed, watcher = watch_disconnect(receive)
        try:
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"text/event-stream")]})
            first = {"kind": "task", "id": f"t{number}", "contextId": "c",
                     "status": {"state": "working"}}
            await send({"type": "http.response.body", "more_body": True,
                        "body": b"data: " + orjson.dumps(
                            {"jsonrpc": "2.0", "id": rid, "result": first}) + b"\n\n"})
            if text == "hold":
                await closed.wait()
                return
            if text == "big":  # one event above the response cap
                await send({"type": "http.response.body", "body": b"data: " + orjson.dumps(
                    {"jsonrpc": "2.0", "id": rid, "result": message(
                        "x" * (RESPONSE_CAP + 1024))}) + b"\n\n"})
                return
            event = b"data: " + orjson.dumps({"jsonrpc": "2.0", "id": rid, "result": {
                "kind": "artifact-update", "taskId": f"t{number}", "contextId": "c",
                "artifact": {"artifactId": "a", "parts": [{"kind": "text",
                                                           "text": "x" * EVENT_PAD}]}}}) + b"\n\n"
            while not closed.is_set() and self.sent[number] < FLOOD_LIMIT:
                await send({"type": "http.response.body", "body": event, "more_body": True})
                self.sent[number] += len(event)
                await asyncio.sleep(0)
            await send({"type": "http.response.body", "body": b""})
        finally:
            watcher.cancel()
            self.open -= 1

    def wait_closed(self, seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        while self.open and time.monotonic() < deadline:
            time.sleep(0.05)
        return self.open == 0


def message(text: str) -> dict:
    return {"kind": "message", "role": "agent", "messageId": "m",
            "parts": [{"kind": "text", "text": text}]}


class OwnGrpcAgent:
    """An agent serving its own gRPC interface (1.0), so the node passes calls through:
    ``SendStreamingMessage`` sends a task, then ("hold") holds the stream until its caller
    leaves or ("flood") sends 64 KiB events as fast as the node takes them."""

    def __init__(self) -> None:
        self.open = 0
        self.calls = 0
        self.sent: dict[int, int] = {}
        self._lock = threading.Lock()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        port = self.server.add_insecure_port("127.0.0.1:0")
        self.address = f"127.0.0.1:{port}"
        self.server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
            "lf.a2a.v1.A2AService", {
                "SendStreamingMessage": grpc.unary_stream_rpc_method_handler(
                    self.stream, request_deserializer=a2a_pb2.SendMessageRequest.FromString,
                    response_serializer=a2a_pb2.StreamResponse.SerializeToString),
                "SendMessage": grpc.unary_unary_rpc_method_handler(
                    self.send, request_deserializer=a2a_pb2.SendMessageRequest.FromString,
                    response_serializer=a2a_pb2.SendMessageResponse.SerializeToString)})])
        card = build_card(f"http://{self.address}/rpc", name="own-grpc", card_shape="1.0",
                          interfaces=[AgentInterface(url=self.address, protocol_binding="GRPC",
                                                     protocol_version="1.0")])
        self.card_document = card_json(card, "1.0")

    def __enter__(self) -> OwnGrpcAgent:
        self.server.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.server.stop(None)

    @staticmethod
    def reply_to(text: str) -> a2a_pb2.Message:
        """An echo, or for "big" a message above the response cap."""
        reply = a2a_pb2.Message(message_id="r", role=a2a_pb2.ROLE_AGENT)
        reply.parts.add().text = "x" * (RESPONSE_CAP + 1024) if text == "big" else f"echo: {text}"
        return reply

    def send(self, request: a2a_pb2.SendMessageRequest,
             context: grpc.ServicerContext) -> a2a_pb2.SendMessageResponse:
        return a2a_pb2.SendMessageResponse(message=self.reply_to(request.message.parts[0].text))

    def stream(self, request: a2a_pb2.SendMessageRequest,
               context: grpc.ServicerContext) -> Iterator[a2a_pb2.StreamResponse]:
        with self._lock:
            self.calls += 1
            self.open += 1
            number = len(self.sent)
            self.sent[number] = 0
        try:
            reply = a2a_pb2.StreamResponse()
            reply.task.id, reply.task.context_id = f"g{self.calls}", "c"
            reply.task.status.state = a2a_pb2.TASK_STATE_WORKING
            yield reply
            if request.message.parts[0].text == "big":
                yield a2a_pb2.StreamResponse(message=self.reply_to("big"))
                return
            if request.message.parts[0].text == "flood":
                event = a2a_pb2.StreamResponse()
                event.artifact_update.task_id = reply.task.id
                event.artifact_update.artifact.parts.add().text = "x" * EVENT_PAD
                size = event.ByteSize()
                while context.is_active() and self.sent[number] < FLOOD_LIMIT:
                    yield event
                    self.sent[number] += size
                return
            deadline = time.monotonic() + 30
            while context.is_active() and time.monotonic() < deadline:
                time.sleep(0.02)
        finally:
            with self._lock:
                self.open -= 1

    def wait_closed(self, seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        while self.open and time.monotonic() < deadline:
            time.sleep(0.05)
        return self.open == 0


@dataclass
class Listener:
    node: Node
    agent: HostileAgent
    address: str
    agent_id: str = "hostile"

    @property
    def token(self) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {self.node.token}"),)

    def request(self, text: str) -> a2a_pb2.SendMessageRequest:
        request = a2a_pb2.SendMessageRequest(tenant=self.agent_id)
        request.message.message_id = "m1"
        request.message.role = a2a_pb2.ROLE_USER
        request.message.parts.add().text = text
        return request

    def channel(self, *options: tuple[str, int]) -> grpc.Channel:
        """A channel of its own connection (grpcio shares one between channels of the same
        target and options, unless each has its own subchannel pool)."""
        return grpc.insecure_channel(self.address, options=[
            ("grpc.use_local_subchannel_pool", 1), *options])

    def echo(self, channel: grpc.Channel | None = None) -> None:
        """A call that goes through (on ``channel``, else a new one), and the node's health."""
        own = channel is None
        channel = channel or self.channel()
        try:
            reply = grpc10.A2AServiceStub(channel).SendMessage(
                self.request("ping"), metadata=self.token, timeout=10)
            assert reply.message.parts[0].text == "echo: ping"
        finally:
            if own:
                channel.close()
        assert httpx.get(f"{self.node.url}/healthz", timeout=5).status_code == 200


@pytest.fixture(scope="module")
def own_grpc_agent():
    with OwnGrpcAgent() as agent:
        yield agent


@pytest.fixture(scope="module")
def listener(own_grpc_agent):
    with serve_agent(HostileAgent()) as agent:
        port = free_port()
        with running_node("uvicorn", A2A_GRPC_PORT=str(port),
                          A2A_MAX_REQUEST_BYTES=str(REQUEST_CAP),
                          A2A_MAX_RESPONSE_BYTES=str(RESPONSE_CAP),
                          A2A_GRPC_MAX_CONCURRENT_STREAMS=str(MAX_STREAMS),
                          A2A_SSE_STALL_TIMEOUT_SECONDS=str(STALL_SECONDS),
                          A2A_SSE_BUFFER_BYTES=str(SSE_BUFFER_BYTES)) as node:
            register_on(node, "hostile", agent.url)
            response = httpx.post(f"{node.url}/api/v1/agents", headers={
                "Authorization": f"Bearer {node.token}"}, json={
                "agent_id": "capped", "url": agent.url, "max_concurrency": 1,
                "card": {"name": "capped", "url": agent.url}})
            assert response.status_code == 201, response.text
            for agent_id, cap in (("own-grpc", 1), ("own-grpc-free", 100)):
                response = httpx.post(f"{node.url}/api/v1/agents", headers={
                    "Authorization": f"Bearer {node.token}"}, json={
                    "agent_id": agent_id, "url": f"http://{own_grpc_agent.address}/rpc",
                    "max_concurrency": cap, "card": own_grpc_agent.card_document})
                assert response.status_code == 201, response.text
            yield Listener(node, agent, f"127.0.0.1:{port}")


@pytest.fixture
def hostile(listener, own_grpc_agent):
    assert listener.agent.wait_closed(10) and own_grpc_agent.wait_closed(10)
    listener.agent.texts.clear()
    listener.agent.sent.clear()
    own_grpc_agent.sent.clear()
    return listener


def test_a_request_above_the_cap_is_refused_unread(hostile):
    with hostile.channel() as channel:
        stub = grpc10.A2AServiceStub(channel)
        # Under the cap (the node's own, not gRPC's default of 4 MiB): it goes through.
        reply = stub.SendMessage(hostile.request("y" * (REQUEST_CAP // 2)), metadata=hostile.token,
                                 timeout=10)
        assert reply.message.parts[0].text.startswith("echo: yyy")
        with pytest.raises(grpc.RpcError) as refused:
            stub.SendMessage(hostile.request("x" * (REQUEST_CAP + 1)), metadata=hostile.token,
                             timeout=10)
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert hostile.agent.texts == ["y" * (REQUEST_CAP // 2)]
        hostile.echo(channel)  # the same connection serves the next call


@pytest.mark.parametrize("agent_id", ["hostile", "own-grpc-free"])
@pytest.mark.parametrize("streaming", [False, True], ids=["send", "stream"])
def test_a_reply_above_the_cap_is_a_status_with_the_executed_flag(hostile, agent_id, streaming):
    """A reply (a stream's event) above ``A2A_MAX_RESPONSE_BYTES``, translated or passed
    through: ``response_too_large``, after what the stream relayed before it."""
    request = hostile.request("big")
    request.tenant = agent_id
    with hostile.channel() as channel:
        stub = grpc10.A2AServiceStub(channel)
        with pytest.raises(grpc.RpcError) as refused:
            if streaming:
                call = stub.SendStreamingMessage(request, metadata=hostile.token, timeout=10)
                assert next(call).HasField("task")
                next(call)
            else:
                stub.SendMessage(request, metadata=hostile.token, timeout=10)
        code, executed, info = status_of(refused.value)
        assert (code, executed, info["kind"]) == \
            (grpc.StatusCode.RESOURCE_EXHAUSTED, "true", "response_too_large")
        hostile.echo(channel)


def test_metadata_under_the_limit_always_goes_through(hostile):
    """Between grpcio's default soft (8 KiB) and hard (16 KiB) limits a call would be refused
    at random: the listener's one limit takes every call below it."""
    metadata = (*hostile.token, ("x-large", "m" * (MAX_METADATA_BYTES - 3072)))
    with hostile.channel() as channel:
        stub = grpc10.A2AServiceStub(channel)
        for _ in range(20):
            reply = stub.SendMessage(hostile.request("hello"), metadata=metadata, timeout=10)
            assert reply.message.parts[0].text == "echo: hello"
        with pytest.raises(grpc.RpcError) as refused:
            stub.SendMessage(hostile.request("hello"), timeout=10, metadata=(
                *hostile.token, ("x-large", "m" * MAX_METADATA_BYTES)))
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, refused.value
    assert hostile.agent.texts == ["hello"] * 20


@pytest.mark.parametrize("shape", ["one huge entry", "many entries"])
def test_huge_metadata_is_refused_and_the_node_serves_on(hostile, shape):
    if shape == "one huge entry":
        metadata = (*hostile.token, ("x-huge", "h" * (1 << 20)))
    else:
        metadata = (*hostile.token, *((f"x-h{i}", "h" * 1000) for i in range(1000)))
    with hostile.channel() as channel:
        stub = grpc10.A2AServiceStub(channel)
        with pytest.raises(grpc.RpcError) as refused:
            stub.SendMessage(hostile.request("hello"), metadata=metadata, timeout=10)
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, refused.value
        hostile.echo(channel)
    assert hostile.agent.texts == ["ping"]
    hostile.echo()


def test_calls_above_the_stream_limit_wait_for_a_free_stream(hostile):
    with hostile.channel() as channel, hostile.channel() as other:
        stub = grpc10.A2AServiceStub(channel)
        held = [stub.SendStreamingMessage(hostile.request("hold"), metadata=hostile.token,
                                          timeout=30) for _ in range(MAX_STREAMS)]
        for call in held:
            assert next(call).HasField("task")
        assert hostile.agent.open == MAX_STREAMS
        waiting = stub.SendMessage.future(hostile.request("waiting"), metadata=hostile.token,
                                          timeout=30)
        # The limit is per connection: another one is served meanwhile.
        hostile.echo(other)
        time.sleep(0.5)
        assert not waiting.done() and "waiting" not in hostile.agent.texts
        held[0].cancel()
        assert waiting.result(timeout=10).message.parts[0].text == "echo: waiting"
        held[1].cancel()
    assert hostile.agent.wait_closed(10)


@pytest.mark.parametrize("path", ["translated", "passed through"])
def test_a_caller_that_never_reads_a_stream_is_bounded_and_ended(hostile, own_grpc_agent, path):
    """Callers that never read a flood of large events: the agent is no longer read once the
    buffers on the way are full, the node grows by about its relay's buffers, and the calls
    end ``stream_stalled`` after the stall timeout with the agent's streams cancelled."""
    node = hostile.node
    agent: HostileAgent | OwnGrpcAgent = hostile.agent
    hostile.echo()
    if path == "passed through":
        hostile.agent_id, agent = "own-grpc-free", own_grpc_agent
        with hostile.channel() as channel:  # the path's first use (its channel) before
            call = grpc10.A2AServiceStub(channel).SendStreamingMessage(
                hostile.request("hold"), metadata=hostile.token, timeout=10)
            assert next(call).HasField("task")
            call.cancel()
        assert agent.wait_closed(5)
        agent.sent.clear()
    baseline = node.rss_mib()
    # No BDP probing: the caller's receive window stays gRPC's initial one, what it may take
    # in unread is its own small buffer.
    with hostile.channel(("grpc.http2.bdp_probe", 0)) as channel:
        stub = grpc10.A2AServiceStub(channel)
        calls = [stub.SendStreamingMessage(hostile.request("flood"), metadata=hostile.token,
                                           timeout=60) for _ in range(MAX_STREAMS)]
        # Held until the flood stops moving (the agent is no longer read), within the stall
        # timeout.
        peak, last, still = baseline, -1, 0
        started = time.monotonic()
        while still < 5 and time.monotonic() < started + STALL_SECONDS - 0.3:
            time.sleep(0.1)
            peak = max(peak, node.rss_mib())
            total = sum(agent.sent.values())
            still = still + 1 if total == last else 0
            last = total
        sent = dict(agent.sent)
        assert still == 5, f"the agent is still read: {sent}"
        assert len(sent) == MAX_STREAMS and agent.open == MAX_STREAMS, sent
        # The agent is no longer read: the socket buffers and a bounded relay, not the flood;
        # the node holds about the relay's buffer per stream.
        assert max(sent.values()) < NOT_READ_ON_BYTES, sent
        if path == "passed through":
            # gRPC's flow control all the way: the node's receive window from the agent and its
            # relay's buffer, A2A_SSE_BUFFER_BYTES each, plus an event in the caller's own
            # window and one in the agent's write (with BDP growth the window alone was ~5 MiB).
            assert max(sent.values()) <= 2 * SSE_BUFFER_BYTES + 2 * (EVENT_PAD + 1024), sent
        assert peak - baseline < MAX_STREAMS * STALLED_STREAM_MIB, (baseline, peak)
        # Stalled past the deadline: the agent's streams are freed, the calls end.
        assert agent.wait_closed(STALL_SECONDS + 8), "the stalled streams were not freed"
        for call in calls:
            with pytest.raises(grpc.RpcError) as ended:
                for _ in call:
                    pass
            code, executed, info = status_of(ended.value)
            assert (code, executed, info["kind"]) == \
                (grpc.StatusCode.DEADLINE_EXCEEDED, "true", "stream_stalled")
        hostile.agent_id = "hostile"
        hostile.echo(channel)


def test_a_caller_that_abandons_a_stream_frees_the_agent(hostile):
    """The agent's stream is cancelled (it sees its caller leave) and its concurrency slot
    (one, for this agent) is free for the next call, a held stream and a flooding one alike."""
    hostile.agent_id = "capped"
    try:
        with hostile.channel() as channel:
            stub = grpc10.A2AServiceStub(channel)
            for text in ("hold", "flood", "hold"):
                call = stub.SendStreamingMessage(hostile.request(text), metadata=hostile.token,
                                                 timeout=30)
                assert next(call).HasField("task")
                assert hostile.agent.open == 1
                with pytest.raises(grpc.RpcError) as busy:  # the agent's one slot is taken
                    stub.SendMessage(hostile.request("busy"), metadata=hostile.token, timeout=10)
                assert status_of(busy.value)[2]["kind"] == "busy"
                call.cancel()
                assert hostile.agent.wait_closed(5), f"{text}: the agent's stream went on"
            hostile.echo(channel)
    finally:
        hostile.agent_id = "hostile"


def test_a_caller_that_abandons_a_passed_through_stream_frees_the_agent(hostile, own_grpc_agent):
    """The same through pass-through: the agent's own gRPC stream is cancelled and the slot
    (counted by the node for passed-through calls) freed."""
    hostile.agent_id = "own-grpc"
    before = own_grpc_agent.calls
    try:
        with hostile.channel() as channel:
            stub = grpc10.A2AServiceStub(channel)
            for number in range(3):
                call = stub.SendStreamingMessage(hostile.request("hold"), metadata=hostile.token,
                                                 timeout=30)
                assert next(call).task.id == f"g{own_grpc_agent.calls}"
                assert own_grpc_agent.open == 1
                with pytest.raises(grpc.RpcError) as busy:
                    next(stub.SendStreamingMessage(hostile.request("busy"),
                                                   metadata=hostile.token, timeout=10))
                assert status_of(busy.value)[2]["kind"] == "busy"
                call.cancel()
                assert own_grpc_agent.wait_closed(5), f"call {number}: the agent's stream went on"
            assert own_grpc_agent.calls == before + 3  # the refused ones never reached it
    finally:
        hostile.agent_id = "hostile"


def test_connections_beyond_the_limit_are_closed_at_once():
    """``A2A_HTTP_MAX_CONNECTIONS`` bounds the gRPC listener's connections too (its own
    count): with 4 held open (a preface each, nothing more), a fifth is closed at once and a
    call on it fails ``UNAVAILABLE``; once one of the 4 leaves, a call gets through to the
    gateway (refused ``UNAUTHENTICATED``: it has no token)."""
    import socket

    def held(port: int) -> socket.socket:
        sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        sock.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        assert sock.recv(9)  # the node's SETTINGS: the connection is open
        return sock

    def call(port: int) -> grpc.StatusCode:
        with grpc.insecure_channel(f"127.0.0.1:{port}", options=[
                ("grpc.use_local_subchannel_pool", 1)]) as channel:
            with pytest.raises(grpc.RpcError) as refused:
                grpc10.A2AServiceStub(channel).SendMessage(
                    a2a_pb2.SendMessageRequest(tenant="anyone"), timeout=5)
            return refused.value.code()

    port = free_port()
    with running_node("uvicorn", A2A_GRPC_PORT=str(port), A2A_HTTP_MAX_CONNECTIONS="4"):
        socks = [held(port) for _ in range(4)]
        try:
            extra = socket.create_connection(("127.0.0.1", port), timeout=5)
            assert extra.recv(9) == b""  # closed without a byte
            extra.close()
            assert call(port) == grpc.StatusCode.UNAVAILABLE
            socks.pop().close()
            deadline = time.monotonic() + 5
            while (code := call(port)) == grpc.StatusCode.UNAVAILABLE \
                    and time.monotonic() < deadline:
                time.sleep(0.1)  # the node sees the close
            assert code == grpc.StatusCode.UNAUTHENTICATED
        finally:
            for sock in socks:
                sock.close()
