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
import tempfile
import threading
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import Future
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


class AsyncSandbox:
    """One sandbox on one provider. ``provider`` is a provider or its config, e.g. ``{"local": {}}``."""

    def __init__(self, provider: Mapping[str, Any] | SandboxProvider, spec: SandboxSpec | None = None) -> None:
        self._provider: SandboxProvider = create_provider(provider) if isinstance(provider, Mapping) else provider
        self._spec = spec
        self._handle: SandboxHandle | None = None
        self._stopped = True
        self._closed = False

    def _require_handle(self) -> SandboxHandle:
        if self._handle is None or self._stopped:
            raise RuntimeError("Sandbox has not been started")
        return self._handle

    async def start(self, spec: SandboxSpec | None = None) -> AsyncSandbox:
        """Create the sandbox and write ``spec.files`` into it; if that fails, nothing is left running."""
        if self._closed:
            raise RuntimeError("Sandbox has been stopped; create a new one")
        if self._handle is not None and not self._stopped:
            raise RuntimeError("Sandbox is already started")
        spec = spec if spec is not None else self._spec
        if spec is None:
            raise ValueError("Sandbox.start() requires a SandboxSpec (pass it here or to the constructor)")
        handle = await self._provider.create(spec)
        try:
            await self._write_files(handle, spec.files)
        except BaseException:
            self._closed = True
            try:
                await self._provider.close(handle)
            finally:
                await self._provider.aclose()
            raise
        self._spec, self._handle, self._stopped = spec, handle, False
        return self

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
        return await self._provider.exec(
            self._require_handle(),
            command,
            cwd=cwd if cwd is not None else self._spec.workdir if self._spec is not None else None,
            env=env,
            timeout_s=timeout_s,
            user=user,
        )

    async def upload(self, local_path: Path | str, remote_path: str) -> None:
        await self._provider.upload_file(self._require_handle(), Path(local_path), remote_path)

    async def download(self, remote_path: str, local_path: Path | str) -> None:
        await self._provider.download_file(self._require_handle(), remote_path, Path(local_path))

    async def status(self) -> SandboxStatus:
        """``UNKNOWN`` before start, ``STOPPED`` after stop, else what the provider reports."""
        if self._handle is None:
            return SandboxStatus.UNKNOWN
        if self._stopped:
            return SandboxStatus.STOPPED
        return await self._provider.status(self._handle)

    async def endpoint(self, port: int) -> SandboxEndpoint:
        """The URL of a service port declared in ``spec.ports``, for providers that can expose one."""
        if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
            raise ValueError(f"Sandbox endpoint port must be an integer between 1 and 65535, got {port!r}")
        declared = tuple(self._spec.ports) if self._spec is not None else ()
        if port not in declared:
            raise ValueError(
                f"Sandbox port {port} was not declared in SandboxSpec.ports; declared ports: {list(declared)!r}"
            )
        if not isinstance(self._provider, SupportsSandboxEndpoint):
            raise NotImplementedError(
                f"Sandbox provider {_provider_name(self._provider)!r} does not support service endpoints"
            )
        endpoint = await self._provider.endpoint(self._require_handle(), port)
        if not isinstance(endpoint, SandboxEndpoint):
            raise TypeError(f"Sandbox provider endpoint() must return SandboxEndpoint, got {type(endpoint).__name__}")
        return endpoint

    async def stop(self) -> None:
        """End the sandbox and release the provider; calling it again does nothing."""
        if self._closed:
            return
        try:
            if self._handle is not None and not self._stopped:
                self._stopped = True
                await self._provider.close(self._handle)
        finally:
            self._closed = True
            await self._provider.aclose()

    async def serialize(self, *, scope: str | None = None) -> dict[str, Any]:
        """A JSON descriptor from which :meth:`connect` rebuilds this sandbox in another process."""
        if not isinstance(self._provider, ConnectableProvider):
            raise RuntimeError(f"provider {_provider_name(self._provider)!r} does not support serialize()/connect()")
        descriptor = await self._provider.serialize_handle(self._require_handle(), scope=scope)
        if isinstance(descriptor, dict) and descriptor.get("workdir") is None and self._spec is not None:
            descriptor = {**descriptor, "workdir": self._spec.workdir}
        return descriptor

    @classmethod
    async def connect(cls, descriptor: Mapping[str, Any] | Any, *, provider: SandboxProvider) -> AsyncSandbox:
        """A started sandbox for a descriptor from :meth:`serialize` (``provider`` must support connecting)."""
        if not isinstance(provider, ConnectableProvider):
            raise RuntimeError(f"provider {_provider_name(provider)!r} does not support serialize()/connect()")
        if not isinstance(descriptor, Mapping) and hasattr(descriptor, "to_dict"):
            descriptor = descriptor.to_dict()
        handle = await provider.connect(descriptor)
        sandbox = cls(
            provider, SandboxSpec(workdir=descriptor.get("workdir") if isinstance(descriptor, Mapping) else None)
        )
        sandbox._handle, sandbox._stopped = handle, False
        return sandbox

    async def __aenter__(self) -> AsyncSandbox:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()


