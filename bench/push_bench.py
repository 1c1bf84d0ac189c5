"""Push relay: pushes relayed per second and agent push -> webhook latency, on PostgreSQL and
Redis with two Celery delivery workers.

    .venv/bin/python bench/push_bench.py --quick          # about a minute
    .venv/bin/python bench/push_bench.py                  # about two and a half minutes

Starts everything itself: a bench database created at ``--postgres-url`` (dropped at the end),
Redis at ``--redis-url`` (give it a database of its own), one node (``manage.py serve --server
uvicorn``) and ``--workers`` Celery workers (``--pool=solo``, ``A2A_PUSH_DELIVERY=celery``), all
pinned to core 0; the orchestrator -- the agent that pushes, the caller's webhook (aiohttp) and
a capturing agent that receives the relayed configs -- on core 1. Each of ``--configs``
configs is relayed for real (a caller's ``message/send`` with a ``pushNotificationConfig``
through the node), then pushed to with the relay secret the agent got.

Phases: **saturate** -- ``--configs`` pushers, each one push after another on its own config,
for ``--seconds``: pushes acknowledged per second (the ingress), pushes delivered per second
(the webhook's arrivals over the same window), the time the backlog took to drain after, node
and worker CPU per push; **paced** -- ``--rate`` pushes per second spread over the configs
(open loop, each push sent at its scheduled time; by default ``--load`` 0.5 of the rate the
saturate phase acknowledged) for ``--seconds``: latency from the push's scheduled send to the
webhook's arrival, p50/p99, and to the node's 202 (the ingress's share). Both check every
acknowledged push arrived, in order per config, and count duplicates.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import aiohttp  # noqa: E402
import orjson  # noqa: E402
from aiohttp import web  # noqa: E402

from bench.common import (  # noqa: E402
    PYTHON,
    PlatformNode,
    Proc,
    cpu_seconds,
    create_postgres_db,
    drop_postgres_db,
    free_port,
    keep_logs,
    percentile,
    pin_self_to_load_core,
    temp_dir,
    write_results,
)

PUSH_ENV = {
    "A2A_PUSH_RELAY": "true",
    "A2A_PUSH_DELIVERY": "celery",
    "A2A_PUSH_RATE_PER_SECOND": "100000",  # the bench measures the relay, not the rate limit
    "A2A_PUSH_RATE_BURST": "100000",
    "A2A_PUSH_SWEEP_SECONDS": "2",
    "LOG_LEVEL": "WARNING",
}


class Rig:
    """The orchestrator's servers: a capturing agent and the caller's webhook."""

    def __init__(self) -> None:
        self.agent_port, self.hook_port = free_port(), free_port()
        self.configs: dict[str, dict] = {}  # message id -> the relayed config the agent got
        self.sent_at: dict[str, float] = {}  # push marker -> scheduled send (monotonic)
        self.acked_at: dict[str, float] = {}  # push marker -> its 202 read
        self.arrivals: list[tuple[float, str, str, str]] = []  # (at, hook, key, marker)

    async def _agent(self, request: web.Request) -> web.Response:
        body = orjson.loads(await request.read())
        params = body.get("params") or {}
        config = (params.get("configuration") or {}).get("pushNotificationConfig")
        if config:
            self.configs[params["message"]["messageId"]] = config
        task = {"kind": "task", "id": f"task-{params['message']['messageId']}",
                "contextId": "bench", "status": {"state": "submitted"}}
        return web.json_response({"jsonrpc": "2.0", "id": body.get("id"), "result": task})

    async def _hook(self, request: web.Request) -> web.Response:
        body = await request.read()
        self.arrivals.append((time.monotonic(), request.match_info["name"],
                              request.headers.get("Idempotency-Key", ""),
                              orjson.loads(body)["statusUpdate"]["marker"]))
        return web.json_response({"ok": True})

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/", self._agent)
        app.router.add_post("/hook/{name}", self._hook)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        for port in (self.agent_port, self.hook_port):
            await web.TCPSite(self.runner, "127.0.0.1", port).start()


async def relay_configs(session: aiohttp.ClientSession, rig: Rig, node: str, agent_id: str,
                        caller: str, count: int) -> list[dict]:
    out = []
    for i in range(count):
        message_id = f"m{i}-{os.urandom(3).hex()}"
        async with session.post(f"{node}/a2a/{agent_id}", headers={
                "Authorization": f"Bearer {caller}"}, json={
                "jsonrpc": "2.0", "id": i, "method": "message/send", "params": {
                    "message": {"role": "user", "messageId": message_id,
                                "parts": [{"kind": "text", "text": "hi"}]},
                    "configuration": {"pushNotificationConfig": {
                        "url": f"http://127.0.0.1:{rig.hook_port}/hook/c{i}",
                        "token": "caller-token"}}}}) as response:
            answer = await response.json()
            assert response.status == 200 and "result" in answer, answer
        out.append({**rig.configs[message_id], "name": f"c{i}", "task": f"t{i}"})
    return out


async def push(session: aiohttp.ClientSession, rig: Rig, config: dict, marker: str,
               at: float, acked: dict[str, tuple[str, int]], errors: dict[str, int]) -> None:
    rig.sent_at[marker] = at
    body = orjson.dumps({"statusUpdate": {"taskId": config["task"], "marker": marker,
                                          "status": {"state": "TASK_STATE_WORKING"}}})
    try:
        async with session.post(config["url"], data=body, headers={
                "Content-Type": "application/json",
                "X-A2A-Notification-Token": config["token"]}) as response:
            if response.status == 202:
                acked[marker] = (config["name"], (await response.json())["sequence"])
                rig.acked_at[marker] = time.monotonic()
            else:
                errors[f"http {response.status}"] = errors.get(f"http {response.status}", 0) + 1
    except (aiohttp.ClientError, TimeoutError) as exc:
        errors[type(exc).__name__] = errors.get(type(exc).__name__, 0) + 1


def check(rig: Rig, acked: dict[str, tuple[str, int]], since: int) -> dict:
    """Every acknowledged push arrived; in order per config; duplicates counted."""
    arrivals = rig.arrivals[since:]
    seen: dict[str, list[int]] = {}
    duplicates = 0
    keys: set[str] = set()
    for _, name, key, _marker in arrivals:
        if key in keys:
            duplicates += 1
            continue
        keys.add(key)
        seen.setdefault(name, []).append(int(key.rsplit(".", 1)[1]))
    arrived = {marker for _, _, _, marker in arrivals}
    return {"acked": len(acked), "missing": len(set(acked) - arrived),
            "duplicates": duplicates,
            "in_order": all(seqs == sorted(seqs) for seqs in seen.values())}


async def drain(rig: Rig, acked: dict, since: int, timeout: float) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        arrived = {marker for _, _, _, marker in rig.arrivals[since:]}
        if set(acked) <= arrived:
            break
        await asyncio.sleep(0.05)
    return time.monotonic() - started


async def saturate(session, rig: Rig, configs: list[dict], seconds: float, pids: list[int],
                   ) -> dict:
    acked: dict[str, tuple[str, int]] = {}
    errors: dict[str, int] = {}
    since = len(rig.arrivals)
    cpu0 = cpu_seconds(pids)
    started = time.monotonic()
    end = started + seconds

    async def pusher(config: dict) -> None:
        n = 0
        while time.monotonic() < end:
            n += 1
            await push(session, rig, config, f"s-{config['name']}-{n}", time.monotonic(),
                       acked, errors)

    await asyncio.gather(*(pusher(c) for c in configs))
    window = time.monotonic() - started
    in_window = sum(1 for at, *_ in rig.arrivals[since:] if at <= started + window)
    drained = await drain(rig, acked, since, timeout=120)
    cpu = cpu_seconds(pids) - cpu0
    out = {"configs": len(configs), "seconds": round(window, 2),
           "acked_per_second": round(len(acked) / window, 1),
           "delivered_per_second_in_window": round(in_window / window, 1),
           "drain_seconds": round(drained, 2),
           "server_cpu_ms_per_push": round(cpu * 1000 / max(1, len(acked)), 2),
           "errors": errors}
    out.update(check(rig, acked, since))
    return out


async def paced(session, rig: Rig, configs: list[dict], rate: float, seconds: float) -> dict:
    acked: dict[str, tuple[str, int]] = {}
    errors: dict[str, int] = {}
    since = len(rig.arrivals)
    started = time.monotonic()
    total = int(rate * seconds)
    tasks = []
    for i in range(total):
        at = started + i / rate
        await asyncio.sleep(max(0.0, at - time.monotonic()))
        config = configs[i % len(configs)]
        tasks.append(asyncio.create_task(push(session, rig, config, f"p-{i}", at, acked,
                                              errors)))
    await asyncio.gather(*tasks)
    await drain(rig, acked, since, timeout=60)
    latencies = [(at - rig.sent_at[marker]) * 1000 for at, _, _, marker in rig.arrivals[since:]
                 if marker in acked]
    ingress = [(rig.acked_at[m] - rig.sent_at[m]) * 1000 for m in acked]
    out = {"rate": rate, "seconds": seconds, "sent": total,
           "latency_ms_p50": round(percentile(latencies, 50), 1),
           "latency_ms_p99": round(percentile(latencies, 99), 1),
           "ingress_ack_ms_p50": round(percentile(ingress, 50), 1),
           "ingress_ack_ms_p99": round(percentile(ingress, 99), 1),
           "latency_ms_max": round(max(latencies, default=float("nan")), 1), "errors": errors}
    out.update(check(rig, acked, since))
    return out


def register(node: PlatformNode, admin: str, url: str) -> str:
    import httpx

    agent_id = f"push-bench-{os.urandom(3).hex()}"
    response = httpx.post(f"{node.url}/api/v1/agents", timeout=30, headers={
        "Authorization": f"Bearer {admin}"}, json={
        "agent_id": agent_id, "url": url, "card": {"name": "Push bench agent", "url": url}})
    assert response.status_code == 201, response.text
    return agent_id


async def run(args: argparse.Namespace, node: PlatformNode, admin: str, caller: str,
              pids: list[int]) -> dict:
    rig = Rig()
    await rig.start()
    agent_id = register(node, admin, f"http://127.0.0.1:{rig.agent_port}/")
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector,
                                     timeout=aiohttp.ClientTimeout(total=30)) as session:
        configs = await relay_configs(session, rig, node.url, agent_id, caller, args.configs)
        warm = await saturate(session, rig, configs, 2.0, pids)
        full = await saturate(session, rig, configs, args.seconds, pids)
        # Latency below saturation: half the rate the saturated ingress acknowledged.
        rate = args.rate or max(1.0, round(full["acked_per_second"] * args.load, 1))
        result = {"warmup": warm, "saturate": full,
                  "paced": await paced(session, rig, configs, rate, args.seconds)}
    await rig.runner.cleanup()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--postgres-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/12")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--configs", type=int, help="pushers (one config each); 32, quick 16")
    parser.add_argument("--seconds", type=float, help="per phase; 30, quick 8")
    parser.add_argument("--rate", type=float,
                        help="paced phase's pushes/s; default: --load x the saturated rate")
    parser.add_argument("--load", type=float, default=0.5,
                        help="the paced rate as a share of the saturate phase's (0.5)")
    args = parser.parse_args()
    args.configs = args.configs or (16 if args.quick else 32)
    args.seconds = args.seconds or (8.0 if args.quick else 30.0)

    db_url, db_name = create_postgres_db(args.postgres_url)
    procs: list[Proc] = []
    with temp_dir("a2a-push-bench-") as tmp_name:
        tmp = Path(tmp_name)
        try:
            node = PlatformNode("node", tmp, database_url=db_url,
                                extra_env={"REDIS_URL": args.redis_url, **PUSH_ENV})
            admin, _registrar, caller = node.prepare()
            procs.append(node.serve("uvicorn"))
            for i in range(args.workers):
                procs.append(Proc(f"worker-{i}", [
                    PYTHON, "-m", "celery", "-A", "config", "worker", "--pool=solo",
                    "-n", f"push-bench-{i}@%h", "--without-heartbeat", "--without-gossip",
                    "--without-mingle", "-l", "warning"], node.env, tmp).start())
            time.sleep(3)  # the workers connect to the broker
            for proc in procs:
                if not proc.alive():
                    raise RuntimeError(f"{proc.name} exited:\n{proc.log_tail()}")
            pin_self_to_load_core()
            result = asyncio.run(run(args, node, admin, caller,
                                     [pid for p in procs for pid in p.pids()]))
        finally:
            for proc in procs:
                proc.stop()
            keep_logs(tmp, "push")
            drop_postgres_db(args.postgres_url, db_name)
    payload = {"settings": {"workers": args.workers, "configs": args.configs,
                            "seconds": args.seconds, "rate": args.rate, "load": args.load,
                            "quick": args.quick,
                            "env": PUSH_ENV}, **result}
    path = write_results("push", payload)
    s, p = result["saturate"], result["paced"]
    print(f"saturate ({args.configs} pushers, {args.workers} workers): "
          f"{s['acked_per_second']} pushes/s acknowledged, "
          f"{s['delivered_per_second_in_window']} delivered/s, drained in {s['drain_seconds']} s,"
          f" {s['server_cpu_ms_per_push']} ms server CPU/push; missing {s['missing']}, "
          f"duplicates {s['duplicates']}, in order {s['in_order']}")
    print(f"paced ({p['rate']}/s): push -> webhook p50 {p['latency_ms_p50']} ms, "
          f"p99 {p['latency_ms_p99']} ms (the node's 202: p50 {p['ingress_ack_ms_p50']} ms, "
          f"p99 {p['ingress_ack_ms_p99']} ms); missing {p['missing']}, in order {p['in_order']}")
    print(f"results: {path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path}")


if __name__ == "__main__":
    main()
