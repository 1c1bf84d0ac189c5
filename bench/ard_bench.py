"""ARD benchmark: ``POST /ard/v1/search`` over 10,000 agents, and ``ai-catalog.json`` generation.

A node (its own data dir in a temp folder; SQLite by default, PostgreSQL with ``--postgres`` in
a bench database created here and dropped at the end) runs ``manage.py serve`` pinned to core 0;
this script's load generator runs on core 1. Phases:

1. register ``--agents`` agents (default 10,000) through ``POST /api/v1/agents`` (c=32): the 30
   realistic cards of tests/ard/corpus.py, each copy with its own name and a few extra words,
   all public (the search index is fed by the registry's events, as in production);
2. search, closed loop at c=1 and c=8 for ``--seconds`` each: the 30 natural-language queries of
   the relevance test in turn, anonymous; p50/p99 latency and requests/s; meanwhile a probe
   GETs ``/healthz`` every 20 ms (the node's other requests), its p50/p99 reported next to the
   same probe on the idle node (``probe_idle``);
3. ``ai-catalog.json``: generation time of the whole manifest in the node's own environment
   (``manage.py shell``, cache cleared each round, median and max of ``--catalog-rounds``), then
   HTTP GETs: warm (cached bytes) 200 and conditional 304.

    .venv/bin/python bench/ard_bench.py [--quick] [--postgres] [--server uvicorn]

``ARD_SEMANTIC=false`` in the environment serves the lexical ranking alone (the node inherits
it), to compare with the default hybrid ranking in the same conditions.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (  # noqa: E402
    PlatformNode,
    create_postgres_db,
    drop_postgres_db,
    keep_logs,
    machine_info,
    percentile,
    pin_self_to_load_core,
    temp_dir,
    write_results,
)
from tests.ard.corpus import CARDS, QUERIES  # noqa: E402

WORDS = (
    "global regional enterprise fast secure open premium local realtime smart "
    "assistant service tool api partner pro lite plus beta cloud"
).split()


def agent_card(index: int) -> tuple[str, dict]:
    """A distinct card per index, built on one of the 30 realistic ones."""
    base_id, base = list(CARDS.items())[index % len(CARDS)]
    rng = random.Random(index)
    extra = " ".join(rng.sample(WORDS, 3))
    card = {
        **base,
        "name": f"{base['name']} {index}",
        "description": f"{base['description']} {extra}.",
        "url": f"http://127.0.0.1:9/{base_id}-{index}",
    }
    return f"{base_id}-{index:05d}", card


def figures(latencies: list[float], seconds: float, statuses: dict) -> dict:
    return {
        "requests": len(latencies),
        "seconds": round(seconds, 2),
        "per_s": round(len(latencies) / seconds, 1) if seconds else 0.0,
        "p50_ms": round(percentile(latencies, 50) * 1e3, 2) if latencies else None,
        "p99_ms": round(percentile(latencies, 99) * 1e3, 2) if latencies else None,
        "statuses": {str(k): v for k, v in statuses.items()},
    }


async def register_all(session, base: str, token: str, count: int) -> dict:
    headers = {"Authorization": f"Bearer {token}"}
    queue: asyncio.Queue[int] = asyncio.Queue()
    for index in range(count):
        queue.put_nowait(index)
    statuses: dict = {}
    started = time.perf_counter()

    async def worker() -> None:
        while not queue.empty():
            agent_id, card = agent_card(queue.get_nowait())
            async with session.post(
                f"{base}/api/v1/agents",
                headers=headers,
                json={
                    "agent_id": agent_id,
                    "card": card,
                    "public": True,
                    "ttl_seconds": 86400,
                },
            ) as response:
                await response.read()
                statuses[response.status] = statuses.get(response.status, 0) + 1

    await asyncio.gather(*(worker() for _ in range(32)))
    seconds = time.perf_counter() - started
    return {
        "agents": count,
        "seconds": round(seconds, 1),
        "statuses": statuses,
        "per_s": round(count / seconds, 1),
    }


async def probe_loop(session, base: str, seconds: float) -> dict:
    """``GET /healthz`` every 20 ms for ``seconds``: how long the node's other requests wait."""
    latencies: list[float] = []
    statuses: dict = {}
    started = time.perf_counter()
    deadline = started + seconds
    while time.perf_counter() < deadline:
        t0 = time.perf_counter()
        async with session.get(f"{base}/healthz") as response:
            await response.read()
            statuses[response.status] = statuses.get(response.status, 0) + 1
        latencies.append(time.perf_counter() - t0)
        await asyncio.sleep(0.02)
    return figures(latencies, time.perf_counter() - started, statuses)


async def search_loop(session, base: str, concurrency: int, seconds: float) -> dict:
    latencies: list[float] = []
    statuses: dict = {}
    deadline = time.perf_counter() + seconds
    counter = iter(range(10**9))
    probe = asyncio.create_task(probe_loop(session, base, seconds))

    async def worker() -> None:
        while time.perf_counter() < deadline:
            text = QUERIES[next(counter) % len(QUERIES)][0]
            started = time.perf_counter()
            async with session.post(
                f"{base}/ard/v1/search", json={"query": {"text": text}, "pageSize": 10}
            ) as response:
                await response.read()
                statuses[response.status] = statuses.get(response.status, 0) + 1
            latencies.append(time.perf_counter() - started)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    out = figures(latencies, time.perf_counter() - started, statuses)
    out["probe_healthz"] = await probe
    return out


