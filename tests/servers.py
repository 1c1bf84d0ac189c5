"""Real servers on loopback for tests: uvicorn serving any ASGI app in a background thread."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import uvicorn


def kernel_buffer_bytes() -> int:
    """The most one loopback TCP connection may hold in kernel buffers on this machine: the
    receive and send maxima it autotunes up to (tcp_rmem + tcp_wmem; 32 + 4 MiB on some
    machines). An agent writes that much into a connection nobody reads before it blocks, so
    a test telling "the node stopped reading" from what an agent sent must allow for it."""
    total = 0
    for name in ("tcp_rmem", "tcp_wmem"):
        try:
            total += int(Path(f"/proc/sys/net/ipv4/{name}").read_text().split()[2])
        except (OSError, ValueError, IndexError):
            total += 32 * 1024 * 1024  # not Linux: assume generous buffers
    return total


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def refuses_connections(port: int) -> bool:
    """Whether nothing accepts a TCP connection on the loopback ``port`` now (a drained or
    stopped server)."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return True
    return False


class PromptServer(uvicorn.Server):
    """uvicorn's server, stopped without two waits of 0.1 s each: its main loop looks at
    ``should_exit`` every 0.1 s (here it is also woken by :meth:`stop_now`), and its shutdown
    gives open connections 0.1 s to see it (here skipped when none is open, as after most
    tests). Those waits were 0.2 s of every live-server test's teardown, on about a thousand
    tests per CI pass (measured: ``ThreadedUvicorn.stop`` took 0.20 s, now 0.003 s, on the whole
    platform's app)."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None

    async def main_loop(self) -> None:
        self._loop, self._wake = asyncio.get_running_loop(), asyncio.Event()
        counter = 0
        should_exit = await self.on_tick(counter)
        while not should_exit:
            counter = (counter + 1) % 864000
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), 0.1)
            should_exit = await self.on_tick(counter)

    def stop_now(self) -> None:
        """Ask the server to stop (from any thread) and wake its main loop."""
        self.should_exit = True
        loop, wake = self._loop, self._wake
        if loop is not None and wake is not None:
            with contextlib.suppress(RuntimeError):  # its loop has ended already
                loop.call_soon_threadsafe(wake.set)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        if self.server_state.connections or self.server_state.tasks or self.force_exit:
            await super().shutdown(sockets)
            return
        for server in self.servers:
            server.close()
        for sock in sockets or []:
            sock.close()
        for server in self.servers:
            await server.wait_closed()
        await self.lifespan.shutdown()


class ThreadedUvicorn:
    """An ASGI app served by a real uvicorn on 127.0.0.1 in a thread of the test process."""

    def __init__(self, app, *, port: int | None = None, lifespan: str = "on",
                 ssl_certfile: str | None = None, ssl_keyfile: str | None = None) -> None:
        self.port = port or free_port()
        self.scheme = "https" if ssl_certfile else "http"
        self.config = uvicorn.Config(
            app, host="127.0.0.1", port=self.port, lifespan=lifespan, log_level="warning",
            loop="asyncio", timeout_graceful_shutdown=2,
            ssl_certfile=ssl_certfile, ssl_keyfile=ssl_keyfile,
        )
        self.server = PromptServer(self.config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"

    def start(self) -> ThreadedUvicorn:
        self.thread.start()
        deadline = time.monotonic() + 15
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"uvicorn on port {self.port} did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self.server.stop_now()
        self.thread.join(timeout=10)


@contextmanager
def serve_app(app, **kwargs) -> Iterator[ThreadedUvicorn]:
    server = ThreadedUvicorn(app, **kwargs).start()
    try:
        yield server
    finally:
        server.stop()
        from ard import indexer

        indexer.settle_deferred()  # the search documents its registrations deferred, written
        # before the test's database is emptied for the next test


class PortTaken(Exception):
    """A ``manage.py serve`` subprocess stopped because its port was taken meanwhile (a port
    from :func:`free_port` is free only until another process, such as CI's other pass, binds
    it)."""


def listens_on(pid: int, port: int) -> bool:
    """Whether process ``pid`` holds a listening TCP socket on ``port`` (Linux ``/proc``)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(f"socket:[{fields[9]}]")
    try:
        descriptors = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for descriptor in descriptors:
        try:
            if os.readlink(f"/proc/{pid}/fd/{descriptor}") in inodes:
                return True
        except OSError:
            continue
    return False


