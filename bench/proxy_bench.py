"""Gateway benchmark: the gateway side by side with a direct call and reference proxies.

Method (docs/performance.md): one run, interleaved rounds, every server process pinned to core 0
(``taskset -c 0``), the load generator (``wrk -t1``, and this script's own aiohttp client for
SSE) on core 1, a fast local agent answering a fixed JSON-RPC result. Arms:

  direct           wrk -> agent (raw ASGI under uvicorn + uvloop + httptools)
  gateway-uvicorn  wrk -> ``manage.py serve --server uvicorn`` -> agent
  gateway-daphne   wrk -> ``manage.py serve`` (Daphne) -> agent
  httpx-naive-proxy  wrk -> uvicorn + Starlette + one shared httpx.AsyncClient (defaults:
                   20 keep-alive connections) -> agent: the naive proxy, NOT tuned like the
                   aiohttp arm; a floor, not a target
  aiohttp-proxy    wrk -> uvicorn + raw ASGI + aiohttp -> agent (the reference for the targets)
  daphne-ceiling   wrk -> Daphne + URLRouter + raw ASGI fixed reply (no upstream at all)
  gateway-traced   (--tracing) as gateway-uvicorn with A2A_TRACING=on, spans exported over
                   OTLP/HTTP to a sink on the load core; compare with gateway-uvicorn (off)
  gateway-baseline (--baseline-ref REF) the uvicorn gateway built from git REF (e.g. the
                   commit before a feature): "compiled in but off" / "without it", same run
  gateway-variant  (--variant-env K=V[,K=V...]) the uvicorn gateway of this tree with those
                   settings in its environment: a setting's effect, same code, same run
  gateway-stats-on / gateway-stats-off (``--stats``): two more uvicorn gateways, one with
                   per-agent statistics on and A2A_AUDIT=errors (the defaults), one with
                   A2A_STATS=false and A2A_AUDIT=off: the console's cost on the hot path
  gateway-uvicorn-rest / gateway-daphne-rest (``--rest``): the same two nodes called on the
                   A2A HTTP+JSON binding (``POST /a2a/{id}/message:send``, forwarded to the
                   agent's HTTP+JSON interface) instead of JSON-RPC: the binding's cost, same
                   process, same run (the agent answers every POST alike); with
                   ``--baseline-ref``, the baseline's two nodes too (``gateway-baseline-rest``,
                   ``gateway-daphne-baseline-rest``)

Figures: req/s, p50/p99 for 1 KiB ``message/send`` at c=1 and c=64 and 256 KiB at c=64; server
CPU per request (all server-side processes of the arm); ratios; SSE first-event latency; how
many concurrent SSE streams one node holds, with RSS per stream.

Everything is started here (the platform nodes get their own SQLite data dir in a temp folder,
are migrated, get API clients, and the agent is registered through the API) and stopped at the
end. ``--quick`` takes about a minute; the default run a few minutes. Loopback only.

    .venv/bin/python bench/proxy_bench.py [--quick] [--rounds N] [--duration S] [--streams N]
        [--tracing] [--baseline-ref REF] [--variant-env K=V[,K=V...]] [--rest]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.apps import CARD, RESULT  # noqa: E402
from bench.common import (  # noqa: E402
    BENCH,
    LOAD_CORE,
    PYTHON,
    ROOT,
    PlatformNode,
    Proc,
    clean_env,
    cpu_seconds,
    create_postgres_db,
    drop_postgres_db,
    free_port,
    keep_logs,
    machine_info,
    median,
    percentile,
    pin_self_to_load_core,
    rss_kib,
    temp_dir,
    uvicorn_argv,
    write_results,
)

AGENT_ID = "bench-agent"
LUA = BENCH / "wrk_post.lua"
SCENARIOS = [("1KiB", 1024, 1), ("1KiB", 1024, 64), ("256KiB", 256 * 1024, 64)]


def rpc_body(size: int, method: str = "message/send", text: str = "") -> bytes:
    """A JSON-RPC A2A request of exactly ``size`` bytes (method first, so agents see it early)."""
    def render(pad: str) -> bytes:
        return json.dumps({
            "jsonrpc": "2.0", "id": 1, "method": method,
            "params": {"message": {"kind": "message", "role": "user", "messageId": "m-1",
                                   "parts": [{"kind": "text", "text": text + pad}]}},
        }, separators=(",", ":")).encode()

    base = render("")
    return render("x" * max(0, size - len(base)))


@dataclass
class Arm:
    name: str
    url: str
    pids: list[int]
    headers: dict[str, str] = field(default_factory=dict)
    uses_upstream: bool = True
    server_pid: int = 0
    available: bool = True
    reason: str = ""
    gateway: bool = False


# --- load generation ---------------------------------------------------------------------------


def run_wrk(arm: Arm, body_file: Path, conns: int, duration: int) -> dict:
    argv = ["taskset", "-c", str(LOAD_CORE), "wrk", "-t1", f"-c{conns}", f"-d{duration}s",
            "--latency", "--timeout", "10s", "-s", str(LUA), "-H", "Content-Type: application/json"]
    for key, value in arm.headers.items():
        argv += ["-H", f"{key}: {value}"]
    argv.append(arm.url)
    env = {**os.environ, "BENCH_BODY_FILE": str(body_file)}
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=duration + 60)
    for line in done.stdout.splitlines():
        if line.startswith("BENCH_JSON "):
            return json.loads(line[len("BENCH_JSON "):])
    raise RuntimeError(f"wrk gave no result for {arm.name}: {done.stdout}\n{done.stderr}")


def upstream_stats(upstream_url: str) -> dict:
    return httpx.get(f"{upstream_url}/stats", timeout=5).json()


def measure(arm: Arm, body_file: Path, conns: int, duration: int, upstream_url: str) -> dict:
    posts0 = upstream_stats(upstream_url)["posts"] if arm.uses_upstream else 0
    cpu0 = cpu_seconds(arm.pids)
    result = run_wrk(arm, body_file, conns, duration)
    cpu1 = cpu_seconds(arm.pids)
    posts1 = upstream_stats(upstream_url)["posts"] if arm.uses_upstream else 0
    requests = result["requests"]
    seconds = result["duration_us"] / 1e6
    errors = sum(result["errors"].values())
    return {
        "rps": requests / seconds if seconds else 0.0,
        "p50_us": result["latency_us"]["p50"],
        "p99_us": result["latency_us"]["p99"],
        "cpu_us_per_req": (cpu1 - cpu0) * 1e6 / requests if requests else None,
        "requests": requests,
        "errors": errors,
        # Requests the agent did not see: a proxy that answered without forwarding (busy,
        # unreachable...). Requests still in flight when wrk stops make it slightly negative.
        "not_forwarded": (requests - (posts1 - posts0)) if arm.uses_upstream else 0,
    }


# --- the arms ----------------------------------------------------------------------------------


def probe(arm: Arm, timeout: float = 10.0) -> None:
    """One 1 KiB call: the agent's fixed reply must come back byte for byte."""
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        try:
            response = httpx.post(arm.url, content=rpc_body(1024), timeout=10, headers={
                "Content-Type": "application/json", **arm.headers})
        except httpx.HTTPError as exc:
            last = repr(exc)
        else:
            if response.status_code == 200 and response.content == RESULT:
                if arm.gateway and response.headers.get("x-a2a-executed") != "true":
                    arm.available, arm.reason = False, "reply lacks X-A2A-Executed: true"
                return
            last = f"HTTP {response.status_code}: {response.text[:300]}"
        time.sleep(0.3)
    arm.available, arm.reason = False, f"probe failed: {last}"