async def catalog_gets(session, base: str, rounds: int) -> dict:
    out = {}
    async with session.get(f"{base}/.well-known/ai-catalog.json") as response:
        body = await response.read()
        etag = response.headers["ETag"]
    out["bytes"] = len(body)
    out["entries"] = len(json.loads(body)["entries"])
    for name, headers in (("warm_200", {}), ("conditional_304", {"If-None-Match": etag})):
        latencies: list[float] = []
        statuses: dict = {}
        started = time.perf_counter()
        for _ in range(rounds):
            t0 = time.perf_counter()
            async with session.get(
                f"{base}/.well-known/ai-catalog.json", headers=headers
            ) as response:
                await response.read()
                statuses[response.status] = statuses.get(response.status, 0) + 1
            latencies.append(time.perf_counter() - t0)
        out[name] = figures(latencies, time.perf_counter() - started, statuses)
    return out


GENERATE = """
import json, statistics, time
from ard import catalog
times = []
for _ in range({rounds}):
    catalog._cache.clear()
    t0 = time.perf_counter()
    body, etag = catalog.catalog_bytes(actor=None, base_url="http://bench.example")
    times.append(time.perf_counter() - t0)
print(json.dumps({{"median_ms": round(statistics.median(times) * 1e3, 1),
                  "max_ms": round(max(times) * 1e3, 1), "rounds": {rounds},
                  "bytes": len(body), "entries": len(json.loads(body)["entries"])}}))
"""


async def run_load(base: str, registrar: str, args) -> dict:
    import aiohttp

    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(
        connector=connector, timeout=aiohttp.ClientTimeout(total=120)
    ) as session:
        registration = await register_all(session, base, registrar, args.agents)
        print(
            f"registered {args.agents} agents in {registration['seconds']} s "
            f"({registration['statuses']})",
            flush=True,
        )
        result: dict = {"registration": registration}
        result["probe_idle"] = await probe_loop(session, base, min(args.seconds, 3.0))
        print(f"probe /healthz, idle node: p50 {result['probe_idle']['p50_ms']} ms "
              f"p99 {result['probe_idle']['p99_ms']} ms", flush=True)
        for concurrency in (1, 8):
            figures_ = await search_loop(session, base, concurrency, args.seconds)
            result[f"search_c{concurrency}"] = figures_
            print(
                f"search c={concurrency}: {figures_['per_s']}/s p50 {figures_['p50_ms']} ms "
                f"p99 {figures_['p99_ms']} ms {figures_['statuses']}; probe /healthz meanwhile "
                f"p50 {figures_['probe_healthz']['p50_ms']} ms "
                f"p99 {figures_['probe_healthz']['p99_ms']} ms",
                flush=True,
            )
        result["catalog_http"] = await catalog_gets(session, base, args.catalog_rounds)
        warm = result["catalog_http"]["warm_200"]
        print(
            f"ai-catalog.json over HTTP ({result['catalog_http']['entries']} entries, "
            f"{result['catalog_http']['bytes']} bytes): warm 200 p50 {warm['p50_ms']} ms, "
            f"304 p50 {result['catalog_http']['conditional_304']['p50_ms']} ms",
            flush=True,
        )
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1,000 agents, short phases")
    parser.add_argument(
        "--postgres",
        action="store_true",
        help="PostgreSQL at --postgres-url (a bench database is created)",
    )
    parser.add_argument("--postgres-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--server", choices=["daphne", "uvicorn"], default="uvicorn")
    parser.add_argument("--agents", type=int)
    parser.add_argument("--seconds", type=float)
    parser.add_argument("--catalog-rounds", type=int)
    args = parser.parse_args()
    args.agents = args.agents or (1000 if args.quick else 10_000)
    args.seconds = args.seconds or (3 if args.quick else 15)
    args.catalog_rounds = args.catalog_rounds or (3 if args.quick else 10)
    pin_self_to_load_core()
    db_url, db_name = None, None
    if args.postgres:
        db_url, db_name = create_postgres_db(args.postgres_url)
    database = "postgresql" if db_url else "sqlite"
    try:
        with temp_dir("a2a-ard-bench-") as tmp_name:
            node = PlatformNode("ard-node", Path(tmp_name), database_url=db_url)
            _admin, registrar, _caller = node.prepare()
            proc = node.serve(args.server)
            try:
                load = asyncio.run(run_load(node.url, registrar, args))
            finally:
                proc.stop()
                keep_logs(Path(tmp_name), f"ard-{database}")
            generated = json.loads(
                node.manage("shell", "-c", GENERATE.format(rounds=args.catalog_rounds))
                .strip()
                .splitlines()[-1]
            )
            print(
                f"ai-catalog.json generation at {generated['entries'] - 1} agents: median "
                f"{generated['median_ms']} ms, max {generated['max_ms']} ms",
                flush=True,
            )
    finally:
        if db_name:
            drop_postgres_db(args.postgres_url, db_name)
    path = write_results(
        f"ard-{database}",
        {
            "benchmark": "ard",
            "database": database,
            "server": args.server,
            "agents": args.agents,
            "quick": args.quick,
            # the node's ranking: hybrid (default) or lexical alone (ARD_SEMANTIC=false)
            "ard_semantic": os.environ.get("ARD_SEMANTIC", "true"),
            "machine": machine_info(),
            "server_core": 0,
            "load_generator": "aiohttp (core 1)",
            **load,
            "catalog_generation": generated,
        },
    )
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
