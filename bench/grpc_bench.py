"""The gateway's gRPC binding against direct gRPC to the agent, in the same run.

One a2a-sdk agent (``bench/grpc_agent.py``: the SDK's JSON-RPC application and the SDK's gRPC
handler on one event loop, one ``DefaultRequestHandler``, every message answered ``ok``) and one
embedded node (``manage.py serve --server uvicorn --grpc-port G``), each its own process, both
pinned to the server core; the agent is registered on the node with its JSON-RPC interface only,
so a gRPC call through the gateway is translated to JSON-RPC and back. The load generator is this
process, on the load core. Arms, measured in interleaved rounds (the order rotates each round):

* ``grpc-direct``: a ``grpc.aio`` client (``A2AServiceStub.SendMessage``, unary) calling the
  agent's own gRPC server;
* ``grpc-gateway``: the same client calling the node's gRPC listener (``tenant`` = the agent id,
  the caller's token in ``authorization`` metadata); the node calls the agent's JSON-RPC;
* ``jsonrpc-gateway``: an aiohttp client POSTing JSON-RPC ``SendMessage`` (``A2A-Version: 1.0``)
  to ``/a2a/{agent_id}`` (reference: the same call on the node's HTTP binding);
* ``jsonrpc-direct``: the same aiohttp client POSTing to the agent's JSON-RPC endpoint.

At c=N the gRPC arms keep N unary calls in flight over ``min(N, --channels)`` channels (one HTTP/2
connection each; the node allows 100 streams per connection), the JSON-RPC arms over N keep-alive
connections. Figures per arm and concurrency: calls/s (median over rounds), p50/p99 (all rounds'
calls), server CPU per call (node and agent, each and together, from ``/proc``), the load
generator's CPU share of its core (near 100 % means the client, not the server, set the pace),
errors by status. Ratios:
gateway ÷ direct per binding, the median of each round's back-to-back ratio (the target:
gRPC through the gateway ≥ 0.5 × direct gRPC at c=64). Every reply is checked (``ok``).

    .venv/bin/python bench/grpc_bench.py --quick      # about half a minute
    .venv/bin/python bench/grpc_bench.py              # 3 rounds x 3 s per arm and concurrency
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from collections import Counter
from pathlib import Path

import aiohttp
import grpc
import httpx
import orjson
from a2a.types import a2a_pb2, a2a_pb2_grpc

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (  # noqa: E402
    PYTHON,
    PlatformNode,
    Proc,
    clean_env,
    cpu_seconds,
    free_port,
    median,
    percentile,
    pin_self_to_load_core,
    temp_dir,
    write_results,
)

AGENT_ID = "grpc-bench-agent"
ARMS = ("grpc-direct", "grpc-gateway", "jsonrpc-gateway", "jsonrpc-direct")
RATIOS = {"grpc": ("grpc-gateway", "grpc-direct"),
          "jsonrpc": ("jsonrpc-gateway", "jsonrpc-direct"),
          "grpc_gateway_over_jsonrpc_gateway": ("grpc-gateway", "jsonrpc-gateway")}
TARGET = 0.5  # the goal: gRPC through the gateway >= 0.5x direct gRPC at c=64


def grpc_request(tenant: str, index: int) -> a2a_pb2.SendMessageRequest:
    return a2a_pb2.SendMessageRequest(tenant=tenant, message=a2a_pb2.Message(
        message_id=f"m-{index}", role=a2a_pb2.ROLE_USER, parts=[a2a_pb2.Part(text="hello")]))


def jsonrpc_body(index: int) -> bytes:
    return orjson.dumps({
        "jsonrpc": "2.0", "id": index, "method": "SendMessage",
        "params": {"message": {"messageId": f"m-{index}", "role": "ROLE_USER",
                               "parts": [{"text": "hello"}]}},
    })


def self_cpu() -> float:
    times = os.times()
    return times.user + times.system


class GrpcArm:
    """Channels opened once (kept across rounds, as keep-alive connections are)."""

    def __init__(self, address: str, tenant: str, metadata: tuple, channels: int) -> None:
        self.address, self.tenant, self.metadata = address, tenant, metadata
        self.channels = [grpc.aio.insecure_channel(address) for _ in range(channels)]
        self.stubs = [a2a_pb2_grpc.A2AServiceStub(channel) for channel in self.channels]

    async def call(self, number: int, index: int) -> tuple[bool, str]:
        stub = self.stubs[number % len(self.stubs)]
        try:
            reply = await stub.SendMessage(grpc_request(self.tenant, index),
                                           metadata=self.metadata, timeout=30)
        except grpc.aio.AioRpcError as error:
            return False, f"{error.code().name}: {error.details()}"[:200]
        if reply.message.parts and reply.message.parts[0].text == "ok":
            return True, ""
        return False, f"unexpected reply: {str(reply)[:150]}"

    async def close(self) -> None:
        for channel in self.channels:
            await channel.close()


class JsonRpcArm:
    def __init__(self, url: str, headers: dict[str, str], connections: int) -> None:
        self.url = url
        self.session = aiohttp.ClientSession(
            headers=headers, connector=aiohttp.TCPConnector(limit=connections),
            timeout=aiohttp.ClientTimeout(total=30))

    async def call(self, number: int, index: int) -> tuple[bool, str]:
        try:
            async with self.session.post(self.url, data=jsonrpc_body(index)) as response:
                body = await response.read()
                status = response.status
        except (TimeoutError, aiohttp.ClientError) as error:
            return False, type(error).__name__
        if status != 200:
            return False, f"HTTP {status}: {body[:150]!r}"
        try:
            parts = orjson.loads(body)["result"]["message"]["parts"]
            if parts[0]["text"] == "ok":
                return True, ""
        except (ValueError, KeyError, IndexError, TypeError):
            pass
        return False, f"unexpected reply: {body[:150]!r}"

    async def close(self) -> None:
        await self.session.close()


async def drive(arm, concurrency: int, seconds: float) -> dict:
    """``concurrency`` callers calling back to back for ``seconds``: latencies and errors."""
    latencies: list[float] = []
    errors: Counter[str] = Counter()
    deadline = time.monotonic() + seconds

    async def caller(number: int) -> None:
        index = number * 10_000_000
        while time.monotonic() < deadline:
            index += 1
            started = time.perf_counter()
            good, why = await arm.call(number, index)
            if good:
                latencies.append(time.perf_counter() - started)
            else:
                errors[why] += 1

    cpu_before = self_cpu()
    started = time.monotonic()
    await asyncio.gather(*(caller(n) for n in range(concurrency)))
    elapsed = time.monotonic() - started
    return {"calls": len(latencies), "errors": dict(errors), "seconds": elapsed,
            "client_cpu": self_cpu() - cpu_before, "latencies": latencies}


async def measure(arms_for, levels: list[int], rounds: int, seconds: float,
                  node_pids: list[int], agent_pids: list[int]) -> dict:
    figures: dict[str, dict] = {}
    for concurrency in levels:
        arms = arms_for(concurrency)
        try:
            for arm in arms.values():  # warm up: connections, the node's caches, the agent's
                await drive(arm, min(concurrency, 4), 1.0)
            samples: dict[str, list[dict]] = {name: [] for name in arms}
            for round_number in range(rounds):
                shift = round_number % len(arms)
                order = list(arms)[shift:] + list(arms)[:shift]
                for name in order:
                    node_before, agent_before = cpu_seconds(node_pids), cpu_seconds(agent_pids)
                    run = await drive(arms[name], concurrency, seconds)
                    run["node_cpu"] = cpu_seconds(node_pids) - node_before
                    run["agent_cpu"] = cpu_seconds(agent_pids) - agent_before
                    samples[name].append(run)
                    print(f"  c={concurrency} round {round_number + 1} {name:<16} "
                          f"{run['calls'] / run['seconds']:>8.1f} calls/s, "
                          f"errors {sum(run['errors'].values())}", flush=True)
        finally:
            for arm in arms.values():
                await arm.close()
        figures[f"c={concurrency}"] = summary(samples)
    return figures


def summary(samples: dict[str, list[dict]]) -> dict:
    out: dict[str, dict] = {}
    for name, runs in samples.items():
        latencies = [value for run in runs for value in run["latencies"]]
        calls = sum(run["calls"] for run in runs)
        errors: Counter[str] = Counter()
        for run in runs:
            errors.update(run["errors"])
        out[name] = {
            "calls_per_s": round(median([run["calls"] / run["seconds"] for run in runs]), 1),
            "per_round_calls_per_s": [round(run["calls"] / run["seconds"], 1) for run in runs],
            "p50_ms": round(percentile(latencies, 50) * 1000, 3),
            "p99_ms": round(percentile(latencies, 99) * 1000, 3),
            "server_cpu_us_per_call": round(
                sum(run["node_cpu"] + run["agent_cpu"] for run in runs) / max(calls, 1) * 1e6, 1),
            "node_cpu_us_per_call": round(
                sum(run["node_cpu"] for run in runs) / max(calls, 1) * 1e6, 1),
            "agent_cpu_us_per_call": round(
                sum(run["agent_cpu"] for run in runs) / max(calls, 1) * 1e6, 1),
            "client_cpu_share": round(sum(run["client_cpu"] for run in runs)
                                      / sum(run["seconds"] for run in runs), 2),
            "calls": calls,
            "errors": sum(errors.values()),
            "errors_by_kind": dict(errors.most_common(5)),
        }
    ratios: dict[str, dict] = {}
    for label, (arm, reference) in RATIOS.items():
        per_round = [a["calls"] / a["seconds"] / (r["calls"] / r["seconds"])
                     for a, r in zip(samples[arm], samples[reference], strict=True)
                     if r["calls"]]
        ratios[label] = {
            "throughput_ratio": round(median(per_round), 3) if per_round else None,
            "per_round": [round(value, 3) for value in per_round],
            "p50_ratio": round(out[arm]["p50_ms"] / out[reference]["p50_ms"], 3)
            if out[reference]["p50_ms"] else None,
            "added_p50_ms": round(out[arm]["p50_ms"] - out[reference]["p50_ms"], 3),
            "server_cpu_ratio": round(out[arm]["server_cpu_us_per_call"]
                                      / out[reference]["server_cpu_us_per_call"], 3)
            if out[reference]["server_cpu_us_per_call"] else None,
        }
    out["ratios"] = ratios
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1 round x 2 s")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--concurrency", default="1,64")
    parser.add_argument("--channels", type=int, default=4,
                        help="gRPC channels (HTTP/2 connections) per arm at c > 1")
    parser.add_argument("--server", default="uvicorn", choices=("uvicorn", "daphne"))
    args = parser.parse_args()
    rounds, seconds = (1, 2.0) if args.quick else (args.rounds, args.seconds)
    levels = [int(c) for c in args.concurrency.split(",")]

    with temp_dir("a2a-grpc-bench-") as tmp_name:
        tmp = Path(tmp_name)
        node = PlatformNode("node", tmp)
        admin, _registrar, caller = node.prepare()
        http_port, agent_grpc_port, node_grpc_port = free_port(), free_port(), free_port()
        agent = Proc("agent", [PYTHON, "-m", "bench.grpc_agent", "--http-port", str(http_port),
                               "--grpc-port", str(agent_grpc_port)], clean_env(), tmp).start()
        try:
            agent_url = f"http://127.0.0.1:{http_port}/"
            agent.wait_ready(f"{agent_url}.well-known/agent-card.json")
            node.serve(args.server, "--no-periodic", "--grpc-port", str(node_grpc_port))
            card = httpx.get(f"{agent_url}.well-known/agent-card.json", timeout=10).json()
            registered = httpx.post(
                f"{node.url}/api/v1/agents", headers={"Authorization": f"Bearer {admin}"},
                # a day's TTL (the run sends no heartbeats); no per-agent concurrency cap
                json={"agent_id": AGENT_ID, "url": agent_url, "card": card,
                      "max_concurrency": 100_000, "ttl_seconds": 86_400}, timeout=30)
            registered.raise_for_status()
            pin_self_to_load_core()
            token = (("authorization", f"Bearer {caller}"),)
            json_headers = {"Content-Type": "application/json", "A2A-Version": "1.0"}

            def arms_for(concurrency: int) -> dict:
                channels = max(1, min(concurrency, args.channels))
                return {
                    "grpc-direct": GrpcArm(f"127.0.0.1:{agent_grpc_port}", "", (), channels),
                    "grpc-gateway": GrpcArm(f"127.0.0.1:{node_grpc_port}", AGENT_ID, token,
                                            channels),
                    "jsonrpc-gateway": JsonRpcArm(
                        f"{node.url}/a2a/{AGENT_ID}",
                        {**json_headers, "Authorization": f"Bearer {caller}"}, concurrency),
                    "jsonrpc-direct": JsonRpcArm(agent_url, json_headers, concurrency),
                }

            async def probe_then_measure() -> dict:
                probes = arms_for(1)
                try:
                    for name, arm in probes.items():
                        good, why = await arm.call(0, 0)
                        if not good:
                            raise RuntimeError(f"arm {name} failed its probe: {why}")
                finally:
                    for arm in probes.values():
                        await arm.close()
                return await measure(arms_for, levels, rounds, seconds, node.proc.pids(),
                                     agent.pids())

            figures = asyncio.run(probe_then_measure())
            node_log_errors = [line for line in node.proc.log_tail(400).splitlines()
                               if "REFUSED_STREAM" in line or "Traceback" in line][:10]
        finally:
            if node.proc is not None:
                node.proc.stop()
            agent.stop()

    print_figures(figures)
    path = write_results("grpc", {
        "rounds": rounds, "seconds": seconds, "channels": args.channels, "server": args.server,
        "target": {"grpc_gateway_over_direct_at_c64": TARGET},
        "node_log_errors": node_log_errors, "figures": figures})
    print(f"\nresults: {path.relative_to(Path(__file__).resolve().parent.parent)}")


def print_figures(figures: dict) -> None:
    print(f"\n{'load':<6} {'arm':<16} {'calls/s':>9} {'p50 ms':>8} {'p99 ms':>8} "
          f"{'CPU us/call: node':>18} {'agent':>7} {'client CPU':>10} {'errors':>7}")
    for level, arms in figures.items():
        for name in ARMS:
            f = arms[name]
            print(f"{level:<6} {name:<16} {f['calls_per_s']:>9} {f['p50_ms']:>8} "
                  f"{f['p99_ms']:>8} {f['node_cpu_us_per_call']:>18} "
                  f"{f['agent_cpu_us_per_call']:>7} "
                  f"{f['client_cpu_share']:>10} {f['errors']:>7}")
            for why, count in f["errors_by_kind"].items():
                print(f"{'':<6}   {count} x {why}")
        for label, ratio in arms["ratios"].items():
            arm, reference = RATIOS[label]
            print(f"{level:<6} {arm} / {reference}: x{ratio['throughput_ratio']} "
                  f"(rounds {ratio['per_round']}), added p50 {ratio['added_p50_ms']} ms, "
                  f"server CPU x{ratio['server_cpu_ratio']}")
    c64 = figures.get("c=64", {}).get("ratios", {}).get("grpc", {}).get("throughput_ratio")
    if c64 is not None:
        print(f"\ntarget: gRPC through the gateway >= {TARGET}x direct gRPC at c=64: x{c64} "
              f"({'met' if c64 >= TARGET else 'NOT met'})")


if __name__ == "__main__":
    main()
