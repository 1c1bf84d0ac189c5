"""Scale benchmark: the routing table and the subscribers at 100,000 agents, in one process.

No server: a real :class:`gateway.runtime.GatewayNode` (in-memory channel layer) over a real
database (SQLite in a temp folder, or PostgreSQL with ``--postgres``: a throwaway bench database
is created and dropped). ``--agents`` rows (default 100,000) are bulk-inserted (registering
100,000 agents through the API would measure registration, not the table). Measured:

1. **Routing-table memory**: bytes per route and in all (``tracemalloc``: the table's dict,
   its ``AgentRoute`` objects and their strings), plus the process's RSS growth.
2. **Resync time** on a running node, each with the event loop's worst stall while it ran (a
   1 ms ticker on the loop records the longest gap between its ticks): a full reload of every
   agent, an incremental resync with nothing changed, and one with ``--changed`` rows changed
   (the read runs in a worker thread; the loop only applies the changes).
3. **Subscriber memory per agent**: ``--owned`` agents (default 10,000) moved to this node;
   the incremental resync that sees the move spawns their virtual subscribers; the traced
   memory growth divided by their number (in-memory channel layer; each subscriber's task
   waits on its channel).
4. **Admin agent list page** as a logged-in superuser (Django's test client, the whole
   middleware stack and template rendering, no network): the first page, a search, a filter
   and a sort by a column, each ``--admin-rounds`` times (median and worst ms) with its number
   of SQL queries and the slowest query. The reference is the same pages measured in the same
   run with ``--admin-reference`` agents (default 1,000) inserted, before the rest; both see
   the same per-minute statistics rows (one for each of the first 1,000 agents).

    .venv/bin/python bench/scale_bench.py [--agents 100000] [--owned 10000] [--postgres]
        [--admin-rounds 7] [--admin-reference 1000]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (  # noqa: E402
    create_postgres_db,
    drop_postgres_db,
    machine_info,
    rss_kib,
    write_results,
)

NODE = "scale-node"


def _setup_django(tmp: str, database_url: str | None) -> None:
    if database_url:
        os.environ["DATABASE_URL"] = database_url
        os.environ["A2A_SINGLE_NODE"] = "true"
    else:
        os.environ.pop("DATABASE_URL", None)
        os.environ["A2A_SQLITE_PATH"] = os.path.join(tmp, "scale.sqlite3")
    os.environ["DJANGO_SETTINGS_MODULE"] = "config.settings"
    os.environ.setdefault("SECRET_KEY", "bench-only-not-secret")
    os.environ["LOG_LEVEL"] = "WARNING"  # the node's per-resync line would be timed too
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def _insert_agents(count: int, start: int = 0) -> float:
    from datetime import timedelta

    from django.utils import timezone

    from registry.models import Agent

    now = timezone.now()
    started = time.perf_counter()
    batch: list[Agent] = []
    for index in range(start, start + count):
        agent_id = f"scale-{index:06d}"
        url = f"http://10.0.{index // 250 % 256}.{index % 250}:8000/"
        batch.append(
            Agent(
                agent_id=agent_id,
                name=agent_id,
                url=url,
                card={"name": agent_id},
                card_raw="{}",
                card_sha256=f"{index:064x}",
                card_shape="a2a-0.3",
                ttl_seconds=86400,
                max_concurrency=10,
                registered_at=now,
                last_seen=now,
                expires_at=now + timedelta(days=1),
                node_id="other-node",
                routing_changed_at=now - timedelta(hours=1),
            )
        )
        if len(batch) == 5000:
            Agent.objects.bulk_create(batch)
            batch = []
    if batch:
        Agent.objects.bulk_create(batch)
    return time.perf_counter() - started


#: The admin changelist pages timed: (name, query parameters). Every agent is on "other-node",
#: so the filter matches (and counts) every row; the search matches one agent but scans all.
ADMIN_PAGES = (
    ("first_page", {}),
    ("search", {"q": "scale-000421"}),
    ("filter_node", {"node_id": "other-node"}),
    ("sorted_last_seen_desc", {"o": "-4"}),
    ("sorted_requests_desc", {"o": "-6"}),
)


def _insert_stats(count: int) -> None:
    """One per-minute statistics row, in the list's 15-minute window, for each of ``count``
    agents: the list's traffic columns then have rows to read."""
    from django.utils import timezone

    from console.models import AgentMinute
    from gateway.histogram import BUCKETS

    minute = timezone.now().replace(second=0, microsecond=0)
    AgentMinute.objects.bulk_create(
        [
            AgentMinute(
                agent_id=f"scale-{i:06d}", node_id=NODE, minute=minute, requests=i % 97 + 1,
                errors_executed=i % 5, histogram=[0] * BUCKETS, last_call_at=minute,
                last_outcome="ok",
            )
            for i in range(count)
        ],
        batch_size=2000,
    )


