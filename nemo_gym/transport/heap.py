"""Giving memory a server has freed back to the system once a large request has been answered.

The C library keeps what Python frees in its heap for reuse, and little of it is ever handed back: after a run's
``/aggregate_metrics`` (10,000 rows parsed, a dict of metrics per task) an agent and a resources server each kept
~15 MB they no longer used, and the next run's rows did not fit into those holes, so each run added to the last.
A collection frees what only reference cycles still hold; glibc's ``malloc_trim(0)`` then returns every free page,
in the middle of the heap as well as at its top. Both are cheap next to a large request, and never run more than
once per :data:`MIN_INTERVAL_S`, so a workload whose every request is large pays for one release a second at most.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Callable

__all__ = [
    "RELEASE_AFTER_BYTES",
    "MIN_INTERVAL_S",
    "release_after_response",
    "release_freed_memory",
    "release_read_pieces",
    "release_soon",
]

RELEASE_AFTER_BYTES = 1 << 20
"""A request body from this size on is followed, once it has been answered, by a release."""
MIN_INTERVAL_S = 1.0
"""Releases closer together than this are put off (one waits at most), so the last large request still gets one."""

_UNLOADED: object = object()
_trim: Callable[[int], int] | None | object = _UNLOADED
_last_release = -MIN_INTERVAL_S
_pending: asyncio.TimerHandle | None = None


def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, or None where the C library has none (musl, macOS). ``ctypes`` loads on first use."""
    global _trim
    if _trim is _UNLOADED:
        import ctypes

        try:
            function = ctypes.CDLL(None).malloc_trim
        except (OSError, AttributeError):
            _trim = None
        else:
            function.argtypes = [ctypes.c_size_t]
            function.restype = ctypes.c_int
            _trim = function
    return _trim  # type: ignore[return-value]


def release_freed_memory() -> bool:
    """Collect garbage, then hand the heap's free pages back to the system. Returns whether the C library trimmed."""
    global _last_release, _pending
    _pending = None
    _last_release = time.monotonic()
    gc.collect()
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


def release_read_pieces() -> None:
    """Once a large body has been read and its pieces joined: hand back the pages the pieces held, before the work on
    the body (parsing it, forwarding it) begins. No garbage collection, nothing else has been freed yet: glibc's
    ``malloc_trim(0)`` alone, spaced like the other releases (:data:`MIN_INTERVAL_S`). At a run's end the agent
    forwarding ``/aggregate_metrics`` and the resources server parsing it each held ~3.4 MB of freed pieces of the
    10,000 rows' body while the other worked: the stack's peak."""
    global _last_release
    now = time.monotonic()
    if now - _last_release < MIN_INTERVAL_S:
        return
    trim = _malloc_trim()
    if trim is not None:
        _last_release = now
        trim(0)


def release_soon() -> None:
    """:func:`release_freed_memory` now, or, if one ran less than :data:`MIN_INTERVAL_S` ago, when that time is up
    (on the running loop; a release already waiting covers this call too)."""
    global _pending
    wait = _last_release + MIN_INTERVAL_S - time.monotonic()
    if wait <= 0:
        if _pending is not None:
            _pending.cancel()
        release_freed_memory()
    elif _pending is None:
        _pending = asyncio.get_running_loop().call_later(wait, release_freed_memory)


async def release_after_response() -> None:
    """A response's background task (Starlette runs it once the body is sent): :func:`release_soon`. A coroutine, so
    it runs on the loop; a plain function would run on a worker thread, in an arena of its own."""
    release_soon()
