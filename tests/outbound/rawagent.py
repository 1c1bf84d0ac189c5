"""Raw-socket agents: bare TCP servers on loopback whose every byte a test scripts.

Each accepted connection runs ``script(conn, agent)`` in a thread of its own; the agent counts
connections and keeps the requests it read, so tests assert what reached it (how many
connections a client opened, whether a request arrived at all).
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable


def read_request(conn: socket.socket, timeout: float = 5.0) -> bytes:
    """One HTTP/1.1 request (head and Content-Length body); b"" if the peer closed first."""
    conn.settimeout(timeout)
    data = b""
    while b"\r\n\r\n" not in data:
        piece = conn.recv(65536)
        if not piece:
            return b""
        data += piece
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    while len(body) < length:
        piece = conn.recv(65536)
        if not piece:
            break
        body += piece
    return head + b"\r\n\r\n" + body


def response(body: bytes, *, status: bytes = b"200 OK", extra: bytes = b"") -> bytes:
    """A complete keep-alive JSON response."""
    return (
        b"HTTP/1.1 " + status + b"\r\nContent-Type: application/json\r\n"
        b"Content-Length: " + str(len(body)).encode() + b"\r\n" + extra + b"\r\n" + body
    )


Script = Callable[[socket.socket, "RawAgent"], None]


class RawAgent:
    """A bare TCP server on 127.0.0.1 (or ::1) running ``script`` per connection."""

    def __init__(self, script: Script, *, family: int = socket.AF_INET) -> None:
        self.script = script
        self.connections = 0
        self.requests: list[bytes] = []
        self.sent = 0  # bytes the script reports having written (bounds tests)
        self.closed_by_peer = threading.Event()
        self.listener = socket.socket(family, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("::1" if family == socket.AF_INET6 else "127.0.0.1", 0))
        self.listener.listen(64)
        self.port = self.listener.getsockname()[1]
        host = "[::1]" if family == socket.AF_INET6 else "127.0.0.1"
        self.url = f"http://{host}:{self.port}/rpc"
        self._threads: list[threading.Thread] = []
        self._accept = threading.Thread(target=self._serve, daemon=True)
        self._accept.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            thread = threading.Thread(target=self._run, args=(conn,), daemon=True)
            self._threads.append(thread)
            thread.start()

    def _run(self, conn: socket.socket) -> None:
        with conn:
            try:
                self.script(conn, self)
            except OSError:
                self.closed_by_peer.set()

    def take_request(self, conn: socket.socket) -> bytes:
        request = read_request(conn)
        if request:
            self.requests.append(request)
        return request

    def wait_closed(self, conn: socket.socket, seconds: float) -> None:
        """Wait up to ``seconds`` for the peer to close ``conn`` (end of stream or a reset)."""
        conn.settimeout(seconds)
        try:
            while conn.recv(65536):
                pass
        except TimeoutError:
            return  # still open: closed_by_peer stays unset
        except OSError:
            pass
        self.closed_by_peer.set()

    def close(self) -> None:
        self.listener.close()

    def __enter__(self) -> RawAgent:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