#: The hot path's files whose ``tracing.ENABLED`` checks --tracing-compiled-out removes.
TRACING_HOOK_FILES = ("gateway/handler.py", "gateway/rest_handler.py", "gateway/forwarding.py",
                      "gateway/subscriber.py")


def baseline_checkout(ref: str, tmp: Path, name: str = "baseline-src") -> Path:
    """The project's files at git ``ref`` (``git archive``), to run a baseline gateway from."""
    root = tmp / name
    root.mkdir()
    archive = subprocess.run(["git", "archive", "--format=tar", ref], cwd=ROOT,
                             capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(root)], input=archive, check=True)
    return root


def start_gateway(server: str, tmp: Path, upstream_url: str, procs: list[Proc],
                  upstream: Proc, *, name: str | None = None,
                  extra_env: dict[str, str] | None = None, root: Path | None = None) -> Arm:
    name = name or f"gateway-{server}"
    node = PlatformNode(name, tmp, extra_env=extra_env, **({"root": root} if root else {}))
    try:
        admin, _registrar, caller = node.prepare()
        proc = node.serve(server)
        procs.append(proc)
        # An HTTP+JSON interface too (the --rest arms call it; JSON-RPC arms never do).
        card = {**json.loads(CARD), "url": f"{upstream_url}/",
                "additionalInterfaces": [{"transport": "HTTP+JSON",
                                          "url": f"{upstream_url}/rest"}]}
        response = httpx.post(f"{node.url}/api/v1/agents", timeout=30,
                              headers={"Authorization": f"Bearer {admin}"},
                              json={"agent_id": AGENT_ID, "url": f"{upstream_url}/",
                                    "card": card, "max_concurrency": 100_000,
                                    "ttl_seconds": 86_400})
        if response.status_code not in (200, 201):
            raise RuntimeError(f"registration failed: {response.status_code} {response.text}")
    except Exception as exc:  # report, keep benchmarking the other arms
        return Arm(name, "", [], available=False, reason=str(exc)[:500], gateway=True)
    return Arm(name, f"{node.url}/a2a/{AGENT_ID}", [proc.pid, upstream.pid],
               headers={"Authorization": f"Bearer {caller}"}, server_pid=proc.pid, gateway=True)


def start_cross_node(tmp: Path, args, upstream_url: str, procs: list[Proc], upstream: Proc,
                     database_url: str, layer: str | None = None, *, build: Path | None = None,
                     redis_url: str | None = None) -> list[Arm]:
    """Two distributed nodes (PostgreSQL + Redis, ``serve --server uvicorn``): the agent is
    registered on node A, which owns its subscriber; node B reaches it through the broker.
    ``layer``: another ``A2A_CHANNEL_LAYER`` than the default, for a second pair of nodes whose
    arms are named after it (``dist-cross-node-pubsub``), on a database of its own. ``build``:
    the pair runs that checkout instead (``--baseline-ref``; arms ``dist-*-baseline``), on a
    database and a Redis database (``redis_url``) of its own."""
    shared = {"REDIS_URL": redis_url or args.redis_url, "SECRET_KEY": "bench-secret-key"}
    suffix = "-baseline" if build is not None else f"-{layer}" if layer else ""
    if layer:
        shared["A2A_CHANNEL_LAYER"] = layer
    roots = {"root": build} if build is not None else {}
    node_a = PlatformNode(f"node-a{suffix}", tmp, database_url=database_url, **roots,
                          extra_env={**shared, "NODE_ID": f"bench-a{suffix}-{os.getpid()}"})
    node_b = PlatformNode(f"node-b{suffix}", tmp, database_url=database_url, **roots,
                          extra_env={**shared, "NODE_ID": f"bench-b{suffix}-{os.getpid()}"})
    agent_id = f"{AGENT_ID}-x{os.getpid()}{suffix}"
    try:
        admin, _registrar, caller = node_a.prepare()
        with ThreadPoolExecutor(max_workers=2) as pool:
            for proc in pool.map(lambda node: node.serve("uvicorn"), (node_a, node_b)):
                procs.append(proc)
        card = {**json.loads(CARD), "url": f"{upstream_url}/"}
        response = httpx.post(f"{node_a.url}/api/v1/agents", timeout=30,
                              headers={"Authorization": f"Bearer {admin}"},
                              json={"agent_id": agent_id, "url": f"{upstream_url}/",
                                    "card": card, "max_concurrency": 100_000,
                                    "ttl_seconds": 86_400})
        if response.status_code not in (200, 201):
            raise RuntimeError(f"registration failed: {response.status_code} {response.text}")
    except Exception as exc:
        return [Arm(name + suffix, "", [], available=False, reason=str(exc)[:500], gateway=True)
                for name in ("dist-single-node", "dist-cross-node")]
    auth = {"Authorization": f"Bearer {caller}"}
    pa, pb = node_a.proc, node_b.proc
    return [
        Arm(f"dist-single-node{suffix}", f"{node_a.url}/a2a/{agent_id}", [pa.pid, upstream.pid],
            headers=auth, server_pid=pa.pid, gateway=True),
        # CPU of both nodes: the receiving node and the owner both work for each request.
        Arm(f"dist-cross-node{suffix}", f"{node_b.url}/a2a/{agent_id}",
            [pb.pid, pa.pid, upstream.pid], headers=auth, server_pid=pb.pid, gateway=True),
    ]


