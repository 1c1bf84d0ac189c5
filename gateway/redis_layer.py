"""The gateway's own Redis channel layer (``A2A_CHANNEL_LAYER=direct``, the default with Redis).

Redis pub/sub under the Channels layer API (``send``, ``receive``, ``new_channel``, the groups
and flush extensions), with the pub/sub layer's semantics (docs/adr/0003) and less work per
message. Profiling two nodes under load showed channels-redis's pub/sub layer spending most of
a cross-node call in redis-py: every ``publish()`` takes a lock and a pooled connection and waits
for its own round trip (so at c=64 the sends of a node queue behind one another), and every
received message goes through ``PubSub.get_message()`` with a timeout. Here, per event loop:

- **one publishing connection, pipelined**: every ``send()`` made in one loop iteration is
  written in one ``write()``; replies come back in order and resolve each sender's future, so
  any number of sends are in flight with no lock and one round trip per batch, not per message;
- **one subscribing connection** whose parser hands each message straight to its channel's
  bounded mailbox (no polling, no timeout per message);
- msgpack for the envelope, as channels-redis (bytes stay bytes, no copies beyond the frame).

Semantics (tests/gateway/test_redis_layer.py proves them):

- **No delivery without a listener, and the sender learns it**: ``send()`` returns how many
  processes received the message (Redis' ``PUBLISH`` count). 0 means nobody subscribes to the
  channel: the gateway answers ``unreachable`` at once instead of waiting for an ack.
- **Checked sends**: a ``send()`` with Redis down raises ``ConnectionError`` within the connect
  timeout; a reply not back within ``socket_timeout`` fails every send in flight on that
  connection (it is closed and reopened on the next send).
- **Single owner**: a named channel is subscribed by this process at its first ``receive()`` and
  unsubscribed when that ``receive()`` is cancelled (a subscriber's teardown), so a new owner
  elsewhere is the only listener; the count returned by ``send()`` shows a second one (the
  gateway logs it).
- Per-channel order is kept (one connection per direction). A mailbox holds at most
  ``capacity`` messages (further ones are dropped with a warning, as pub/sub drops them for
  a channel nobody reads). After a lost connection the subscriber reconnects by itself and
  resubscribes every channel; messages published meanwhile are lost, as with the pub/sub layer.

Only ``redis://`` and ``rediss://`` addresses (one host) are supported; Sentinel and sharding
need channels-redis (``A2A_CHANNEL_LAYER=pubsub``).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import types
import uuid
from collections import deque
from collections.abc import Callable
from typing import Any, cast
from urllib.parse import unquote, urlsplit

import hiredis
import msgpack

logger = logging.getLogger(__name__)

_packb = msgpack.Packer(use_bin_type=True).pack
_unpackb = msgpack.unpackb
_INCOMPLETE: Any = object()


class RedisReplyError(Exception):
    """Redis answered a command with an error reply."""


def _parser() -> Any:
    """A RESP2 reply parser over the pieces a connection receives: hiredis's ``Reader``
    (error replies returned as :class:`RedisReplyError`, a malformed stream raised as
    ``ConnectionError``, ``_INCOMPLETE`` until a whole reply is in). It replaced a hand-written
    parser, 2.4 to 10 times faster per reply (``bench/resp_bench.py``, docs/performance.md)."""
    return hiredis.Reader(protocolError=ConnectionError, replyError=RedisReplyError,
                          notEnoughData=_INCOMPLETE)


def command(*parts: bytes) -> bytes:
    out = [b"*%d\r\n" % len(parts)]
    for part in parts:
        out.append(b"$%d\r\n%b\r\n" % (len(part), part))
    return b"".join(out)


class _Connection(asyncio.Protocol):
    """One Redis connection: pipelined requests answered in order (futures), and, on a
    subscribing connection, pushed messages handed to ``on_push``."""

    def __init__(self, loop: asyncio.AbstractEventLoop, timeout: float,
                 on_push: Callable[[list[Any]], None] | None = None,
                 on_lost: Callable[[_Connection], None] | None = None) -> None:
        self.loop = loop
        self.timeout = timeout
        self.on_push = on_push
        self.on_lost = on_lost
        self.parser = _parser()
        self.transport: asyncio.Transport | None = None
        self.pending: deque[asyncio.Future[Any] | None] = deque()
        self.out: list[bytes] = []
        self.closed = False
        self._flush_scheduled = False
        self._watch: asyncio.TimerHandle | None = None
        self._watched = 0
        self.replies = 0  # replies received (the stuck-connection check watches it move)

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # create_connection's: a Transport

    def data_received(self, data: bytes) -> None:
        parser = self.parser
        parser.feed(data)
        pending = self.pending
        on_push = self.on_push
        while True:
            try:
                value = parser.gets()
            except (ValueError, ConnectionError) as exc:
                self._fail(ConnectionError(f"bad Redis reply: {exc}"))
                return
            if value is _INCOMPLETE:
                return
            if on_push is not None and type(value) is list and value and value[0] == b"message":
                on_push(value)
                continue
            if not pending:
                continue  # an unsolicited reply (never sent by Redis to a client here)
            self.replies += 1
            future = pending.popleft()
            if future is None or future.done():
                continue
            if isinstance(value, RedisReplyError):
                future.set_exception(value)
            else:
                future.set_result(value)

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(ConnectionError(f"Redis connection lost: {exc or 'closed'}"))

    # requests
    def request(self, data: bytes, replies: int = 1) -> asyncio.Future[Any]:
        """Queue one command (written with the others of this loop iteration); its future
        gets the last of its ``replies`` replies."""
        if self.closed:
            raise ConnectionError("Redis connection closed")
        future = self.loop.create_future()
        pending = self.pending
        for _ in range(replies - 1):
            pending.append(None)
        pending.append(future)
        self.out.append(data)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self._flush)
        if self._watch is None:
            self._watched = self.replies
            self._watch = self.loop.call_later(self.timeout, self._check)
        return future

    def _flush(self) -> None:
        self._flush_scheduled = False
        out = self.out
        if not out or self.closed:
            return
        self.out = []
        self.transport.write(out[0] if len(out) == 1 else b"".join(out))  # type: ignore[union-attr]  # connected

    def _check(self) -> None:
        """Replies outstanding and none arrived for a whole ``timeout``: the connection is
        stuck; close it (every request in flight fails, the next one reconnects)."""
        self._watch = None
        if not self.pending:
            return
        if self.replies == self._watched:
            self._fail(ConnectionError(f"no reply from Redis for {self.timeout:g} s"))
            return
        self._watched = self.replies
        self._watch = self.loop.call_later(self.timeout, self._check)

    def close(self) -> None:
        self._fail(ConnectionError("Redis connection closed"), lost=False)

    def _fail(self, exc: BaseException, *, lost: bool = True) -> None:
        if self.closed:
            return
        self.closed = True
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None
        pending, self.pending = self.pending, deque()
        for future in pending:
            if future is not None and not future.done():
                future.set_exception(exc)
        if self.transport is not None:
            self.transport.abort()
        if lost and self.on_lost is not None:
            self.on_lost(self)


class _Mailbox:
    """A channel's received messages (serialized), bounded; one long-lived reader."""

    __slots__ = ("items", "waiters", "capacity", "dropped")

    def __init__(self, capacity: int) -> None:
        self.items: deque[bytes] = deque()
        self.waiters: deque[asyncio.Future[None]] = deque()
        self.capacity = capacity
        self.dropped = 0

    def put(self, data: bytes) -> None:
        if len(self.items) >= self.capacity:
            self.dropped += 1
            if self.dropped == 1 or self.dropped % 1000 == 0:
                logger.warning("channel mailbox full (%d): %d message(s) dropped",
                               self.capacity, self.dropped)
            return
        self.items.append(data)
        waiters = self.waiters
        while waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                break

    async def get(self) -> bytes:
        items = self.items
        while not items:
            waiter = asyncio.get_running_loop().create_future()
            self.waiters.append(waiter)
            try:
                await waiter
            except BaseException:
                if waiter in self.waiters:
                    self.waiters.remove(waiter)
                raise
        return items.popleft()


