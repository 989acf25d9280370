"""The sandbox objects servers use: ``AsyncSandbox`` for async code, ``Sandbox`` for blocking code.

Both wrap one provider (built from a one-key config, or passed in) and one sandbox's life: ``start(spec)``, then
``exec``/``upload``/``download``/``status``/``endpoint``, then ``stop()`` (also on leaving ``with``). A stopped
sandbox cannot be started again; make a new one.

``Sandbox`` runs an ``AsyncSandbox`` on an event loop in its own thread, so blocking code (and code that runs inside
another event loop's worker thread) can use providers that are async. Calling it from a coroutine would block that
coroutine's loop, so it refuses.
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import threading
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import TimeoutError as FutureTimeoutError
from pathlib import Path
from typing import Any, TypeVar

from nemo_gym.sandbox.providers import (
    ConnectableProvider,
    SandboxEndpoint,
    SandboxExecResult,
    SandboxHandle,
    SandboxProvider,
    SandboxSpec,
    SandboxStatus,
    SupportsSandboxEndpoint,
    create_provider,
)

__all__ = ["AsyncSandbox", "Sandbox"]

T = TypeVar("T")

SYNC_OPERATION_TIMEOUT_S = 3600.0
"""Longest a ``Sandbox`` call waits for its loop thread, so a wedged provider cannot hang the caller forever."""
SYNC_LOOP_CLOSE_TIMEOUT_S = 5.0


def _provider_name(provider: object) -> str:
    return str(getattr(provider, "name", type(provider).__name__))


def _checked_port(port: object, declared: tuple[int, ...]) -> int:
    """``port`` when it is a TCP port the spec declared; otherwise a ``ValueError`` saying how to fix the call."""
    valid = isinstance(port, int) and not isinstance(port, bool) and 0 < port < 65536
    if not valid:
        raise ValueError(f"endpoint() needs a TCP port between 1 and 65535; {port!r} is not one")
    assert isinstance(port, int)
    if port not in declared:
        raise ValueError(f"port {port} was not declared: list it in SandboxSpec.ports (declared now: {list(declared)})")
    return port


class AsyncSandbox:
    """One sandbox on one provider. ``provider`` is a provider or its config, e.g. ``{"local": {}}``.

    ``owns_provider=False`` leaves the provider open when the sandbox stops: for sandboxes that share one provider
    (a Compose collection), whose owner closes it once.
    """

    def __init__(
        self,
        provider: Mapping[str, Any] | SandboxProvider,
        spec: SandboxSpec | None = None,
        *,
        owns_provider: bool = True,
    ) -> None:
        self._provider: SandboxProvider = provider if not isinstance(provider, Mapping) else create_provider(provider)
        self._owns_provider = owns_provider
        self._spec = spec
        self._handle: SandboxHandle | None = None
        self._stopped = True
        self._closed = False

    def _live(self) -> SandboxHandle:
        """The handle of the running sandbox; calling before ``start()`` (or after ``stop()``) is a caller bug."""
        handle = self._handle
        if handle is not None and not self._stopped:
            return handle
        raise RuntimeError("this sandbox has not been started: await start(spec) before using it")

    async def start(self, spec: SandboxSpec | None = None) -> AsyncSandbox:
        """Create the sandbox and write ``spec.files`` into it; if that fails, nothing is left running."""
        if self._closed:
            raise RuntimeError("this sandbox has been stopped and cannot restart: create a new AsyncSandbox")
        if self._handle is not None and not self._stopped:
            raise RuntimeError("this sandbox is already started: stop() it before starting another")
        chosen = self._spec if spec is None else spec
        if chosen is None:
            raise ValueError("start() requires a SandboxSpec: pass one to start() or to the constructor")
        handle = await self._provider.create(chosen)
        try:
            await self._write_files(handle, chosen.files)
        except BaseException:
            self._closed = True
            await self._release(handle)
            raise
        self._spec = chosen
        self._handle = handle
        self._stopped = False
        return self

    async def _release(self, handle: SandboxHandle | None) -> None:
        """Close ``handle`` (when there is one) and then the provider it owns, even if closing the sandbox fails."""
        try:
            if handle is not None:
                await self._provider.close(handle)
        finally:
            if self._owns_provider:
                await self._provider.aclose()

    async def _write_files(self, handle: SandboxHandle, files: Mapping[str, str]) -> None:
        """Providers transfer files, not strings: stage each text in a local file first."""
        if not files:
            return
        with tempfile.TemporaryDirectory(prefix="nemo-gym-sandbox-files-") as staging:
            for index, (target, text) in enumerate(files.items()):
                source = Path(staging, str(index))
                source.write_text(text, encoding="utf-8")
                await self._provider.upload_file(handle, source, target)

    async def exec(
        self,
        command: str,
        *,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout_s: int | float | None = 180,
        user: str | int | None = None,
    ) -> SandboxExecResult:
        """Run a shell command (in ``spec.workdir`` unless ``cwd``); failure and timeout come back as results."""
        live = self._live()
        where = cwd
        if where is None and self._spec is not None:
            where = self._spec.workdir
        return await self._provider.exec(live, command, cwd=where, env=env, timeout_s=timeout_s, user=user)

    async def upload(self, local_path: Path | str, remote_path: str) -> None:
        """Copy the local file ``local_path`` to ``remote_path`` inside the sandbox."""
        live = self._live()
        await self._provider.upload_file(live, Path(local_path), remote_path)

    async def download(self, remote_path: str, local_path: Path | str) -> None:
        """Copy ``remote_path`` out of the sandbox to the local file ``local_path``."""
        live = self._live()
        await self._provider.download_file(live, remote_path, Path(local_path))

    async def status(self) -> SandboxStatus:
        """``UNKNOWN`` before start, ``STOPPED`` after stop, else what the provider reports."""
        handle = self._handle
        if handle is not None and not self._stopped:
            return await self._provider.status(handle)
        return SandboxStatus.UNKNOWN if handle is None else SandboxStatus.STOPPED

    async def endpoint(self, port: int) -> SandboxEndpoint:
        """The URL of a service port declared in ``spec.ports``, for providers that can expose one."""
        wanted = _checked_port(port, tuple(self._spec.ports) if self._spec else ())
        provider = self._provider
        if not isinstance(provider, SupportsSandboxEndpoint):
            raise NotImplementedError(
                f"provider {_provider_name(provider)!r} does not support service endpoints: pick one that does"
            )
        found = await provider.endpoint(self._live(), wanted)
        if isinstance(found, SandboxEndpoint):
            return found
        raise TypeError(f"provider {_provider_name(provider)!r} returned {type(found).__name__} from endpoint()")

    async def stop(self) -> None:
        """End the sandbox and release the provider; calling it again does nothing."""
        if self._closed:
            return
        self._closed = True
        running = self._handle if not self._stopped else None
        self._stopped = True
        await self._release(running)

    def _connectable(self, provider: SandboxProvider) -> ConnectableProvider:
        if isinstance(provider, ConnectableProvider):
            return provider
        raise RuntimeError(
            f"provider {_provider_name(provider)!r} does not support serialize()/connect(); use one that does"
        )

    async def serialize(self, *, scope: str | None = None) -> dict[str, Any]:
        """A JSON descriptor from which :meth:`connect` rebuilds this sandbox in another process."""
        provider = self._connectable(self._provider)
        descriptor = await provider.serialize_handle(self._live(), scope=scope)
        if self._spec is not None and isinstance(descriptor, dict) and descriptor.get("workdir") is None:
            return dict(descriptor, workdir=self._spec.workdir)
        return descriptor

    @classmethod
    async def connect(
        cls, descriptor: Mapping[str, Any] | Any, *, provider: SandboxProvider, owns_provider: bool = True
    ) -> AsyncSandbox:
        """A started sandbox for a descriptor from :meth:`serialize` (``provider`` must support connecting)."""
        sandbox = cls(provider, owns_provider=owns_provider)
        data = descriptor
        if not isinstance(data, Mapping) and hasattr(data, "to_dict"):
            data = data.to_dict()
        sandbox._handle = await sandbox._connectable(provider).connect(data)
        sandbox._spec = SandboxSpec(workdir=data.get("workdir") if isinstance(data, Mapping) else None)
        sandbox._stopped = False
        return sandbox

    async def __aenter__(self) -> AsyncSandbox:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()


class _LoopThread:
    """A private event loop on a daemon thread: blocking callers submit coroutines to it and wait for the answer."""

    def __init__(self, wait_s: float = SYNC_OPERATION_TIMEOUT_S, join_s: float = SYNC_LOOP_CLOSE_TIMEOUT_S) -> None:
        self._wait_s = wait_s
        self._join_s = join_s
        self._done = False
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()

        def serve() -> None:
            asyncio.set_event_loop(self.loop)
            self.loop.call_soon(ready.set)
            self.loop.run_forever()

        self._thread = threading.Thread(target=serve, name="nemo-gym-sandbox-loop", daemon=True)
        self._thread.start()
        ready.wait()

    def _refuse_if_unsafe(self, what: str) -> None:
        if self._done or self.loop.is_closed():
            raise RuntimeError(f"Sandbox.{what}(): this sandbox is closed; create a new Sandbox")
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop in this thread: blocking is fine
        raise RuntimeError(f"Sandbox.{what}() would block this event loop; use AsyncSandbox in async code instead")

    def submit(self, what: str, work: Callable[[], Awaitable[T]]) -> T:
        """Await ``work()`` on the loop thread; give up (and cancel it) after ``wait_s``."""
        self._refuse_if_unsafe(what)

        async def job() -> T:
            return await work()

        pending = asyncio.run_coroutine_threadsafe(job(), self.loop)
        try:
            return pending.result(timeout=self._wait_s)
        except FutureTimeoutError:
            stuck = f"Sandbox.{what}() had no answer after {self._wait_s:g}s; the provider may be stuck"
        # Reached only on a timeout: the abandoned work is cancelled before the caller hears about it.
        pending.cancel()
        raise TimeoutError(stuck)

    def close(self) -> None:
        """Stop the loop; one still busy after ``join_s`` is left to its daemon thread."""
        already_closed, self._done = self._done, True
        if already_closed or self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(self._join_s)
        if not self._thread.is_alive():
            self.loop.close()


class Sandbox:
    """The blocking twin of :class:`AsyncSandbox`, same methods without ``await`` (``serialize``/``connect`` are
    async-only). Each call is forwarded to an ``AsyncSandbox`` living on a private loop thread."""

    def __init__(self, provider: Mapping[str, Any] | SandboxProvider, spec: SandboxSpec | None = None) -> None:
        self._closed = True
        self._worker = _LoopThread()

        async def build() -> AsyncSandbox:  # built on the loop thread, where its provider will run
            return AsyncSandbox(provider, spec)

        try:
            self._inner = self._worker.submit("__init__", build)
        except BaseException:
            self._worker.close()
            raise
        self._closed = False

    def _forward(self, name: str, *args: Any, **kwargs: Any) -> Any:
        method = getattr(self._inner, name)
        return self._worker.submit(name, lambda: method(*args, **kwargs))

    def start(self, spec: SandboxSpec | None = None) -> Sandbox:
        self._forward("start", spec)
        return self

    def exec(
        self,
        command: str,
        *,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout_s: int | float | None = 180,
        user: str | int | None = None,
    ) -> SandboxExecResult:
        result: SandboxExecResult = self._forward("exec", command, cwd=cwd, env=env, timeout_s=timeout_s, user=user)
        return result

    def upload(self, local_path: Path | str, remote_path: str) -> None:
        self._forward("upload", local_path, remote_path)

    def download(self, remote_path: str, local_path: Path | str) -> None:
        self._forward("download", remote_path, local_path)

    def status(self) -> SandboxStatus:
        state: SandboxStatus = SandboxStatus.STOPPED if self._closed else self._forward("status")
        return state

    def endpoint(self, port: int) -> SandboxEndpoint:
        found: SandboxEndpoint = self._forward("endpoint", port)
        return found

    def stop(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._forward("stop")
        finally:
            self._worker.close()

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def __del__(self) -> None:  # pragma: no cover - a safety net for sandboxes nobody stopped
        if getattr(self, "_closed", True):
            return
        with contextlib.suppress(Exception):
            self.stop()