def wait_until_serving(process, url: str, *, timeout: float, what: str) -> None:
    """Wait for a ``manage.py serve`` subprocess to answer ``/healthz`` on its own socket (an
    answer from another process that took the port does not count); fail the test with its
    output if it exits or does not answer within ``timeout`` seconds, or raise
    :class:`PortTaken` when it stopped because its port was taken."""
    import httpx
    import pytest

    port = int(url.rsplit(":", 1)[1].split("/", 1)[0])
    deadline = time.monotonic() + timeout
    while True:
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200 \
                    and listens_on(process.pid, port):
                return
        except httpx.HTTPError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            output = process.stdout.read().decode(errors="replace") if process.stdout else ""
            if f"port {port} is in use" in output:
                raise PortTaken(output)
            pytest.fail(f"{what} did not start:\n{output}")
        time.sleep(0.1)


def start_node(env: dict[str, str], server: str = "uvicorn", *, what: str = "node",
               timeout: float = 60.0, node_id: str | None = None):
    """``manage.py serve --server <server> --no-periodic`` in a subprocess with ``env``, on a
    free port, serving; answers ``(process, port)``. A free port can be taken before the node
    binds it (:class:`PortTaken`): it starts again on another one, three times at most.
    ``NODE_ID`` is ``node_id``, else the environment's, else ``node-<port>``."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parent.parent
    for attempt in range(3):
        port = free_port()
        env = {**env, "NODE_ID": node_id or env.get("NODE_ID") or f"node-{port}"}
        process = subprocess.Popen(
            [sys.executable, "manage.py", "serve", "--server", server, "--port", str(port),
             "--no-periodic"],
            cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )
        try:
            wait_until_serving(process, f"http://127.0.0.1:{port}", timeout=timeout, what=what)
            return process, port
        except PortTaken:
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


# --- raw ASGI agents: what every scripted agent of the tests does the same way ------------------


async def answer_lifespan(receive, send) -> None:
    """Answer an ASGI lifespan scope (startup and shutdown complete at once)."""
    while (await receive())["type"] != "lifespan.shutdown":
        await send({"type": "lifespan.startup.complete"})
    await send({"type": "lifespan.shutdown.complete"})


async def read_body(receive) -> bytes:
    """The whole request body of an ASGI HTTP scope."""
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            return body


def watch_disconnect(receive) -> tuple[asyncio.Event, asyncio.Task]:
    """Once the body is read: an event set when the client goes away (``http.disconnect``),
    and the task watching for it (cancel it when the response is done)."""
    gone = asyncio.Event()

    async def watch() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        gone.set()

    return gone, asyncio.get_running_loop().create_task(watch())


@contextmanager
def serve_agent(agent, path: str = "/rpc"):
    """Serve a raw ASGI agent (an object with a ``url`` attribute) and set its ``url``."""
    with serve_app(agent) as server:
        agent.url = server.url + path
        yield agent


def wire_name(channel: str) -> str:
    """``channel``'s Redis pub/sub name under the process's channel layer (the direct layer
    namespaces names by Redis database; channels-redis's layers do not)."""
    from channels.layers import get_channel_layer

    return getattr(get_channel_layer(), "wire_name", str)(channel)


ROOT = Path(__file__).resolve().parent.parent


def fresh_env(data_dir: Path, **extra: str) -> dict[str, str]:
    """The environment of a fresh embedded node in ``data_dir`` (none of the outer services)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("DATABASE_URL", "REDIS_URL", "DJANGO_SETTINGS_MODULE", "NODE_ID",
                        "ALLOWED_HOSTS")}
    env.update({"A2A_DATA_DIR": str(data_dir), "PYTHONUNBUFFERED": "1", **extra})
    return env


def run_manage(env, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    """``manage.py *args`` in a subprocess under ``env``."""
    return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120, check=check)


def wait_for_ok(url: str, proc: subprocess.Popen, timeout: float = 30) -> None:
    """Until ``url`` answers 200 (fails early if ``proc`` exits)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"server exited early: {proc.stdout.read()}")
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"{url} did not come up")


def flush_console_now() -> None:
    """Write the live node's pending statistics and audit rows now: its own flush job's one
    step, run on the node's event loop. Tests that count rows per flush set
    ``A2A_STATS_FLUSH_SECONDS`` long and flush here, so no timed flush splits their calls."""
    from console import flusher
    from gateway import runtime

    asyncio.run_coroutine_threadsafe(flusher.flush_once(), runtime.current_node().loop).result(30)