class _AsyncLoopRunner:
    """An event loop on a daemon thread that blocking callers hand coroutines to."""

    def __init__(
        self, *, wait_timeout_s: float = SYNC_OPERATION_TIMEOUT_S, close_timeout_s: float = SYNC_LOOP_CLOSE_TIMEOUT_S
    ) -> None:
        self._wait_timeout_s = wait_timeout_s
        self._close_timeout_s = close_timeout_s
        self._closed = False
        self._loop = asyncio.new_event_loop()
        started = threading.Event()
        self._thread = threading.Thread(
            target=self._serve, args=(started,), name="nemo-gym-sandbox-sync-loop", daemon=True
        )
        self._thread.start()
        started.wait()

    def _serve(self, started: threading.Event) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.call_soon(started.set)
        self._loop.run_forever()

    def _check_can_block(self, operation: str) -> None:
        if self._closed or self._loop.is_closed():
            raise RuntimeError("Sandbox sync loop is closed")
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return
        raise RuntimeError(f"Sandbox.{operation}() is blocking; use AsyncSandbox in async code instead.")

    def _wait(self, operation: str, future: Future[T]) -> T:
        try:
            return future.result(timeout=self._wait_timeout_s)
        except FutureTimeoutError:
            future.cancel()
            raise TimeoutError(
                f"Sandbox.{operation}() timed out waiting for the sync loop after {self._wait_timeout_s:g}s"
            ) from None

    def call(self, operation: str, function: Callable[[], T]) -> T:
        """Run a plain function on the loop thread (objects that bind to the loop are made there)."""
        self._check_can_block(operation)
        future: Future[T] = Future()

        def invoke() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                future.set_result(function())
            except BaseException as error:
                future.set_exception(error)

        self._loop.call_soon_threadsafe(invoke)
        return self._wait(operation, future)

    def run(self, operation: str, make_awaitable: Callable[[], Awaitable[T]]) -> T:
        """Run a coroutine on the loop thread and wait for its result (cancelled when the wait times out)."""
        self._check_can_block(operation)

        async def invoke() -> T:
            return await make_awaitable()

        return self._wait(operation, asyncio.run_coroutine_threadsafe(invoke(), self._loop))

    def close(self) -> None:
        """Stop the loop; a loop still busy after ``close_timeout_s`` is left to its daemon thread."""
        if self._closed:
            return
        self._closed = True
        if self._loop.is_closed():
            return
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=self._close_timeout_s)
        if not self._thread.is_alive():
            self._loop.close()


class Sandbox:
    """The blocking twin of :class:`AsyncSandbox`, same methods without ``await`` (``serialize``/``connect`` are
    async-only)."""

    def __init__(self, provider: Mapping[str, Any] | SandboxProvider, spec: SandboxSpec | None = None) -> None:
        self._closed = True
        self._runner = _AsyncLoopRunner()
        try:
            self._async_sandbox = self._runner.call("__init__", lambda: AsyncSandbox(provider, spec))
        except BaseException:
            self._runner.close()
            raise
        self._closed = False

    def start(self, spec: SandboxSpec | None = None) -> Sandbox:
        self._runner.run("start", lambda: self._async_sandbox.start(spec))
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
        return self._runner.run(
            "exec", lambda: self._async_sandbox.exec(command, cwd=cwd, env=env, timeout_s=timeout_s, user=user)
        )

    def upload(self, local_path: Path | str, remote_path: str) -> None:
        self._runner.run("upload", lambda: self._async_sandbox.upload(local_path, remote_path))

    def download(self, remote_path: str, local_path: Path | str) -> None:
        self._runner.run("download", lambda: self._async_sandbox.download(remote_path, local_path))

    def status(self) -> SandboxStatus:
        if self._closed:
            return SandboxStatus.STOPPED
        return self._runner.run("status", self._async_sandbox.status)

    def endpoint(self, port: int) -> SandboxEndpoint:
        return self._runner.run("endpoint", lambda: self._async_sandbox.endpoint(port))

    def stop(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._runner.run("stop", self._async_sandbox.stop)
        finally:
            self._runner.close()

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def __del__(self) -> None:  # pragma: no cover - a safety net for sandboxes nobody stopped
        if not getattr(self, "_closed", True):
            try:
                self.stop()
            except Exception:
                pass
