"""What crosses the broker per call: numbered reply messages, large bodies in pieces of at most
``PIECE_BYTES``, joined back in order by the entry node, and a lost message ending the call
(``stream_gap``) instead of being relayed around.

The owner's real :class:`~gateway.broker_sink.BrokerSink` publishes through the real Redis layer
(gateway.redis_layer); the entry node's real :class:`~gateway.inbox.Reassembly` takes what a
receiver gets on the reply channel into a real :class:`~gateway.sse.StreamBuffer`."""

from __future__ import annotations

import asyncio
import os

import pytest

from gateway import envelope as env
from gateway import grants
from gateway.broker_sink import BrokerSink
from gateway.conf import NodeSettings
from gateway.inbox import STREAM_GAP, Inbox, Reassembly
from gateway.redis_layer import RedisDirectChannelLayer
from gateway.sse import StreamBuffer
from registry.ids import agent_channel

pytestmark = pytest.mark.timeout(60)


class Wire:
    """The real layer, recording every reply message published (and dropping the ones asked;
    the owner's ``a2a.ended`` notices pass)."""

    def __init__(self, layer: RedisDirectChannelLayer, drop: set[int] = frozenset()) -> None:
        self.layer = layer
        self.drop = drop
        self.sent: list[dict] = []

    async def send(self, channel: str, message: dict) -> int:
        if message["type"] != env.REPLY:
            return await self.layer.send(channel, message)
        self.sent.append(message)
        if len(self.sent) in self.drop:
            return 1  # lost on the way (a publish that never reached Redis)
        return await self.layer.send(channel, message)


async def _relay(redis_url: str, messages: list[dict], *, drop: set[int] = frozenset(),
                 window: int = 0, read_credit: bool = True):
    """Publish ``messages`` through a BrokerSink; return (what was published, what the entry
    node's buffer got)."""
    layer = RedisDirectChannelLayer(hosts=[{"address": redis_url}], prefix=os.urandom(4).hex())
    try:
        channel = await layer.new_channel("reply.")
        wire = Wire(layer, drop)
        tasks: set[asyncio.Task] = set()
        sink = BrokerSink(wire, channel, "r1", tasks)
        sink.piece = env.PIECE_BYTES
        sink.window = window
        sink.credit_timeout = 10
        buffer = StreamBuffer(64 * 1024 * 1024)
        reassembly = Reassembly(buffer.put_nowait, buffer.push, 64 * 1024 * 1024)
        received = [0]

        def on_piece(size: int) -> None:
            received[0] += size
            if read_credit:
                sink.credit(0, received[0])

        reassembly.on_piece = on_piece
        got: list[dict] = []

        async def receive() -> None:
            while True:
                reassembly(await layer.receive(channel))

        receiver = asyncio.get_running_loop().create_task(receive())

        async def publish() -> None:
            for message in messages:
                await sink(message)

        publisher = asyncio.get_running_loop().create_task(publish())
        try:
            async with asyncio.timeout(20):
                while True:
                    message = await buffer.get()
                    got.append(message)
                    if message is STREAM_GAP or not message.get("more", True):
                        break
            await asyncio.wait_for(publisher, 5)
        finally:
            publisher.cancel()
            receiver.cancel()
            await asyncio.gather(publisher, receiver, return_exceptions=True)
        return wire.sent, got, sink
    finally:
        await layer.flush()


def _stream(sizes: list[int]) -> list[dict]:
    start = env.start("r1", 200, [], b"", more=True, sse=True)
    chunks = [env.chunk("r1", bytes([65 + i % 26]) * size, more=True)
              for i, size in enumerate(sizes)]
    return [start, *chunks, env.chunk("r1", b"", more=False)]


def test_large_bodies_cross_in_pieces_and_are_joined_in_order(redis_url):
    sizes = [10, 3 * 1024 * 1024 + 17, 5, env.PIECE_BYTES, env.PIECE_BYTES + 1, 700_000]
    originals = _stream(sizes)
    bodies = [m["body"] for m in originals]
    sent, got, _ = asyncio.run(_relay(redis_url, originals))
    assert all(len(m.get("body") or b"") <= env.PIECE_BYTES for m in sent)
    assert [m["n"] for m in sent] == list(range(1, len(sent) + 1))
    assert len(sent) > 60  # the 3 MiB body alone is 49 pieces
    assert [m["body"] for m in got] == bodies
    assert [m["k"] for m in got] == [env.START] + [env.CHUNK] * (len(sizes) + 1)
    assert all("pc" not in m for m in got)


def test_a_lost_message_ends_the_call_with_a_gap(redis_url):
    originals = _stream([100, 200, 300, 400])
    sent, got, _ = asyncio.run(_relay(redis_url, originals, drop={3}))
    assert got[-1] is STREAM_GAP
    assert [m["body"] for m in got[:-1]] == [b"", originals[1]["body"]]  # nothing after it


