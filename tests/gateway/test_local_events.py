"""Embedded mode's registry events between processes (``gateway.local_events``): what a node
receives, what a sender does with a node that is gone, and who may write to the directory.
The end-to-end proof (a discover run in another process, a call through the node) is in
``test_cross_process_events.py``."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import tempfile
from pathlib import Path

import pytest

from gateway import local_events


@pytest.fixture
def short_tmp():
    """A temporary directory with a short path: a Unix socket's path holds 107 bytes."""
    path = Path(tempfile.mkdtemp(prefix="ev-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_a_listening_node_gets_each_event_and_a_dead_ones_socket_is_removed(short_tmp):
    tmp_path = short_tmp
    directory = tmp_path / "registry.sqlite3.events"

    async def run() -> tuple[list[dict], int, int, bool]:
        got: list[dict] = []
        listener = local_events.Listener(got.append)
        assert listener.start(directory)
        # A node killed without cleaning up: its socket file stays, nobody reads it.
        stale = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        stale.bind(str(directory / "1-1.sock"))
        stale.close()
        delivered = await asyncio.to_thread(local_events.send, {"event": {"kind": "x"}},
                                            directory)
        for _ in range(500):  # until the loop has read the datagram (bounded)
            if got:
                break
            await asyncio.sleep(0.01)
        stale_left = (directory / "1-1.sock").exists()
        listener.stop()
        after = local_events.send({"event": {"kind": "y"}}, directory)
        return got, delivered, after, stale_left

    got, delivered, after, stale_left = asyncio.run(run())
    assert got == [{"event": {"kind": "x"}}] and delivered == 1
    assert not stale_left  # removed by the sender that found it refusing
    assert after == 0 and not directory.exists()  # the last node leaves no litter
    assert local_events.send({"event": {}}, tmp_path / "nobody") == 0


def test_the_directory_is_the_users_alone(short_tmp):
    directory = short_tmp / "events"
    directory.mkdir(mode=0o777)
    os.chmod(directory, 0o777)

    async def run() -> int:
        listener = local_events.Listener(lambda message: None)
        assert listener.start(directory)
        mode = directory.stat().st_mode & 0o777
        listener.stop()
        return mode

    assert asyncio.run(run()) == 0o700


def test_a_path_too_long_for_a_socket_is_refused_with_a_warning(tmp_path, caplog):
    directory = tmp_path / ("x" * 120)

    async def run() -> bool:
        return local_events.Listener(lambda message: None).start(directory)

    assert not asyncio.run(run())
    assert "socket path too long" in caplog.text
