"""MCP tool calls against direct gateway calls, in the same run.

One embedded node (``manage.py serve --server uvicorn``, pinned to the server core) and the fast
local agent (``bench/apps.py:upstream``, same core) registered on it. Two arms, measured in
interleaved rounds (the order alternates) at each concurrency:

* ``a2a``: ``POST /a2a/{agent_id}`` with a JSON-RPC ``message/send`` (what an A2A caller sends);
* ``mcp``: ``POST /mcp`` with a JSON-RPC ``tools/call`` of that agent's tool (stateless, the
  handshake-era protocol header, so an SSE response carrying the result), which the bridge
  turns into the same ``message/send`` (the agent's card says it does not stream) through the
  gateway's handler, in-process;
* ``mcp-2026``: the same call in the 2026-07-28 protocol (version, client info and
  capabilities in ``_meta``; ``Mcp-Method``/``Mcp-Name`` headers), answered as JSON.

Both arms are driven by one in-process httpx load generator on the load core (raw HTTP, so the
client's cost is the same for both). Figures per arm: calls/s, p50/p99 latency, server CPU per
call (node and agent, from ``/proc``); and the MCP arm's added latency (p50, p99) and CPU over
the direct call. Every reply is checked (an ``ok`` text); errors are counted.

    .venv/bin/python bench/mcp_bench.py --quick      # about half a minute
    .venv/bin/python bench/mcp_bench.py              # 3 rounds x 4 s per arm and concurrency
    .venv/bin/python bench/mcp_bench.py --baseline-ref REF   # and a node of git REF beside it

``--baseline-ref REF`` adds a second node built from git ``REF`` (``git archive``), with the
same agent registered, and its three arms (``a2a-baseline``, ``mcp-baseline``,
``mcp-2026-baseline``) in the same rotating rounds: this tree's figures against REF's, same
run.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

import httpx
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.apps import CARD  # noqa: E402
from bench.common import (  # noqa: E402
    ROOT,
    PlatformNode,
    Proc,
    clean_env,
    cpu_seconds,
    free_port,
    median,
    percentile,
    pin_self_to_load_core,
    temp_dir,
    uvicorn_argv,
    write_results,
)
from bench.proxy_bench import baseline_checkout  # noqa: E402

AGENT_ID = "bench-agent"
PROTOCOL_VERSION = "2025-11-25"
MODERN_VERSION = "2026-07-28"


def a2a_body(index: int) -> bytes:
    return orjson.dumps({
        "jsonrpc": "2.0", "id": index, "method": "message/send",
        "params": {"message": {"kind": "message", "role": "user", "messageId": f"m-{index}",
                               "parts": [{"kind": "text", "text": "hello"}]}},
    })


def mcp_body(index: int) -> bytes:
    return orjson.dumps({
        "jsonrpc": "2.0", "id": index, "method": "tools/call",
        "params": {"name": AGENT_ID, "arguments": {"message": "hello"}},
    })


def modern_body(index: int) -> bytes:
    """The 2026-07-28 protocol: each request carries its version, client info and
    capabilities in ``_meta`` (no handshake)."""
    return orjson.dumps({
        "jsonrpc": "2.0", "id": index, "method": "tools/call",
        "params": {"name": AGENT_ID, "arguments": {"message": "hello"}, "_meta": {
            "io.modelcontextprotocol/protocolVersion": MODERN_VERSION,
            "io.modelcontextprotocol/clientInfo": {"name": "mcp-bench", "version": "1"},
            "io.modelcontextprotocol/clientCapabilities": {}}},
    })


def a2a_ok(response: httpx.Response) -> bool:
    return response.json().get("result", {}).get("parts", [{}])[0].get("text") == "ok"


def mcp_ok(response: httpx.Response) -> bool:
    """The tool result, from the SSE response of the handshake-era protocol (its last
    ``data:`` line) or a JSON body."""
    text = response.text
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        data = [line[5:].strip() for line in text.splitlines() if line.startswith("data:")]
        text = data[-1] if data else "{}"
    result = orjson.loads(text).get("result", {})
    return not result.get("isError") and result.get("content", [{}])[0].get("text") == "ok"


async def drive(url: str, headers: dict[str, str], body, ok, concurrency: int,
                seconds: float) -> dict:
    """``concurrency`` callers posting back to back for ``seconds``: latencies and errors."""
    latencies: list[float] = []
    errors = 0
    deadline = time.monotonic() + seconds
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(headers=headers, timeout=30, limits=limits) as client:
        async def caller(number: int) -> None:
            nonlocal errors
            index = number * 1_000_000
            while time.monotonic() < deadline:
                index += 1
                started = time.perf_counter()
                try:
                    response = await client.post(url, content=body(index))
                    good = response.status_code == 200 and ok(response)
                except (httpx.HTTPError, ValueError):
                    good = False
                if good:
                    latencies.append(time.perf_counter() - started)
                else:
                    errors += 1

        started = time.monotonic()
        await asyncio.gather(*(caller(n) for n in range(concurrency)))
        elapsed = time.monotonic() - started
    return {"calls": len(latencies), "errors": errors, "seconds": elapsed,
            "latencies": latencies}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1 round x 2 s")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--concurrency", default="1,16")
    parser.add_argument("--baseline-ref", metavar="REF",
                        help="also a node built from this git ref, measured in the same rounds")
    args = parser.parse_args()
    rounds, seconds = (1, 2.0) if args.quick else (args.rounds, args.seconds)
    levels = [int(c) for c in args.concurrency.split(",")]

    with temp_dir("a2a-mcp-bench-") as tmp_name:
        tmp = Path(tmp_name)
        port = free_port()
        agent = Proc("upstream", uvicorn_argv("bench.apps:upstream", port, lifespan="off"),
                     clean_env(), tmp).start()
        agent.wait_ready(f"http://127.0.0.1:{port}/stats")
        upstream = f"http://127.0.0.1:{port}/"
        builds = [("", ROOT)]
        if args.baseline_ref:
            builds.append(("-baseline", baseline_checkout(args.baseline_ref, tmp)))
        nodes: list[PlatformNode] = []
        try:
            arms: dict[str, tuple] = {}
            pids: dict[str, list[int]] = {}
            for suffix, root in builds:
                node = PlatformNode(f"node{suffix}", tmp, root=root)
                nodes.append(node)
                arms.update(_start_node(node, upstream, suffix))
                for name in ("a2a", "mcp", "mcp-2026"):
                    pids[f"{name}{suffix}"] = [*node.proc.pids(), *agent.pids()]
            pin_self_to_load_core()
            for url, headers, body, ok in arms.values():  # warm both paths up
                asyncio.run(drive(url, headers, body, ok, 4, 1.0))
            figures: dict[str, dict] = {}
            for concurrency in levels:
                samples = {name: [] for name in arms}
                for round_number in range(rounds):
                    shift = round_number % len(arms)  # the order rotates each round
                    order = list(arms)[shift:] + list(arms)[:shift]
                    for name in order:
                        url, headers, body, ok = arms[name]
                        cpu_before = cpu_seconds(pids[name])
                        run = asyncio.run(drive(url, headers, body, ok, concurrency, seconds))
                        run["cpu"] = cpu_seconds(pids[name]) - cpu_before
                        samples[name].append(run)
                figures[f"c={concurrency}"] = _summary(samples)
        finally:
            for node in nodes:
                if node.proc is not None:
                    node.proc.stop()
            agent.stop()

    _print(figures)
    path = write_results("mcp", {"rounds": rounds, "seconds": seconds,
                                 "baseline_ref": args.baseline_ref, "figures": figures})
    print(f"\nresults: {path.relative_to(Path(__file__).resolve().parent.parent)}")


def _start_node(node: PlatformNode, upstream: str, suffix: str) -> dict[str, tuple]:
    """Prepare and start ``node`` with the fast local agent registered: its three arms."""
    admin, _registrar, caller = node.prepare()
    node.serve("uvicorn", "--no-periodic")
    registered = httpx.post(
        f"{node.url}/api/v1/agents", headers={"Authorization": f"Bearer {admin}"},
        # A TTL beyond the run (the nodes run without periodic work, so nothing heartbeats).
        json={"agent_id": AGENT_ID, "url": upstream, "ttl_seconds": 3600,
              # not streaming: tool calls use message/send, as the direct arm does
              "card": {**orjson.loads(CARD), "url": upstream,
                       "capabilities": {"streaming": False}}}, timeout=30)
    registered.raise_for_status()
    auth = {"Authorization": f"Bearer {caller}", "Content-Type": "application/json"}
    return {
        f"a2a{suffix}": (f"{node.url}/a2a/{AGENT_ID}", auth, a2a_body, a2a_ok),
        f"mcp{suffix}": (f"{node.url}/mcp", {**auth, "Accept": "application/json, "
                                                             "text/event-stream",
                                             "MCP-Protocol-Version": PROTOCOL_VERSION},
                         mcp_body, mcp_ok),
        f"mcp-2026{suffix}": (f"{node.url}/mcp", {
            **auth, "Accept": "application/json, text/event-stream",
            "MCP-Protocol-Version": MODERN_VERSION, "Mcp-Method": "tools/call",
            "Mcp-Name": AGENT_ID}, modern_body, mcp_ok),
    }


def _summary(samples: dict[str, list[dict]]) -> dict:
    out: dict[str, dict] = {}
    for name, runs in samples.items():
        latencies = [value for run in runs for value in run["latencies"]]
        calls = sum(run["calls"] for run in runs)
        out[name] = {
            "calls_per_s": round(median([run["calls"] / run["seconds"] for run in runs]), 1),
            "p50_ms": round(percentile(latencies, 50) * 1000, 3),
            "p99_ms": round(percentile(latencies, 99) * 1000, 3),
            "cpu_us_per_call": round(sum(run["cpu"] for run in runs) / max(calls, 1) * 1e6, 1),
            "calls": calls,
            "errors": sum(run["errors"] for run in runs),
        }
    for suffix in ("", "-baseline"):
        if f"a2a{suffix}" in out:
            _added(out, suffix)
    if "a2a-baseline" in out:
        out["this_over_baseline"] = {
            name: {"calls_per_s": round(out[name]["calls_per_s"]
                                        / max(out[f"{name}-baseline"]["calls_per_s"], 1e-9), 3),
                   "cpu_us_per_call": round(out[name]["cpu_us_per_call"]
                                            / max(out[f"{name}-baseline"]["cpu_us_per_call"],
                                                  1e-9), 3)}
            for name in ("a2a", "mcp", "mcp-2026")}
    return out


def _added(out: dict, suffix: str) -> None:
    """The MCP arms of one build against that build's direct call."""
    a2a = out[f"a2a{suffix}"]
    for name in (f"mcp{suffix}", f"mcp-2026{suffix}"):
        mcp = out[name]
        out[f"{name}_over_a2a"] = {
            "added_p50_ms": round(mcp["p50_ms"] - a2a["p50_ms"], 3),
            "added_p99_ms": round(mcp["p99_ms"] - a2a["p99_ms"], 3),
            "added_cpu_us_per_call": round(mcp["cpu_us_per_call"] - a2a["cpu_us_per_call"], 1),
            "throughput_ratio": round(mcp["calls_per_s"] / a2a["calls_per_s"], 3)
            if a2a["calls_per_s"] else None,
        }