def test_a_lost_piece_ends_the_call_with_a_gap(redis_url):
    originals = _stream([10, 400_000, 20])
    sent, got, _ = asyncio.run(_relay(redis_url, originals, drop={5}))
    assert sent[2].get("pc") == 6  # the pieced message: its head and 6 pieces
    assert got[-1] is STREAM_GAP
    assert all(len(m["body"]) < 400_000 for m in got[:-1])  # never relayed incomplete


def test_a_repeated_message_is_relayed_once():
    buffer = StreamBuffer(1024)
    reassembly = Reassembly(buffer.put_nowait, buffer.push, 1024)
    for number in (1, 2, 2, 1, 3):
        reassembly({**env.chunk("r", b"%d" % number, more=number < 3), "n": number})
    assert [m["body"] for m in buffer._items] == [b"1", b"2", b"3"]


def test_an_ack_between_a_message_and_its_pieces_is_no_gap():
    """The owner's ack timer fired as its answer started: the ack's publish follows the
    message's first part, before its pieces."""
    buffer = StreamBuffer(1024 * 1024)
    reassembly = Reassembly(buffer.put_nowait, buffer.push, 1024 * 1024)
    reassembly({**env.start("r", 200, [], b"a" * env.PIECE_BYTES, more=False, sse=False),
                "n": 1, "pc": 2})
    reassembly(env.ack("r"))
    reassembly({**env.piece("r", b"b" * env.PIECE_BYTES), "n": 2})
    reassembly({**env.piece("r", b"c"), "n": 3})
    assert [m["k"] for m in buffer._items] == [env.ACK, env.START]
    assert buffer._items[1]["body"] == b"a" * env.PIECE_BYTES + b"b" * env.PIECE_BYTES + b"c"


def test_an_oversize_announcement_is_refused():
    buffer = StreamBuffer(1024)
    reassembly = Reassembly(buffer.put_nowait, buffer.push, 10 * env.PIECE_BYTES)
    reassembly({**env.chunk("r", b"x" * env.PIECE_BYTES, more=True), "n": 1, "pc": 11})
    assert list(buffer._items) == [STREAM_GAP]


def test_pieces_of_one_message_cross_at_most_a_window_ahead(redis_url):
    """Until the entry node says it took them (a2a_received), the owner sends at most a
    window of one large message's pieces: Redis never queues a whole large message."""
    window = 256 * 1024

    async def run():
        layer = RedisDirectChannelLayer(hosts=[{"address": redis_url}],
                                        prefix=os.urandom(4).hex())
        try:
            channel = await layer.new_channel("reply.")
            wire = Wire(layer)
            sink = BrokerSink(wire, channel, "r1", set())
            sink.piece, sink.window, sink.credit_timeout = env.PIECE_BYTES, window, 10
            message = env.chunk("r1", b"x" * (2 * 1024 * 1024), more=True)
            task = asyncio.get_running_loop().create_task(sink(message))
            await asyncio.sleep(1.0)
            held = sink.pieces_sent
            assert not task.done()
            assert window <= held <= window + env.PIECE_BYTES
            while not task.done():  # the entry node takes them: the rest crosses
                sink.credit(0, sink.pieces_sent)
                await asyncio.sleep(0.01)
            await task
            assert sink.pieces_sent == 2 * 1024 * 1024
            assert len(wire.sent) == 32
        finally:
            await layer.flush()

    asyncio.run(run())


def test_a_lost_last_message_is_found_by_the_owners_ending_notice(redis_url):
    """The last message of a call is lost on the way: no later number shows it, but the owner
    tells the entry node's inbox where the call ended (``a2a.ended``, gateway.endings) and the
    call gets :data:`STREAM_GAP`; so does a running stream that lost a message and went quiet
    (the owner tells how far its publishes got); a call that arrived whole gets nothing more."""

    async def run():
        layer = RedisDirectChannelLayer(hosts=[{"address": redis_url}],
                                        prefix=os.urandom(4).hex())
        inbox = Inbox(layer)
        inbox.start()
        try:
            assert await inbox.wait_ready(5)
            buffers = {}
            for request_id, drop in (("lost", {3}), ("whole", set())):
                buffer = buffers[request_id] = StreamBuffer(1024 * 1024)
                inbox.pending[request_id] = Reassembly(buffer.put_nowait, buffer.push,
                                                       1024 * 1024)
                sink = BrokerSink(Wire(layer, drop), inbox.channel, request_id, set())
                sink.piece = env.PIECE_BYTES
                await sink(env.start(request_id, 200, [], b"", more=True, sse=True))
                await sink(env.chunk(request_id, b"data: 1\n\n", more=True))
                await sink(env.chunk(request_id, b"", more=False))  # the 3rd: lost for "lost"
            async with asyncio.timeout(env.ENDED_EVERY_SECONDS * 3):
                got = [await buffers["lost"].get() for _ in range(3)]
            assert got[-1] is STREAM_GAP
            assert [m["body"] for m in got[:2]] == [b"", b"data: 1\n\n"]
            await asyncio.sleep(env.ENDED_EVERY_SECONDS * 1.5)  # its notices came too
            whole = buffers["whole"]
            assert [m.get("more") for m in whole._items] == [True, True, False]
            # a stream still running: its 2nd message is lost, and nothing comes after it
            quiet = StreamBuffer(1024 * 1024)
            inbox.pending["quiet"] = Reassembly(quiet.put_nowait, quiet.push, 1024 * 1024)
            sink = BrokerSink(Wire(layer, {2}), inbox.channel, "quiet", set())
            await sink(env.start("quiet", 200, [], b"", more=True, sse=True))
            await sink(env.chunk("quiet", b"data: 1\n\n", more=True))
            async with asyncio.timeout(env.ENDED_EVERY_SECONDS * 3):
                got = [await quiet.get() for _ in range(2)]
            assert got[-1] is STREAM_GAP
            del sink
        finally:
            await inbox.stop()
            await layer.flush()

    asyncio.run(run())


