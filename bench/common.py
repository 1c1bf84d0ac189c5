"""Shared plumbing for the benchmarks: pinned child processes, readiness, CPU and RSS readings,
a platform node (own SQLite data dir, migrate, API clients) and result files."""

from __future__ import annotations

import json
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
RESULTS = BENCH / "results"
PYTHON = sys.executable
SERVER_CORE = "0"
LOAD_CORE = 1
CLK_TCK = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _any_core() -> None:
    """Setup commands (migrate, create_client) are not measured: let them use every core."""
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, range(os.cpu_count() or 1))


def pin_self_to_load_core() -> None:
    """The orchestrator and its in-process load generators run on the load core."""
    if hasattr(os, "sched_setaffinity") and os.cpu_count() and os.cpu_count() > LOAD_CORE:
        os.sched_setaffinity(0, {LOAD_CORE})


def clean_env(**extra: str) -> dict[str, str]:
    """The environment for a child: no inherited mode switches unless given explicitly."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("DATABASE_URL", "REDIS_URL", "A2A_DATA_DIR", "NODE_ID")}
    env["PYTHONPATH"] = str(ROOT)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


@dataclass
class Proc:
    """A child process pinned to the server core, its log in the run's temp folder."""

    name: str
    argv: list[str]
    env: dict[str, str]
    log_dir: Path
    core: str = SERVER_CORE
    popen: subprocess.Popen | None = None
    url: str = ""
    extra_pids: list[int] = field(default_factory=list)
    cwd: Path = ROOT  # another checkout of the project (a baseline build) runs from its own

    def start(self) -> Proc:
        # Appended: a restarted node (bench/soak.py --rolling-restart) keeps its earlier lines.
        log = open(self.log_dir / f"{self.name}.log", "ab")  # noqa: SIM115 (lives with the child)
        self.popen = subprocess.Popen(["taskset", "-c", self.core, *self.argv], cwd=self.cwd,
                                      env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                      start_new_session=True)
        return self

    @property
    def pid(self) -> int:
        assert self.popen is not None
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def log_tail(self, lines: int = 30) -> str:
        path = self.log_dir / f"{self.name}.log"
        try:
            return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def wait_ready(self, url: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                raise RuntimeError(f"{self.name} exited:\n{self.log_tail()}")
            try:
                httpx.get(url, timeout=2)
                return
            except httpx.HTTPError:
                time.sleep(0.1)
        raise RuntimeError(f"{self.name} not ready at {url} after {timeout}s:\n{self.log_tail()}")

    def stop(self) -> None:
        if not self.alive():
            return
        os.killpg(self.pid, signal.SIGINT)
        try:
            self.popen.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(self.pid, signal.SIGKILL)
            self.popen.wait(timeout=5)

    def pids(self) -> list[int]:
        return [self.pid, *self.extra_pids]


def cpu_seconds(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime + stime
    return total / CLK_TCK


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def uvicorn_argv(app: str, port: int, lifespan: str = "on") -> list[str]:
    return [PYTHON, "-m", "uvicorn", app, "--host", "127.0.0.1", "--port", str(port),
            "--loop", "uvloop", "--http", "httptools", "--no-access-log",
            "--log-level", "warning", "--lifespan", lifespan,
            "--timeout-keep-alive", "75"]


class PlatformNode:
    """One embedded platform node: its own data dir, migrated; API clients created."""

    def __init__(self, name: str, tmp: Path, *, extra_env: dict[str, str] | None = None,
                 database_url: str | None = None, root: Path = ROOT) -> None:
        self.name = name
        self.root = root
        self.data_dir = tmp / name
        self.data_dir.mkdir(parents=True, exist_ok=True)
        extra = {"A2A_DATA_DIR": str(self.data_dir), **(extra_env or {})}
        # Loopback nodes: the host names they answer to, and /metrics readable by the bench.
        extra.setdefault("ALLOWED_HOSTS", "127.0.0.1,localhost")
        extra.setdefault("A2A_METRICS_REQUIRE_TOKEN", "false")
        extra.setdefault("A2A_MAX_AGENTS_PER_CLIENT", "0")  # one registrar, 10,000 agents
        if database_url:
            extra["DATABASE_URL"] = database_url
            extra.setdefault("SECRET_KEY", "bench-secret-key")
            if "REDIS_URL" not in extra:
                extra["A2A_SINGLE_NODE"] = "true"
        self.env = clean_env(**extra)
        self.env["PYTHONPATH"] = str(root)
        self.tmp = tmp
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: Proc | None = None

    def manage(self, *args: str, timeout: float = 300) -> str:
        done = subprocess.run([PYTHON, "manage.py", *args], cwd=self.root, env=self.env,
                              capture_output=True, text=True, timeout=timeout,
                              preexec_fn=_any_core)
        if done.returncode != 0:
            raise RuntimeError(f"manage.py {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}")
        return done.stdout

    def prepare(self) -> tuple[str, str, str]:
        """Migrate and create an admin, a registrar and a caller; answers their tokens."""
        self.manage("migrate", "--noinput")
        tag = os.urandom(3).hex()

        def create(role_scopes: tuple[str, str]) -> str:
            role, scopes = role_scopes
            out = self.manage("create_client", f"bench-{role}-{tag}", "--scopes", scopes)
            return out.strip().splitlines()[-1].strip()

        with ThreadPoolExecutor(max_workers=3) as pool:
            admin, registrar, caller = pool.map(
                create, (("admin", "admin"), ("registrar", "register"), ("caller", "call")))
        return admin, registrar, caller

    def serve(self, server: str, *extra: str, core: str = SERVER_CORE) -> Proc:
        """Start ``manage.py serve`` pinned to ``core`` (a taskset list: "0", "0-1")."""
        argv = [PYTHON, "manage.py", "serve", "--port", str(self.port), "--server", server,
                *extra]
        self.proc = Proc(f"{self.name}", argv, self.env, self.tmp, cwd=self.root,
                         core=core).start()
        self.proc.url = self.url
        self.proc.wait_ready(f"{self.url}/healthz", timeout=90)
        return self.proc


def create_postgres_db(admin_url: str) -> tuple[str, str]:
    """Create a throwaway bench database next to ``admin_url``'s; answers (its URL, its name)."""
    import psycopg

    name = f"a2a_bench_{os.urandom(4).hex()}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return admin_url.rsplit("/", 1)[0] + f"/{name}", name


def drop_postgres_db(admin_url: str, name: str) -> None:
    import psycopg

    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def machine_info() -> dict:
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpus": os.cpu_count(), "cpu_model": cpu, "python": platform.python_version(),
            "platform": platform.platform()}


def run_info() -> dict:
    """What makes a run traceable: when, on which machine, at which commit, by which command."""
    root = Path(__file__).resolve().parent.parent

    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True,
                                  timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    return {
        "utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "host": platform.node(),
        "machine": machine_info(),
        "commit": git("rev-parse", "HEAD"),
        # Uncommitted changes to tracked files: the figures may not be the commit's.
        "dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
    }


def write_results(prefix: str, payload: dict, directory: Path | None = None) -> Path:
    """Write one run's figures to ``bench/results/`` (committed: every figure quoted in the
    README names the file of the run it comes from), with :func:`run_info` first; a test's
    run names another ``directory`` (``test-artifacts/``), so it never adds to the committed
    results."""
    directory = directory or RESULTS
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{prefix}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps({"run": run_info(), **payload}, indent=2, sort_keys=False))
    return path


def keep_logs(tmp: Path, prefix: str) -> Path | None:
    """Copy the children's logs out of the temp folder into bench/results/ before it goes."""
    logs = sorted(tmp.glob("*.log"))
    if not logs:
        return None
    target = RESULTS / f"{prefix}-logs-{time.strftime('%Y%m%d-%H%M%S')}"
    target.mkdir(parents=True, exist_ok=True)
    for log in logs:
        (target / log.name).write_bytes(log.read_bytes()[-2_000_000:])
    return target


def temp_dir(prefix: str) -> tempfile.TemporaryDirectory:
    return tempfile.TemporaryDirectory(prefix=prefix)


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def median(values: list[float]) -> float:
    return percentile(values, 50)
