"""The bounded worker pool behind rollout collection and re-verification."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from typing import TypeVar

T = TypeVar("T")

START_BATCH = 64
"""Workers started between two turns of the event loop: the first calls are on the wire while the rest start."""


async def run_bounded(handle: Callable[[T], Awaitable[None]], items: Iterator[T], concurrency: int) -> None:
    """Call ``handle`` on every item with at most ``concurrency`` calls in flight.

    Workers share one plain iterator, so items are pulled lazily (memory stays flat however many there are) and each
    is taken exactly once. A worker is started with an item in hand, so there are never more workers than items, and
    they start in batches of :data:`START_BATCH` with a turn of the event loop between: at a concurrency of thousands
    the first calls go out at once instead of after every worker has been set up. If a worker fails or the pool is
    cancelled (Ctrl-C), every worker is cancelled before the exception propagates, so no call outlives the pool.
    """

    async def worker(first: T) -> None:
        await handle(first)
        for item in items:
            await handle(item)

    workers: list[asyncio.Task[None]] = []
    try:
        for first in items:
            workers.append(asyncio.create_task(worker(first)))
            if len(workers) >= max(1, concurrency):
                break
            if len(workers) % START_BATCH == 0:
                await asyncio.sleep(0)  # let the started workers send before starting more
        await asyncio.gather(*workers)
    except BaseException:
        for task in workers:
            task.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
        raise
