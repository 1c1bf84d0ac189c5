"""Open-loop soak: a fixed request rate of mixed traffic against one node, for minutes.

    .venv/bin/python bench/soak.py --minutes 30                 # the README's figure
    .venv/bin/python bench/soak.py --minutes 2 --interval 20    # a short check
    DATABASE_URL=postgresql://postgres@127.0.0.1:5432/postgres REDIS_URL=redis://127.0.0.1:6379/9 \
        .venv/bin/python bench/soak.py --distributed --minutes 2

Starts a node (``manage.py serve``, pinned to core 0; embedded, or with ``--distributed`` a
throwaway PostgreSQL database next to ``DATABASE_URL`` and ``REDIS_URL``) and real a2a-sdk echo
agents in processes of their own, then offers ``--rate`` requests per second *open loop*: each
request is started on schedule whether or not earlier ones finished (so a slow server meets a
growing queue, as in production, instead of a politely waiting client). The mix: ``message/send``
(60 %), ``message/stream`` of a short task (10 %), heartbeats (25 %), registration churn
(register or deregister a throwaway agent, 5 %).

``--nodes 2`` (with ``--distributed``) starts two nodes on the same PostgreSQL and Redis, with
half the agents registered on each, and spreads the load over both (nothing pinned then: the
nodes, agents, databases and generator share the cores as a cluster on one host would);
``--rolling-restart N`` restarts every node in turn (SIGTERM, wait for it to exit, start it
again on the same port, then the next one) every N seconds during the run. A request the
restarting node did not take -- its connection refused, or a kept-alive connection closed or
reset before any answer began (a node shutting down closes its idle connections; a request
crossing that close is never read, and a node finishes every request it has read before it
exits, within its drain) -- is sent to the other node, as a load balancer would; a call that
fails in any other way counts as failed. The load generator is aiohttp (one pool per node):
httpx's pool fell behind at 200 req/s once restarts left half-closed connections in it. The
summary reports the restarts and the failed calls during them. RSS growth is then measured
from the first window after the last restart.

    DATABASE_URL=... REDIS_URL=... .venv/bin/python bench/soak.py --distributed --nodes 2 \
        --rolling-restart 60 --minutes 3 --interval 20

Every ``--interval`` seconds it prints: requests, errors and error rate, p50/p99 latency (a
stream's latency is to its last event) and the node's RSS. At the end: totals, RSS growth from
the end of the first window (warm-up) to the end, and the targets (errors <= 0.1 %, p99 <
250 ms at 200 req/s, RSS growth <= 10 %). ``--check`` exits 1 when errors or RSS growth miss
their targets (p99 is reported, never asserted: timings on a shared machine are not a verdict).
Writes JSON to bench/results/ (or --results DIR).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import httpx
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (  # noqa: E402
    SERVER_CORE,
    PlatformNode,
    create_postgres_db,
    drop_postgres_db,
    machine_info,
    percentile,
    pin_self_to_load_core,
    rss_kib,
    temp_dir,
    write_results,
)
from tests.faults import AgentProcess  # noqa: E402

MIX = (("send", 0.60), ("stream", 0.10), ("heartbeat", 0.25), ("churn", 0.05))


class _NotServed(Exception):
    """The node refused the connection (restarting), or closed a kept-alive one before
    answering anything (shutting down): the request goes to the other node."""

MAX_IN_FLIGHT = 5000  # beyond this the generator counts a request as failed instead of queueing
ERROR_TARGET = 0.001
RSS_TARGET = 0.10
P99_TARGET_MS = 250.0


@dataclass
class Window:
    started: float
    latencies: list[float] = field(default_factory=list)
    errors: int = 0
    kinds: dict[str, int] = field(default_factory=dict)
    rss_kib: int = 0
    #: Latencies of the successful requests, by kind (send, stream, heartbeat, churn).
    by_kind: dict[str, list[float]] = field(default_factory=dict)

    @property
    def requests(self) -> int:
        return len(self.latencies) + self.errors


class Soak:
    def __init__(
        self, base: str | list[str], tokens: dict[str, str], agent_ids: list[str],
        agent_url: str
    ) -> None:
        self.bases = [base] if isinstance(base, str) else list(base)
        self.base = self.bases[0]
        #: Requests re-sent to another node after a refused connection (a node restarting).
        self.redirected = 0
        #: (start, end) of each node restart (loop time), and the errors inside them.
        self.restarts: list[tuple[float, float]] = []
        self.restart_errors = 0
        self._next = 0
        self.started_perf = time.perf_counter()
        self.interval = 60.0
        self.tokens = tokens
        self.agent_ids = agent_ids
        self.agent_url = agent_url
        self.in_flight = 0
        self.churn: list[str] = []
        self.sequence = 0
        self.windows: list[Window] = []
        self.error_samples: list[str] = []
        #: With ``--trace``: (start s since the run began, kind, node index, latency s or None).
        self.trace: list[tuple[float, str, int, float | None]] | None = None

    def _headers(self, role: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens[role]}"}

    async def one(self, client: dict[str, aiohttp.ClientSession], kind: str,
                  window: Window) -> None:
        """One request of ``kind``; ``client``: a client (connection pool) per node."""
        self.in_flight += 1
        started = time.perf_counter()
        ok = False
        detail = ""
        self._next += 1
        first = self._next % len(self.bases)
        try:
            for attempt in range(len(self.bases) * 20):
                base = self.bases[(first + attempt) % len(self.bases)]
                try:
                    ok, detail = await getattr(self, f"_{kind}")(client[base], base)
                    break
                except _NotServed as exc:
                    if len(self.bases) == 1:
                        raise
                    self.redirected += 1
                    detail = f"not served: {exc}"
                    if attempt % len(self.bases) == len(self.bases) - 1:
                        # Every node refused it once: wait a little before the next round. A
                        # load balancer tries the next node at once (nginx's proxy_next_upstream).
                        await asyncio.sleep(0.05)
            else:
                ok = False
        except Exception as exc:  # transport errors count as errors, never stop the soak
            detail = f"{type(exc).__name__}: {exc}"
        finally:
            self.in_flight -= 1
        if self.trace is not None:
            self.trace.append((started - self.started_perf, kind, first,
                               time.perf_counter() - started if ok else None))
        if ok:
            elapsed = time.perf_counter() - started
            window.latencies.append(elapsed)
            window.by_kind.setdefault(kind, []).append(elapsed)
        else:
            if self.restarts and self.restarts[-1][1] >= time.perf_counter() - 30:
                self.restart_errors += 1  # during (or within 30 s after) a node restart
            window.errors += 1
            window.kinds[kind] = window.kinds.get(kind, 0) + 1
            if len(self.error_samples) < 20:
                self.error_samples.append(f"{kind}: {detail}"[:300])

    @staticmethod
    async def _request(session: aiohttp.ClientSession, method: str, url: str, **kwargs):
        """The response (its head read); :class:`_NotServed` when no answer began."""
        try:
            return await session.request(method, url, **kwargs)
        except (aiohttp.ClientConnectorError, aiohttp.ServerDisconnectedError) as exc:
            raise _NotServed(f"{type(exc).__name__}: {exc}") from exc
        except aiohttp.ClientOSError as exc:
            # Reset before any answer, or the request could not even be written: a node
            # shutting down closes its idle kept-alive connections, and a request crossing that
            # close is reset unread or cut off (the gateway reads a whole body before it acts,
            # and a node drains every request it has read before it exits; the failover tests
            # count at the agent that nothing runs twice). nginx's proxy_next_upstream treats
            # "an error passing a request" the same way. Any error once an answer began counts
            # as a failure.
            if exc.errno in (errno.ECONNRESET, errno.EPIPE) or "write request body" in str(exc):
                raise _NotServed(f"{type(exc).__name__}: {exc}") from exc
            raise

    def _rpc(self, method: str, text: str) -> dict:
        self.sequence += 1
        return {
            "jsonrpc": "2.0",
            "id": f"soak-{self.sequence}",
            "method": method,
            "params": {
                "message": {
                    "role": "user",
                    "messageId": f"m{self.sequence}",
                    "parts": [{"kind": "text", "text": text}],
                }
            },
        }

    async def _send(self, client, base):
        agent_id = random.choice(self.agent_ids)
        async with await self._request(
            client, "POST", f"{base}/a2a/{agent_id}",
            json=self._rpc("message/send", "hi"), headers=self._headers("caller"),
        ) as response:
            body = await response.read()
        ok = response.status == 200 and b'"result"' in body and b'"error"' not in body
        return ok, f"{response.status} {body[:200]!r}"

    async def _stream(self, client, base):
        agent_id = random.choice(self.agent_ids)
        body = b""
        async with await self._request(
            client, "POST", f"{base}/a2a/{agent_id}",
            headers=self._headers("caller"), json=self._rpc("message/stream", "task soak"),
        ) as response:
            async for chunk in response.content.iter_any():
                body += chunk
        ok = response.status == 200 and b'"completed"' in body and b'"error"' not in body
        return ok, f"{response.status} {body[-200:]!r}"

    async def _registry(self, client, method: str, url: str, ok: tuple[int, ...], **kwargs):
        """A registry call as the registrar: (answered with a status in ``ok``, detail)."""
        async with await self._request(client, method, url, headers=self._headers("registrar"),
                                       **kwargs) as response:
            body = await response.read()
        return response.status in ok, f"{response.status} {body[:200]!r}"

    async def _heartbeat(self, client, base):
        agent_id = random.choice(self.agent_ids)
        return await self._registry(client, "POST", f"{base}/api/v1/agents/{agent_id}/heartbeat",
                                    (200,))

    async def _churn(self, client, base):
        if self.churn and (len(self.churn) > 20 or random.random() < 0.5):
            agent_id = self.churn.pop(0)
            return await self._registry(client, "DELETE", f"{base}/api/v1/agents/{agent_id}",
                                        (204,))
        agent_id = f"churn-{os.urandom(4).hex()}"
        card = {"name": "Churn agent", "url": self.agent_url}
        ok, detail = await self._registry(
            client, "POST", f"{base}/api/v1/agents", (200, 201),
            json={"agent_id": agent_id, "url": self.agent_url, "card": card},
        )
        if ok:
            self.churn.append(agent_id)
        return ok, detail

    async def run(self, *, rate: float, seconds: float, interval: float, node_pid,
                  restart=None, restart_every: float = 0.0) -> None:
        """``node_pid``: the pid to sample RSS of (or a function answering it: nodes restart).
        ``restart(index)``: restarts node ``index`` (blocking), every ``restart_every`` s."""
        kinds = [k for k, _ in MIX]
        weights = [w for _, w in MIX]
        pid_of = node_pid if callable(node_pid) else (lambda: node_pid)
        self.started_perf = time.perf_counter()
        self.interval = interval
        # A connection pool per node, aiohttp's: httpx's (httpcore) scans every connection of
        # its pool for each queued request and, once a node restart left half-closed
        # connections in it, made the generator itself fall behind (5,000 requests queued in
        # the generator, the nodes idle). Idle connections are dropped well before the node's
        # keep-alive timeout (A2A_HTTP_KEEPALIVE_SECONDS, 5 s) would close them.
        async with contextlib.AsyncExitStack() as stack:
            client = {
                base: await stack.enter_async_context(aiohttp.ClientSession(
                    timeout=aiohttp.ClientTimeout(total=30),
                    connector=aiohttp.TCPConnector(limit=256, keepalive_timeout=2.0),
                ))
                for base in self.bases
            }
            loop = asyncio.get_running_loop()
            start = loop.time()
            restarter = None
            if restart is not None and restart_every > 0:
                restarter = loop.create_task(self._rolling(restart, restart_every,
                                                           start + seconds))
            window = Window(started=start)
            self.windows.append(window)
            tasks: set[asyncio.Task] = set()
            n = 0
            while True:
                due = start + n / rate
                now = loop.time()
                if due >= start + seconds:
                    break
                if due > now:
                    await asyncio.sleep(due - now)
                if loop.time() - window.started >= interval:
                    window.rss_kib = rss_kib(pid_of())
                    self._print(window, len(self.windows))
                    window = Window(started=window.started + interval)
                    self.windows.append(window)
                n += 1
                if self.in_flight >= MAX_IN_FLIGHT:
                    window.errors += 1
                    window.kinds["overload"] = window.kinds.get("overload", 0) + 1
                    continue
                task = loop.create_task(self.one(client, random.choices(kinds, weights)[0], window))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            if tasks:
                await asyncio.wait(tasks, timeout=60)
            if restarter is not None:
                restarter.cancel()
                await asyncio.gather(restarter, return_exceptions=True)
            window.rss_kib = rss_kib(pid_of())
            self._print(window, len(self.windows))

    async def _rolling(self, restart, every: float, end: float) -> None:
        """Restart every node in turn, every ``every`` seconds, until ``end`` - 10 s."""
        loop = asyncio.get_running_loop()
        while loop.time() + every < end - 10:
            await asyncio.sleep(every)
            for index in range(len(self.bases)):
                began = time.perf_counter()
                seconds = await asyncio.to_thread(restart, index)
                self.restarts.append((began, time.perf_counter()))
                print(f"restarted node {index} ({seconds:.1f} s until it served again)",
                      flush=True)
                await asyncio.sleep(5)

    @staticmethod
    def _print(window: Window, index: int) -> None:
        ms = [v * 1000 for v in window.latencies]
        rate = window.errors / window.requests if window.requests else 0.0
        print(
            f"window {index:3d}: {window.requests:7d} req  {window.errors:5d} err "
            f"({rate:.3%})  p50 {percentile(ms, 50):7.1f} ms  p99 {percentile(ms, 99):7.1f} ms"
            f"  RSS {window.rss_kib / 1024:7.1f} MiB  {window.kinds or ''}",
            flush=True,
        )
        print(
            "            p99 by kind: " + "  ".join(
                f"{kind} {percentile([v * 1000 for v in values], 99):.1f} ms"
                for kind, values in sorted(window.by_kind.items())
            ),
            flush=True,
        )


def summarize(soak: Soak, rate: float) -> dict:
    windows = soak.windows
    latencies = [v * 1000 for w in windows for v in w.latencies]
    requests = sum(w.requests for w in windows)
    errors = sum(w.errors for w in windows)
    first = 0
    if soak.restarts:  # RSS of a restarted node: from the first full window after the last
        last = soak.restarts[-1][1] - soak.started_perf
        first = min(int(last // soak.interval) + 1, len(windows) - 1)
    baseline = windows[first].rss_kib if len(windows) > first + 1 else windows[-1].rss_kib
    growth = (windows[-1].rss_kib - baseline) / baseline if baseline else 0.0
    if soak.restarts and first >= len(windows) - 1:
        growth = None  # no full window after the last restart: not measured
    return {
        "rate": rate,
        "requests": requests,
        "errors": errors,
        "error_rate": errors / requests if requests else 0.0,
        "p50_ms": percentile(latencies, 50),
        "p99_ms": percentile(latencies, 99),
        "rss_first_window_kib": baseline,
        "rss_end_kib": windows[-1].rss_kib,
        "rss_growth": growth,
        "windows": [
            {
                "requests": w.requests,
                "errors": w.errors,
                "kinds": w.kinds,
                "p50_ms": percentile([v * 1000 for v in w.latencies], 50),
                "p99_ms": percentile([v * 1000 for v in w.latencies], 99),
                "rss_kib": w.rss_kib,
                "p99_ms_by_kind": {
                    kind: percentile([v * 1000 for v in values], 99)
                    for kind, values in sorted(w.by_kind.items())
                },
            }
            for w in windows
        ],
        "error_samples": soak.error_samples,
        "nodes": len(soak.bases),
        "node_restarts": len(soak.restarts),
        "failed_during_restarts": soak.restart_errors,
        "redirected_to_other_node": soak.redirected,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--rate", type=float, default=200.0, help="requests per second")
    parser.add_argument("--interval", type=float, default=60.0, help="report window, seconds")
    parser.add_argument("--server", choices=["uvicorn", "daphne"], default="uvicorn")
    parser.add_argument("--agents", type=int, default=2, help="real a2a-sdk agents")
    parser.add_argument(
        "--distributed",
        action="store_true",
        help="PostgreSQL (a throwaway DB next to DATABASE_URL) and REDIS_URL",
    )
    parser.add_argument("--nodes", type=int, default=1, choices=[1, 2],
                        help="2: two nodes on the same database and Redis (needs --distributed)")
    parser.add_argument("--rolling-restart", type=float, default=0.0, metavar="SECONDS",
                        help="restart every node in turn (SIGTERM) every SECONDS (--nodes 2)")
    parser.add_argument(
        "--results", type=Path, default=None,
        help="where the result JSON goes (default bench/results/; the CI soak: test-artifacts/)",
    )
    parser.add_argument(
        "--trace", type=Path, default=None, metavar="FILE",
        help="write every request (start, kind, node, latency) and the restarts as JSON",
    )
    parser.add_argument(
        "--keep-logs", type=Path, default=None, metavar="DIR",
        help="copy the nodes' logs into DIR at the end",
    )
    parser.add_argument(
        "--check", action="store_true", help="exit 1 if errors > 0.1 %% or RSS growth > 10 %%"
    )
    args = parser.parse_args()
    if args.nodes > 1 and not args.distributed:
        parser.error("--nodes 2 needs --distributed")
    if args.rolling_restart and args.nodes < 2:
        parser.error("--rolling-restart needs --nodes 2")
    # One node: pinned to core 0, this generator (and the agents it starts) to core 1. Two
    # nodes: nothing pinned -- the nodes, agents, PostgreSQL, Redis and the generator share the
    # cores as a small cluster on one host would (two nodes pinned to one core measured the
    # core's contention, each restart starving the surviving node while the other booted).
    cores = SERVER_CORE
    if args.nodes == 1:
        pin_self_to_load_core()
    else:
        cores = f"0-{(os.cpu_count() or 1) - 1}"
    db_name = admin_url = None
    agents = [AgentProcess(steps=3, step_delay=0.02) for _ in range(args.agents)]
    with temp_dir("a2a-soak-") as tmp_name:
        try:
            extra: dict[str, str] = {"A2A_NODE_HEARTBEAT_SECONDS": "5"}
            database_url = None
            if args.distributed:
                admin_url, redis_url = os.environ.get("DATABASE_URL"), os.environ.get("REDIS_URL")
                if not admin_url or not redis_url:
                    parser.error("--distributed needs DATABASE_URL and REDIS_URL")
                database_url, db_name = create_postgres_db(admin_url)
                extra["REDIS_URL"] = redis_url
            node = PlatformNode(
                "soak-node", Path(tmp_name), extra_env=extra, database_url=database_url
            )
            admin, registrar, caller = node.prepare()
            proc = node.serve(args.server, core=cores)
            nodes = [node]
            if args.nodes == 2:
                second = PlatformNode(
                    "soak-node-2", Path(tmp_name), extra_env=extra, database_url=database_url
                )
                second.serve(args.server, core=cores)
                nodes.append(second)
            for agent in agents:
                agent.start()
            agent_ids = []
            with httpx.Client(timeout=30) as client:
                for index, agent in enumerate(agents):
                    agent_id = f"soak-{index}-{os.urandom(2).hex()}"
                    response = client.post(
                        f"{nodes[index % len(nodes)].url}/api/v1/agents",
                        headers={"Authorization": f"Bearer {registrar}"},
                        json={
                            "agent_id": agent_id,
                            "url": agent.url,
                            "ttl_seconds": 3600,
                            "max_concurrency": 1000,
                            "card": {"name": "Soak agent", "url": agent.url},
                        },
                    )
                    response.raise_for_status()
                    agent_ids.append(agent_id)
            soak = Soak(
                [n.url for n in nodes],
                {"admin": admin, "registrar": registrar, "caller": caller},
                agent_ids,
                agents[0].url,
            )
            print(
                f"soak: {args.rate:.0f} req/s open loop for {args.minutes} min against "
                f"{', '.join(n.url for n in nodes)} "
                f"({'distributed' if args.distributed else 'embedded'}, {args.server}), "
                f"{len(agents)} agents"
                + (f", rolling restart every {args.rolling_restart:g} s"
                   if args.rolling_restart else ""),
                flush=True,
            )

            def restart(index: int) -> float:
                """SIGTERM node ``index``, wait for it to exit, start it again (same port)."""
                target = nodes[index]
                began = time.perf_counter()
                target.proc.popen.send_signal(signal.SIGTERM)
                try:
                    target.proc.popen.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    target.proc.stop()
                target.serve(args.server, core=cores)
                return time.perf_counter() - began

            if args.trace:
                soak.trace = []
            asyncio.run(
                soak.run(
                    rate=args.rate,
                    seconds=args.minutes * 60,
                    interval=args.interval,
                    node_pid=lambda: nodes[0].proc.pid,
                    restart=restart if args.rolling_restart else None,
                    restart_every=args.rolling_restart,
                )
            )
            summary = summarize(soak, args.rate)
            if args.trace:
                restarts = [(a - soak.started_perf, b - soak.started_perf)
                            for a, b in soak.restarts]
                args.trace.write_text(orjson.dumps({"restarts": restarts,
                                                    "requests": soak.trace}).decode())
            if args.keep_logs:
                args.keep_logs.mkdir(parents=True, exist_ok=True)
                for log in Path(tmp_name).glob("*.log"):
                    shutil.copyfile(log, args.keep_logs / log.name)
        finally:
            for agent in agents:
                agent.kill()
            for started in locals().get("nodes") or []:
                if started.proc is not None:
                    started.proc.stop()
            if db_name and admin_url:
                drop_postgres_db(admin_url, db_name)
    print(
        f"total: {summary['requests']} requests, {summary['errors']} errors "
        f"({summary['error_rate']:.3%}, target <= {ERROR_TARGET:.1%}); "
        f"p50 {summary['p50_ms']:.1f} ms, p99 {summary['p99_ms']:.1f} ms "
        f"(target < {P99_TARGET_MS:.0f} ms at 200 req/s); RSS growth after warm-up "
        + (f"{summary['rss_growth']:+.1%}" if summary["rss_growth"] is not None
           else "not measured (no full window after the last restart)")
        + f" (target <= {RSS_TARGET:.0%})"
    )
    if summary["nodes"] > 1:
        print(f"nodes: {summary['nodes']}, restarts: {summary['node_restarts']}, failed calls "
              f"during restarts: {summary['failed_during_restarts']}, requests sent to the "
              f"other node, not taken by the restarting one: {summary['redirected_to_other_node']}")
    for sample in summary["error_samples"][:5]:
        print(f"  error sample: {sample}")
    path = write_results("soak", {"machine": machine_info(),
                                 "args": {**vars(args), "results": str(args.results or ""),
                                          "trace": str(args.trace or ""),
                                          "keep_logs": str(args.keep_logs or "")},
                                 **summary}, args.results)
    print(f"results: {path}")
    if args.check and (summary["error_rate"] > ERROR_TARGET
                       or (summary["rss_growth"] or 0.0) > RSS_TARGET):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
