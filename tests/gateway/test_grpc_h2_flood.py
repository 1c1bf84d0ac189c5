"""Raw HTTP/2 floods against the node's gRPC listener: what a hostile peer can send below gRPC.

A stock gRPC client cannot misbehave at the HTTP/2 layer, so these tests speak HTTP/2 on a bare
socket: frames built with hyperframe and header blocks with hpack (the ``h2`` package's own
layers, requirements/dev.txt), and an ``h2`` client connection where the frames are
well-formed. Against the running node of tests/gateway/test_grpc_hostile.py (``manage.py
serve`` in a subprocess: its RSS and CPU time are its own), each flood must be bounded -- the
connection closed or the stream refused, the node's memory and CPU bounded -- and a caller on
another connection must be served meanwhile and after:

- a header block far above the metadata limit (HEADERS and CONTINUATIONs, one huge field);
- a header block of a huge number of one-byte (indexed) fields;
- rapid reset (complete requests each cancelled at once, HEADERS + DATA + RST_STREAM);
- a SETTINGS flood, never reading the acknowledgements;
- a CONTINUATION flood (a header block that never ends, each frame full of new fields) and a
  PING flood from a peer that never reads: grpcio's core bounds neither, the node's frame guard
  (gateway/grpc_binding/frame_guard.py) closes such a connection.
"""

from __future__ import annotations

import os
import select
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import hpack
import pytest
from hyperframe.frame import (
    ContinuationFrame,
    DataFrame,
    Frame,
    GoAwayFrame,
    HeadersFrame,
    PingFrame,
    RstStreamFrame,
    SettingsFrame,
)

from gateway.grpc_binding.server import MAX_METADATA_BYTES
from tests.gateway import test_grpc_hostile as hostile_tests

pytestmark = pytest.mark.one_pass("embedded")

# The node of tests/gateway/test_grpc_hostile.py (its agents and caps), one per module.
own_grpc_agent = hostile_tests.own_grpc_agent
listener = hostile_tests.listener
hostile = hostile_tests.hostile

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
FRAME = 16 * 1024  # SETTINGS_MAX_FRAME_SIZE's default: the largest frame a peer must take
#: What a flood may add to the node's RSS (its baseline is about 100 MiB); every flood sends
#: several times this.
RSS_GROWTH_MIB = 48
#: What a flood may cost the node in CPU once it has stopped (a second measured): nothing
#: left running on its behalf.
IDLE_CPU_SECONDS = 0.3
#: Each flood's bound in time (it stops earlier once the node closes the connection).
FLOOD_SECONDS = 4.0

def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def request_headers(listener, path: str = "/lf.a2a.v1.A2AService/SendMessage",
                    ) -> list[tuple[str, str]]:
    return [(":method", "POST"), (":scheme", "http"), (":path", path),
            (":authority", listener.address), ("content-type", "application/grpc"),
            ("te", "trailers"), ("authorization", f"Bearer {listener.node.token}")]


def grpc_message(listener, text: str) -> bytes:
    body = listener.request(text).SerializeToString()
    return b"\x00" + len(body).to_bytes(4, "big") + body


