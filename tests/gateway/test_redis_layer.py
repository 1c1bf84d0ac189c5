"""The broker semantics the gateway relies on (docs/adr/0003), proved on a real Redis for both
Redis layers it supports: ``direct`` (gateway.redis_layer, the default) and ``pubsub``
(channels-redis). Single owner, no delivery without a listener, checked sends, order, groups,
bounded mailboxes, recovery after a Redis restart."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from channels_redis.pubsub import RedisPubSubChannelLayer

from gateway.redis_layer import RedisDirectChannelLayer
from tests import faults
from tests.servers import free_port

LAYERS = {"direct": RedisDirectChannelLayer, "pubsub": RedisPubSubChannelLayer}


def make(kind: str, url: str, **config):
    return LAYERS[kind](hosts=[{"address": url, "socket_connect_timeout": 5,
                                "socket_timeout": 5}], **config)


def name(tag: str) -> str:
    return f"_AGENTS_.test-{tag}-{uuid.uuid4().hex[:10]}"


@pytest.fixture(params=sorted(LAYERS))
def kind(request) -> str:
    return request.param


@pytest.fixture
async def pair(kind, redis_url):
    """Two layers on one Redis, as two nodes (separate connections)."""
    a, b = make(kind, redis_url), make(kind, redis_url)
    yield a, b
    await a.flush()
    await b.flush()


async def _listening(layer, channel: str) -> asyncio.Task:
    """Start a receive loop's receive() and let it subscribe."""
    task = asyncio.get_running_loop().create_task(layer.receive(channel))
    for _ in range(100):
        await asyncio.sleep(0.01)
        if not isinstance(layer, RedisDirectChannelLayer):
            break
        if channel in layer._layer().channels and layer._layer()._sub_ready.is_set():
            break
    await asyncio.sleep(0.05)
    return task


async def test_no_delivery_without_a_listener(pair, kind):
    """A message to a channel nobody receives on is dropped, not queued for a later listener;
    the direct layer's send() says so (0 listeners), which the gateway answers at once."""
    a, b = pair
    channel = name("nobody")
    sent = await a.send(channel, {"type": "lost"})
    if kind == "direct":
        assert sent == 0
    task = await _listening(b, channel)
    sent = await a.send(channel, {"type": "kept"})
    if kind == "direct":
        assert sent == 1
    async with asyncio.timeout(5):
        assert (await task)["type"] == "kept"  # the earlier message was never delivered


async def test_single_owner_teardown_unsubscribes(pair, kind, redis_url):
    """A receive loop cancelled (a subscriber's teardown) stops listening, so a new owner on
    another node is the only one: a send reaches exactly one process."""
    import redis.asyncio as aioredis

    a, b = pair
    channel = name("owner")
    old = await _listening(a, channel)
    old.cancel()
    with pytest.raises(asyncio.CancelledError):
        await old
    new = await _listening(b, channel)
    probe = aioredis.Redis.from_url(redis_url)
    try:
        for _ in range(50):
            (_, listeners), = await probe.pubsub_numsub(getattr(b, "wire_name", str)(channel))
            if listeners == 1:
                break
            await asyncio.sleep(0.02)
        assert listeners == 1
    finally:
        await probe.aclose()
    sent = await a.send(channel, {"type": "q", "body": b"\x00\xff"})
    if kind == "direct":
        assert sent == 1
    async with asyncio.timeout(5):
        message = await new
    assert message == {"type": "q", "body": b"\x00\xff"}  # bytes stay bytes


async def test_direct_send_counts_every_listener(redis_url):
    """Two processes subscribed to one agent channel (two owners, a misconfiguration) show in
    the count the gateway checks and logs."""
    a, b, c = (make("direct", redis_url) for _ in range(3))
    channel = name("two-owners")
    try:
        first, second = await _listening(b, channel), await _listening(c, channel)
        assert await a.send(channel, {"type": "dup"}) == 2
        async with asyncio.timeout(5):
            assert (await first)["type"] == (await second)["type"] == "dup"
    finally:
        for layer in (a, b, c):
            await layer.flush()


async def test_concurrent_sends_keep_order(pair, kind):
    """Sends in flight together (pipelined in one write on the direct layer) arrive in the
    order they were made, each delivered once."""
    a, b = pair
    channel = await b.new_channel("reply.")
    results = await asyncio.gather(*[a.send(channel, {"type": "m", "n": n}) for n in range(300)])
    if kind == "direct":
        assert results == [1] * 300
    async with asyncio.timeout(10):
        received = [(await b.receive(channel))["n"] for _ in range(300)]
    assert received == list(range(300))