def start_distributed(tmp: Path, args, upstream_url: str, procs: list[Proc], upstream: Proc,
                      database_url: str) -> list[Arm]:
    """The distributed arms: the default layer, then one pair per ``--compare-layer``."""
    arms = start_cross_node(tmp, args, upstream_url, procs, upstream, database_url)
    for layer, url in zip(args.compare_layer, args.compare_db_urls, strict=True):
        arms.extend(start_cross_node(tmp, args, upstream_url, procs, upstream, url, layer))
    if args.baseline_db_url:  # the baseline build's pair: its own database and Redis db
        base, _, db = args.redis_url.rpartition("/")
        redis_url = f"{base}/{int(db or 0) + 1}"
        arms.extend(start_cross_node(tmp, args, upstream_url, procs, upstream,
                                     args.baseline_db_url, build=args.baseline_root,
                                     redis_url=redis_url))
    return arms


def start_arms(tmp: Path, args, database_url: str | None = None
               ) -> tuple[list[Arm], list[Proc], str]:
    procs: list[Proc] = []
    up_port = free_port()
    upstream_url = f"http://127.0.0.1:{up_port}"
    upstream = Proc("upstream", uvicorn_argv("bench.apps:upstream", up_port, lifespan="off"),
                    clean_env(BENCH_SSE_HOLD=str(args.hold_seconds)), tmp).start()
    procs.append(upstream)
    waits = [(upstream, f"{upstream_url}/stats")]

    arms = [Arm("direct", f"{upstream_url}/", [upstream.pid], server_pid=upstream.pid)]
    args.baseline_root = baseline_checkout(args.baseline_ref, tmp) if args.baseline_ref \
        else None
    if args.only_cross_node:  # the distributed arms alone (profiling the broker path)
        upstream.wait_ready(f"{upstream_url}/stats")
        arms.extend(start_distributed(tmp, args, upstream_url, procs, upstream, database_url))
        for arm in arms:
            if arm.available:
                probe(arm)
        return arms, procs, upstream_url
    proxy_env = clean_env(BENCH_UPSTREAM=f"{upstream_url}/")
    for name, app in (("httpx-naive-proxy", "bench.apps:httpx_proxy"),
                      ("aiohttp-proxy", "bench.apps:aiohttp_proxy")):
        port = free_port()
        proc = Proc(name, uvicorn_argv(app, port), proxy_env, tmp).start()
        procs.append(proc)
        waits.append((proc, f"http://127.0.0.1:{port}/"))
        arms.append(Arm(name, f"http://127.0.0.1:{port}/", [proc.pid, upstream.pid],
                        server_pid=proc.pid))
    port = free_port()
    ceiling = Proc("daphne-ceiling", [PYTHON, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port),
                                      "bench.apps:daphne_ceiling"], clean_env(), tmp).start()
    procs.append(ceiling)
    waits.append((ceiling, f"http://127.0.0.1:{port}/"))
    arms.append(Arm("daphne-ceiling", f"http://127.0.0.1:{port}/a2a/{AGENT_ID}", [ceiling.pid],
                    uses_upstream=False, server_pid=ceiling.pid))
    for proc, url in waits:
        proc.wait_ready(url)
    if not args.skip_gateway:
        # Both nodes migrate and start in parallel: startup is most of a quick run otherwise.
        with ThreadPoolExecutor(max_workers=2) as pool:
            started = list(pool.map(
                lambda server: start_gateway(server, tmp, upstream_url, procs, upstream),
                ("uvicorn", "daphne")))
        arms.extend(started)
    if args.tracing:
        # Tracing on, exporting every span over OTLP/HTTP (batched, as in production) to a
        # sink on the load core: the gateway pays for span creation, context propagation and
        # the exporter thread; the collector's own work is not the gateway's.
        sink_port = free_port()
        sink = Proc("otlp-sink", uvicorn_argv("bench.apps:otlp_sink", sink_port, lifespan="off"),
                    clean_env(), tmp, core=str(LOAD_CORE)).start()
        procs.append(sink)
        sink.wait_ready(f"http://127.0.0.1:{sink_port}/")
        arms.append(start_gateway("uvicorn", tmp, upstream_url, procs, upstream,
                                  name="gateway-traced", extra_env={
                                      "A2A_TRACING": "on", "OTEL_TRACES_EXPORTER": "otlp",
                                      "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT":
                                          f"http://127.0.0.1:{sink_port}/v1/traces"}))
    if args.baseline_root is not None:
        root = args.baseline_root
        arms.append(start_gateway("uvicorn", tmp, upstream_url, procs, upstream,
                                  name="gateway-baseline", root=root))
        # Daphne too: the default server's figure against the same ref, same rounds.
        arms.append(start_gateway("daphne", tmp, upstream_url, procs, upstream,
                                  name="gateway-daphne-baseline", root=root))
    if args.variant_env:
        variant = dict(item.split("=", 1) for item in args.variant_env.split(",") if item)
        arms.append(start_gateway("uvicorn", tmp, upstream_url, procs, upstream,
                                  name="gateway-variant", extra_env=variant))
    if args.tracing_compiled_out:
        # The current commit with the tracing hooks compiled out (``tracing.ENABLED`` replaced
        # by ``False``: the compiler drops those branches), against gateway-uvicorn (compiled
        # in, A2A_TRACING off): what the hooks cost when tracing is off.
        root = baseline_checkout("HEAD", tmp, name="untraced-src")
        for rel in TRACING_HOOK_FILES:
            path = root / rel
            path.write_text(path.read_text().replace("tracing.ENABLED", "False"))
        arms.append(start_gateway("uvicorn", tmp, upstream_url, procs, upstream,
                                  name="gateway-untraced", root=root))
    if args.stats:
        # The console's statistics and error audit on vs off, same server, same run.
        variants = (("gateway-stats-on", {"A2A_STATS": "true", "A2A_AUDIT": "errors"}),
                    ("gateway-stats-off", {"A2A_STATS": "false", "A2A_AUDIT": "off"}))
        with ThreadPoolExecutor(max_workers=2) as pool:
            arms.extend(pool.map(
                lambda v: start_gateway("uvicorn", tmp, upstream_url, procs, upstream,
                                        name=v[0], extra_env=v[1]), variants))
    if args.rest:
        # The HTTP+JSON binding on the same nodes: a twin arm per gateway, another route.
        for arm in list(arms):
            if arm.name in ("gateway-uvicorn", "gateway-daphne", "gateway-baseline",
                            "gateway-daphne-baseline") and arm.available:
                arms.append(Arm(f"{arm.name}-rest", f"{arm.url}/message:send", arm.pids,
                                headers=arm.headers, server_pid=arm.server_pid, gateway=True))
    if database_url:
        arms.extend(start_distributed(tmp, args, upstream_url, procs, upstream, database_url))
    for arm in arms:
        if arm.available:
            probe(arm)
    return arms, procs, upstream_url