class RawConnection:
    """One HTTP/2 connection to the listener on a bare socket: frames in, frames out."""

    def __init__(self, address: str) -> None:
        host, port = address.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=5)
        self.sock.sendall(PREFACE + SettingsFrame(0).serialize())
        self.buffer = b""
        self.closed = False
        self.stalled = False  # the node stopped reading (a send waited 5 s)
        # The node's SETTINGS, acknowledged (unacknowledged, it would close the connection
        # after its settings timeout).
        for frame in self.frames(5.0):
            if isinstance(frame, SettingsFrame) and "ACK" not in frame.flags:
                self.sock.sendall(SettingsFrame(0, flags=["ACK"]).serialize())
                break
        else:
            raise AssertionError("the listener sent no SETTINGS")

    def send(self, *frames: Frame) -> bool:
        """Send ``frames``; False once the node closed the connection (reset, broken pipe) or
        stopped reading it."""
        return self.send_bytes(b"".join(frame.serialize() for frame in frames))

    def send_bytes(self, data: bytes) -> bool:
        try:
            self.sock.sendall(data)
            return True
        except TimeoutError:
            self.stalled = True
            return False
        except OSError:
            self.closed = True
            return False

    def frames(self, seconds: float) -> Iterator[Frame]:
        """The frames the node sends within ``seconds`` (sooner if it closes)."""
        deadline = time.monotonic() + seconds
        while True:
            while len(self.buffer) >= 9:
                frame, length = Frame.parse_frame_header(memoryview(self.buffer[:9]))
                if len(self.buffer) < 9 + length:
                    break
                frame.parse_body(memoryview(self.buffer[9:9 + length]))
                self.buffer = self.buffer[9 + length:]
                yield frame
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self.closed:
                return
            self.sock.settimeout(remaining)
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                return
            except OSError:
                data = b""
            if not data:
                self.closed = True
                return
            self.buffer += data

    def close(self) -> None:
        self.sock.close()


def header_block_frames(stream_id: int, block: bytes, *, end_headers: bool = True,
                        end_stream: bool = False) -> list[Frame]:
    """``block`` as a HEADERS frame and the CONTINUATIONs that follow, ``FRAME`` bytes each."""
    pieces = [block[i:i + FRAME] for i in range(0, len(block), FRAME)] or [b""]
    first = HeadersFrame(stream_id, pieces[0])
    if end_stream:
        first.flags.add("END_STREAM")
    frames: list[Frame] = [first]
    for piece in pieces[1:]:
        frames.append(ContinuationFrame(stream_id, piece))
    if end_headers:
        frames[-1].flags.add("END_HEADERS")
    return frames


def refusal(connection: RawConnection, stream_id: int, seconds: float = 5.0) -> str:
    """How the node refused ``stream_id``: ``grpc-status N`` (its trailers), ``rst_stream``,
    ``goaway`` or ``closed``; fails when the stream got a reply or nothing came."""
    decoder = hpack.Decoder()
    decoder.max_allowed_table_size = 1 << 16
    block = b""
    for frame in connection.frames(seconds):
        if isinstance(frame, GoAwayFrame):
            return "goaway"
        if frame.stream_id != stream_id:
            continue
        if isinstance(frame, RstStreamFrame):
            return "rst_stream"
        if isinstance(frame, DataFrame) and frame.data:
            raise AssertionError("the refused stream got a reply message")
        if isinstance(frame, HeadersFrame | ContinuationFrame):
            block += frame.data
            if "END_HEADERS" in frame.flags:
                fields = dict(decoder.decode(block))
                block = b""
                if "grpc-status" in fields:
                    assert fields["grpc-status"] != "0", fields
                    return f"grpc-status {fields['grpc-status']}"
    if connection.closed:
        return "closed"
    raise AssertionError(f"stream {stream_id} was neither answered nor refused in {seconds} s")


@contextmanager
def bounded(node) -> Iterator[None]:
    """The node's RSS (sampled every 20 ms) grows at most ``RSS_GROWTH_MIB`` during the
    block, and it is idle after it (at most ``IDLE_CPU_SECONDS`` of CPU in a second)."""
    before = node.rss_mib()
    peak = [before]
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.02):
            peak[0] = max(peak[0], node.rss_mib())

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        yield
    finally:
        stop.set()
        sampler.join(5)
    grown = max(peak[0], node.rss_mib()) - before
    assert grown < RSS_GROWTH_MIB, f"the node's RSS grew by {grown:.0f} MiB"
    cpu = cpu_seconds(node.process.pid)
    time.sleep(1.0)
    spent = cpu_seconds(node.process.pid) - cpu
    assert spent < IDLE_CPU_SECONDS, f"the node spent {spent:.2f} s of CPU after the flood"