class _Address:
    def __init__(self, host: dict[str, Any]) -> None:
        url = urlsplit(host.get("address") or "redis://localhost:6379")
        if url.scheme not in ("redis", "rediss"):
            raise ValueError(f"the direct Redis layer supports redis:// and rediss:// only, "
                             f"not {url.scheme}://")
        self.host = url.hostname or "localhost"
        self.port = url.port or 6379
        self.username = unquote(url.username) if url.username else None
        self.password = unquote(url.password) if url.password else host.get("password")
        self.ssl: ssl.SSLContext | None = None
        if url.scheme == "rediss":
            self.ssl = ssl.create_default_context()
        self.connect_timeout = float(host.get("socket_connect_timeout") or 2)
        self.timeout = float(host.get("socket_timeout") or 10)
        db = (url.path or "/").strip("/") or "0"
        if not db.isdigit():
            raise ValueError(f"the Redis database in {host.get('address')!r} must be a number")
        #: Prepended to every pub/sub name on the wire. Redis pub/sub ignores the database
        #: number, so without it two deployments sharing a Redis server on different
        #: databases (staging on /1, production on /0) would hear each other's Queries.
        self.namespace = f"db{int(db)}."



class _LoopLayer:
    """The layer's connections and channels on one event loop."""

    def __init__(self, address: _Address, prefix: str, capacity: int) -> None:
        self.address = address
        self.prefix = prefix
        self.capacity = capacity
        self.namespace = address.namespace
        self.loop = asyncio.get_running_loop()
        self.channels: dict[str, _Mailbox] = {}
        self.groups: dict[str, set[str]] = {}  # group channel name -> member channels
        self._pub: _Connection | None = None
        self._pub_lock = asyncio.Lock()
        self._sub: _Connection | None = None
        self._sub_lock = asyncio.Lock()
        self._sub_ready = asyncio.Event()
        self._reconnect: asyncio.Task[None] | None = None
        self._closing = False
        #: Called with a description when the subscribing connection is lost (the node ends
        #: the calls whose replies crossed the broker: what was published meanwhile is gone).
        self.lost_listeners: list[Callable[[str], None]] = []

    # --- connections -------------------------------------------------------------------------

    async def _open(self, on_push: Callable[[list[Any]], None] | None = None,
                    on_lost: Callable[[_Connection], None] | None = None) -> _Connection:
        address = self.address
        conn = _Connection(self.loop, address.timeout, on_push, on_lost)
        try:
            async with asyncio.timeout(address.connect_timeout):
                await self.loop.create_connection(lambda: conn, address.host, address.port,
                                                  ssl=address.ssl)
                if address.password:
                    auth = (b"AUTH", address.username.encode(), address.password.encode()) \
                        if address.username else (b"AUTH", address.password.encode())
                    await conn.request(command(*auth))
        except TimeoutError:
            conn.close()
            raise ConnectionError(f"Redis at {address.host}:{address.port}: "
                                  f"no connection within {address.connect_timeout:g} s") from None
        except OSError as exc:
            conn.close()
            raise ConnectionError(f"Redis at {address.host}:{address.port}: {exc}") from exc
        return conn

    async def publisher(self) -> _Connection:
        async with self._pub_lock:
            conn = self._pub
            if conn is None or conn.closed:
                conn = self._pub = await self._open()
            return conn

    async def publish(self, channel: str, data: bytes) -> int:
        conn = self._pub
        if conn is None or conn.closed:
            conn = await self.publisher()
        name = (self.namespace + channel).encode()
        receivers: int = await conn.request(b"*3\r\n$7\r\nPUBLISH\r\n$%d\r\n%b\r\n$%d\r\n%b\r\n"
                                            % (len(name), name, len(data), data))
        return receivers

    def _on_push(self, value: list[Any]) -> None:
        if len(value) < 3:
            return
        name = value[1].decode()
        if not name.startswith(self.namespace):
            return
        name = name[len(self.namespace):]
        mailbox = self.channels.get(name)
        if mailbox is not None:
            mailbox.put(value[2])
            return
        members = self.groups.get(name)
        if members:
            for member in members:
                mailbox = self.channels.get(member)
                if mailbox is not None:
                    mailbox.put(value[2])

    def _on_sub_lost(self, conn: _Connection) -> None:
        if conn is not self._sub:
            return
        self._sub_ready.clear()
        if not self._closing and (self.channels or self.groups):
            logger.warning("Redis subscriber connection lost; reconnecting")
            self._start_reconnect()
            detail = f"Redis at {self.address.host}:{self.address.port}: connection lost"
            for listener in list(self.lost_listeners):
                try:
                    listener(detail)
                except Exception:  # one listener's failure must not stop the reconnection
                    logger.exception("a broker-loss listener failed")

    def _start_reconnect(self) -> None:
        if self._reconnect is None or self._reconnect.done():
            self._reconnect = self.loop.create_task(self._reconnect_loop(),
                                                    name="redis-layer-resubscribe")

    async def _reconnect_loop(self) -> None:
        delay = 0.05
        while not self._closing and (self.channels or self.groups):
            try:
                await self._connect_subscriber()
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                logger.debug("Redis subscriber reconnect failed: %s", exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)

    async def _connect_subscriber(self) -> None:
        async with self._sub_lock:
            old = self._sub
            if old is not None and not old.closed and self._sub_ready.is_set():
                return
            if old is not None:
                self._sub = None
                old.close()  # half set up: never two subscribing connections
            conn = await self._open(self._on_push, self._on_sub_lost)
            self._sub = conn
            try:
                names = [*self.channels, *self.groups]
                for start in range(0, len(names), 1000):
                    part = [(self.namespace + n).encode() for n in names[start:start + 1000]]
                    async with asyncio.timeout(self.address.timeout):
                        await conn.request(command(b"SUBSCRIBE", *part), len(part))
            except BaseException:
                self._sub = None
                conn.close()
                raise
            self._sub_ready.set()

    async def _subscribe(self, name: str) -> None:
        """Subscribe ``name`` (already registered locally) and wait for Redis to confirm."""
        if not self._sub_ready.is_set():
            try:
                await self._connect_subscriber()
            except (ConnectionError, TimeoutError):  # Redis down: retry what stays registered
                self._start_reconnect()
                raise
        conn = self._sub
        if conn is None or conn.closed:
            self._start_reconnect()
            raise ConnectionError("Redis subscriber connection lost")
        # Subscribed again even if the (re)connection just did (it may have listed the
        # channels before this one was registered); Redis ignores a repeated SUBSCRIBE.
        async with asyncio.timeout(self.address.timeout):
            await conn.request(command(b"SUBSCRIBE", (self.namespace + name).encode()))

    def _unsubscribe(self, name: str) -> None:
        conn = self._sub
        if conn is not None and not conn.closed:
            # The confirmation is not awaited (a cancelled receive() cannot wait for it).
            conn.request(command(b"UNSUBSCRIBE", (self.namespace + name).encode())) \
                .add_done_callback(_retrieve)

    # --- Channels layer API ------------------------------------------------------------------

    async def new_channel(self, prefix: str = "specific.") -> str:
        channel = f"{self.prefix}{prefix}{uuid.uuid4().hex}"
        self.channels[channel] = _Mailbox(self.capacity)
        try:
            await self._subscribe(channel)
        except BaseException:
            self.channels.pop(channel, None)
            raise
        return channel

    async def receive(self, channel: str) -> Any:
        mailbox = self.channels.get(channel)
        if mailbox is None:
            mailbox = self.channels[channel] = _Mailbox(self.capacity)
            # Registered before subscribing: if Redis is down now, the reconnection
            # subscribes it and a repeated receive() just waits.
            await self._subscribe(channel)
        try:
            data = await mailbox.get()
        except asyncio.CancelledError:
            # The reader went away (a subscriber's teardown): stop listening, so another owner
            # is the only one (single owner), and so a send() to it counts 0 listeners here.
            if self.channels.get(channel) is mailbox:
                del self.channels[channel]
                try:
                    self._unsubscribe(channel)
                except ConnectionError:
                    pass
            raise
        return _unpackb(data)

    async def group_add(self, group: str, channel: str) -> None:
        if channel not in self.channels:
            raise RuntimeError("group_add() needs a channel of this process (new_channel())")
        name = f"{self.prefix}__group__{group}"
        members = self.groups.get(name)
        if members is None:
            members = self.groups[name] = set()
            members.add(channel)
            try:
                await self._subscribe(name)
            except BaseException:
                members.discard(channel)
                if not members:
                    self.groups.pop(name, None)
                raise
        else:
            members.add(channel)

    async def group_discard(self, group: str, channel: str) -> None:
        name = f"{self.prefix}__group__{group}"
        members = self.groups.get(name)
        if not members or channel not in members:
            return
        members.discard(channel)
        if not members:
            del self.groups[name]
            try:
                self._unsubscribe(name)
            except ConnectionError:
                pass

    async def group_send(self, group: str, message: dict[str, Any]) -> int:
        return await self.publish(f"{self.prefix}__group__{group}", _packb(message))

    async def flush(self) -> None:
        self._closing = True
        if self._reconnect is not None:
            self._reconnect.cancel()
        for conn in (self._pub, self._sub):
            if conn is not None:
                conn.close()
        self._pub = self._sub = None
        self._sub_ready.clear()
        self.channels = {}
        self.groups = {}
        self._closing = False


