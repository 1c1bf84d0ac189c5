"""Fault injection for tests: private PostgreSQL, Redis, platform nodes and agents that a test
starts itself (on free loopback ports, in temp dirs) and may kill -9, SIGSTOP or restart, plus an
asyncio TCP fault proxy (resets, stalls, cut-off bodies).

Never the machine's shared services: every process here is started by this module, and only
those processes are signalled (by their own process group).

* :class:`PrivatePostgres` -- ``initdb`` + ``postgres`` from ``/usr/lib/postgresql/*/bin`` in a
  temp dir, as the ``postgres`` user when run as root (PostgreSQL refuses root).
* :class:`PrivateRedis` -- ``redis-server --port N`` without persistence.
* :class:`Node` -- ``manage.py serve`` (uvicorn) with the given environment.
* :class:`AgentProcess` -- a real a2a-sdk echo agent (tests/a2a_agents.py) in a process of its
  own, logging every JSON-RPC request id it receives to a file (:meth:`AgentProcess.received`).
* :class:`FaultProxy` -- TCP proxy in a thread; ``mode`` = ``pass`` | ``reset`` (RST at once) |
  ``stall`` (accept, never answer) | ``cut`` (forward the request, relay ``cut_after`` bytes of
  the answer, then reset).
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import json
import os
import pwd
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from tests.servers import free_port

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


class FaultSetupError(RuntimeError):
    """A private service could not be started (tests fail in CI, skip elsewhere)."""


def wait_port(port: int, timeout: float = 20.0, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise FaultSetupError(f"process exited with {proc.returncode} before port {port}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.05)
    raise FaultSetupError(f"nothing listening on port {port} after {timeout}s")


def _running(pid: int) -> bool:
    """Whether ``pid`` is a process that has not exited (a zombie counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _descendants(root: int) -> list[int]:
    """Every descendant of ``root``, from /proc (children first found, then theirs)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                stat = handle.read()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    found, queue = [], [root]
    while queue:
        for child in children.get(queue.pop(), []):
            found.append(child)
            queue.append(child)
    return found


class _Process:
    """A child process in a session (process group) of its own."""

    proc: subprocess.Popen | None = None

    def _spawn(self, args: list[str], **kwargs) -> subprocess.Popen:
        self.proc = subprocess.Popen(args, start_new_session=True, **kwargs)
        return self.proc

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int) -> None:
        """Send ``sig`` to this process, its process group and every descendant (PostgreSQL's
        backends start sessions of their own, so the group alone misses them)."""
        if not self.alive():
            return
        pids = _descendants(self.proc.pid)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, sig)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)

    def kill(self) -> None:
        """kill -9, then reap, and wait (at most 10 s) until every descendant is gone too: a
        PostgreSQL backend still attached to the shared memory makes the next start fail."""
        if self.proc is None:
            return
        pids = _descendants(self.proc.pid) if self.alive() else []
        self.signal(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        deadline = time.monotonic() + 10
        for pid in pids:
            while time.monotonic() < deadline and _running(pid):
                time.sleep(0.02)

    def pause(self) -> None:
        self.signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.signal(signal.SIGCONT)

    def terminate(self, timeout: float = 10.0) -> None:
        if not self.alive():
            return
        self.resume()
        self.signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()


# --- PostgreSQL --------------------------------------------------------------------------------


def _pg_bin() -> Path:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"))
    if not found:
        path = shutil.which("postgres")
        if path is None:
            raise FaultSetupError("no PostgreSQL binaries (apt-get install postgresql)")
        return Path(path).parent
    return Path(found[-1]).parent


class PrivatePostgres(_Process):
    """A throwaway PostgreSQL cluster on a free port, trust auth, no fsync."""

    def __init__(self) -> None:
        self.bin = _pg_bin()
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="a2a-pg-"))
        self.data = self.dir / "data"
        self.user: str | None = None
        if os.geteuid() == 0:
            self.user = "postgres"
            entry = pwd.getpwnam(self.user)
            os.chown(self.dir, entry.pw_uid, entry.pw_gid)
        self._run_as(
            [
                str(self.bin / "initdb"),
                "-D",
                str(self.data),
                "-U",
                "postgres",
                "-A",
                "trust",
                "-E",
                "UTF8",
                "--no-sync",
            ],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )

    def _prefix(self) -> list[str]:
        return ["runuser", "-u", self.user, "--"] if self.user else []

    def _run_as(self, args: list[str], **kwargs) -> subprocess.CompletedProcess:
        try:
            return subprocess.run(self._prefix() + args, timeout=120, **kwargs)
        except subprocess.CalledProcessError as exc:
            raise FaultSetupError(f"{args[0]} failed: {exc.stderr!r}") from exc

    def url(self, dbname: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{dbname}"

    def start(self) -> PrivatePostgres:
        args = self._prefix() + [
            str(self.bin / "postgres"),
            "-D",
            str(self.data),
            "-p",
            str(self.port),
            "-c",
            "listen_addresses=127.0.0.1",
            "-c",
            f"unix_socket_directories={self.dir}",
            "-c",
            "fsync=off",
            "-c",
            "full_page_writes=off",
            "-c",
            "max_connections=200",
            "-c",
            "shared_buffers=32MB",
        ]
        for attempt in range(3):
            log = open(self.dir / "postgres.log", "ab")  # noqa: SIM115 - kept by the child
            proc = self._spawn(args, stdout=log, stderr=log)
            try:
                wait_port(self.port, 30, proc)
                break
            except FaultSetupError as exc:
                tail = (self.dir / "postgres.log").read_text(errors="replace")[-600:]
                if attempt == 2:  # e.g. a killed predecessor's memory not yet released
                    raise FaultSetupError(f"{exc}; postgres.log ends: {tail}") from None
                time.sleep(1.0)
        deadline = time.monotonic() + 30
        while True:  # accepting TCP is not accepting queries (recovery after kill -9)
            ready = subprocess.run(
                [str(self.bin / "pg_isready"), "-h", "127.0.0.1", "-p", str(self.port), "-q"],
                check=False,
            )
            if ready.returncode == 0:
                return self
            if time.monotonic() > deadline:
                raise FaultSetupError("private PostgreSQL did not become ready")
            time.sleep(0.1)

    def restart(self) -> PrivatePostgres:
        self.kill()
        return self.start()

    def psql(self, sql: str, dbname: str = "postgres") -> str:
        result = subprocess.run(
            [
                str(self.bin / "psql"),
                "-h",
                "127.0.0.1",
                "-p",
                str(self.port),
                "-U",
                "postgres",
                "-d",
                dbname,
                "-qAtc",
                sql,
            ],
            check=True,
            capture_output=True,
            text=True,
            timeout=60,
        )
        return result.stdout.strip()

    def cleanup(self) -> None:
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


# --- Redis -------------------------------------------------------------------------------------


class PrivateRedis(_Process):
    def __init__(self) -> None:
        self.port = free_port()
        if shutil.which("redis-server") is None:
            raise FaultSetupError("redis-server is not installed")

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def start(self) -> PrivateRedis:
        proc = self._spawn(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--loglevel",
                "warning",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_port(self.port, 10, proc)
        return self

    def restart(self) -> PrivateRedis:
        self.kill()
        return self.start()

    def cleanup(self) -> None:
        self.kill()


def sse_events(response: httpx.Response) -> Iterator[dict]:
    """The SSE events of a streamed response, each event's first ``data:`` line parsed, as they
    arrive (CRLF line ends read as LF)."""
    buffer = b""
    for chunk in response.iter_raw():
        buffer += chunk.replace(b"\r\n", b"\n")
        while b"\n\n" in buffer:
            block, buffer = buffer.split(b"\n\n", 1)
            data = [line[6:] for line in block.split(b"\n") if line.startswith(b"data: ")]
            if data:
                yield json.loads(data[0])


# --- platform processes -------------------------------------------------------------------------


def platform_env(*, database_url: str | None, redis_url: str | None, **extra: str) -> dict:
    """The environment of a platform process (node, beat, manage.py) using these services."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DATABASE_URL", "REDIS_URL", "NODE_ID", "PYTEST_CURRENT_TEST")
    }
    env.update(
        {
            "SECRET_KEY": "fault-tests",
            "LOG_LEVEL": "WARNING",
            "PYTHONUNBUFFERED": "1",
            "DJANGO_SETTINGS_MODULE": "config.settings",
        }
    )
    if database_url:
        env["DATABASE_URL"] = database_url
    if redis_url:
        env["REDIS_URL"] = redis_url
    elif database_url:
        env["A2A_SINGLE_NODE"] = "true"  # PostgreSQL without Redis: one node, chosen explicitly
    env.update(extra)
    return env