def admin_figures(rounds: int) -> dict:
    """Each page of :data:`ADMIN_PAGES`: median and worst ms over ``rounds`` (after one warm-up
    request) and this process's median CPU time (the machine is shared: wall time includes
    waiting for a core; with SQLite the CPU time includes the queries, with PostgreSQL not),
    its SQL query count, the slowest query's ms and the rows shown."""
    import statistics

    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext
    from django.urls import reverse

    user, _ = get_user_model().objects.get_or_create(
        username="scale-bench-admin", defaults={"is_staff": True, "is_superuser": True}
    )
    client = Client()
    client.force_login(user)
    url = reverse("admin:registry_agent_changelist")
    out: dict = {}
    for name, params in ADMIN_PAGES:
        client.get(url, params)
        times: list[float] = []
        cpu: list[float] = []
        slowest: dict = {}
        for _ in range(rounds):
            with CaptureQueriesContext(connection) as ctx:
                started, cpu_started = time.perf_counter(), time.process_time()
                response = client.get(url, params)
                times.append(time.perf_counter() - started)
                cpu.append(time.process_time() - cpu_started)
            if response.status_code != 200:
                raise SystemExit(f"admin {name}: HTTP {response.status_code}")
            worst = max(ctx.captured_queries, key=lambda q: float(q["time"]))
            if float(worst["time"]) >= float(slowest.get("time", -1)):
                slowest = worst
        out[name] = {
            "params": params,
            "median_ms": round(statistics.median(times) * 1e3, 1),
            "worst_ms": round(max(times) * 1e3, 1),
            "median_cpu_ms": round(statistics.median(cpu) * 1e3, 1),
            "queries": len(ctx.captured_queries),
            "slowest_query_ms": round(float(slowest["time"]) * 1e3, 1),
            "slowest_query": slowest["sql"][:300],
            "rows_shown": response.content.count(b'class="field-agent_id"'),
        }
    return out


def _print_admin(label: str, pages: dict) -> None:
    for name, page in pages.items():
        print(
            f"admin {label} {name}: median {page['median_ms']} ms (worst {page['worst_ms']}, "
            f"this process's CPU {page['median_cpu_ms']} ms), "
            f"{page['queries']} queries, slowest {page['slowest_query_ms']} ms, "
            f"{page['rows_shown']} rows",
            flush=True,
        )


def _traced() -> int:
    gc.collect()
    return tracemalloc.get_traced_memory()[0]


def _analyze(db_url: str | None) -> None:
    """PostgreSQL: fresh planner statistics after the bulk insert (autovacuum would get there
    a little later). SQLite is left as Django leaves it (no ANALYZE)."""
    from django.db import connection

    if not db_url:
        return
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")


def table_memory() -> dict:
    """Bytes the routing table holds for every agent (a fresh table, a full load)."""
    from gateway.conf import NodeSettings
    from gateway.routing_table import RoutingTable
    from registry import selectors

    rss_before = rss_kib(os.getpid())
    tracemalloc.start()
    base = _traced()
    table = RoutingTable(NodeSettings.from_django(NODE_ID=NODE))
    table.begin_resync()
    table.finish_resync(selectors.agent_routes())
    held = _traced() - base
    tracemalloc.stop()
    rss_growth = rss_kib(os.getpid()) - rss_before
    routes = len(table)
    del table
    return {
        "routes": routes,
        "traced_bytes": held,
        "bytes_per_route": round(held / routes, 1),
        "traced_mib": round(held / 2**20, 1),
        "rss_growth_mib": round(rss_growth / 1024, 1),
    }


