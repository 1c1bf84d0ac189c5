"""The cluster slots' Redis waits are bounded (gateway/grpc_binding/slots.py): a Redis that
takes connections and never answers costs a call's take at most ``REDIS_WAIT_SECONDS`` (then
the node counts on its own), and however many calls wait, the node holds at most
``MAX_CONNECTIONS`` connections to it at once."""

from __future__ import annotations

import asyncio
import selectors
import socket
import threading
import time

from gateway.grpc_binding import slots


class SilentRedis:
    """Takes connections and never answers; counts the most held open at once."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0), backlog=256)
        self.listener.setblocking(False)
        self.url = f"redis://127.0.0.1:{self.listener.getsockname()[1]}/0"
        self.open = self.peak = self.accepted = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        selector = selectors.DefaultSelector()
        selector.register(self.listener, selectors.EVENT_READ)
        connections: set[socket.socket] = set()
        while not self._stop.is_set():
            for key, _ in selector.select(0.05):
                if key.fileobj is not self.listener:
                    self._read(selector, connections, key.fileobj)
                    continue
                # Count only what the client holds when it opens another: epoll reports the
                # listener ahead of a socket whose close arrived before the new connection,
                # so every close already sent is read first.
                for other in list(connections):
                    self._read(selector, connections, other)
                try:
                    connection, _ = self.listener.accept()
                except BlockingIOError:
                    continue
                connection.setblocking(False)
                selector.register(connection, selectors.EVENT_READ)
                connections.add(connection)
                self.accepted += 1
                self.open += 1
                self.peak = max(self.peak, self.open)
        for connection in connections:
            connection.close()

    def _read(self, selector: selectors.BaseSelector, connections: set[socket.socket],
              connection: socket.socket) -> None:
        """Read what the client sent (commands are ignored); a close ends the connection. A
        connection already ended (by the sweep before an accept) is left alone."""
        while connection in connections:
            try:
                data = connection.recv(65536)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:
                selector.unregister(connection)
                connections.discard(connection)
                connection.close()
                self.open -= 1

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


def test_a_silent_redis_costs_each_take_the_wait_at_most_and_bounded_connections():
    redis = SilentRedis()
    calls = 3 * slots.MAX_CONNECTIONS

    async def takes() -> list[tuple[float, BaseException | str | None]]:
        leases = slots.ClusterLeases(redis.url, "test", "node-1", lease=10.0, renew=5.0)

        async def one() -> tuple[float, BaseException | str | None]:
            started = time.monotonic()
            try:
                return time.monotonic() - started, await leases.take("echo", 4)
            except BaseException as exc:  # what the node's take_slot catches and logs
                return time.monotonic() - started, exc

        try:
            first = await asyncio.gather(*(one() for _ in range(calls)))
            second = await asyncio.gather(*(one() for _ in range(calls)))  # pool reused
            return first + second
        finally:
            await leases.close()

    try:
        started = time.monotonic()
        results = asyncio.run(takes())
        took = time.monotonic() - started
    finally:
        redis.stop()
    # Every take failed (nothing granted by a Redis that never answered) ...
    assert all(isinstance(outcome, BaseException) for _, outcome in results), results
    # ... each within the wait, however the client library handles a cancelled command ...
    assert max(seconds for seconds, _ in results) < slots.REDIS_WAIT_SECONDS + 0.5, results
    assert took < 2 * slots.REDIS_WAIT_SECONDS + 2.0
    # ... and 96 calls held no more connections at once than the pool's bound.
    assert 1 <= redis.peak <= slots.MAX_CONNECTIONS, (redis.peak, redis.accepted)