@contextmanager
def served_meanwhile(listener) -> Iterator[list[float]]:
    """Echo calls on their own connections all along the block, every one answered."""
    stop = threading.Event()
    latencies: list[float] = []
    failures: list[BaseException] = []

    def call() -> None:
        while not stop.is_set():
            started = time.monotonic()
            try:
                listener.echo()
            except BaseException as exc:  # noqa: BLE001 - reported below
                failures.append(exc)
                return
            latencies.append(time.monotonic() - started)
            time.sleep(0.05)

    worker = threading.Thread(target=call, daemon=True)
    worker.start()
    try:
        yield latencies
    finally:
        stop.set()
        worker.join(15)
    assert not failures, f"a caller on another connection failed: {failures[0]!r}"
    assert latencies, "no call on another connection completed during the flood"


def test_a_header_block_far_above_the_metadata_limit_is_refused(hostile):
    """One field of 1 MiB (64 frames): the stream is refused, the agent never called."""
    encoder = hpack.Encoder()
    block = encoder.encode([*request_headers(hostile),
                            ("x-huge", os.urandom(512 * 1024).hex())], huffman=False)
    assert len(block) > 64 * MAX_METADATA_BYTES
    connection = RawConnection(hostile.address)
    try:
        with bounded(hostile.node), served_meanwhile(hostile):
            connection.send(*header_block_frames(1, block))
            connection.send(DataFrame(1, grpc_message(hostile, "huge"), flags=["END_STREAM"]))
            how = refusal(connection, 1)
    finally:
        connection.close()
    assert how in ("grpc-status 8", "rst_stream", "goaway", "closed"), how
    assert "huge" not in hostile.agent.texts
    hostile.echo()


def test_a_continuation_flood_is_bounded(hostile):
    """A header block that never ends (CVE-2024's CONTINUATION flood): frame after frame of
    new fields, never END_HEADERS, for up to ``FLOOD_SECONDS``. The node neither keeps them
    (RSS) nor stops serving others; the connection is closed or the fields discarded."""
    encoder = hpack.Encoder()
    connection = RawConnection(hostile.address)
    sent = 0
    try:
        with bounded(hostile.node), served_meanwhile(hostile):
            assert connection.send(HeadersFrame(1, encoder.encode(request_headers(hostile))))
            # One frame of new fields (each a literal added to HPACK's dynamic table), sent
            # again and again: every copy decodes as new fields.
            fields = [(f"x-flood-{number}", "v" * 64) for number in range(190)]
            frame = ContinuationFrame(1, encoder.encode(fields, huffman=False))
            assert len(frame.data) <= FRAME
            burst = frame.serialize() * 16
            deadline = time.monotonic() + FLOOD_SECONDS
            while time.monotonic() < deadline and connection.send_bytes(burst):
                sent += 16 * len(frame.data)
            # Whatever the node did meanwhile: it refuses the stream or closed the connection.
            connection.send(ContinuationFrame(1, b"", flags=["END_HEADERS"]))
            how = refusal(connection, 1)
    finally:
        connection.close()
    assert how in ("grpc-status 8", "rst_stream", "goaway", "closed"), how
    # Either the node closed the connection early, or it read (and dropped) far more than
    # it may keep.
    assert connection.closed or connection.stalled \
        or sent > 4 * RSS_GROWTH_MIB * 1024 * 1024, sent
    assert hostile.agent.texts == [] or set(hostile.agent.texts) == {"ping"}
    hostile.echo()


def test_a_header_block_of_a_huge_number_of_tiny_fields_is_refused(hostile):
    """300,000 one-byte fields (each an index into HPACK's static table, each counted 32
    bytes and more against the limit): refused, fast, without the node keeping them."""
    encoder = hpack.Encoder()
    # Static table entry 16: ``accept-encoding: gzip, deflate``, one byte when indexed.
    block = encoder.encode(request_headers(hostile)) + b"\x90" * 300_000
    connection = RawConnection(hostile.address)
    try:
        with bounded(hostile.node), served_meanwhile(hostile):
            started = time.monotonic()
            connection.send(*header_block_frames(1, block))
            connection.send(DataFrame(1, grpc_message(hostile, "tiny"), flags=["END_STREAM"]))
            how = refusal(connection, 1)
            assert time.monotonic() - started < 5
    finally:
        connection.close()
    assert how in ("grpc-status 8", "rst_stream", "goaway", "closed"), how
    assert "tiny" not in hostile.agent.texts
    hostile.echo()


