"""Registry benchmark: registrations/s and heartbeats/s against ``manage.py serve``.

The node (its own data dir in a temp folder; SQLite by default, PostgreSQL with ``--postgres``
in a bench database created here and dropped at the end) runs pinned to core 0; this script's
aiohttp load generator runs on core 1. Phases:

1. register ``--agents`` agents (default 10,000) through ``POST /api/v1/agents``, c=32
   (``--registration-concurrency``), then ``--more-registrations`` more (the target's figure);
2. closed loop: heartbeats from c=64 workers cycling through all agents, as fast as it goes;
3. open loop: heartbeats at a fixed offered rate (``--rate``, default 1,000/s) -- latency is
   measured from each heartbeat's *scheduled* time, so a stalled server cannot hide its queue.
   This is the 10,000-agents-heartbeating figure the target speaks of (>= 1,000/s on
   PostgreSQL with p99 < 50 ms, with a routing resync inside the window).

The node runs its routing resync every ``--resync-seconds`` (default 5, so several land in the
open-loop window; production's default is 30) and a full reload every
``--full-resync-seconds`` (default 600 as in production: pass e.g. 8 to put full reloads of
every agent inside the window too). Each resync logs one line; the result counts those that
ran inside the open-loop window (``resyncs_in_window``, by kind) and their read and loop
times, so a figure without a resync inside its window shows as such.

    .venv/bin/python bench/registry_bench.py [--quick] [--postgres] [--server uvicorn]
        [--resync-seconds 5] [--full-resync-seconds 600] [--resync-overlap-seconds 5]
        [--more-registrations 3000] [--registrations-only]
    .venv/bin/python bench/registry_bench.py --baseline-ref REF --agents 1000 [--server uvicorn]
        (registrations/s of this build against git REF, interleaved rounds, PostgreSQL)
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (  # noqa: E402
    ROOT,
    PlatformNode,
    create_postgres_db,
    drop_postgres_db,
    keep_logs,
    machine_info,
    median,
    percentile,
    pin_self_to_load_core,
    temp_dir,
    write_results,
)

_WORDS = ("route", "invoice", "customer", "ledger", "refund", "shipment", "warranty", "claim",
          "summarise", "translate", "schedule", "forecast", "inventory", "contract", "audit")


def bench_card(index: int) -> dict:
    """A realistic A2A 0.3 card of 2-8 KiB (size varies with ``index``): provider, security
    scheme, skills with descriptions, tags, examples and modes; its endpoint a host name
    (``localhost``), so the URL check resolves it as it would a real agent's."""
    target = 2048 + (index * 977) % 5800
    card: dict = {
        "name": f"Bench Agent {index}", "version": "1.4.2", "protocolVersion": "0.3.0",
        "description": "Handles " + " ".join(_WORDS[(index + i) % len(_WORDS)] for i in range(12))
        + " requests for the bench.",
        "url": f"http://localhost:9/agents/hb-{index:05d}/", "preferredTransport": "JSONRPC",
        "provider": {"organization": "Bench Corp", "url": "https://bench.example.com"},
        "capabilities": {"streaming": True, "pushNotifications": False},
        "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        "security": [{"bearer": []}],
        "defaultInputModes": ["text/plain", "application/json"],
        "defaultOutputModes": ["text/plain", "application/json"],
        "skills": [],
    }
    size = len(orjson.dumps(card))
    skill = 0
    while size < target:
        words = [_WORDS[(index + skill + i) % len(_WORDS)] for i in range(6)]
        entry = {
            "id": f"skill-{skill}", "name": f"{words[0].title()} {words[1]}",
            "description": f"Takes a {words[2]} and returns its {words[3]}; "
                           f"handles {words[4]} and {words[5]} cases.",
            "tags": words[:4], "examples": [f"{words[0]} the {words[1]} for order {index}"],
            "inputModes": ["text/plain"], "outputModes": ["application/json"],
        }
        card["skills"].append(entry)
        size += len(orjson.dumps(entry)) + 1
        skill += 1
    return card