class RedisDirectChannelLayer:
    """Channels layer: Redis pub/sub over one pipelined publishing connection and one
    subscribing connection per event loop. ``send()`` returns the number of listeners."""

    extensions = ["groups", "flush"]

    def __init__(self, hosts: list[Any] | None = None, prefix: str = "asgi", capacity: int = 10000,
                 **_ignored: Any) -> None:
        hosts = hosts or [{"address": "redis://localhost:6379"}]
        if len(hosts) != 1:
            raise ValueError("the direct Redis layer takes exactly one host")
        host = hosts[0]
        self.address = _Address(host if isinstance(host, dict) else {"address": host})
        self.prefix = prefix
        self.capacity = capacity
        self._layers: dict[asyncio.AbstractEventLoop, _LoopLayer] = {}

    def _layer(self) -> _LoopLayer:
        loop = asyncio.get_running_loop()
        layer = self._layers.get(loop)
        if layer is None:
            layer = self._layers[loop] = _LoopLayer(self.address, self.prefix, self.capacity)
            _close_with_loop(self, loop)
        return layer

    def wire_name(self, channel: str) -> str:
        """``channel``'s Redis pub/sub name (``PUBSUB NUMSUB`` takes it)."""
        return self.address.namespace + channel

    async def send(self, channel: str, message: dict[str, Any]) -> int:
        """Publish ``message``; returns how many processes received it (0: nobody listens)."""
        return await self._layer().publish(channel, _packb(message))

    async def receive(self, channel: str) -> Any:
        return await self._layer().receive(channel)

    async def new_channel(self, prefix: str = "specific.") -> str:
        return await self._layer().new_channel(prefix)

    async def group_add(self, group: str, channel: str) -> None:
        await self._layer().group_add(group, channel)

    async def group_discard(self, group: str, channel: str) -> None:
        await self._layer().group_discard(group, channel)

    async def group_send(self, group: str, message: dict[str, Any]) -> int:
        return await self._layer().group_send(group, message)

    def subscribed(self) -> bool:
        """Whether this loop's subscribing connection is up, with every channel subscribed."""
        layer = self._layers.get(asyncio.get_running_loop())
        conn = layer._sub if layer is not None else None
        return layer is not None and layer._sub_ready.is_set() and conn is not None \
            and not conn.closed

    def on_subscriber_lost(self, listener: Callable[[str], None]) -> Callable[[], None]:
        """Call ``listener(description)`` whenever this loop's subscribing connection is lost
        (from the event loop); returns the function that removes it."""
        listeners = self._layer().lost_listeners
        listeners.append(listener)

        def remove() -> None:
            if listener in listeners:
                listeners.remove(listener)

        return remove

    async def flush(self) -> None:
        layer = self._layers.pop(asyncio.get_running_loop(), None)
        if layer is not None:
            await layer.flush()

    async def close(self) -> None:
        await self.flush()


def _retrieve(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()  # a lost connection: nothing to do, nothing to log


def _close_with_loop(owner: RedisDirectChannelLayer, loop: asyncio.AbstractEventLoop) -> None:
    """Close a loop's connections when the loop closes (``async_to_sync`` runs one loop per
    call in some threads: their connections must not outlive it)."""
    original = loop.close

    def close(self: asyncio.AbstractEventLoop, *args: Any, **kwargs: Any) -> None:
        layer = owner._layers.pop(loop, None)
        if layer is not None and not loop.is_closed():
            try:
                loop.run_until_complete(layer.flush())
            except Exception:  # closing anyway
                pass
        self.close = original  # type: ignore[method-assign]  # the loop's own close, put back
        return original(*args, **kwargs)

    loop.close = types.MethodType(close, loop)  # type: ignore[method-assign]  # close() restores it
