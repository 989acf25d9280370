"""CPU-heavy verification off the event loop: on Ray tasks when the server runs on a Ray cluster, else a process pool.

A resources server's ``/verify`` that burns CPU inline (math-verify, running code, parsing a long proof) stalls every
other request of its server for as long as it runs. :class:`CpuOffload` runs such a function elsewhere and awaits the
result, so the loop keeps answering:

* on a Ray cluster (a server started by ``--ray-address``: its node sets ``NEMO_GYM_RAY_ADDRESS``, or
  ``ray_address=`` given), each call is a Ray task, scheduled on whichever node has a free CPU;
* otherwise, a local process pool (spawned workers, nothing inherited from the server's loop).

Either way at most ``max_in_flight`` calls are outstanding (the rest wait, in order, without taking memory on the
cluster), and workers run at a lower priority (``nice``) so that on a shared machine they yield the CPU to the event
loops they serve. The function must be importable by name (a module-level function) and its arguments picklable.
For a verifier that can hang in C code and needs a per-call deadline that kills it, use ``worker_pool.WorkerPool``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import multiprocessing
import os
from collections.abc import Callable
from typing import Any, TypeVar

RAY_ADDRESS_ENV_VAR = "NEMO_GYM_RAY_ADDRESS"
"""Set by the node that started this server (``launcher/node_agent.py``): the cluster its verification may use."""
DEFAULT_MAX_IN_FLIGHT = 64
WORKER_NICE = 10

T = TypeVar("T")

__all__ = ["DEFAULT_MAX_IN_FLIGHT", "RAY_ADDRESS_ENV_VAR", "CpuOffload"]

_niced = False


def _lower_priority() -> None:
    global _niced
    if not _niced:
        _niced = True
        try:
            os.nice(WORKER_NICE)
        except OSError:
            pass


def _call_niced(fn: Callable[..., T], args: tuple[Any, ...], kwargs: dict[str, Any]) -> T:
    """What runs in a worker (a Ray task or a pool process): lower its priority once, then call ``fn``."""
    _lower_priority()
    return fn(*args, **kwargs)


class CpuOffload:
    """``await offload.run(fn, *args)``: ``fn(*args)`` on a Ray task or a worker process, at most
    ``max_in_flight`` at once. Create it anywhere; it connects (or starts its pool) on first use."""

    def __init__(
        self,
        *,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
        ray_address: str | None = None,
        processes: int | None = None,
        num_cpus: float = 1.0,
    ) -> None:
        if max_in_flight < 1:
            raise ValueError("max_in_flight must be at least 1")
        self.max_in_flight = max_in_flight
        self.ray_address = ray_address or os.environ.get(RAY_ADDRESS_ENV_VAR) or None
        self.processes = processes or max(1, (os.cpu_count() or 2) - 1)
        self.num_cpus = num_cpus
        self._slots: asyncio.Semaphore | None = None
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None
        self._remote: Any = None
        self._connecting: asyncio.Lock | None = None

    @property
    def uses_ray(self) -> bool:
        return self.ray_address is not None

    async def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.max_in_flight)
        async with self._slots:
            if self.uses_ray:
                return await self._on_ray(fn, args, kwargs)
            loop = asyncio.get_running_loop()
            call = functools.partial(_call_niced, fn, args, kwargs)
            return await loop.run_in_executor(self._process_pool(), call)

    async def _on_ray(self, fn: Callable[..., T], args: tuple[Any, ...], kwargs: dict[str, Any]) -> T:
        if self._remote is None:
            self._connecting = self._connecting or asyncio.Lock()
            async with self._connecting:  # one join, however many calls arrive first
                if self._remote is None:
                    await asyncio.to_thread(self._connect)  # joining a cluster takes a second; not on the loop
        result: T = await self._remote.remote(fn, args, kwargs)
        return result

    def _connect(self) -> None:
        import ray

        if not ray.is_initialized():
            ray.init(address=self.ray_address, log_to_driver=False, configure_logging=False)
        self._remote = ray.remote(num_cpus=self.num_cpus, max_retries=3)(_call_niced)

    def _process_pool(self) -> concurrent.futures.ProcessPoolExecutor:
        if self._pool is None:
            self._pool = concurrent.futures.ProcessPoolExecutor(
                self.processes, mp_context=multiprocessing.get_context("spawn"), initializer=_lower_priority
            )
        return self._pool

    def close(self) -> None:
        """Stop the local pool's workers (Ray tasks need no cleanup)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
