"""The gateway's outbound client alone: CPU per request of a version under test against a
reference version of ``outbound/http1.py`` (default: the one on ``main``), same run.

A tiny agent (asyncio protocol answering a fixed keep-alive JSON response, its own process
pinned to core 0) is called by each client version in turn (this process, pinned to core 1), at
concurrency 1 and 16, in interleaved rounds; the figure is client CPU microseconds per request
(``time.process_time``), the median over rounds. It isolates what the hardening (header
counting, the no-progress byte counter, connect-time checks on new connections) costs the hot
path, free of the server stacks' noise in ``proxy_bench.py``.

    .venv/bin/python bench/outbound_client_bench.py --quick
    .venv/bin/python bench/outbound_client_bench.py --reference main --requests 20000
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

AGENT = r"""
import asyncio, sys
BODY = b'{"jsonrpc":"2.0","id":1,"result":{"kind":"message","parts":[{"kind":"text","text":"ok"}]}}'
REPLY = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
         + str(len(BODY)).encode() + b"\r\n\r\n" + BODY)
class Agent(asyncio.Protocol):
    def connection_made(self, t): self.t = t; self.buf = b""
    def data_received(self, data):
        self.buf += data
        while True:
            head_end = self.buf.find(b"\r\n\r\n")
            if head_end < 0: return
            head = self.buf[:head_end].lower()
            i = head.find(b"content-length:")
            n = int(head[i + 15:].split(b"\r\n", 1)[0]) if i >= 0 else 0
            if len(self.buf) < head_end + 4 + n: return
            self.buf = self.buf[head_end + 4 + n:]
            self.t.write(REPLY)
async def main():
    server = await asyncio.get_running_loop().create_server(Agent, "127.0.0.1", int(sys.argv[1]))
    print("ready", flush=True)
    await server.serve_forever()
asyncio.run(main())
"""

BODY = b'{"jsonrpc":"2.0","id":1,"method":"message/send","params":{"message":{}}}' + b" " * 900
HEADERS = {"content-type": "application/json", "a2a-version": "0.3", "x-kubemq-caller-id": "c"}


def load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]  # a .py path: a spec
    spec.loader.exec_module(module)  # type: ignore[union-attr]  # a .py path: a loader
    return module


async def measure(module, url: str, requests: int, concurrency: int) -> float:
    client = module.Client()
    per_worker = requests // concurrency

    async def worker() -> None:
        for _ in range(per_worker):
            r = await client.post(url, BODY, HEADERS, 30.0)
            await r.read(1 << 20)
            module.finish(r)

    await worker()  # warm: connections made, caches filled
    start = time.process_time()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    spent = time.process_time() - start
    await client.close()
    return spent / (per_worker * concurrency) * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reference", default="main", help="git revision of the reference")
    parser.add_argument("--requests", type=int, default=10000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="2 rounds of 3,000 requests")
    args = parser.parse_args()
    if args.quick:
        args.requests, args.rounds = 3000, 2
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()
    source = subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{args.reference}:outbound/http1.py"],
        check=True,
        capture_output=True,
    ).stdout
    folder = Path(tempfile.mkdtemp())
    (folder / "reference_outbound.py").write_bytes(source)
    versions = {
        "reference": load(folder / "reference_outbound.py", "reference_outbound"),
        "current": load(ROOT / "outbound" / "http1.py", "current_outbound"),
    }
    from tests.servers import free_port

    port = free_port()
    agent = subprocess.Popen(
        ["taskset", "-c", "0", sys.executable, "-c", AGENT, str(port)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert agent.stdout is not None and agent.stdout.readline().strip() == "ready"
        if hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, {1 % (os.cpu_count() or 1)})
        url = f"http://127.0.0.1:{port}/rpc"
        results: dict[tuple[str, int], list[float]] = {}
        for round_ in range(args.rounds):
            order = list(versions.items())
            if round_ % 2:
                order.reverse()
            for concurrency in (1, 16):
                for name, module in order:
                    us = asyncio.run(measure(module, url, args.requests, concurrency))
                    results.setdefault((name, concurrency), []).append(us)
                    print(
                        f"round {round_ + 1} c={concurrency:<3} {name:<10} {us:7.1f} us CPU/req",
                        flush=True,
                    )
        print()
        summary: dict[str, dict[str, float]] = {}
        for concurrency in (1, 16):
            ref = statistics.median(results[("reference", concurrency)])
            cur = statistics.median(results[("current", concurrency)])
            summary[f"c{concurrency}"] = {
                "reference_us": round(ref, 2),
                "current_us": round(cur, 2),
                "current_over_reference": round(cur / ref, 4),
            }
            print(
                f"c={concurrency:<3} reference {ref:6.1f} us  current {cur:6.1f} us  "
                f"current/reference {cur / ref:5.3f}"
            )
        from bench.common import write_results

        path = write_results(
            "outbound-client",
            {
                "reference": args.reference,
                "requests": args.requests,
                "rounds": args.rounds,
                "us_cpu_per_request": {
                    f"{name}-c{concurrency}": [round(v, 2) for v in values]
                    for (name, concurrency), values in results.items()
                },
                "medians": summary,
            },
        )
        print(f"results: {path.relative_to(ROOT)}")
    finally:
        agent.terminate()
        agent.wait(5)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