def test_pieces_cross_only_as_the_entry_nodes_budget_grants_them(redis_url):
    """Four owners' large messages to one entry node at once, which takes a piece only every
    few milliseconds: what was published of their pieces and not yet taken by the entry node
    never exceeds its node-wide budget (plus one piece), and every message arrives whole."""
    budget = 4 * env.PIECE_BYTES
    size = 2 * 1024 * 1024 + 5

    async def run():
        layer = RedisDirectChannelLayer(hosts=[{"address": redis_url}],
                                        prefix=os.urandom(4).hex())
        inbox = Inbox(layer, budget=budget)
        inbox.start()
        agent_id = f"budget-{os.urandom(3).hex()}"
        owner_channel = agent_channel(agent_id)
        counts = {"sent": 0, "taken": 0, "most": 0}

        class Counting(Wire):
            async def send(self, channel: str, message: dict) -> int:
                if message.get("k") == env.PIECE:
                    counts["sent"] += len(message["body"])
                    counts["most"] = max(counts["most"], counts["sent"] - counts["taken"])
                return await super().send(channel, message)

        async def owner() -> None:  # the owner's subscriber: grants raise the allowances
            while True:
                grants.credit((await layer.receive(owner_channel))["tags"])

        class Slow:
            """The entry node taking what its subscription got slowly."""

            def __init__(self, reassembly: Reassembly) -> None:
                self.reassembly = reassembly
                self.grant = reassembly.grant
                self.queue: asyncio.Queue = asyncio.Queue()

            def __call__(self, message: dict) -> None:
                self.queue.put_nowait(message)

            async def feed(self) -> None:
                while True:
                    self.reassembly(await self.queue.get())
                    await asyncio.sleep(0.003)

        loop = asyncio.get_running_loop()
        listening = loop.create_task(owner())
        feeders = []
        try:
            assert await inbox.wait_ready(5)
            await asyncio.sleep(0.2)  # the owner's channel subscribed
            buffers, sinks = [], []
            settings = NodeSettings.from_django()
            for k in range(4):
                request_id = f"big-{k}"
                buffer = StreamBuffer(4 * size)
                reassembly = Reassembly(buffer.put_nowait, buffer.push, 4 * size)

                def taken(piece: int) -> None:
                    counts["taken"] += piece

                reassembly.on_piece = taken
                tags = {env.TAG_REQUEST_ID: request_id, env.TAG_METHOD: "message/send"}
                inbox.expect(tags, reassembly, agent_id)
                slow = inbox.pending[request_id] = Slow(reassembly)
                feeders.append(loop.create_task(slow.feed()))
                assert tags[env.TAG_GRANT] == "0"
                sink = BrokerSink(Counting(layer), inbox.channel, request_id, set())
                sink.piece = env.PIECE_BYTES
                sink.allowance = grants.allowance(tags, request_id, settings)
                buffers.append(buffer)
                sinks.append(sink)
            bodies = [bytes([65 + k]) * size for k in range(4)]
            async with asyncio.timeout(20):
                await asyncio.gather(*(sink(env.start(f"big-{k}", 200, [], bodies[k],
                                                      more=False, sse=False))
                                       for k, sink in enumerate(sinks)))
                got = [await buffer.get() for buffer in buffers]
            assert [m["body"] for m in got] == bodies
            assert counts["sent"] == 4 * (size - env.PIECE_BYTES)
            # a piece counts as taken once the entry node has it: one piece of slack
            assert counts["most"] <= budget + env.PIECE_BYTES, counts
            for request_id in list(inbox.pending):
                inbox.pending.pop(request_id)
            assert inbox.budget is not None and inbox.budget.free == budget
        finally:
            listening.cancel()
            for feeder in feeders:
                feeder.cancel()
            await inbox.stop()
            await layer.flush()

    asyncio.run(run())
