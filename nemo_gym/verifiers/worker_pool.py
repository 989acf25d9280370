"""A warm pool of worker processes for CPU-heavy verifiers, with a hard per-call deadline.

Why not ``concurrent.futures.ProcessPoolExecutor``: it cannot stop one stuck call. A SymPy simplification of
``9^{9^{9^9}}`` runs in C and ignores signals, so the only way to end it is to kill the process running it; the
executor would then break for every caller. Here each worker has its own pipe, so the pool knows which process runs
which call, kills exactly that one when its deadline passes, and starts a replacement while the other workers go on.

Why not one process per call: starting an interpreter and importing SymPy costs far more than a verification
(measured here: 110 verifies/s fork-per-call against 350/s for a warm pool of two). Workers start from a
``forkserver`` that has already imported the verifier module, so a replacement is ready in milliseconds.

The event loop never waits on a worker: results are read when the pipe becomes readable (``loop.add_reader``), and
process starts and joins run in a thread.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import signal
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any, Literal

logger = logging.getLogger(__name__)

_STOP = None


@dataclass
class PoolResult:
    """Outcome of one call: ``value`` when it finished, else ``timed_out`` or an ``error`` message."""

    value: Any = None
    timed_out: bool = False
    error: str | None = None

    @property
    def ok(self) -> bool:
        return not self.timed_out and self.error is None


class _Worker:
    def __init__(self, process: multiprocessing.process.BaseProcess, conn: Connection) -> None:
        self.process = process
        self.conn = conn

    @property
    def pid(self) -> int | None:
        return self.process.pid


def _worker_main(
    conn: Connection,
    fn: Callable[..., Any],
    initializer: Callable[[], None] | None,
    nice: int,
) -> None:
    """Runs in the child: warm up, say ready, then answer ``(args, kwargs)`` messages until told to stop."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C goes to the server, which then closes the pool
    _die_with_parent()
    if nice:
        try:
            os.nice(nice)  # verification yields the CPU to the server's event loop when the two compete
        except OSError:
            pass
    try:
        if initializer is not None:
            initializer()
        conn.send(("ready", None))
    except Exception as e:  # reported to the parent, which fails start() with this message
        conn.send(("error", f"{type(e).__name__}: {e}"))
        return
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message is _STOP:
            return
        args, kwargs = message
        try:
            reply = ("ok", fn(*args, **kwargs))
        except Exception as e:
            reply = ("error", f"{type(e).__name__}: {e}")
        try:
            conn.send(reply)
        except Exception as e:  # e.g. the result cannot be pickled
            conn.send(("error", f"cannot send the result back: {type(e).__name__}: {e}"))


def _die_with_parent() -> None:
    """Linux: have the kernel kill this worker when its parent goes, so a server killed with SIGKILL does not leave a
    worker spinning on a pathological input forever. Best effort: elsewhere the worker exits at its next read.

    A forkserver child's parent is the forkserver, which lives until every holder of its "alive" pipe has exited, and
    each child inherits a copy. The worker closes its copy, so the forkserver exits with the server and the kernel
    then ends the worker, even one stuck in C code.
    """
    from multiprocessing import forkserver

    server = getattr(forkserver, "_forkserver", None)
    alive_fd = getattr(server, "_forkserver_alive_fd", None)
    if server is not None and alive_fd is not None:
        try:
            os.close(alive_fd)
        except OSError:
            pass
        server._forkserver_alive_fd = None
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


