"""The bounded worker pool behind rollout collection and re-verification."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from typing import TypeVar

T = TypeVar("T")


async def run_bounded(handle: Callable[[T], Awaitable[None]], items: Iterator[T], concurrency: int) -> None:
    """Call ``handle`` on every item with at most ``concurrency`` calls in flight.

    ``concurrency`` workers share one plain iterator, so items are pulled lazily (memory stays flat however many there
    are) and each is taken exactly once. If a worker fails or the pool is cancelled (Ctrl-C), every worker is
    cancelled before the exception propagates, so no call outlives the pool.
    """

    async def worker() -> None:
        for item in items:
            await handle(item)

    workers = [asyncio.create_task(worker()) for _ in range(max(1, concurrency))]
    try:
        await asyncio.gather(*workers)
    except BaseException:
        for task in workers:
            task.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
        raise