def figures(latencies: list[float], statuses: dict, seconds: float) -> dict:
    ok = statuses.get(200, 0) + statuses.get(201, 0)
    return {
        "requests": len(latencies), "ok": ok, "statuses": {str(k): v for k, v in statuses.items()},
        "seconds": round(seconds, 2), "per_s": round(ok / seconds, 1) if seconds else 0.0,
        "p50_ms": round(percentile(latencies, 50) * 1e3, 2) if latencies else None,
        "p99_ms": round(percentile(latencies, 99) * 1e3, 2) if latencies else None,
        "max_ms": round(max(latencies) * 1e3, 2) if latencies else None,
    }


async def register_all(session, base: str, token: str, ids: list[str], concurrency: int,
                       first_index: int = 0) -> dict:
    import aiohttp

    headers = {"Authorization": f"Bearer {token}"}
    latencies: list[float] = []
    statuses: dict[int, int] = {}
    headers["Content-Type"] = "application/json"
    bodies = [orjson.dumps({"agent_id": agent_id, "card": bench_card(first_index + index),
                            "ttl_seconds": 3600}) for index, agent_id in enumerate(ids)]
    queue = iter(bodies)

    async def worker() -> None:
        for body in queue:
            started = time.perf_counter()
            try:
                async with session.post(f"{base}/api/v1/agents", headers=headers,
                                        data=body) as response:
                    await response.read()
                    statuses[response.status] = statuses.get(response.status, 0) + 1
            except aiohttp.ClientError as exc:
                # Counted, never fatal (not an ok): e.g. a kept-alive connection the server
                # closed after its idle timeout while an A/B's other arm ran its round.
                key = type(exc).__name__
                statuses[key] = statuses.get(key, 0) + 1
            latencies.append(time.perf_counter() - started)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return figures(latencies, statuses, time.perf_counter() - started)


async def heartbeat_closed(session, base: str, token: str, ids: list[str], concurrency: int,
                           seconds: float) -> dict:
    headers = {"Authorization": f"Bearer {token}"}
    latencies: list[float] = []
    statuses: dict[int, int] = {}
    deadline = time.perf_counter() + seconds
    counter = iter(range(10**9))

    async def worker() -> None:
        while time.perf_counter() < deadline:
            agent_id = ids[next(counter) % len(ids)]
            started = time.perf_counter()
            async with session.post(f"{base}/api/v1/agents/{agent_id}/heartbeat",
                                    headers=headers) as response:
                await response.read()
                statuses[response.status] = statuses.get(response.status, 0) + 1
            latencies.append(time.perf_counter() - started)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return figures(latencies, statuses, time.perf_counter() - started)


async def heartbeat_open(session, base: str, token: str, ids: list[str], rate: float,
                         seconds: float, max_in_flight: int = 2000) -> dict:
    """Offer ``rate`` heartbeats/s on a fixed schedule; latency counts from the scheduled time."""
    headers = {"Authorization": f"Bearer {token}"}
    latencies: list[float] = []
    statuses: dict[int, int] = {}
    dropped = 0
    in_flight: set[asyncio.Task] = set()
    loop = asyncio.get_running_loop()

    async def one(agent_id: str, scheduled: float) -> None:
        try:
            async with session.post(f"{base}/api/v1/agents/{agent_id}/heartbeat",
                                    headers=headers) as response:
                await response.read()
                statuses[response.status] = statuses.get(response.status, 0) + 1
        except Exception as exc:  # counted, never fatal: the figure is what the caller saw
            key = type(exc).__name__
            statuses[key] = statuses.get(key, 0) + 1
        latencies.append(loop.time() - scheduled)

    start = loop.time() + 0.05
    wall_start = time.time() + 0.05
    total = int(rate * seconds)
    for index in range(total):
        scheduled = start + index / rate
        delay = scheduled - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        if len(in_flight) >= max_in_flight:  # bounded: a stalled server cannot eat memory
            dropped += 1
            continue
        task = asyncio.create_task(one(ids[index % len(ids)], scheduled))
        in_flight.add(task)
        task.add_done_callback(in_flight.discard)
    if in_flight:
        await asyncio.wait(in_flight, timeout=30)
    elapsed = loop.time() - start
    result = figures(latencies, statuses, elapsed)
    result.update({"offered_per_s": rate, "dropped_over_in_flight_cap": dropped,
                   "window": [wall_start, wall_start + elapsed]})
    return result