class WorkerPool:
    """``processes`` warm workers running ``fn``; ``await pool.run(*args)`` returns a :class:`PoolResult`.

    Calls beyond the number of workers wait their turn (FIFO); the deadline ``timeout_s`` counts from the moment a
    worker takes the call, so a long queue does not time calls out. A pool belongs to the event loop that started it.
    ``fn`` and ``initializer`` must be importable module-level functions (they are sent to the workers by name).
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        processes: int = 2,
        timeout_s: float = 10.0,
        initializer: Callable[[], None] | None = None,
        start_method: Literal["forkserver", "spawn", "fork"] = "forkserver",
        preload: Sequence[str] = (),
        startup_timeout_s: float = 120.0,
        nice: int = 0,
    ) -> None:
        if processes < 1:
            raise ValueError("a worker pool needs at least one process")
        self.fn = fn
        self.processes = processes
        self.timeout_s = timeout_s
        self.initializer = initializer
        self.startup_timeout_s = startup_timeout_s
        self.nice = nice
        self._context = multiprocessing.get_context(start_method)
        if start_method == "forkserver":
            # Workers fork from a server that already imported these, so a replacement starts warm. The list only
            # applies when the process's forkserver starts, which is the first forkserver pool.
            modules = ["__main__", *preload, getattr(fn, "__module__", "")]
            self._context.set_forkserver_preload([m for m in dict.fromkeys(modules) if m])
        self._workers: set[_Worker] = set()
        self._idle: asyncio.Queue[_Worker] = asyncio.Queue()  # binds to the loop on first use (start() checks it)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._filling: asyncio.Task[None] | None = None
        self._calls: set[asyncio.Task[Any]] = set()
        self._replacements: set[asyncio.Task[Any]] = set()
        self._pending = 0  # workers being started or replaced right now
        self._closed = False
        self.replaced = 0
        """How many workers were killed (deadline passed) or died and were replaced."""

    @property
    def pids(self) -> list[int]:
        return sorted(w.pid for w in self._workers if w.pid is not None)

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        """The event loop the pool was started in (None before start)."""
        return self._loop

    @property
    def started(self) -> bool:
        return self._loop is not None

    def belongs_to_running_loop(self) -> bool:
        try:
            return self._loop is asyncio.get_running_loop()
        except RuntimeError:
            return False

    async def start(self) -> None:
        """Start missing workers and wait until each has warmed up. Idempotent.

        The starting runs in its own task: a caller that is cancelled meanwhile (a client gave up) does not leave
        half-started workers behind; they join the pool when ready.
        """
        if self._closed:
            raise RuntimeError("the worker pool is closed")
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        elif self._loop is not asyncio.get_running_loop():
            raise RuntimeError("this worker pool belongs to another event loop")
        if self._filling is None or self._filling.done():
            missing = self.processes - len(self._workers) - self._pending
            if missing <= 0:
                return
            self._pending += missing
            self._filling = asyncio.ensure_future(self._fill(missing))
            self._replacements.add(self._filling)
            self._filling.add_done_callback(self._replacements.discard)
        await asyncio.shield(self._filling)

    async def _fill(self, missing: int) -> None:
        try:
            started = await asyncio.gather(*(self._spawn() for _ in range(missing)), return_exceptions=True)
        finally:
            self._pending -= missing
        for worker in started:
            if isinstance(worker, _Worker):
                await self._requeue(worker)
        failures = [r for r in started if isinstance(r, BaseException)]
        if failures:
            raise failures[0]

    async def run(self, *args: Any, **kwargs: Any) -> PoolResult:
        """Run ``fn(*args, **kwargs)`` in a worker, killing the worker if it overruns the deadline."""
        if not self.started or len(self._workers) + self._pending < self.processes:
            await self.start()  # first call, or a replacement failed to start earlier
        worker = await self._idle.get()
        # The call's bookkeeping runs in its own task, so a cancelled caller never leaves a worker half-used.
        task = asyncio.ensure_future(self._call(worker, args, kwargs))
        self._calls.add(task)
        task.add_done_callback(self._calls.discard)
        return await asyncio.shield(task)

    async def wait_for_replacements(self) -> None:
        """Wait until workers being replaced (after a deadline or a crash) are ready again."""
        await asyncio.gather(*self._replacements, return_exceptions=True)

    async def close(self) -> None:
        """Stop all workers (politely, then by force) and wait for them; no child outlives the pool."""
        self._closed = True
        for task in list(self._calls):
            task.cancel()
        # A replacement being started must finish starting, or its process would escape the list below.
        await asyncio.gather(*self._replacements, return_exceptions=True)
        workers, self._workers = list(self._workers), set()
        for worker in workers:
            try:
                worker.conn.send(_STOP)
            except (OSError, ValueError):
                pass
        await asyncio.to_thread(_join_all, workers, 1.0)

    def close_now(self) -> None:
        """Synchronous close for shutdown paths without an event loop: kill every worker and reap it."""
        self._closed = True
        workers, self._workers = list(self._workers), set()
        for worker in workers:
            if worker.process.is_alive():
                worker.process.kill()
        _join_all(workers, grace_s=0)

    # -----------------------------------------------------------------------------------------------------------------

    async def _call(self, worker: _Worker, args: tuple[Any, ...], kwargs: dict[str, Any]) -> PoolResult:
        try:
            worker.conn.send((args, kwargs))
        except (OSError, ValueError):  # the worker died while idle: replace it and use the new one
            worker = await self._replace(worker, "died while idle")
            worker.conn.send((args, kwargs))
        try:
            status, value = await asyncio.wait_for(self._receive(worker), self.timeout_s)
        except TimeoutError:
            self._replace_in_background(worker, f"call exceeded {self.timeout_s:g} s")
            return PoolResult(timed_out=True, error=f"timed out after {self.timeout_s:g} s")
        except (EOFError, OSError) as e:
            self._replace_in_background(worker, "died during a call")
            return PoolResult(error=f"worker died during the call: {type(e).__name__}")
        await self._requeue(worker)
        if status == "ok":
            return PoolResult(value=value)
        return PoolResult(error=str(value))

    def _replace_in_background(self, worker: _Worker, why: str) -> None:
        """Kill the worker now (it may be burning a core) and start its replacement without making the caller wait."""
        if worker.process.is_alive():
            worker.process.kill()
        self._pending += 1  # counted from now, so run() does not start a second replacement meanwhile
        task = asyncio.ensure_future(self._replace_and_requeue(worker, why))
        self._replacements.add(task)
        task.add_done_callback(self._replacements.discard)
        task.add_done_callback(lambda _: setattr(self, "_pending", self._pending - 1))

    async def _replace_and_requeue(self, worker: _Worker, why: str) -> None:
        try:
            replacement = await self._replace(worker, why)
        except RuntimeError as e:  # no replacement: the pool runs one short until the next run() refills it
            if not self._closed:
                logger.error("could not replace verifier worker %s: %s", worker.pid, e)
            return
        await self._requeue(replacement)

    async def _requeue(self, worker: _Worker) -> None:
        if not self._closed:  # once closed, close() stops every worker it holds
            self._idle.put_nowait(worker)

    async def _receive(self, worker: _Worker) -> tuple[str, Any]:
        """The worker's next message, read once its pipe is readable (never a blocking read on the loop)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[tuple[str, Any]] = loop.create_future()
        fd = worker.conn.fileno()

        def on_readable() -> None:
            loop.remove_reader(fd)
            if future.done():
                return
            try:
                future.set_result(worker.conn.recv())
            except BaseException as e:  # EOFError when the worker died
                future.set_exception(e)

        loop.add_reader(fd, on_readable)
        try:
            return await future
        finally:
            loop.remove_reader(fd)

    async def _spawn(self) -> _Worker:
        parent, child = self._context.Pipe(duplex=True)
        # get_context(str) is typed as BaseContext, which declares no Process; every concrete context has one.
        process = self._context.Process(  # type: ignore[attr-defined]
            target=_worker_main, args=(child, self.fn, self.initializer, self.nice), daemon=True, name="verifier"
        )
        await asyncio.to_thread(process.start)
        child.close()
        worker = _Worker(process, parent)
        self._workers.add(worker)
        try:
            status, detail = await asyncio.wait_for(self._receive(worker), self.startup_timeout_s)
        except (TimeoutError, EOFError, OSError) as e:
            self._workers.discard(worker)
            await asyncio.to_thread(_join_all, [worker], 0)
            raise RuntimeError(f"verifier worker did not start: {type(e).__name__} {e}") from e
        if status != "ready":
            self._workers.discard(worker)
            await asyncio.to_thread(_join_all, [worker], 0)
            raise RuntimeError(f"verifier worker failed to start: {detail}")
        return worker

    async def _replace(self, worker: _Worker, why: str) -> _Worker:
        logger.warning("verifier worker %s %s; starting a replacement", worker.pid, why)
        self._pending += 1
        try:
            self._workers.discard(worker)
            self.replaced += 1
            await asyncio.to_thread(_join_all, [worker], 0)
            if self._closed:
                raise RuntimeError("the worker pool is closed")
            return await self._spawn()
        finally:
            self._pending -= 1


