"""Edge benchmark: what abusive connections cost a node under each server.

For ``serve --server daphne`` and ``--server uvicorn`` (default limits unless overridden in the
environment), from one client process on loopback:

- **idle**: N connections that never send a byte; how many are still open after each of the
  checkpoints (the header timeout closes them);
- **drip**: N connections that send a request head one byte a second; how many are still open;
- **announce**: a request announcing ``Content-Length`` cap + 1 and sending nothing: time to
  the 413;
- **upload**: unauthenticated chunked uploads of up to ``--upload-mib`` each: bytes the client
  got to send before the node answered, and the node's RSS growth.

    .venv/bin/python bench/edge_bench.py --quick      # ~1 minute: 200 connections, 15 s
    .venv/bin/python bench/edge_bench.py              # 2,000 connections, 120 s

Prints a table and writes JSON to bench/results/.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (  # noqa: E402
    PlatformNode,
    machine_info,
    rss_kib,
    temp_dir,
    write_results,
)

CAP = 10 * 1024 * 1024


async def _open(port: int, count: int) -> list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    conns = []
    for _ in range(count):
        try:
            conns.append(await asyncio.open_connection("127.0.0.1", port))
        except OSError:
            break
    return conns


def _still_open(conns) -> int:
    return sum(
        1 for reader, writer in conns if not reader.at_eof() and not writer.transport.is_closing()
    )


async def _drain(conns) -> None:
    """Read whatever the node sent (a 408, then EOF) so ``at_eof`` reflects a close."""
    for reader, _ in conns:
        try:
            await asyncio.wait_for(reader.read(65536), timeout=0.001)
        except (TimeoutError, OSError):
            pass


async def _drip(conns, stop: asyncio.Event) -> None:
    for _, writer in conns:
        writer.write(b"GET /healthz HTTP/1.1\r\n")
    while not stop.is_set():
        for _, writer in conns:
            if not writer.transport.is_closing():
                writer.write(b"X")
        await asyncio.sleep(1)


async def _announce(port: int) -> float:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    started = time.perf_counter()
    writer.write(
        b"POST /a2a/x HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {CAP + 1}\r\n\r\n".encode()
    )
    line = await asyncio.wait_for(reader.readline(), timeout=30)
    elapsed = time.perf_counter() - started
    writer.close()
    assert b" 413 " in line, line
    return elapsed


async def _upload(port: int, mib: int) -> int:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        b"POST /a2a/x HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n"
    )
    chunk = b"x" * 65536
    frame = b"%x\r\n" % len(chunk) + chunk + b"\r\n"
    sent = 0
    read = asyncio.ensure_future(reader.readline())
    try:
        while sent < mib * 1024 * 1024 and not read.done():
            writer.write(frame)
            await asyncio.wait_for(writer.drain(), timeout=5)
            sent += len(chunk)
    except (OSError, TimeoutError):
        pass
    try:
        await asyncio.wait_for(read, timeout=10)
    except (TimeoutError, OSError):
        pass
    writer.close()
    return sent


async def measure(port: int, pid: int, args) -> dict:
    result: dict = {}
    idle = await _open(port, args.connections)
    drip = await _open(port, args.connections)
    result["opened"] = {"idle": len(idle), "drip": len(drip)}
    stop = asyncio.Event()
    dripper = asyncio.ensure_future(_drip(drip, stop))
    checkpoints = []
    started = time.monotonic()
    for at in args.checkpoints:
        await asyncio.sleep(max(0.0, at - (time.monotonic() - started)))
        await _drain(idle)
        await _drain(drip)
        checkpoints.append(
            {"seconds": at, "idle_open": _still_open(idle), "drip_open": _still_open(drip)}
        )
    stop.set()
    await dripper
    for _, writer in idle + drip:
        writer.close()
    result["checkpoints"] = checkpoints
    result["announce_to_413_ms"] = round(await _announce(port) * 1000, 2)
    rss_before = rss_kib(pid)
    sent = await asyncio.gather(*(_upload(port, args.upload_mib) for _ in range(args.uploads)))
    result["upload_sent_mib"] = [round(s / 1048576, 2) for s in sent]
    result["rss_growth_mib"] = round((rss_kib(pid) - rss_before) / 1024, 1)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--connections", type=int, default=2000)
    parser.add_argument("--uploads", type=int, default=8)
    parser.add_argument("--upload-mib", type=int, default=256)
    parser.add_argument("--servers", default="daphne,uvicorn")
    args = parser.parse_args()
    args.checkpoints = [5, 15] if args.quick else [5, 15, 30, 60, 120]
    if args.quick:
        args.connections, args.uploads, args.upload_mib = 200, 2, 64
    report = {"machine": machine_info(), "args": {k: v for k, v in vars(args).items()}}
    with temp_dir("edge") as tmp:
        for server in args.servers.split(","):
            node = PlatformNode(f"edge-{server}", Path(tmp))
            node.prepare()
            proc = node.serve(server)
            try:
                report[server] = asyncio.run(measure(node.port, proc.pid, args))
            finally:
                proc.stop()
    print(f"{'server':<8} {'t (s)':>6} {'idle open':>10} {'drip open':>10}")
    for server in args.servers.split(","):
        for cp in report[server]["checkpoints"]:
            print(f"{server:<8} {cp['seconds']:>6} {cp['idle_open']:>10} {cp['drip_open']:>10}")
    for server in args.servers.split(","):
        r = report[server]
        print(
            f"{server}: opened {r['opened']}, Content-Length cap+1 -> 413 in "
            f"{r['announce_to_413_ms']} ms; unauthenticated uploads sent "
            f"{r['upload_sent_mib']} MiB before the answer; RSS growth {r['rss_growth_mib']} MiB"
        )
    print(write_results("edge", report))


if __name__ == "__main__":
    main()