def manage(env: dict, *args: str, timeout: float = 180) -> str:
    result = subprocess.run(
        [PYTHON, "manage.py", *args],
        cwd=ROOT,
        env=env,
        timeout=timeout,
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        raise FaultSetupError(f"manage.py {' '.join(args)} failed: {result.stderr[-2000:]}")
    return result.stdout


def create_clients(env: dict, specs: dict[str, list[str]]) -> dict[str, str]:
    """Create API clients (name -> scopes) in that environment's database; name -> token."""
    code = (
        "import json, os; from registry import services; out = {}\n"
        f"for name, scopes in {specs!r}.items():\n"
        "    unique = name + '-' + os.urandom(3).hex()\n"
        "    out[name] = services.api_client_create(name=unique, scopes=scopes)[1]\n"
        "print('TOKENS' + json.dumps(out))\n"
    )
    out = manage(env, "shell", "-c", code)
    return json.loads(out.split("TOKENS", 1)[1])


class Node(_Process):
    """One platform node: ``manage.py serve --server uvicorn`` on a free port."""

    def __init__(self, env: dict, *, node_id: str | None = None, extra_args: tuple = ()) -> None:
        self.port = free_port()
        self.env = dict(env, NODE_ID=node_id or f"fault-node-{self.port}")
        self.extra_args = extra_args
        self.log_path = Path(tempfile.mkstemp(prefix="a2a-node-", suffix=".log")[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60) -> Node:
        log = open(self.log_path, "ab")  # noqa: SIM115 - kept open by the child
        proc = self._spawn(
            [
                PYTHON,
                "manage.py",
                "serve",
                "--server",
                "uvicorn",
                "--port",
                str(self.port),
                *self.extra_args,
            ],
            cwd=ROOT,
            env=self.env,
            stdout=log,
            stderr=log,
        )
        wait_port(self.port, timeout, proc)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/readyz", timeout=5).status_code == 200:
                    return self
            time.sleep(0.1)
        raise FaultSetupError(f"node did not become ready; log:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]


AGENT_MAIN = """
import json, sys, threading
import uvicorn
from tests.a2a_agents import EchoAgent
port, log_path, steps, delay = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
agent = EchoAgent(steps=steps, step_delay=delay)
agent.port = port
lock, log = threading.Lock(), open(log_path, "a", buffering=1)
recorder = agent.recorder
inner = recorder.__call__
async def app(scope, receive, send):
    if scope["type"] != "http" or scope["method"] != "POST":
        return await inner(scope, receive, send)
    chunks = []
    async def logging_receive():
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            try:
                rpc_id = json.loads(b"".join(chunks)).get("id")
            except ValueError:
                rpc_id = None
            with lock:
                log.write(json.dumps(rpc_id) + "\\n")
        return message
    return await inner(scope, logging_receive, send)
uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off")
"""


class AgentProcess(_Process):
    """A real a2a-sdk echo agent in a process of its own (so it can be killed -9). Every
    JSON-RPC request id it receives is appended to a log file: :meth:`received`."""

    def __init__(self, *, steps: int = 4, step_delay: float = 0.2) -> None:
        self.port = free_port()
        self.steps, self.step_delay = steps, step_delay
        self.log_path = Path(tempfile.mkstemp(prefix="a2a-agent-", suffix=".ids")[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/"

    def start(self) -> AgentProcess:
        proc = self._spawn(
            [
                PYTHON,
                "-c",
                AGENT_MAIN,
                str(self.port),
                str(self.log_path),
                str(self.steps),
                str(self.step_delay),
            ],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_port(self.port, 30, proc)
        return self

    def received(self) -> list:
        return [json.loads(line) for line in self.log_path.read_text().splitlines() if line]


# --- TCP fault proxy ------------------------------------------------------------------------------


class FaultProxy:
    """A TCP proxy on a free port in front of ``target_port``, in a thread of its own.

    Set :attr:`mode` any time: ``pass`` relays both ways; ``reset`` answers a new connection
    with an RST; ``stall`` accepts and reads but never answers; ``cut`` relays the request and
    ``cut_after`` bytes of the answer, then resets the connection. :attr:`connections` counts
    accepted connections."""

    def __init__(self, target_port: int, *, mode: str = "pass", cut_after: int = 64) -> None:
        self.target_port = target_port
        self.mode = mode
        self.cut_after = cut_after
        self.port = free_port()
        self.connections = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.base_events.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/"

    def __enter__(self) -> FaultProxy:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        return self

    def __exit__(self, *exc) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    async def _start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)

    async def _stop(self) -> None:
        self._server.close()
        for writer in list(self._writers):
            _reset(writer)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self._writers.add(writer)
        mode = self.mode
        try:
            if mode == "reset":
                _reset(writer)
                return
            if mode == "stall":
                while await reader.read(65536):
                    pass
                return
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
            self._writers.add(up_writer)
            budget = [self.cut_after if mode == "cut" else -1]

            async def pipe(src, dst, limited: bool) -> None:
                while data := await src.read(65536):
                    if limited and budget[0] >= 0:
                        data = data[: budget[0]]
                        budget[0] -= len(data)
                        dst.write(data)
                        await dst.drain()
                        if budget[0] <= 0:
                            _reset(writer)
                            _reset(up_writer)
                            return
                        continue
                    dst.write(data)
                    await dst.drain()
                with contextlib.suppress(OSError):
                    dst.write_eof()

            await asyncio.gather(
                pipe(reader, up_writer, False),
                pipe(up_reader, writer, True),
                return_exceptions=True,
            )
        except OSError:
            pass
        finally:
            self._writers.discard(writer)
            with contextlib.suppress(Exception):
                writer.close()

    def reset_all(self) -> None:
        """Reset every open connection (an agent killed -9 mid-answer looks like this)."""

        def go() -> None:
            for writer in list(self._writers):
                _reset(writer)

        self._loop.call_soon_threadsafe(go)


def _reset(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


@contextlib.contextmanager
def private_services(*, postgres: bool = True, redis: bool = True) -> Iterator[dict]:
    """Start a private PostgreSQL (migrated) and/or Redis; yields their handles and URLs."""
    pg = rd = None
    try:
        out: dict = {}
        if postgres:
            pg = PrivatePostgres().start()
            pg.psql("CREATE DATABASE a2a")
            out["pg"], out["database_url"] = pg, pg.url("a2a")
        if redis:
            rd = PrivateRedis().start()
            out["redis"], out["redis_url"] = rd, rd.url()
        env = platform_env(database_url=out.get("database_url"), redis_url=out.get("redis_url"))
        if postgres:
            manage(env, "migrate", "--noinput")
        out["env"] = env
        yield out
    finally:
        if rd is not None:
            rd.cleanup()
        if pg is not None:
            pg.cleanup()