class LoopLag:
    """The longest gap between the ticks of a 1 ms ticker on the loop: how long the loop was
    blocked (a gap of 1 ms is an idle loop); and the cyclic GC's collections meanwhile (the
    longest one and how many were full, generation 2), to tell a GC pause from our code."""

    def __init__(self) -> None:
        self.worst = 0.0
        self._task: asyncio.Task | None = None
        self._gc_started = 0.0
        self.gc_worst = 0.0
        self.gc_full = 0

    def _on_gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._gc_started = time.perf_counter()
            return
        self.gc_worst = max(self.gc_worst, time.perf_counter() - self._gc_started)
        self.gc_full += info["generation"] == 2

    async def _tick(self) -> None:
        loop = asyncio.get_running_loop()
        last = loop.time()
        while True:
            await asyncio.sleep(0.001)
            now = loop.time()
            self.worst = max(self.worst, now - last)
            last = now

    async def measure(self, coro) -> dict:
        self.worst = self.gc_worst = 0.0
        self.gc_full = 0
        self._task = asyncio.create_task(self._tick())
        await asyncio.sleep(0.01)
        gc.callbacks.append(self._on_gc)
        started = time.perf_counter()
        try:
            await coro
        finally:
            gc.callbacks.remove(self._on_gc)
        elapsed = time.perf_counter() - started
        await asyncio.sleep(0.01)
        self._task.cancel()
        return {
            "seconds": round(elapsed, 3),
            "worst_loop_stall_ms": round(self.worst * 1e3, 1),
            "worst_gc_pause_ms": round(self.gc_worst * 1e3, 1),
            "full_gc_collections": self.gc_full,
        }


