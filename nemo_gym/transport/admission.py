"""First-come, first-served admission: to outgoing connection slots, and to a server's request handling.

Outgoing: aiohttp's pool also caps connections per host, but a connection freed while others wait can be taken by a
request that arrives in the same instant, ahead of every waiter; the waiter goes back to the queue. Under a steady
overload (4096 rollouts in flight, 1024 connections to the model) the same unlucky rollouts lost that race again and
again: p99 latency was 2.5x the median. Here a freed slot is handed straight to the oldest waiter, so queueing is fair
(p99 1.2x the median), and aiohttp's own limit (sized the same) never makes anyone wait.

Incoming: :class:`AdmissionMiddleware` lets a server work on a bounded number of requests from outside the server
mesh at once (a collector's or a trainer's ``/run``); the others wait at the door, in arrival order. A request waiting
there costs its connection and a few KB, not the ~70 KB a rollout holds once FastAPI has parsed and validated its body
and the agent has started calling other servers, so 4096 rollouts in flight cost the agent ~190 MB instead of ~380 MB.
Calls a server makes to other servers (through ``ServerClient``) while serving an admitted request carry
:data:`NESTED_HEADER` and are never queued: the work they belong to was admitted already, and queueing them could
deadlock two servers that call each other. Calls to outside APIs (OpenAI, vLLM) never carry it.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections import deque
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from nemo_gym.transport.origins import origin_of as origin_of  # re-exported: where callers have found it

__all__ = [
    "NESTED_HEADER",
    "AdmissionMiddleware",
    "FairLimiter",
    "HostGate",
    "QueueTimeout",
    "in_admitted_request",
    "origin_of",
]

NESTED_HEADER = "X-NeMo-Gym-Nested"
"""Set (to ``1``) on every call a server makes while serving an admitted request; such calls skip the queue."""
_NESTED_HEADER_KEY = NESTED_HEADER.lower().encode()

_admitted: contextvars.ContextVar[bool] = contextvars.ContextVar("nemo_gym_admitted_request", default=False)


class QueueTimeout(TimeoutError):
    """The deadline passed while waiting for a slot: the request was never sent."""

    def __init__(self, slots: int) -> None:
        super().__init__(f"no free slot among {slots}")
        self.slots = slots


class FairLimiter:
    """At most ``size`` holders at once; waiters are served strictly in arrival order."""

    __slots__ = ("_free", "_loop", "_size", "_waiters")

    def __init__(self, size: int, loop: asyncio.AbstractEventLoop) -> None:
        self._size = size
        self._free = size
        self._loop = loop
        self._waiters: deque[asyncio.Future[None]] = deque()

    def try_acquire(self) -> bool:
        """Take a slot if one is free and nobody is queued for it (no waiting, no allocation)."""
        if self._free > 0 and not self._waiters:
            self._free -= 1
            return True
        return False

    async def acquire(self, deadline: float | None = None) -> None:
        """Wait for a slot; raises :class:`QueueTimeout` if ``deadline`` (loop time) passes first."""
        if self.try_acquire():
            return
        waiter: asyncio.Future[None] = self._loop.create_future()
        self._waiters.append(waiter)
        try:
            if deadline is None:
                await waiter
            else:
                async with asyncio.timeout_at(deadline):
                    await waiter
        except BaseException as exc:
            if waiter.done() and not waiter.cancelled():
                self.release()  # the slot arrived just as we gave up: pass it on
            else:
                waiter.cancel()  # skipped by release()
            if isinstance(exc, TimeoutError):
                raise QueueTimeout(self._size) from exc
            raise

    def release(self) -> None:
        """Give the slot to the oldest live waiter, or back to the pool."""
        waiters = self._waiters
        while waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self._free += 1

    @property
    def waiting(self) -> int:
        return sum(1 for waiter in self._waiters if not waiter.done())


class HostGate:
    """One :class:`FairLimiter` per destination (``scheme://host:port``), created on first use."""

    __slots__ = ("_limiters", "_loop", "_size")

    def __init__(self, size_per_host: int, loop: asyncio.AbstractEventLoop) -> None:
        self._size = size_per_host
        self._loop = loop
        self._limiters: dict[str, FairLimiter] = {}

    def limiter(self, origin: str) -> FairLimiter:
        limiter = self._limiters.get(origin)
        if limiter is None:
            limiter = self._limiters[origin] = FairLimiter(self._size, self._loop)
        return limiter


def in_admitted_request() -> bool:
    """True inside the handling of a request that went through (or was exempt from) an :class:`AdmissionMiddleware`."""
    return _admitted.get()


_Scope = MutableMapping[str, Any]
_Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
_Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


class AdmissionMiddleware:
    """ASGI middleware: at most ``limit`` outside requests are handled at once; the rest wait in arrival order.

    Exempt, and never queued: requests carrying :data:`NESTED_HEADER`, paths in ``exempt_paths`` (the health check, so
    a busy server still answers "alive"), and non-HTTP scopes (lifespan). ``limit=None`` turns the bound off.
    A request whose client hung up while it waited is dropped when its turn comes, without reaching the app: a
    trainer that timed out and retried does not get the rollout run twice.
    """

    def __init__(
        self,
        app: Callable[[_Scope, _Receive, _Send], Awaitable[None]],
        limit: int | None,
        exempt_paths: frozenset[str] = frozenset({"/"}),
    ) -> None:
        if limit is not None and limit < 1:
            raise ValueError(f"limit must be at least 1 (or None for no bound), not {limit}")
        self.app = app
        self.limit = limit
        self.exempt_paths = exempt_paths
        self._limiter: FairLimiter | None = None

    @property
    def waiting(self) -> int:
        """Requests queued at the door right now."""
        return 0 if self._limiter is None else self._limiter.waiting

    async def __call__(self, scope: _Scope, receive: _Receive, send: _Send) -> None:
        if scope["type"] != "http":  # lifespan, websockets: no request to admit, and no request context to mark
            await self.app(scope, receive, send)
            return
        if self.limit is None or scope["path"] in self.exempt_paths or _is_nested(scope):
            token = _admitted.set(True)
            try:
                await self.app(scope, receive, send)
            finally:
                _admitted.reset(token)
            return
        limiter = self._limiter
        if limiter is None:
            limiter = self._limiter = FairLimiter(self.limit, asyncio.get_running_loop())
        waited = not limiter.try_acquire()
        if waited:
            await limiter.acquire()
        try:
            if waited:
                still_there = await _unless_gone(receive)
                if still_there is None:
                    return  # the client hung up while its request waited: no one to answer, no rollout to run
                receive = still_there
            token = _admitted.set(True)
            try:
                await self.app(scope, receive, send)
            finally:
                _admitted.reset(token)
        finally:
            limiter.release()


async def _unless_gone(receive: _Receive) -> _Receive | None:
    """None if the client disconnected; else a ``receive`` that first hands back the message read to find out."""
    first = await receive()
    if first["type"] == "http.disconnect":
        return None
    pending: list[MutableMapping[str, Any]] = [first]

    async def replay() -> MutableMapping[str, Any]:
        return pending.pop() if pending else await receive()

    return replay


def _is_nested(scope: _Scope) -> bool:
    for name, _value in scope.get("headers", ()):
        if name == _NESTED_HEADER_KEY:
            return True
    return False