RESET_STREAMS = 20_000


def test_rapid_reset_is_bounded(hostile):
    """Complete requests, each cancelled at once (HEADERS + DATA + RST_STREAM), as fast as
    the socket takes them: the node never runs more of them at once than it may (the agent
    sees a small share at most), stays bounded, and serves other connections."""
    config = h2.config.H2Configuration(client_side=True, header_encoding="utf-8")
    conn = h2.connection.H2Connection(config=config)
    conn.initiate_connection()
    host, port = hostile.address.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=5)
    sock.sendall(conn.data_to_send())
    headers = request_headers(hostile)
    body = grpc_message(hostile, "reset me")
    sent = 0
    state = {"closed": False}

    def take(wait: float) -> None:
        """Feed what the node sent (window updates, its answers) to the client connection."""
        sock.settimeout(wait)
        try:
            data = sock.recv(1 << 20)
        except (TimeoutError, BlockingIOError):
            return
        except OSError:
            data = b""
        if not data:
            state["closed"] = True
            return
        try:
            events = conn.receive_data(data)
        except h2.exceptions.ProtocolError:
            state["closed"] = True
            return
        if any(isinstance(event, h2.events.ConnectionTerminated) for event in events):
            state["closed"] = True
        pending = conn.data_to_send()
        if pending:
            sock.sendall(pending)

    try:
        with bounded(hostile.node), served_meanwhile(hostile):
            deadline = time.monotonic() + FLOOD_SECONDS
            while sent < RESET_STREAMS and time.monotonic() < deadline \
                    and not state["closed"]:
                for _ in range(100):
                    if conn.outbound_flow_control_window < len(body):
                        break  # the node grants more as it reads
                    stream_id = conn.get_next_available_stream_id()
                    conn.send_headers(stream_id, headers)
                    conn.send_data(stream_id, body, end_stream=True)
                    conn.reset_stream(stream_id)
                    sent += 1
                try:
                    sock.sendall(conn.data_to_send())
                except OSError:
                    state["closed"] = True
                    break
                take(0.0 if conn.outbound_flow_control_window >= len(body) else 0.5)
    finally:
        sock.close()
    reached = hostile.agent.texts.count("reset me")
    assert sent >= 1000, sent
    # Cancelled before the node's handler ran, most never reach the agent; none is kept.
    assert reached <= sent // 10, (reached, sent)
    assert hostile.agent.wait_closed(10)
    hostile.echo()


@pytest.mark.parametrize("kind", ["SETTINGS", "PING"])
def test_settings_and_ping_floods_are_bounded(hostile, kind):
    """Frames each calling for an acknowledgement, sent for up to ``FLOOD_SECONDS`` by a peer
    that never reads them: the acknowledgements cannot pile up in the node (it stops reading,
    or closes the connection: the frame guard's PING limit)."""
    connection = RawConnection(hostile.address)
    batch = b"".join(
        (SettingsFrame(0, settings={SettingsFrame.INITIAL_WINDOW_SIZE: 65535})
         if kind == "SETTINGS" else PingFrame(0, opaque_data=i.to_bytes(8, "big"))).serialize()
        for i in range(1000))
    sent = 0
    pending = b""
    connection.sock.setblocking(False)
    try:
        with bounded(hostile.node), served_meanwhile(hostile):
            deadline = time.monotonic() + FLOOD_SECONDS
            while time.monotonic() < deadline:
                if not pending:
                    pending = batch
                # Whole frames only: a send the node does not take waits (it stopped reading).
                if not select.select([], [connection.sock], [], 0.1)[1]:
                    continue
                try:
                    sent += connection.sock.send(pending[:65536])
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError:
                    connection.closed = True
                    break
                pending = batch[sent % len(batch):] if sent % len(batch) else b""
    finally:
        connection.close()
    assert sent >= len(batch)
    hostile.echo()