async def node_figures(args) -> dict:
    from asgiref.sync import sync_to_async
    from django.db.models import F
    from django.utils import timezone

    from gateway.conf import NodeSettings
    from gateway.layers import InMemoryChannelLayer
    from gateway.runtime import GatewayNode
    from registry.models import Agent

    settings = NodeSettings.from_django().but(
        NODE_ID=NODE,
        A2A_ROUTING_RESYNC_SECONDS=3600,
        A2A_ROUTING_FULL_RESYNC_SECONDS=3600,
        A2A_GC_FREEZE=True,
    )
    node = GatewayNode(settings, layer=InMemoryChannelLayer(), broadcast=False)
    lag = LoopLag()
    out: dict = {}
    try:
        out["start_with_full_load"] = await lag.measure(node.start())
        out["routes"] = len(node.table)
        out["full_resync"] = await lag.measure(node.resync(full=True))
        out["incremental_resync_nothing_changed"] = await lag.measure(node.resync())

        def change(ids: list[str], **values) -> int:
            return Agent.objects.filter(agent_id__in=ids).update(
                routing_changed_at=timezone.now(), **values
            )

        changed_ids = [f"scale-{i:06d}" for i in range(args.owned, args.owned + args.changed)]
        await sync_to_async(change)(changed_ids, max_concurrency=F("max_concurrency") + 1)
        incremental = await lag.measure(node.resync())
        incremental["changed_rows"] = args.changed
        out["incremental_resync_changed"] = incremental

        # Subscribers: move --owned agents to this node; the incremental resync spawns them.
        owned_ids = [f"scale-{i:06d}" for i in range(args.owned)]
        tracemalloc.start()
        base = _traced()
        rss_before = rss_kib(os.getpid())
        await sync_to_async(change)(owned_ids, node_id=NODE)
        spawn = await lag.measure(node.resync())
        await asyncio.sleep(1.0)  # every subscriber's task started and waiting on its channel
        held = _traced() - base
        rss_growth = rss_kib(os.getpid()) - rss_before
        tracemalloc.stop()
        subscribers = len(node.manager.subscribers)
        out["subscribers"] = {
            "spawned": subscribers,
            "resync": spawn,
            "traced_bytes": held,
            "bytes_per_subscriber": round(held / subscribers, 1) if subscribers else None,
            "rss_growth_mib": round(rss_growth / 1024, 1),
            "rss_per_subscriber_bytes": round(rss_growth * 1024 / subscribers, 1)
            if subscribers
            else None,
        }
    finally:
        await node.stop()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", type=int, default=100_000)
    parser.add_argument(
        "--owned",
        type=int,
        default=10_000,
        help="agents moved to the node to measure subscriber memory",
    )
    parser.add_argument(
        "--changed",
        type=int,
        default=1_000,
        help="rows changed before the measured incremental resync",
    )
    parser.add_argument("--admin-rounds", type=int, default=7)
    parser.add_argument(
        "--admin-reference",
        type=int,
        default=1_000,
        help="agents inserted when the admin pages' reference is measured",
    )
    parser.add_argument(
        "--postgres",
        action="store_true",
        help="PostgreSQL at --postgres-url (a bench database is created)",
    )
    parser.add_argument("--postgres-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    args = parser.parse_args()
    if args.owned + args.changed > args.agents:
        parser.error("--owned + --changed must not exceed --agents")
    if not 1_000 <= args.admin_reference < args.agents:
        parser.error("--admin-reference must be at least 1000 and below --agents")
    started = time.time()
    db_url, db_name = create_postgres_db(args.postgres_url) if args.postgres else (None, None)
    try:
        with tempfile.TemporaryDirectory(prefix="a2a-scale-bench-") as tmp:
            _setup_django(tmp, db_url)
            reference = args.admin_reference
            insert_seconds = _insert_agents(reference)
            _insert_stats(1_000)
            admin_reference = admin_figures(args.admin_rounds)
            _print_admin(f"{reference} agents", admin_reference)
            insert_seconds += _insert_agents(args.agents - reference, start=reference)
            print(f"inserted {args.agents} agents in {insert_seconds:.1f} s", flush=True)
            _analyze(db_url)
            admin = admin_figures(args.admin_rounds)
            _print_admin(f"{args.agents} agents", admin)
            table = table_memory()
            print(
                f"routing table: {table['routes']} routes, {table['traced_mib']} MiB traced "
                f"({table['bytes_per_route']} B/route), RSS +{table['rss_growth_mib']} MiB",
                flush=True,
            )
            node = asyncio.run(node_figures(args))
            from django.db import connections

            connections.close_all()
    finally:
        if db_name:
            drop_postgres_db(args.postgres_url, db_name)
    for key in (
        "start_with_full_load",
        "full_resync",
        "incremental_resync_nothing_changed",
        "incremental_resync_changed",
    ):
        run = node[key]
        print(
            f"{key}: {run['seconds']} s, worst loop stall {run['worst_loop_stall_ms']} ms "
            f"(worst GC pause {run['worst_gc_pause_ms']} ms, {run['full_gc_collections']} full)"
        )
    subs = node["subscribers"]
    print(
        f"subscribers: {subs['spawned']} spawned, {subs['bytes_per_subscriber']} B each traced, "
        f"RSS {subs['rss_per_subscriber_bytes']} B each; spawning resync {subs['resync']}"
    )
    result = {
        "benchmark": "scale",
        "database": "postgresql" if db_url else "sqlite",
        "agents": args.agents,
        "owned": args.owned,
        "changed": args.changed,
        "machine": machine_info(),
        "insert_seconds": round(insert_seconds, 1),
        "routing_table": table,
        **node,
        "admin_changelist": {
            "rounds": args.admin_rounds,
            "reference_agents": args.admin_reference,
            "reference": admin_reference,
            "at_agents": admin,
        },
        "elapsed_s": round(time.time() - started, 1),
    }
    path = write_results(f"scale-{result['database']}", result)
    print(f"wrote {path} ({result['elapsed_s']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
