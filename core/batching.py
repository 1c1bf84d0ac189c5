"""Coalescing concurrent requests into batches on the event loop (group commit).

A :class:`Coalescer` runs one batch at a time: the first request starts a batch at once (no
added latency when idle); requests arriving while it runs wait and form the next one, up to
``max_batch`` items. So the batch size follows the load by itself: one under light load, many
when a database round trip and a commit per request would otherwise queue. Each item gets its
own result (or exception). The queue of waiting items is bounded: past ``max_waiting`` a
submission is refused with :class:`Overloaded` rather than queued.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")


class Overloaded(Exception):
    """More items wait for a batch than the coalescer holds."""


class Coalescer(Generic[T, R]):
    """Batches of items submitted concurrently to one event loop, run by ``run``.

    ``run(items)`` answers one result per item, in order; an item's result that is an
    exception is raised to that item's submitter alone. ``run`` raising fails the whole batch.
    """

    def __init__(self, run: Callable[[list[T]], Awaitable[Sequence[R | BaseException]]], *,
                 max_batch: int, max_waiting: int, max_running: int = 1) -> None:
        self._run = run
        self._max_batch = max_batch
        self._max_waiting = max_waiting
        self._max_running = max_running
        self._waiting: list[tuple[T, asyncio.Future[R]]] = []
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def waiting(self) -> int:
        """Items submitted and not yet taken into a batch."""
        return len(self._waiting)

    @property
    def running(self) -> int:
        """Batches being written now."""
        return len(self._tasks)

    async def submit(self, item: T) -> R:
        """``item``'s result, once a batch holding it has run."""
        if len(self._waiting) >= self._max_waiting:
            raise Overloaded
        future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._waiting.append((item, future))
        if len(self._tasks) < self._max_running:
            task = asyncio.get_running_loop().create_task(self._drain())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return await future

    async def _drain(self) -> None:
        try:
            while self._waiting:
                batch = self._waiting[:self._max_batch]
                del self._waiting[:self._max_batch]
                await self._run_batch(batch)
        except BaseException as exc:  # cancelled (the loop shuts down): no waiter left hanging
            waiting, self._waiting = self._waiting, []
            _fail(waiting, exc)
            raise

    async def _run_batch(self, batch: list[tuple[T, asyncio.Future[R]]]) -> None:
        try:
            results = await self._run([item for item, _ in batch])
            if len(results) != len(batch):
                raise RuntimeError(f"{len(results)} results for a batch of {len(batch)}")
        except BaseException as exc:
            _fail(batch, exc)
            if not isinstance(exc, Exception):  # cancellation: stop, as asked
                raise
            return
        for (_, future), result in zip(batch, results, strict=True):
            if future.done():  # its submitter went away (a client disconnected)
                continue
            if isinstance(result, BaseException):
                future.set_exception(result)
            else:
                future.set_result(result)


def _fail(batch: list[tuple[Any, asyncio.Future[Any]]], exc: BaseException) -> None:
    for _, future in batch:
        if future.done():
            continue
        if isinstance(exc, asyncio.CancelledError):
            future.cancel()
        else:
            future.set_exception(exc)


def per_loop(factory: Callable[[], T]) -> Callable[[], T]:
    """A function answering one object per running event loop (``factory()`` made on first
    use): a coalescer's futures belong to one loop, and a test process runs several."""
    import weakref

    made: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, T] = weakref.WeakKeyDictionary()

    def get() -> T:
        loop = asyncio.get_running_loop()
        obj = made.get(loop)
        if obj is None:
            obj = made[loop] = factory()
        return obj

    get.on = made.get  # type: ignore[attr-defined]  # loop -> its object, if made (observers)
    return get