_RESYNC_LINE = re.compile(
    r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) INFO gateway\.runtime: routing resync "
    r"\((full|incremental)\): (\d+) \S+, read ([\d.]+) ms \(worker thread\), "
    r"applied ([\d.]+) ms \(loop\)"
)


def resyncs_in_window(log: Path, window: list[float]) -> dict:
    """The node's routing resyncs (one log line each) that finished inside ``window``."""
    found: dict[str, list[dict]] = {"full": [], "incremental": []}
    for line in log.read_text(errors="replace").splitlines():
        match = _RESYNC_LINE.match(line)
        if match is None:
            continue
        stamp = datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
        if window[0] <= stamp <= window[1]:
            found[match.group(2)].append({
                "rows": int(match.group(3)), "read_ms": float(match.group(4)),
                "loop_ms": float(match.group(5)),
            })
    return {kind: {"count": len(runs), "runs": runs} for kind, runs in found.items()}


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` so far (/proc: Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class NodeCpu:
    """The node's CPU time per request of a phase: a figure the machine's other load moves
    far less than requests/s or latency (it counts the node's own work, not its waits)."""

    def __init__(self, pid: int | None) -> None:
        self.pid = pid
        self.start = cpu_seconds(pid) if pid else 0.0

    def per_request(self, figures_: dict) -> None:
        if not self.pid:
            return
        used = cpu_seconds(self.pid) - self.start
        figures_["node_cpu_ms_per_request"] = round(1000 * used / max(figures_["ok"], 1), 3)


def cpu_note(figures_: dict) -> str:
    cpu = figures_.get("node_cpu_ms_per_request")
    return f", node CPU {cpu} ms a request" if cpu is not None else ""


def at_scale_key(width: int) -> str:
    """The result's key of the registrations/s figure (the target's) at ``width`` clients."""
    return f"registration_at_scale_c{width}"


async def search_after_burst(session, base: str, admin: str, expected: int) -> dict:
    """An ARD list right after the registrations: the node answers it once the search
    documents it deferred are written (read your writes), so its time is how far the index
    was behind; ``total`` must count every agent registered."""
    started = time.perf_counter()
    async with session.get(f"{base}/ard/v1/agents?pageSize=1",
                           headers={"Authorization": f"Bearer {admin}"}) as resp:
        status, body = resp.status, await resp.read()
    total = orjson.loads(body).get("total") if status == 200 else None
    return {"status": status, "ms": round((time.perf_counter() - started) * 1e3, 1),
            "total": total, "expected": expected, "complete": total == expected}


async def run_load(base: str, registrar: str, args, node_pid: int | None = None,
                   admin: str | None = None) -> dict:
    import aiohttp

    ids = [f"hb-{index:05d}" for index in range(args.agents)]
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector,
                                     timeout=aiohttp.ClientTimeout(total=60)) as session:
        cpu = NodeCpu(node_pid)
        width = args.registration_concurrency
        registration = await register_all(session, base, registrar, ids, width)
        cpu.per_request(registration)
        print(f"registered {registration['ok']}/{args.agents} at {registration['per_s']}/s "
              f"p50 {registration['p50_ms']} ms p99 {registration['p99_ms']} ms"
              f"{cpu_note(registration)}", flush=True)
        # The target's figure: new registrations with --agents already registered.
        more = [f"new-{index:05d}" for index in range(args.more_registrations)]
        cpu = NodeCpu(node_pid)
        at_scale = await register_all(session, base, registrar, more, width, len(ids))
        cpu.per_request(at_scale)
        print(f"{args.more_registrations} more with {args.agents} registered: "
              f"{at_scale['per_s']}/s p50 {at_scale['p50_ms']} ms p99 {at_scale['p99_ms']} ms"
              f"{cpu_note(at_scale)}", flush=True)
        registered = {f"registration_c{width}": registration, at_scale_key(width): at_scale}
        if admin is not None:
            search = registered["search_after_burst"] = await search_after_burst(
                session, base, admin, len(ids) + len(more))
            print(f"ARD list right after: {search['total']} of {search['expected']} agents "
                  f"in {search['ms']} ms (status {search['status']})", flush=True)
        if args.registrations_only:
            return registered
        cpu = NodeCpu(node_pid)
        closed = await heartbeat_closed(session, base, registrar, ids, 64, args.closed_seconds)
        cpu.per_request(closed)
        print(f"heartbeats closed loop c=64: {closed['per_s']}/s p50 {closed['p50_ms']} ms "
              f"p99 {closed['p99_ms']} ms{cpu_note(closed)}", flush=True)
        cpu = NodeCpu(node_pid)
        opened = await heartbeat_open(session, base, registrar, ids, args.rate, args.open_seconds)
        cpu.per_request(opened)
        print(f"heartbeats open loop at {args.rate}/s: {opened['per_s']}/s "
              f"p50 {opened['p50_ms']} ms p99 {opened['p99_ms']} ms{cpu_note(opened)}", flush=True)
    return {**registered, "heartbeat_closed_c64": closed, "heartbeat_open": opened}


def baseline_checkout(ref: str, tmp: Path) -> Path:
    """The project's files at git ``ref`` (``git archive``), to run a baseline node from."""
    root = tmp / "baseline-src"
    root.mkdir()
    archive = subprocess.run(["git", "archive", "--format=tar", ref], cwd=ROOT,
                             capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(root)], input=archive, check=True)
    return root


async def ab_load(arms: dict[str, tuple[str, str]], args) -> dict:
    """Registrations/s of each arm (name -> (url, token)), interleaved: ``--ab-rounds`` rounds,
    each registering ``--ab-batch`` new agents on every arm in turn (c=32), after ``--agents``
    were registered on each."""
    import aiohttp

    connector = aiohttp.TCPConnector(limit=0)
    out: dict = {name: {"rounds": []} for name in arms}
    async with aiohttp.ClientSession(connector=connector,
                                     timeout=aiohttp.ClientTimeout(total=120)) as session:
        for name, (url, token) in arms.items():
            ids = [f"hb-{index:05d}" for index in range(args.agents)]
            out[name]["preload"] = await register_all(session, url, token, ids, 32)
            print(f"{name}: {args.agents} registered at {out[name]['preload']['per_s']}/s",
                  flush=True)
        for round_no in range(args.ab_rounds):
            for name, (url, token) in arms.items():
                first = args.agents + round_no * args.ab_batch
                ids = [f"new-{index:05d}" for index in range(first, first + args.ab_batch)]
                figures_ = await register_all(session, url, token, ids, 32, first)
                out[name]["rounds"].append(figures_)
                print(f"round {round_no + 1} {name}: {figures_['per_s']}/s "
                      f"p50 {figures_['p50_ms']} ms", flush=True)
    for name in arms:
        rates = [r["per_s"] for r in out[name]["rounds"]]
        out[name]["median_per_s"] = median(rates)
    return out


def main_ab(args) -> int:
    """``--baseline-ref``: registrations/s of this build and of REF, interleaved."""
    started = time.time()
    created: list[str] = []
    result: dict = {}
    try:
        with temp_dir("a2a-registry-ab-") as tmp_name:
            tmp = Path(tmp_name)
            roots = {"baseline": baseline_checkout(args.baseline_ref, tmp), "current": ROOT}
            procs, arms = [], {}
            try:
                for name, root in roots.items():
                    db_url, db_name = create_postgres_db(args.postgres_url)
                    created.append(db_name)
                    node = PlatformNode(f"registry-{name}", tmp, database_url=db_url, root=root)
                    _admin, registrar, _caller = node.prepare()
                    procs.append(node.serve(args.server))
                    arms[name] = (node.url, registrar)
                load = asyncio.run(ab_load(arms, args))
            finally:
                for proc in procs:
                    proc.stop()
    finally:
        for db_name in created:
            drop_postgres_db(args.postgres_url, db_name)
    ratio = load["current"]["median_per_s"] / load["baseline"]["median_per_s"]
    sizes = [len(orjson.dumps(bench_card(i)))
             for i in range(args.agents + args.ab_rounds * args.ab_batch)]
    result = {
        "benchmark": "registry-ab", "database": "postgresql", "server": args.server,
        "baseline_ref": args.baseline_ref, "agents_preloaded": args.agents,
        "rounds": args.ab_rounds, "batch": args.ab_batch, "machine": machine_info(),
        "load_average_at_start": os.getloadavg(), "server_core": 0,
        "load_generator": "aiohttp (core 1)", "command": " ".join(["python", *sys.argv]),
        "card_bytes": {"min": min(sizes), "max": max(sizes),
                       "mean": round(sum(sizes) / len(sizes))},
        **load, "current_over_baseline": round(ratio, 2),
        "elapsed_s": round(time.time() - started, 1),
    }
    print(f"\nregistrations/s, median of {args.ab_rounds} interleaved rounds: "
          f"current {load['current']['median_per_s']}, baseline ({args.baseline_ref}) "
          f"{load['baseline']['median_per_s']}: x{ratio:.2f}")
    path = write_results("registry-ab-postgresql", result)
    print(f"wrote {path} ({result['elapsed_s']} s)")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--postgres", action="store_true",
                        help="PostgreSQL at --postgres-url (a bench database is created)")
    parser.add_argument("--postgres-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--server", choices=["daphne", "uvicorn"], default="daphne")
    parser.add_argument("--agents", type=int)
    parser.add_argument("--more-registrations", type=int, default=3000,
                        help="new agents registered after --agents (the registrations/s figure)")
    parser.add_argument("--registration-concurrency", type=int, default=32, metavar="N",
                        help="concurrent registering clients (default 32; the A/B's rounds "
                             "stay at 32)")
    parser.add_argument("--registrations-only", action="store_true",
                        help="skip the heartbeat phases (profiling registrations)")
    parser.add_argument("--rate", type=float, default=1000.0)
    parser.add_argument("--closed-seconds", type=float)
    parser.add_argument("--open-seconds", type=float)
    parser.add_argument("--resync-seconds", type=float, default=5.0,
                        help="the node's A2A_ROUTING_RESYNC_SECONDS (production: 30)")
    parser.add_argument("--full-resync-seconds", type=float, default=600.0,
                        help="the node's A2A_ROUTING_FULL_RESYNC_SECONDS")
    parser.add_argument("--resync-overlap-seconds", type=float, default=5.0,
                        help="the node's A2A_ROUTING_RESYNC_OVERLAP_SECONDS (production: 60; "
                             "one node has no clock skew; 60 re-reads the registration burst)")
    parser.add_argument("--baseline-ref", metavar="REF",
                        help="A/B instead: registrations/s of this build and of git REF, "
                             "interleaved rounds on PostgreSQL (e.g. --agents 1000)")
    parser.add_argument("--ab-rounds", type=int, default=4)
    parser.add_argument("--ab-batch", type=int, default=300)
    args = parser.parse_args()
    if args.registration_concurrency < 1:
        parser.error("--registration-concurrency must be at least 1")
    args.agents = args.agents or (2000 if args.quick else 10_000)
    if args.baseline_ref:
        pin_self_to_load_core()
        return main_ab(args)
    args.closed_seconds = args.closed_seconds or (5 if args.quick else 15)
    args.open_seconds = args.open_seconds or (5 if args.quick else 20)
    pin_self_to_load_core()
    started = time.time()
    load_at_start = os.getloadavg()
    db_url, db_name = None, None
    if args.postgres:
        db_url, db_name = create_postgres_db(args.postgres_url)
    result: dict = {}
    try:
        with temp_dir("a2a-registry-bench-") as tmp_name:
            resync_env = {
                "A2A_ROUTING_RESYNC_SECONDS": str(args.resync_seconds),
                "A2A_ROUTING_FULL_RESYNC_SECONDS": str(args.full_resync_seconds),
                "A2A_ROUTING_RESYNC_OVERLAP_SECONDS": str(args.resync_overlap_seconds),
            }
            node = PlatformNode("registry-node", Path(tmp_name), database_url=db_url,
                                extra_env=resync_env)
            admin, registrar, _caller = node.prepare()
            proc = node.serve(args.server)
            try:
                load = asyncio.run(run_load(node.url, registrar, args, proc.pid, admin))
            finally:
                proc.stop()
                keep_logs(Path(tmp_name), f"registry-{'postgresql' if db_url else 'sqlite'}")
            if "heartbeat_open" in load:
                load["heartbeat_open"]["resyncs_in_window"] = resyncs_in_window(
                    Path(tmp_name) / f"{proc.name}.log", load["heartbeat_open"].pop("window")
                )
            result = {
                "benchmark": "registry", "database": "postgresql" if db_url else "sqlite",
                "server": args.server, "agents": args.agents, "quick": args.quick,
                "machine": machine_info(), "server_core": 0,
                "load_generator": "aiohttp (core 1)",
                "command": " ".join(["python", *sys.argv]), "node_env": resync_env, **load,
                "load_average_at_start": load_at_start, "load_average_at_end": os.getloadavg(),
                "elapsed_s": round(time.time() - started, 1),
            }
    finally:
        if db_name:
            drop_postgres_db(args.postgres_url, db_name)
    sizes = [len(orjson.dumps(bench_card(index)))
             for index in range(args.agents + args.more_registrations)]
    result["card_bytes"] = {"min": min(sizes), "max": max(sizes),
                            "mean": round(sum(sizes) / len(sizes))}
    target = ""
    if db_url and "heartbeat_open" in result:
        opened = result["heartbeat_open"]
        resyncs = opened["resyncs_in_window"]
        inside = resyncs["full"]["count"] + resyncs["incremental"]["count"]
        # Served: every heartbeat offered answered (999.9/s of 1,000/s offered over a window
        # that closes a hair late is every one of them), none dropped at the in-flight cap.
        served = (args.rate >= 1000 and opened["ok"] == opened["requests"]
                  and not opened.get("dropped_over_in_flight_cap")
                  and opened["per_s"] >= 0.99 * args.rate)
        met = served and (opened["p99_ms"] or 1e9) < 50 and inside > 0
        target = (f" target (1000/s offered all served, p99 < 50 ms, a resync inside the "
                  f"window): "
                  f"{'met' if met else 'NOT met'}")
    if db_url:
        at_scale = result[at_scale_key(args.registration_concurrency)]["per_s"]
        target += (f" registrations at scale: {at_scale}/s "
                   f"({'met' if at_scale >= 1000 else 'NOT met'}, target >= 1000/s)")
    resyncs = result.get("heartbeat_open", {}).get("resyncs_in_window")
    if resyncs:
        print(f"resyncs inside the open-loop window: {resyncs['incremental']['count']} "
              f"incremental, {resyncs['full']['count']} full")
    print(f"\n{result['database']} / {args.server}:{target}")
    path = write_results(f"registry-{result['database']}", result)
    print(f"wrote {path} ({result['elapsed_s']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
