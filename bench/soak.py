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
import os
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (  # noqa: E402
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

    @property
    def requests(self) -> int:
        return len(self.latencies) + self.errors


class Soak:
    def __init__(
        self, base: str, tokens: dict[str, str], agent_ids: list[str], agent_url: str
    ) -> None:
        self.base = base
        self.tokens = tokens
        self.agent_ids = agent_ids
        self.agent_url = agent_url
        self.in_flight = 0
        self.churn: list[str] = []
        self.sequence = 0
        self.windows: list[Window] = []
        self.error_samples: list[str] = []

    def _headers(self, role: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens[role]}"}

    async def one(self, client: httpx.AsyncClient, kind: str, window: Window) -> None:
        self.in_flight += 1
        started = time.perf_counter()
        ok = False
        detail = ""
        try:
            ok, detail = await getattr(self, f"_{kind}")(client)
        except Exception as exc:  # transport errors count as errors, never stop the soak
            detail = f"{type(exc).__name__}: {exc}"
        finally:
            self.in_flight -= 1
        if ok:
            window.latencies.append(time.perf_counter() - started)
        else:
            window.errors += 1
            window.kinds[kind] = window.kinds.get(kind, 0) + 1
            if len(self.error_samples) < 20:
                self.error_samples.append(f"{kind}: {detail}"[:300])

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

    async def _send(self, client):
        agent_id = random.choice(self.agent_ids)
        response = await client.post(
            f"/a2a/{agent_id}",
            json=self._rpc("message/send", "hi"),
            headers=self._headers("caller"),
        )
        ok = response.status_code == 200 and "result" in response.json()
        return ok, f"{response.status_code} {response.text[:200]}"

    async def _stream(self, client):
        agent_id = random.choice(self.agent_ids)
        body = b""
        async with client.stream(
            "POST",
            f"/a2a/{agent_id}",
            headers=self._headers("caller"),
            json=self._rpc("message/stream", "task soak"),
        ) as response:
            async for chunk in response.aiter_raw():
                body += chunk
        ok = response.status_code == 200 and b'"completed"' in body and b'"error"' not in body
        return ok, f"{response.status_code} {body[-200:]!r}"

    async def _heartbeat(self, client):
        agent_id = random.choice(self.agent_ids)
        response = await client.post(
            f"/api/v1/agents/{agent_id}/heartbeat", headers=self._headers("registrar")
        )
        return response.status_code == 200, f"{response.status_code} {response.text[:200]}"

    async def _churn(self, client):
        if self.churn and (len(self.churn) > 20 or random.random() < 0.5):
            agent_id = self.churn.pop(0)
            response = await client.delete(
                f"/api/v1/agents/{agent_id}", headers=self._headers("registrar")
            )
            return response.status_code == 204, f"{response.status_code} {response.text[:200]}"
        agent_id = f"churn-{os.urandom(4).hex()}"
        response = await client.post(
            "/api/v1/agents",
            headers=self._headers("registrar"),
            json={
                "agent_id": agent_id,
                "url": self.agent_url,
                "card": {"name": "Churn agent", "url": self.agent_url},
            },
        )
        if response.status_code in (200, 201):
            self.churn.append(agent_id)
            return True, ""
        return False, f"{response.status_code} {response.text[:200]}"

    async def run(self, *, rate: float, seconds: float, interval: float, node_pid: int) -> None:
        kinds = [k for k, _ in MIX]
        weights = [w for _, w in MIX]
        limits = httpx.Limits(max_connections=1000, max_keepalive_connections=200)
        async with httpx.AsyncClient(base_url=self.base, timeout=30, limits=limits) as client:
            loop = asyncio.get_running_loop()
            start = loop.time()
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
                    window.rss_kib = rss_kib(node_pid)
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
            window.rss_kib = rss_kib(node_pid)
            self._print(window, len(self.windows))

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


def summarize(soak: Soak, rate: float) -> dict:
    windows = soak.windows
    latencies = [v * 1000 for w in windows for v in w.latencies]
    requests = sum(w.requests for w in windows)
    errors = sum(w.errors for w in windows)
    baseline = windows[0].rss_kib if len(windows) > 1 else windows[-1].rss_kib
    growth = (windows[-1].rss_kib - baseline) / baseline if baseline else 0.0
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
            }
            for w in windows
        ],
        "error_samples": soak.error_samples,
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
    parser.add_argument(
        "--results", type=Path, default=None,
        help="where the result JSON goes (default bench/results/; the CI soak: test-artifacts/)",
    )
    parser.add_argument(
        "--check", action="store_true", help="exit 1 if errors > 0.1 %% or RSS growth > 10 %%"
    )
    args = parser.parse_args()
    pin_self_to_load_core()
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
            proc = node.serve(args.server)
            for agent in agents:
                agent.start()
            agent_ids = []
            with httpx.Client(base_url=node.url, timeout=30) as client:
                for index, agent in enumerate(agents):
                    agent_id = f"soak-{index}-{os.urandom(2).hex()}"
                    response = client.post(
                        "/api/v1/agents",
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
                node.url,
                {"admin": admin, "registrar": registrar, "caller": caller},
                agent_ids,
                agents[0].url,
            )
            print(
                f"soak: {args.rate:.0f} req/s open loop for {args.minutes} min against "
                f"{node.url} ({'distributed' if args.distributed else 'embedded'}, "
                f"{args.server}), {len(agents)} agents",
                flush=True,
            )
            asyncio.run(
                soak.run(
                    rate=args.rate,
                    seconds=args.minutes * 60,
                    interval=args.interval,
                    node_pid=proc.pid,
                )
            )
            summary = summarize(soak, args.rate)
        finally:
            for agent in agents:
                agent.kill()
            if node_proc := locals().get("proc"):
                node_proc.stop()
            if db_name and admin_url:
                drop_postgres_db(admin_url, db_name)
    print(
        f"total: {summary['requests']} requests, {summary['errors']} errors "
        f"({summary['error_rate']:.3%}, target <= {ERROR_TARGET:.1%}); "
        f"p50 {summary['p50_ms']:.1f} ms, p99 {summary['p99_ms']:.1f} ms "
        f"(target < {P99_TARGET_MS:.0f} ms at 200 req/s); RSS growth after warm-up "
        f"{summary['rss_growth']:+.1%} (target <= {RSS_TARGET:.0%})"
    )
    for sample in summary["error_samples"][:5]:
        print(f"  error sample: {sample}")
    path = write_results("soak", {"machine": machine_info(),
                                 "args": {**vars(args), "results": str(args.results or "")},
                                 **summary}, args.results)
    print(f"results: {path}")
    if args.check and (summary["error_rate"] > ERROR_TARGET or summary["rss_growth"] > RSS_TARGET):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