async def test_groups(pair, kind):
    a, b = pair
    group = f"test-{uuid.uuid4().hex[:8]}"
    one, two = await b.new_channel("x."), await b.new_channel("x.")
    await b.group_add(group, one)
    await b.group_add(group, two)
    await a.group_send(group, {"type": "announce"})
    async with asyncio.timeout(5):
        assert (await b.receive(one))["type"] == "announce"
        assert (await b.receive(two))["type"] == "announce"
    await b.group_discard(group, one)
    await b.group_discard(group, two)
    if kind == "direct":
        for _ in range(50):  # the unsubscribe is written, not awaited
            if await a.group_send(group, {"type": "late"}) == 0:
                break
            await asyncio.sleep(0.02)
        assert await a.group_send(group, {"type": "late"}) == 0


async def test_send_with_redis_down_fails_fast(kind):
    """Checked sends: with no Redis, send() raises (the gateway answers `unreachable` at once)
    instead of queueing or hanging."""
    import redis.exceptions

    layer = make(kind, f"redis://127.0.0.1:{free_port()}/0")
    with pytest.raises((ConnectionError, OSError, redis.exceptions.ConnectionError)):
        async with asyncio.timeout(10):  # a hang guard, not a speed assertion
            await layer.send(name("down"), {"type": "x"})


async def test_direct_mailbox_is_bounded(redis_url):
    """A channel nobody reads keeps at most ``capacity`` messages; later ones are dropped."""
    a, b = make("direct", redis_url), make("direct", redis_url, capacity=3)
    try:
        channel = await b.new_channel("slow.")
        for n in range(10):
            assert await a.send(channel, {"n": n}) == 1
        await a.send(channel, {"n": "sync"})
        # PUBLISH answers once Redis has written to b's socket, not once b has read it: wait
        # until b has taken all eleven (3 kept, 8 dropped) before making room by reading.
        mailbox = b._layer().channels[channel]
        async with asyncio.timeout(5):
            while mailbox.dropped < 8:
                await asyncio.sleep(0.005)
        assert mailbox.dropped == 8
        async with asyncio.timeout(5):
            assert [(await b.receive(channel))["n"] for _ in range(3)] == [0, 1, 2]
        await a.send(channel, {"n": "after"})
        async with asyncio.timeout(5):
            assert (await b.receive(channel))["n"] == "after"
    finally:
        await a.flush()
        await b.flush()


@pytest.fixture
def private_redis():
    try:
        redis = faults.PrivateRedis().start()
    except (faults.FaultSetupError, OSError) as exc:
        if faults.IN_CI:
            pytest.fail(f"a private Redis could not start: {exc} (CI=true: this must work)")
        pytest.skip(f"a private Redis could not start: {exc}")
    yield redis
    redis.cleanup()


async def test_direct_layer_recovers_after_a_redis_restart(private_redis):
    """Redis killed -9 and restarted: sends fail while it is down, then the subscriber
    reconnects by itself and resubscribes its channels (messages sent meanwhile are lost)."""
    url = private_redis.url()
    a, b = make("direct", url), make("direct", url)
    try:
        channel = await b.new_channel("inbox.")
        assert await a.send(channel, {"n": 1}) == 1
        async with asyncio.timeout(5):
            assert (await b.receive(channel))["n"] == 1
        receiving = asyncio.get_running_loop().create_task(b.receive(channel))
        private_redis.kill()
        with pytest.raises(ConnectionError):
            async with asyncio.timeout(10):
                for _ in range(50):
                    await a.send(channel, {"n": "down"})
                    await asyncio.sleep(0.05)
        private_redis.start()
        async with asyncio.timeout(20):
            while await _send_or_zero(a, channel, {"n": 2}) == 0:
                await asyncio.sleep(0.1)
            assert (await receiving)["n"] == 2
    finally:
        await a.flush()
        await b.flush()


async def _send_or_zero(layer, channel, message) -> int:
    try:
        return await layer.send(channel, message)
    except ConnectionError:
        return 0


async def test_direct_layers_on_two_databases_never_hear_each_other(redis_url):
    """Redis pub/sub ignores the database number; the direct layer namespaces its names by it,
    so two deployments sharing one Redis server on different databases (staging and
    production) never receive each other's Queries for an agent id they both serve."""
    base, _, db = redis_url.rpartition("/")
    other_db = (int(db) + 1) % 16 if db.isdigit() else 1
    here, there = make("direct", redis_url), make("direct", f"{base}/{other_db}")
    channel = name("shared-id")
    try:
        listener = await _listening(there, channel)
        assert await here.send(channel, {"type": "staging"}) == 0  # nobody here listens
        done, _ = await asyncio.wait({listener}, timeout=0.3)
        assert not done  # the other database's listener heard nothing
        assert await there.send(channel, {"type": "own"}) == 1
        async with asyncio.timeout(5):
            assert (await listener)["type"] == "own"
    finally:
        await here.flush()
        await there.flush()
