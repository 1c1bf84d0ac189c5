"""Registry events between the processes of one embedded installation, which has no broker.

In embedded mode the channel layer lives in the node's memory, so a registry change made by
another process on the machine (``manage.py discover --once``, ``manage.py shell``, any tool
calling the registry services) would reach the running node only at its next database resync
(``A2A_ROUTING_RESYNC_SECONDS``). Instead, each running node binds a Unix datagram socket in a
directory beside its database (``<sqlite file>.events/``; ``<A2A_DATA_DIR>/events/`` for a
database that is not a file), and a process without a node sends every registry event to each
socket there: the same announcement the replicator sends on Redis in distributed mode, applied
by the same code (``Replicator.remote_message``).

Why this shape: a datagram send never blocks (a full socket drops the event; the resync is
the safety net, as for Redis announcements), needs no port, no token and no polling, and the
directory (0700) admits only the user who owns the database file, who may change the registry
anyway. A socket whose node died refuses the send and is removed by the sender.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

logger = logging.getLogger(__name__)

#: A registry announcement is well under 4 KiB (an id, an endpoint URL, a few fields).
MAX_DATAGRAM = 64 * 1024
# sockaddr_un holds 108 bytes, the terminating NUL included.
_MAX_SOCKET_PATH = 107
_numbers = itertools.count(1)


def events_dir() -> Path:
    """Where this installation's nodes listen: beside the SQLite file the process uses (the
    test database under pytest), so processes on different databases never meet."""
    from django.conf import settings
    from django.db import connections

    db = connections["default"].settings_dict
    name = str(db.get("NAME") or "")
    if db.get("ENGINE", "").endswith("sqlite3") and name and ":memory:" not in name \
            and not name.startswith("file:"):
        return Path(name + ".events")
    return Path(settings.DATA_DIR) / "events"


class Listener:
    """A node's end: receives the datagrams on its event loop and hands each message to
    ``on_message``."""

    def __init__(self, on_message: Callable[[dict[str, Any]], None]) -> None:
        self.on_message = on_message
        self.path: Path | None = None
        self._sock: socket.socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self, directory: Path | None = None) -> bool:
        """Bind the socket (on the running loop); False, logged, when it cannot be bound."""
        directory = directory or events_dir()
        path = directory / f"{os.getpid()}-{next(_numbers)}.sock"  # short: sun_path is small
        if len(os.fsencode(path)) > _MAX_SOCKET_PATH:
            logger.warning("registry events from other processes reach this node only at its "
                           "resync: socket path too long (%s)", path)
            return False
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            if directory.stat().st_uid != os.getuid():
                raise PermissionError(f"{directory} belongs to another user")
            directory.chmod(0o700)  # only this user may announce registry events
            path.unlink(missing_ok=True)  # left by a process that had this pid
            sock.bind(str(path))
            os.chmod(path, 0o600)
            sock.setblocking(False)
        except OSError as exc:
            sock.close()
            logger.warning("registry events from other processes reach this node only at its "
                           "resync: cannot listen at %s (%s)", path, exc)
            return False
        self._sock, self.path = sock, path
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(sock.fileno(), self._readable)
        return True

    def _readable(self) -> None:
        sock = self._sock
        if sock is None:
            return
        for _ in range(256):  # a bounded slice per wake-up; the reader fires again if more
            try:
                data = sock.recv(MAX_DATAGRAM)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                logger.warning("registry event socket: %s", exc)
                return
            try:
                message = orjson.loads(data)
            except orjson.JSONDecodeError:
                logger.warning("ignoring a registry event datagram that is not JSON")
                continue
            if isinstance(message, dict):
                self.on_message(message)

    def stop(self) -> None:
        sock, self._sock = self._sock, None
        if sock is None:
            return
        if self._loop is not None and not self._loop.is_closed():
            self._loop.remove_reader(sock.fileno())
        sock.close()
        if self.path is not None:
            self.path.unlink(missing_ok=True)
            with contextlib.suppress(OSError):  # the last node of this database: no litter
                self.path.parent.rmdir()


def send(message: dict[str, Any], directory: Path | None = None) -> int:
    """Send ``message`` to every node listening for this installation (or in ``directory``);
    how many took it. Never blocks; a socket left by a dead node is removed."""
    directory = directory or events_dir()
    try:
        paths = sorted(directory.glob("*.sock"))
    except OSError:
        return 0
    if not paths:
        return 0
    data = orjson.dumps(message)
    if len(data) > MAX_DATAGRAM:
        logger.warning("registry event too large to send (%d bytes); nodes resync later",
                       len(data))
        return 0
    delivered = 0
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.setblocking(False)
        for path in paths:
            try:
                sock.sendto(data, str(path))
                delivered += 1
            except (ConnectionRefusedError, FileNotFoundError):
                path.unlink(missing_ok=True)  # its node is gone
            except OSError as exc:  # full (BlockingIOError), permissions: the resync catches up
                logger.warning("registry event not delivered to %s (%s); it resyncs later",
                               path.name, exc)
    return delivered
