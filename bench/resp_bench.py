"""RESP parsing on the gateway's Redis connections: the hand-written parser the Redis layer
had (kept here as the reference) against hiredis's ``Reader``, on the traffic a node's
subscribing connection sees (pub/sub ``message`` pushes) and its publishing one (``PUBLISH``
counts), fed in the pieces a socket delivers, rounds interleaved.

    python bench/resp_bench.py --messages 20000 --rounds 7

Each case reports the best and median microseconds per reply of both parsers and their ratio
(hiredis / hand-written: below 1 is faster).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import hiredis  # noqa: E402

from bench.common import write_results  # noqa: E402

_INCOMPLETE: Any = object()


class _Incomplete(Exception):
    pass


class HandWritten:
    """The Redis layer's RESP2 parser before hiredis (gateway/redis_layer.py until 2026-12)."""

    def __init__(self) -> None:
        self.buf = bytearray()
        self.pos = 0

    def feed(self, data: bytes) -> None:
        self.buf += data

    def gets(self) -> Any:
        start = self.pos
        try:
            value = self._parse()
        except _Incomplete:
            self.pos = start
            return _INCOMPLETE
        if self.pos == len(self.buf):
            self.buf.clear()
            self.pos = 0
        elif self.pos > 65536:
            del self.buf[:self.pos]
            self.pos = 0
        return value

    def _parse(self) -> Any:
        buf = self.buf
        pos = self.pos
        end = buf.find(b"\r\n", pos)
        if end < 0:
            raise _Incomplete
        kind = buf[pos]
        self.pos = end + 2
        if kind == 0x24:
            size = int(buf[pos + 1:end])
            if size < 0:
                return None
            stop = end + 2 + size
            if len(buf) < stop + 2:
                raise _Incomplete
            self.pos = stop + 2
            return bytes(buf[end + 2:stop])
        if kind == 0x2A:
            count = int(buf[pos + 1:end])
            if count < 0:
                return None
            return [self._parse() for _ in range(count)]
        if kind == 0x3A:
            return int(buf[pos + 1:end])
        if kind == 0x2B:
            return bytes(buf[pos + 1:end])
        raise ValueError(kind)


def _message(channel: bytes, payload: bytes) -> bytes:
    return (b"*3\r\n$7\r\nmessage\r\n$%d\r\n%b\r\n$%d\r\n%b\r\n"
            % (len(channel), channel, len(payload), payload))


def _pieces(stream: bytes, size: int) -> list[bytes]:
    return [stream[i:i + size] for i in range(0, len(stream), size)]


def _run(pieces: list[bytes], reader: Any, incomplete: Any) -> int:
    count = 0
    for piece in pieces:
        reader.feed(piece)
        while True:
            value = reader.gets()
            if value is incomplete:
                break
            count += 1
    return count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    channel = b"a2a.reply.vm-node-1!7c1f0e2a9b"
    cases = {
        "push 200 B": _message(channel, b"m" * 200),
        "push 4 KiB": _message(channel, b"m" * 4096),
        "push 64 KiB": _message(channel, b"m" * 65536),
        "publish count": b":1\r\n",
    }
    results = {}
    for name, reply in cases.items():
        n = args.messages if len(reply) < 10000 else args.messages // 10
        pieces = _pieces(reply * n, 65536)  # what one socket read delivers at most
        times: dict[str, list[float]] = {"hand-written": [], "hiredis": []}
        for _ in range(args.rounds):
            for label in times:
                if label == "hiredis":
                    reader, incomplete = hiredis.Reader(), False
                else:
                    reader, incomplete = HandWritten(), _INCOMPLETE
                started = time.perf_counter()
                got = _run(pieces, reader, incomplete)
                times[label].append((time.perf_counter() - started) / n * 1e6)
                assert got == n, (label, got, n)
        own, fast = times["hand-written"], times["hiredis"]
        results[name] = {
            "replies": n,
            "hand_written_us": {"best": min(own), "median": statistics.median(own)},
            "hiredis_us": {"best": min(fast), "median": statistics.median(fast)},
            "ratio_median": statistics.median(fast) / statistics.median(own),
        }
        print(f"{name:14} hand-written {statistics.median(own):7.2f} us   hiredis "
              f"{statistics.median(fast):7.2f} us   ratio {results[name]['ratio_median']:.2f}")
    write_results("resp", {"hiredis": hiredis.__version__, "cases": results})


if __name__ == "__main__":
    main()
