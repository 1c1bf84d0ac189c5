"""Discovery benchmark: 10,000 endpoints served by one local card server.

    .venv/bin/python bench/discovery_bench.py [--endpoints 10000] [--workers 4] [--postgres]

Measures, against a reference taken in the same run:

1. the first full discovery cycle (every card fetched and parsed);
2. an all-304 cycle after every entry expired (target <= 10 s);
3. a mass expiry with several workers refreshing at once: exactly one fetch per URL
   (Redis locks when REDIS_URL is set, else threads sharing one process's cache);
4. snapshot digest over 10,000 agents (target <= 200 ms) and the snapshot build.

The reference for fetching is bare concurrent GETs of the same cards on the same shared client
(no caching logic, no database); for the digest, one sha256 over the same bytes. The card server
runs in its own process (uvicorn + httptools). The benchmark empties the discovery tables, so it
runs only on a database it created itself: a throwaway SQLite file, or with ``--postgres`` a
fresh PostgreSQL database created at ``--postgres-url`` and dropped at the end. With
``DATABASE_URL`` set it refuses to start. Results go to ``bench/results/discovery-*.json``.
Runtime is bounded by the endpoint count (about a minute for 10,000 on 2 cores).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import create_postgres_db, drop_postgres_db, write_results  # noqa: E402

WELL_KNOWN = "/.well-known/agent-card.json"

def _first_error(outcomes: list[dict]) -> str | None:
    for results in outcomes:
        for result in results.values():
            if result.error:
                return result.error
    return None


# --- the card server (runs in a subprocess; no Django) -----------------------------------------

_hits: dict[str, int] = {}


def _card_bytes(i: int, port: int) -> bytes:
    card = {
        "name": f"Agent {i}", "description": "bench", "url": f"http://127.0.0.1:{port}/a/{i}/",
        "version": "1.0.0", "protocolVersion": "0.3.0", "capabilities": {},
        "defaultInputModes": ["text/plain"], "defaultOutputModes": ["text/plain"],
        "skills": [{"id": f"s{i}", "name": "s", "description": "s",
                    "tags": ["bench", f"t{i % 50}"]}],
    }
    return json.dumps(card, sort_keys=True).encode()


async def card_app(scope, receive, send) -> None:
    """Cards at ``/a/{i}/.well-known/agent-card.json`` with ETag, max-age and 304; counts."""
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    path = scope["path"]
    if path == "/_counts":
        values = list(_hits.values())
        body = json.dumps({"total": sum(values), "paths": len(values),
                           "max": max(values, default=0), "min": min(values, default=0)}).encode()
        if scope["method"] == "DELETE":
            _hits.clear()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": body})
        return
    _hits[path] = _hits.get(path, 0) + 1
    i = int(path.split("/")[2])
    raw = _card_bytes(i, scope["server"][1])
    etag = f'"{hashlib.sha1(raw).hexdigest()}"'.encode()
    headers = [(b"etag", etag), (b"cache-control", b"max-age=300")]
    inm = next((v for k, v in scope["headers"] if k == b"if-none-match"), None)
    if inm == etag:
        await send({"type": "http.response.start", "status": 304, "headers": headers})
        await send({"type": "http.response.body", "body": b""})
        return
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"), *headers]})
    await send({"type": "http.response.body", "body": raw})


# --- the benchmark -------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _start_server(port: int) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "bench.discovery_bench:card_app", "--host",
         "127.0.0.1", "--port", str(port), "--http", "httptools", "--loop", "uvloop",
         "--log-level", "warning", "--no-access-log", "--backlog", "4096"],
        cwd=ROOT,
    )
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return proc
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError("card server did not start")


def _setup_django(tmp: str) -> None:
    if not os.environ.get("DATABASE_URL"):
        os.environ["A2A_SQLITE_PATH"] = os.path.join(tmp, "bench.sqlite3")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    os.environ.setdefault("SECRET_KEY", "bench-only-not-secret")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def _server_counts(base: str, reset: bool = False) -> dict:
    import httpx

    resp = httpx.request("DELETE" if reset else "GET", f"{base}/_counts", timeout=10)
    return resp.json()


def _reference_gets(urls: list[str]) -> float:
    """Bare concurrent GETs on the shared client: what fetching alone costs."""
    import asyncio

    from django.conf import settings

    from discovery import http

    async def go() -> None:
        client = http.async_client()
        gate = asyncio.Semaphore(settings.DISCOVERY_FETCH_CONCURRENCY)

        async def one(u: str) -> None:
            async with gate:
                (await client.get(u)).read()

        await asyncio.gather(*(one(u) for u in urls))

    start = time.perf_counter()
    http.run(go())
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--endpoints", type=int, default=10_000)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--postgres", action="store_true",
                        help="run on a fresh PostgreSQL database (created, then dropped)")
    parser.add_argument("--postgres-url", default="postgresql://postgres@127.0.0.1:5432/postgres",
                        help="the server (and an existing database to connect to) for --postgres")
    args = parser.parse_args()
    if os.environ.get("DATABASE_URL"):
        # It deletes every discovery row and discovery-sourced agent: never on a database
        # someone else owns.
        parser.error("DATABASE_URL is set: this benchmark empties the discovery tables and runs "
                     "only on a database it creates itself. Unset DATABASE_URL (SQLite in a "
                     "temp folder) or pass --postgres (a fresh database, dropped at the end).")
    n = args.endpoints
    tmp = tempfile.mkdtemp(prefix="discovery-bench-")
    created = None
    if args.postgres:
        url, created = create_postgres_db(args.postgres_url)
        os.environ["DATABASE_URL"] = url
        os.environ["A2A_SINGLE_NODE"] = "true"
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    server = _start_server(port)
    try:
        _setup_django(tmp)
        figures: dict = {"endpoints": n, "workers": args.workers,
                         "database": "postgresql" if created else "sqlite"}
        status = _run(n, args.workers, base, figures)
        print(f"wrote {write_results('discovery', figures)}")
        return status
    finally:
        server.terminate()
        server.wait(10)
        if created:
            from django.db import connections

            connections.close_all()
            drop_postgres_db(args.postgres_url, created)


def _run(n: int, workers: int, base: str, figures: dict) -> int:
    """Run the phases, print each, and record them in ``figures``."""
    from django.conf import settings

    from core.locks import LocalLocks, RedisLocks
    from discovery import models as m
    from discovery.card_cache import CardCache, Outcome
    from discovery.loop import run_cycle
    from discovery.snapshots import SelectedAgent, snapshot_digest, snapshot_publish
    from registry.models import Agent

    for model in (m.SessionPin, m.Snapshot, m.CardBlob, m.CardCacheEntry, m.EndpointHealth,
                  m.ConfiguredAgent, m.Need, m.CapabilityTag, m.AllowedHost, m.Alert):
        model.objects.all().delete()
    Agent.objects.filter(source=Agent.Source.DISCOVERY).delete()
    m.AllowedHost.objects.create(host="127.0.0.1", allow_http=True)
    m.ConfiguredAgent.objects.bulk_create(
        [m.ConfiguredAgent(kind="probe", local_name=f"agent_{i:05d}", url=f"{base}/a/{i}/",
                           description=f"Bench agent {i}.") for i in range(n)],
        batch_size=1000,
    )
    tag = m.CapabilityTag.objects.create(name="bench")
    m.Need.objects.create(tag=tag, input_modes=["text/plain"], output_modes=["text/plain"],
                          description="Bench need.")
    urls = [f"{base}/a/{i}{WELL_KNOWN}" for i in range(n)]
    mode = "redis" if settings.REDIS_URL else "embedded"
    print(f"discovery bench: {n} endpoints, one card server ({base}), mode={mode}, "
          f"fetch concurrency {settings.DISCOVERY_FETCH_CONCURRENCY}")

    ref = _reference_gets(urls)
    _server_counts(base, reset=True)
    print(f"reference: {n} bare concurrent GETs (no cache, no DB):   {ref:6.2f} s "
          f"({n / ref:,.0f}/s)")

    cache = CardCache()
    report = run_cycle(cache=cache)
    first = report.seconds
    served = _server_counts(base, reset=True)
    print(f"cycle 1, first full fetch:  {first:6.2f} s  fetched={report.fetched} "
          f"failed={report.failed} requests={served['total']} selected={report.selected} "
          f"(cap {report.capped} left out)  x{first / ref:.1f} reference")

    cache.expire_all()
    report = run_cycle(cache=cache)
    second = report.seconds
    served = _server_counts(base, reset=True)
    ok_304 = report.not_modified == n and served["total"] == n
    print(f"cycle 2, all 304:           {second:6.2f} s  not_modified={report.not_modified} "
          f"requests={served['total']} published={report.published}  x{second / ref:.1f} "
          f"reference  [target <= 10 s: {'OK' if second <= 10 and ok_304 else 'MISSED'}]")

    # Mass expiry: several workers notice every entry expired at once.
    if settings.REDIS_URL:
        caches = [CardCache(locks=RedisLocks(settings.REDIS_URL)) for _ in range(workers)]
        how = f"{workers} caches (separate in-flight maps) + Redis locks"
    else:
        shared = CardCache(locks=LocalLocks())
        caches = [shared] * workers
        how = f"{workers} threads sharing the process cache"
    caches[0].expire_all()
    barrier = threading.Barrier(workers)
    outcomes: list[dict] = []

    def worker(c: CardCache) -> None:
        from django.db import connection

        barrier.wait()
        outcomes.append(c.refresh_many(urls))
        connection.close()

    start = time.perf_counter()
    threads = [threading.Thread(target=worker, args=(c,)) for c in caches]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    mass = time.perf_counter() - start
    served = _server_counts(base, reset=True)
    single = served["total"] == n and served["max"] == 1 and served["paths"] == n
    shared_results = sum(1 for o in outcomes for r in o.values() if r.outcome == Outcome.SHARED)
    # A fetch that failed (e.g. timed out after the server answered) leaves its entry due, so
    # a worker that had not yet claimed that URL fetches it again: counted, not hidden.
    failed = sorted({u for o in outcomes for u, r in o.items() if r.outcome == Outcome.FAILED})
    example = f" e.g. {_first_error(outcomes)!r}" if failed else ""
    print(f"mass expiry, {how}: {mass:6.2f} s  requests={served['total']} for {n} URLs, "
          f"max per URL={served['max']}, shared results={shared_results}, "
          f"failed fetches={len(failed)}{example}  "
          f"[exactly one fetch per URL: {'OK' if single else 'MISSED'}]")

    # Snapshot digest and build over n agents.
    entries = cache.entries()
    agents = [
        SelectedAgent(local_name=f"agent_{i:05d}", description="d", agent_id=f"agent-{i:05d}",
                      card_sha256=entries[u].sha256, card_url=u, source="probe",
                      card=entries[u].card, raw=entries[u].raw)
        for i, u in enumerate(urls)
    ]
    pairs = [(a.local_name, a.card_sha256) for a in agents]
    blob = b"".join(f"{a}\0{b}\n".encode() for a, b in pairs)
    start = time.perf_counter()
    hashlib.sha256(blob).hexdigest()
    ref_digest = time.perf_counter() - start
    start = time.perf_counter()
    snapshot_digest(pairs)
    digest_s = time.perf_counter() - start
    start = time.perf_counter()
    snap, published = snapshot_publish(agents=agents)
    build_s = time.perf_counter() - start
    print(f"snapshot digest, {n} agents: {digest_s * 1000:6.1f} ms (reference one sha256 over "
          f"the same bytes {ref_digest * 1000:.1f} ms)  "
          f"[target <= 200 ms: {'OK' if digest_s <= 0.2 else 'MISSED'}]")
    print(f"snapshot build + publish (rows, {n} card blobs): {build_s:6.2f} s  v{snap.version} "
          f"published={published}")
    ok = second <= 10 and ok_304 and single and digest_s <= 0.2
    figures.update({
        "reference_get_s": round(ref, 3), "first_cycle_s": round(first, 3),
        "all_304_cycle_s": round(second, 3), "all_304_ok": ok_304,
        "mass_expiry_s": round(mass, 3), "mass_expiry_one_fetch_per_url": single,
        "mass_expiry_requests": served["total"], "mass_expiry_failed_fetches": len(failed),
        "digest_ms": round(digest_s * 1000, 2), "reference_digest_ms": round(ref_digest * 1000, 2),
        "snapshot_build_s": round(build_s, 3), "all_targets_met": ok,
    })
    print("result:", "all targets met" if ok else "a target was MISSED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