def _join_all(workers: Sequence[_Worker], grace_s: float = 5.0) -> None:
    """Wait up to ``grace_s`` for workers to exit, kill the rest, reap them all and close their pipes."""
    for worker in workers:
        worker.process.join(grace_s)
        if worker.process.is_alive():
            worker.process.kill()
            worker.process.join(5)
        worker.conn.close()


class ServerPool:
    """The worker pool of one resources server: created on first use in the running event loop, started with the
    app and stopped with it.

    Servers are also built and called directly in tests, without an app lifespan and with a fresh event loop per
    test, so the pool is (re)created for whichever loop calls :meth:`get`.
    """

    def __init__(self, factory: Callable[[], WorkerPool]) -> None:
        self._factory = factory
        self._pool: WorkerPool | None = None

    def get(self) -> WorkerPool:
        """The pool for the running event loop; outside any loop (inspection from a test), the current pool."""
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        stale = self._pool is not None and self._pool.started and running is not None and self._pool.loop is not running
        if self._pool is None or stale:
            if self._pool is not None:
                self._pool.close_now()
            self._pool = self._factory()
        return self._pool

    async def run(self, *args: Any, **kwargs: Any) -> PoolResult:
        return await self.get().run(*args, **kwargs)

    async def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is None:
            return
        if pool.belongs_to_running_loop():
            await pool.close()
        else:
            pool.close_now()

    def attach(self, app: Any, admission_limit: int | None = None, path_suffix: str = "/verify") -> None:
        """Warm the pool when ``app`` (a FastAPI/Starlette app) starts, before its first request; stop it on exit.

        With ``admission_limit``, at most that many ``*/verify`` requests are processed at once (see
        :class:`AdmissionLimit`).
        """
        if admission_limit is not None:
            app.add_middleware(AdmissionLimit, limit=admission_limit, path_suffix=path_suffix)
        inner_lifespan = app.router.lifespan_context

        @asynccontextmanager
        async def lifespan(app: Any) -> AsyncIterator[Any]:
            await self.get().start()
            try:
                async with inner_lifespan(app) as state:
                    yield state
            finally:
                await self.close()

        app.router.lifespan_context = lifespan


class AdmissionLimit:
    """ASGI middleware: at most ``limit`` requests whose path ends with ``path_suffix`` are processed at once.

    Why: a burst of N verify requests puts N request tasks on the event loop, and each does its parsing and body
    validation (about a millisecond in a FastAPI stack) before it first waits for a worker. A health check or
    ``/seed_session`` that arrives during the burst waits behind all of them. Requests past the limit wait here,
    before any of that work, so a burst costs other requests at most ``limit`` parsings. With a few workers, a limit
    of a few times their number keeps them just as busy.
    """

    def __init__(self, app: Any, limit: int, path_suffix: str = "/verify") -> None:
        if limit < 1:
            raise ValueError("admission limit must be at least 1")
        self.app = app
        self.limit = limit
        self.path_suffix = path_suffix
        self._semaphore: asyncio.Semaphore | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def _slots(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        if self._semaphore is None or self._loop is not loop:  # one per event loop (test clients make new ones)
            self._semaphore, self._loop = asyncio.Semaphore(self.limit), loop
        return self._semaphore

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not scope["path"].endswith(self.path_suffix):
            await self.app(scope, receive, send)
            return
        async with self._slots():
            await self.app(scope, receive, send)