# --- SSE ---------------------------------------------------------------------------------------


async def sse_first_event(arms: list[Arm], samples: int, rounds: int) -> dict:
    import aiohttp

    body = rpc_body(512, method="message/stream", text="latency ")
    out: dict[str, dict] = {}
    timings: dict[str, list[float]] = {arm.name: [] for arm in arms}
    failures: dict[str, str] = {}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        for round_index in range(rounds):
            for arm in arms[round_index % len(arms):] + arms[:round_index % len(arms)]:
                for _ in range(max(1, samples // rounds)):
                    headers = {"Content-Type": "application/json",
                               "Accept": "text/event-stream", **arm.headers}
                    started = time.perf_counter()
                    async with session.post(arm.url, data=body, headers=headers) as response:
                        if not response.headers.get("Content-Type", "").startswith(
                                "text/event-stream"):
                            failures[arm.name] = f"not SSE: {(await response.read())[:200]!r}"
                            break
                        first = None
                        events = 0
                        async for line in response.content:
                            if line.startswith(b"data:"):
                                events += 1
                                if first is None:
                                    first = time.perf_counter() - started
                        if first is None or events != 3:
                            failures[arm.name] = f"got {events} events, expected 3"
                            break
                        timings[arm.name].append(first)
    for arm in arms:
        values = timings[arm.name]
        out[arm.name] = {"samples": len(values),
                         "p50_ms": percentile(values, 50) * 1e3 if values else None,
                         "p99_ms": percentile(values, 99) * 1e3 if values else None,
                         "failure": failures.get(arm.name)}
    return out


def _metric_sum(text: str, name: str) -> float | None:
    total, seen = 0.0, False
    for line in text.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            total += float(line.rsplit(" ", 1)[1])
            seen = True
    return total if seen else None


async def sse_hold(arm: Arm, count: int, upstream_url: str, open_timeout: float) -> dict:
    """Open ``count`` concurrent streams through ``arm``, each past its first event; read RSS,
    the agent's open streams and a sync call's latency while they are held; then close them
    all and check the upstream connections are released too."""
    import aiohttp

    body = rpc_body(0, method="message/stream", text="hold")
    headers = {"Content-Type": "application/json", "Accept": "text/event-stream", **arm.headers}
    base = upstream_stats(upstream_url)["streams_open"]
    rss0 = rss_kib(arm.server_pid)
    held: list = []
    failures: dict[str, int] = {}
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=None)
    session = aiohttp.ClientSession(connector=connector, timeout=timeout)
    gate = asyncio.Semaphore(64)

    async def open_one() -> None:
        async with gate:
            try:
                response = await session.post(arm.url, data=body, headers=headers)
            except (aiohttp.ClientError, OSError) as exc:
                key = type(exc).__name__
                failures[key] = failures.get(key, 0) + 1
                return
            if not response.headers.get("Content-Type", "").startswith("text/event-stream"):
                text = (await response.read())[:120].decode(errors="replace")
                failures[text] = failures.get(text, 0) + 1
                response.close()
                return
            async for line in response.content:
                if line.startswith(b"data:"):
                    held.append(response)
                    return
            failures["ended before first event"] = failures.get("ended before first event", 0) + 1

    started = time.perf_counter()
    try:
        await asyncio.wait_for(asyncio.gather(*(open_one() for _ in range(count))),
                               timeout=open_timeout)
    except TimeoutError:
        failures["open timeout"] = count - len(held)
    open_seconds = time.perf_counter() - started
    await asyncio.sleep(1.0)
    rss1 = rss_kib(arm.server_pid)
    upstream_open = upstream_stats(upstream_url)["streams_open"] - base
    metric = None
    if arm.gateway:
        try:
            metrics = httpx.get(arm.url.split("/a2a/")[0] + "/metrics", timeout=10).text
            metric = _metric_sum(metrics, "kubemq_a2a_sse_streams_active")
        except httpx.HTTPError:
            metric = None
    sync_latencies = []
    async with aiohttp.ClientSession() as probe_session:
        for _ in range(20):
            t0 = time.perf_counter()
            async with probe_session.post(arm.url, data=rpc_body(1024), headers={
                    "Content-Type": "application/json", **arm.headers}) as response:
                ok = (await response.read()) == RESULT
            if ok:
                sync_latencies.append(time.perf_counter() - t0)
    for response in held:
        response.close()
    await session.close()
    released_after = None
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if upstream_stats(upstream_url)["streams_open"] - base <= 0:
            released_after = round(15 - (deadline - time.monotonic()), 2)
            break
        await asyncio.sleep(0.25)
    opened = len(held)
    return {
        "requested": count, "opened": opened, "open_seconds": round(open_seconds, 2),
        "failures": failures, "rss_before_mib": round(rss0 / 1024, 1),
        "rss_held_mib": round(rss1 / 1024, 1),
        "rss_per_stream_kib": round((rss1 - rss0) / opened, 1) if opened else None,
        "upstream_streams_open_while_held": upstream_open,
        "metric_sse_streams_active": metric,
        "sync_p50_ms_while_held": round(median(sync_latencies) * 1e3, 2)
        if sync_latencies else None,
        "sync_ok_while_held": f"{len(sync_latencies)}/20",
        "upstream_released_after_s": released_after,
        "upstream_streams_open_after_close":
            upstream_stats(upstream_url)["streams_open"] - base,
    }


# --- report ------------------------------------------------------------------------------------


def summarize(runs: dict) -> dict:
    summary: dict[str, dict] = {}
    for key, per_arm in runs.items():
        summary[key] = {}
        for arm, samples in per_arm.items():
            summary[key][arm] = {
                metric: median([s[metric] for s in samples if s.get(metric) is not None])
                if any(s.get(metric) is not None for s in samples) else None
                for metric in ("rps", "p50_us", "p99_us", "cpu_us_per_req")
            }
            summary[key][arm]["errors"] = sum(s["errors"] for s in samples)
            summary[key][arm]["not_forwarded"] = max(s["not_forwarded"] for s in samples)
    return summary


#: Pairs whose ratio is also reported round by round (req/s, and server CPU per request).
ROUND_PAIRS = (
    ("gateway-uvicorn", "gateway-baseline"),
    ("gateway-daphne", "gateway-daphne-baseline"),
    ("gateway-uvicorn", "gateway-untraced"),
    ("gateway-uvicorn", "gateway-variant"),
    ("gateway-traced", "gateway-uvicorn"),
    ("gateway-uvicorn", "aiohttp-proxy"),
    ("gateway-daphne", "aiohttp-proxy"),
    ("gateway-daphne", "daphne-ceiling"),
    ("daphne-ceiling", "aiohttp-proxy"),
)


def per_round_ratios(runs: dict) -> dict:
    """``a / b`` per interleaved round, for each pair measured: req/s and CPU µs per request
    (b / a for CPU, so above 1 means ``a`` is cheaper), to show the spread a median hides."""
    out: dict[str, dict] = {}
    for scenario, arms in runs.items():
        for a, b in ROUND_PAIRS:
            if a not in arms or b not in arms:
                continue
            pairs = list(zip(arms[a], arms[b], strict=True))
            out.setdefault(scenario, {})[f"{a} / {b}"] = {
                "rps": [round(x["rps"] / y["rps"], 3) if y["rps"] else None for x, y in pairs],
                "cpu_b_over_a": [
                    round(y["cpu_us_per_req"] / x["cpu_us_per_req"], 3)
                    if x.get("cpu_us_per_req") and y.get("cpu_us_per_req") else None
                    for x, y in pairs
                ],
            }
    return out


def ratios(summary: dict) -> list[dict]:
    def get(scenario: str, arm: str, metric: str = "rps"):
        return (summary.get(scenario, {}).get(arm) or {}).get(metric)

    def ratio(a, b):
        return round(a / b, 3) if a and b else None

    rows = []
    for gw in ("gateway-uvicorn", "gateway-daphne"):
        for scenario in summary:
            rows.append({"figure": f"{scenario}: {gw} / aiohttp-proxy (req/s)",
                         "value": ratio(get(scenario, gw), get(scenario, "aiohttp-proxy")),
                         "target": ">= 1.0" if gw == "gateway-uvicorn" and scenario != "1KiB c=1"
                         else ""})
            rows.append({"figure": f"{scenario}: {gw} / httpx-naive-proxy (req/s)",
                         "value": ratio(get(scenario, gw), get(scenario, "httpx-naive-proxy")),
                         "target": ""})
            rows.append({"figure": f"{scenario}: {gw} / direct (req/s)",
                         "value": ratio(get(scenario, gw), get(scenario, "direct")),
                         "target": "reported (nginx: 0.66 c=1, 0.30 c=64)"})
        p50_gw, p50_direct = get("1KiB c=1", gw, "p50_us"), get("1KiB c=1", "direct", "p50_us")
        rows.append({"figure": f"1KiB c=1: {gw} added p50 over direct (us)",
                     "value": round(p50_gw - p50_direct) if p50_gw and p50_direct else None,
                     "target": "<= 250" if gw == "gateway-uvicorn" else ""})
    if "dist-cross-node" in summary.get("1KiB c=1", {}):
        p50_x, p50_direct = (get("1KiB c=1", "dist-cross-node", "p50_us"),
                             get("1KiB c=1", "direct", "p50_us"))
        rows.append({"figure": "1KiB c=1: cross-node added p50 over direct (us)",
                     "value": round(p50_x - p50_direct) if p50_x and p50_direct else None,
                     "target": "<= 1000"})
        rows.append({"figure": "1KiB c=64: cross-node / single-node, distributed (req/s)",
                     "value": ratio(get("1KiB c=64", "dist-cross-node"),
                                    get("1KiB c=64", "dist-single-node")),
                     "target": ">= 0.5"})
        for other in sorted(summary.get("1KiB c=64", {})):
            if not other.startswith("dist-cross-node-"):
                continue
            layer = other.removeprefix("dist-cross-node-")
            if layer == "baseline":  # the baseline build's pair, same rounds
                p50_o = get("1KiB c=1", other, "p50_us")
                rows.append({"figure": "1KiB c=1: cross-node added p50 over direct, baseline "
                                       "build (us)",
                             "value": round(p50_o - p50_direct) if p50_o and p50_direct
                             else None, "target": "reference"})
                for scenario in ("1KiB c=1", "1KiB c=64", "256KiB c=64"):
                    rows.append({"figure": f"{scenario}: cross-node, this build / baseline "
                                           "build (req/s)",
                                 "value": ratio(get(scenario, "dist-cross-node"),
                                                get(scenario, other)),
                                 "target": "reported"})
                rows.append({"figure": "1KiB c=64: cross-node / single-node, baseline build "
                                       "(req/s)",
                             "value": ratio(get("1KiB c=64", other),
                                            get("1KiB c=64", "dist-single-node-baseline")),
                             "target": "reference"})
                continue
            p50_o = get("1KiB c=1", other, "p50_us")
            rows.append({"figure": f"1KiB c=1: cross-node added p50 over direct, {layer} "
                                   "layer (us)",
                         "value": round(p50_o - p50_direct) if p50_o and p50_direct else None,
                         "target": "reference"})
            rows.append({"figure": f"1KiB c=64: cross-node / single-node, {layer} layer "
                                   "(req/s)",
                         "value": ratio(get("1KiB c=64", other),
                                        get("1KiB c=64", f"dist-single-node-{layer}")),
                         "target": "reference"})
            rows.append({"figure": f"1KiB c=64: cross-node, default layer / {layer} layer "
                                   "(req/s)",
                         "value": ratio(get("1KiB c=64", "dist-cross-node"),
                                        get("1KiB c=64", other)),
                         "target": "reference"})
        rows.append({"figure": "1KiB c=64: distributed single node / embedded (req/s)",
                     "value": ratio(get("1KiB c=64", "dist-single-node"),
                                    get("1KiB c=64", "gateway-uvicorn")),
                     "target": ""})

    def each_scenario(arm: str, over: str, figure: str, target: str) -> None:
        """When the run had ``arm``: a row per scenario, ``arm`` / ``over`` (req/s)."""
        if arm in summary.get("1KiB c=64", {}):
            for scenario in summary:
                rows.append({"figure": f"{scenario}: {figure} (req/s)",
                             "value": ratio(get(scenario, arm), get(scenario, over)),
                             "target": target})

    each_scenario("gateway-traced", "gateway-uvicorn", "tracing on / off, gateway-uvicorn",
                  "reported (README)")
    if "gateway-baseline" in summary.get("1KiB c=64", {}):
        each_scenario("gateway-uvicorn", "gateway-baseline",
                      "gateway-uvicorn / gateway-baseline",
                      ">= 0.97 (tracing compiled in but off)")
        each_scenario("gateway-daphne", "gateway-daphne-baseline",
                      "gateway-daphne / gateway-daphne-baseline",
                      "reported (the default server against the ref)")
    if "gateway-untraced" in summary.get("1KiB c=64", {}):
        each_scenario("gateway-uvicorn", "gateway-untraced", "gateway-uvicorn / gateway-untraced",
                      ">= 0.97 (tracing compiled in but off / compiled out)")
    if "gateway-baseline-rest" in summary.get("1KiB c=64", {}):
        each_scenario("gateway-uvicorn-rest", "gateway-baseline-rest",
                      "HTTP+JSON, gateway-uvicorn / gateway-baseline", "reported")
        each_scenario("gateway-baseline-rest", "gateway-baseline",
                      "HTTP+JSON / JSON-RPC, gateway-baseline", "reported")
    for server in ("uvicorn", "daphne"):
        each_scenario(f"gateway-{server}-rest", f"gateway-{server}",
                      f"HTTP+JSON / JSON-RPC, gateway-{server}", ">= 0.9")
        if f"gateway-{server}-rest" in summary.get("1KiB c=64", {}):
            for scenario in summary:
                cpu_rest = get(scenario, f"gateway-{server}-rest", "cpu_us_per_req")
                cpu_rpc = get(scenario, f"gateway-{server}", "cpu_us_per_req")
                rows.append({"figure": f"{scenario}: HTTP+JSON - JSON-RPC, gateway-{server} "
                                       "(server CPU us/req)",
                             "value": round(cpu_rest - cpu_rpc, 1) if cpu_rest and cpu_rpc
                             else None, "target": "reported"})
    if "gateway-variant" in summary.get("1KiB c=64", {}):
        each_scenario("gateway-uvicorn", "gateway-variant", "gateway-uvicorn / gateway-variant",
                      "reported (this tree's settings / --variant-env's)")
    if "gateway-stats-on" in summary.get("1KiB c=64", {}):
        for scenario in summary:
            rows.append({"figure": f"{scenario}: stats+audit(errors) on / off (req/s)",
                         "value": ratio(get(scenario, "gateway-stats-on"),
                                        get(scenario, "gateway-stats-off")),
                         "target": ">= 0.95"})
            cpu_on = get(scenario, "gateway-stats-on", "cpu_us_per_req")
            cpu_off = get(scenario, "gateway-stats-off", "cpu_us_per_req")
            rows.append({"figure": f"{scenario}: stats+audit(errors) on - off (server CPU us/req)",
                         "value": round(cpu_on - cpu_off, 1) if cpu_on and cpu_off else None,
                         "target": "reported (steadier than req/s on a busy machine)"})
    for scenario in ("1KiB c=1", "1KiB c=64"):
        rows.append({"figure": f"{scenario}: daphne-ceiling / aiohttp-proxy (req/s)",
                     "value": ratio(get(scenario, "daphne-ceiling"),
                                    get(scenario, "aiohttp-proxy")),
                     "target": "reported (Daphne's own cost)"})
        rows.append({"figure": f"{scenario}: gateway-daphne / daphne-ceiling (req/s)",
                     "value": ratio(get(scenario, "gateway-daphne"),
                                    get(scenario, "daphne-ceiling")),
                     "target": ">= 0.6" if scenario == "1KiB c=64" else ""})
        p50_aio, p50_direct = (get(scenario, "aiohttp-proxy", "p50_us"),
                               get(scenario, "direct", "p50_us"))
        if scenario == "1KiB c=1":
            rows.append({"figure": "1KiB c=1: aiohttp-proxy added p50 over direct (us)",
                         "value": round(p50_aio - p50_direct) if p50_aio and p50_direct
                         else None, "target": "reference (~+200 us on this machine kind)"})
    return rows


def print_report(result: dict) -> None:
    print()
    print(f"{'scenario':<13}{'arm':<17}{'req/s':>10}{'p50 us':>9}{'p99 us':>9}"
          f"{'CPU us/req':>11}{'errors':>8}{'not fwd':>8}")
    for scenario, per_arm in result["summary"].items():
        for arm, figures in per_arm.items():
            def fmt(value, spec):
                return format(value, spec) if value is not None else "-"
            print(f"{scenario:<13}{arm:<17}{fmt(figures['rps'], ',.0f'):>10}"
                  f"{fmt(figures['p50_us'], '.0f'):>9}{fmt(figures['p99_us'], '.0f'):>9}"
                  f"{fmt(figures['cpu_us_per_req'], '.0f'):>11}{figures['errors']:>8}"
                  f"{figures['not_forwarded']:>8}")
    print()
    for row in result["ratios"]:
        value = "-" if row["value"] is None else row["value"]
        print(f"  {row['figure']:<58} {value!s:>8}  {row['target']}")
    if result.get("per_round"):
        print("\nPer round (req/s ratio; server CPU per request b/a):")
        for scenario, pairs in result["per_round"].items():
            for pair, figures in pairs.items():
                print(f"  {scenario:<13}{pair:<44} rps {figures['rps']}  "
                      f"cpu {figures['cpu_b_over_a']}")
    if result.get("sse_first_event"):
        print("\nSSE first-event latency (ms):")
        for arm, figures in result["sse_first_event"].items():
            print(f"  {arm:<17} p50 {figures['p50_ms'] or float('nan'):7.2f}   "
                  f"p99 {figures['p99_ms'] or float('nan'):7.2f}   n={figures['samples']}"
                  f"{'   ' + figures['failure'] if figures['failure'] else ''}")
    if result.get("sse_hold"):
        print("\nConcurrent SSE streams held by one node:")
        for arm, figures in result["sse_hold"].items():
            print(f"  {arm:<17} {json.dumps(figures)}")
    unavailable = {a["name"]: a["reason"] for a in result["arms"] if not a["available"]}
    if unavailable:
        print("\nArms not measured:")
        for name, reason in unavailable.items():
            print(f"  {name}: {reason}")


# --- main --------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="about one minute")
    parser.add_argument("--rounds", type=int, help="interleaved rounds (default 3, quick 2)")
    parser.add_argument("--duration", type=int, help="seconds per wrk run (default 4, quick 1)")
    parser.add_argument("--streams", type=int, default=1000, help="concurrent SSE streams")
    parser.add_argument("--sse-samples", type=int, help="SSE first-event samples per arm")
    parser.add_argument("--hold-seconds", type=int, default=120)
    parser.add_argument("--skip-gateway", action="store_true")
    parser.add_argument("--stats", action="store_true",
                        help="also gateways with the console's statistics + error audit on and "
                             "off (A2A_STATS, A2A_AUDIT), side by side")
    parser.add_argument("--cross-node", action="store_true",
                        help="also two distributed nodes (PostgreSQL + Redis): single-node and "
                             "cross-node arms")
    parser.add_argument("--only-cross-node", action="store_true",
                        help="only the direct arm and the two distributed arms (implies "
                             "--cross-node)")
    parser.add_argument("--compare-layer", action="append", default=[],
                        choices=("direct", "pubsub", "core"),
                        help="with --cross-node: also a pair of nodes on this A2A_CHANNEL_LAYER "
                             "(arms dist-*-LAYER), same rounds")
    parser.add_argument("--tracing", action="store_true",
                        help="also the uvicorn gateway with OpenTelemetry tracing on "
                             "(gateway-traced), side by side with tracing off")
    parser.add_argument("--baseline-ref", metavar="REF",
                        help="also a uvicorn gateway built from this git ref (gateway-baseline)")
    parser.add_argument("--variant-env", metavar="K=V[,K=V...]",
                        help="one more uvicorn gateway of this tree with these settings")
    parser.add_argument("--tracing-compiled-out", action="store_true",
                        help="also the uvicorn gateway of this commit with the tracing hooks "
                             "compiled out (gateway-untraced)")
    parser.add_argument("--rest", action="store_true",
                        help="also call the gateways on the HTTP+JSON binding (REST arms)")
    parser.add_argument("--skip-sse", action="store_true",
                        help="skip the SSE first-event and held-streams phases")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/12")
    parser.add_argument("--postgres-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    args = parser.parse_args()
    args.cross_node = args.cross_node or args.only_cross_node
    rounds = args.rounds or (2 if args.quick else 3)
    duration = args.duration or (1 if args.quick else 4)
    sse_samples = args.sse_samples or (40 if args.quick else 200)
    if not shutil.which("wrk"):
        print("wrk not found: apt-get install -y wrk", file=sys.stderr)
        return 2
    if (os.cpu_count() or 1) < 2:
        print("warning: fewer than 2 cores; server and load generator share one", file=sys.stderr)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 65536)), hard))
    pin_self_to_load_core()
    started = time.time()

    db_url, db_name = (create_postgres_db(args.postgres_url) if args.cross_node
                       else (None, None))
    compare_dbs = [create_postgres_db(args.postgres_url) for _ in args.compare_layer] \
        if args.cross_node else []
    args.compare_db_urls = [url for url, _name in compare_dbs]
    baseline_db = create_postgres_db(args.postgres_url) \
        if args.cross_node and args.baseline_ref else None
    args.baseline_db_url = baseline_db[0] if baseline_db else None
    with temp_dir("a2a-proxy-bench-") as tmp_name:
        tmp = Path(tmp_name)
        procs: list[Proc] = []
        try:
            phases: dict[str, float] = {}
            mark = time.monotonic()
            arms, procs, upstream_url = start_arms(tmp, args, db_url)
            phases["startup"] = time.monotonic() - mark
            live = [arm for arm in arms if arm.available]
            print("arms: " + ", ".join(f"{a.name}{'' if a.available else ' (unavailable)'}"
                                       for a in arms), flush=True)
            bodies = {}
            for label, size, _ in SCENARIOS:
                path = tmp / f"body-{label}.json"
                path.write_bytes(rpc_body(size))
                bodies[label] = path
            for arm in live:  # warm-up: connections, caches, JIT-less but lazy imports
                measure(arm, bodies["1KiB"], 64, 1, upstream_url)
            runs: dict[str, dict[str, list]] = {}
            mark = time.monotonic()
            for round_index in range(rounds):
                for label, _size, conns in SCENARIOS:
                    key = f"{label} c={conns}"
                    order = live[round_index % len(live):] + live[:round_index % len(live)]
                    for arm in order:
                        if arm.name == "daphne-ceiling" and label != "1KiB":
                            continue
                        sample = measure(arm, bodies[label], conns, duration, upstream_url)
                        runs.setdefault(key, {}).setdefault(arm.name, []).append(sample)
                        print(f"round {round_index + 1} {key:<12} {arm.name:<16} "
                              f"{sample['rps']:>9,.0f} req/s  p50 {sample['p50_us']} us",
                              flush=True)
            phases["warmup+rounds"] = time.monotonic() - mark
            mark = time.monotonic()
            sse_arms = [a for a in live if a.name != "daphne-ceiling" and not args.skip_sse
                        and not a.name.endswith("-rest")]
            sse_latency = (asyncio.run(sse_first_event(sse_arms, sse_samples, rounds))
                           if sse_arms else {})
            phases["sse_latency"] = time.monotonic() - mark
            mark = time.monotonic()
            hold_arms = [a for a in live if not args.skip_sse
                         and a.name in ("aiohttp-proxy", "gateway-uvicorn", "gateway-daphne")]
            hold = {}
            for arm in hold_arms:
                hold[arm.name] = asyncio.run(sse_hold(arm, args.streams, upstream_url,
                                                      open_timeout=60))
                print(f"held {arm.name}: {hold[arm.name]['opened']}/{args.streams}", flush=True)
            phases["sse_hold"] = time.monotonic() - mark
            summary = summarize(runs)
            result = {
                "benchmark": "proxy", "quick": args.quick, "rounds": rounds,
                "duration_s": duration, "machine": machine_info(),
                "load_generator": "wrk -t1 (core 1); SSE: aiohttp client (core 1)",
                "server_core": 0,
                "command": " ".join([Path(PYTHON).name, *sys.argv]),
                "arms": [{"name": a.name, "url": a.url, "available": a.available,
                          "reason": a.reason} for a in arms],
                "summary": summary, "ratios": ratios(summary),
                "per_round": per_round_ratios(runs), "runs": runs,
                "sse_first_event": sse_latency, "sse_hold": hold,
                "phases_s": {k: round(v, 1) for k, v in phases.items()},
                "elapsed_s": round(time.time() - started, 1),
            }
        finally:
            for proc in reversed(procs):
                proc.stop()
            keep_logs(tmp, "proxy")
            if db_name:
                drop_postgres_db(args.postgres_url, db_name)
            for _url, name in [*compare_dbs, *([baseline_db] if baseline_db else [])]:
                drop_postgres_db(args.postgres_url, name)
    print_report(result)
    path = write_results("proxy", result)
    print(f"\nwrote {path} ({result['elapsed_s']} s: {result['phases_s']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