def _print(figures: dict) -> None:
    print(f"{'load':<6} {'arm':<9} {'calls/s':>9} {'p50 ms':>8} {'p99 ms':>8} "
          f"{'CPU us/call':>12} {'errors':>7}")
    for level, arms in figures.items():
        suffixes = ("", "-baseline") if "a2a-baseline" in arms else ("",)
        for suffix in suffixes:
            for name in (f"a2a{suffix}", f"mcp{suffix}", f"mcp-2026{suffix}"):
                f = arms[name]
                print(f"{level:<6} {name:<18} {f['calls_per_s']:>9} {f['p50_ms']:>8} "
                      f"{f['p99_ms']:>8} {f['cpu_us_per_call']:>12} {f['errors']:>7}")
            for name in (f"mcp{suffix}", f"mcp-2026{suffix}"):
                extra = arms[f"{name}_over_a2a"]
                print(f"{level:<6} {name} adds {extra['added_p50_ms']} ms p50, "
                      f"{extra['added_p99_ms']} ms p99, {extra['added_cpu_us_per_call']} us CPU "
                      f"per call; throughput x{extra['throughput_ratio']}")
        for name, ratio in arms.get("this_over_baseline", {}).items():
            print(f"{level:<6} {name} this / baseline: calls/s x{ratio['calls_per_s']}, "
                  f"CPU per call x{ratio['cpu_us_per_call']}")


if __name__ == "__main__":
    main()
