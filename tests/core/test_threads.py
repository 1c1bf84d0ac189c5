"""core.threads: the process's pools are named, bounded, shared by name and stopped together."""

from __future__ import annotations

import threading
import time

from core import threads


def test_a_pool_is_shared_by_name_bounded_and_named():
    threads.discard("t-bounded")
    pool = threads.pool("t-bounded", 2)
    assert threads.pool("t-bounded", 5) is pool  # later callers share it, size unchanged
    running, peak, lock = [0], [0], threading.Lock()

    def work() -> str:
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        time.sleep(0.05)
        with lock:
            running[0] -= 1
        return threading.current_thread().name

    names = [f.result(5) for f in [pool.submit(work) for _ in range(8)]]
    assert peak[0] == 2
    assert all(name.startswith("t-bounded") for name in names)
    assert threads.running()["t-bounded"] == 2
    threads.discard("t-bounded")


def test_shutdown_drops_queued_work_and_a_later_call_gets_a_new_pool():
    threads.discard("t-stop")
    pool = threads.pool("t-stop", 1)
    gate = threading.Event()
    first = pool.submit(gate.wait, 5)
    queued = pool.submit(lambda: "never")
    threads.shutdown()
    gate.set()
    assert first.result(5) is True  # running work finishes
    assert queued.cancelled()
    assert threads.pool("t-stop", 1) is not pool
    threads.discard("t-stop")


def test_started_threads_are_named_and_listed():
    stop = threading.Event()
    thread = threads.start("t-listed", stop.wait, 5)
    assert thread.name == "t-listed" and thread.daemon
    assert "t-listed" in threads.running()
    stop.set()
    thread.join(5)
    assert "t-listed" not in threads.running()
