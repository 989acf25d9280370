"""The sandbox objects and value types, against an in-memory provider: what they check and what they forward."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from nemo_gym.sandbox import (
    AsyncSandbox,
    SandboxEndpoint,
    SandboxExecResult,
    SandboxHandle,
    SandboxResources,
    SandboxSpec,
    SandboxStatus,
)


class MemoryProvider:
    """Records calls; files live in a dict. ``fail_upload`` makes every upload fail."""

    name = "memory"

    def __init__(self, fail_upload: bool = False) -> None:
        self.fail_upload = fail_upload
        self.files: dict[str, bytes] = {}
        self.calls: list[tuple[Any, ...]] = []
        self.closed: list[str] = []
        self.aclosed = False

    async def create(self, spec: SandboxSpec) -> SandboxHandle:
        self.calls.append(("create", spec))
        return SandboxHandle(sandbox_id="box-1", provider_name=self.name, raw=None)

    async def exec(self, handle: SandboxHandle, command: str, **options: Any) -> SandboxExecResult:
        self.calls.append(("exec", command, options))
        return SandboxExecResult(stdout="ok", stderr=None, return_code=0)

    async def upload_file(self, handle: SandboxHandle, source_path: Path, target_path: str) -> None:
        if self.fail_upload:
            raise RuntimeError("upload failed")
        self.files[target_path] = source_path.read_bytes()

    async def download_file(self, handle: SandboxHandle, source_path: str, target_path: Path) -> None:
        target_path.write_bytes(self.files[source_path])

    async def status(self, handle: SandboxHandle) -> SandboxStatus:
        return SandboxStatus.RUNNING

    async def close(self, handle: SandboxHandle) -> None:
        self.closed.append(handle.sandbox_id)

    async def aclose(self) -> None:
        self.aclosed = True


class EndpointProvider(MemoryProvider):
    async def endpoint(self, handle: SandboxHandle, port: int) -> SandboxEndpoint:
        return SandboxEndpoint(endpoint=f" http://box:{port} ", headers={"X-Port": port})  # type: ignore[dict-item]


async def test_lifecycle_forwards_to_the_provider(tmp_path: Path) -> None:
    provider = MemoryProvider()
    sandbox = AsyncSandbox(provider, SandboxSpec(workdir="/repo", files={"/repo/a.txt": "alpha"}))
    with pytest.raises(RuntimeError, match="not been started"):
        await sandbox.exec("true")
    await sandbox.start()
    assert provider.files == {"/repo/a.txt": b"alpha"}
    with pytest.raises(RuntimeError, match="already started"):
        await sandbox.start()

    await sandbox.exec("pytest -q", timeout_s=60, user="agent")
    await sandbox.exec("ls", cwd="/elsewhere", env={"A": "1"})
    assert provider.calls[1:] == [
        ("exec", "pytest -q", {"cwd": "/repo", "env": None, "timeout_s": 60, "user": "agent"}),
        ("exec", "ls", {"cwd": "/elsewhere", "env": {"A": "1"}, "timeout_s": 180, "user": None}),
    ]
    await sandbox.download("/repo/a.txt", tmp_path / "a.txt")
    assert (tmp_path / "a.txt").read_text() == "alpha"
    assert await sandbox.status() == SandboxStatus.RUNNING

    await sandbox.stop()
    assert (provider.closed, provider.aclosed) == (["box-1"], True)
    assert await sandbox.status() == SandboxStatus.STOPPED
    with pytest.raises(RuntimeError, match="has been stopped"):
        await sandbox.start()


async def test_start_needs_a_spec_and_cleans_up_a_failed_file_upload() -> None:
    with pytest.raises(ValueError, match="requires a SandboxSpec"):
        await AsyncSandbox(MemoryProvider()).start()
    provider = MemoryProvider(fail_upload=True)
    sandbox = AsyncSandbox(provider)
    with pytest.raises(RuntimeError, match="upload failed"):
        await sandbox.start(SandboxSpec(files={"/x": "y"}))
    assert (provider.closed, provider.aclosed) == (["box-1"], True)
    with pytest.raises(RuntimeError, match="has been stopped"):
        await sandbox.start(SandboxSpec())


async def test_endpoints_need_a_declared_port_and_a_capable_provider() -> None:
    plain = AsyncSandbox(MemoryProvider(), SandboxSpec(ports=[8000]))
    await plain.start()
    with pytest.raises(NotImplementedError, match="does not support service endpoints"):
        await plain.endpoint(8000)
    with pytest.raises(ValueError, match="was not declared"):
        await plain.endpoint(9000)
    with pytest.raises(ValueError, match="between 1 and 65535"):
        await plain.endpoint(0)
    capable = AsyncSandbox(EndpointProvider(), SandboxSpec(ports=["8000"]))  # type: ignore[list-item]
    await capable.start()
    assert await capable.endpoint(8000) == SandboxEndpoint("http://box:8000", {"X-Port": "8000"})
    with pytest.raises(RuntimeError, match="does not support serialize"):
        await capable.serialize()


def test_spec_and_resources_validate_their_values() -> None:
    spec = SandboxSpec(resources={"cpu": "0.5", "memory_mib": "4096"}, ports=[8000, "9222"])  # type: ignore[list-item]
    assert spec.resources == SandboxResources(cpu=0.5, memory_mib=4096)
    assert spec.ports == (8000, 9222)
    positional = SandboxSpec("img", 60, 30, "/w", {}, {}, {}, SandboxResources(), ["/bin/sh"], {"k": 1})
    assert (positional.workdir, positional.provider_options, positional.ports) == ("/w", {"k": 1}, ())
    with pytest.raises(ValueError, match="Unknown sandbox resource keys: memory"):
        SandboxSpec(resources={"memory": "4Gi"})
    with pytest.raises(ValueError, match="Duplicate sandbox TCP port"):
        SandboxSpec(ports=[8000, 8000])
    with pytest.raises(ValueError, match="between 1 and 65535"):
        SandboxSpec(ports=[65536])
    for bad in (8000.5, True, "http"):
        with pytest.raises(ValueError, match="Invalid sandbox TCP port"):
            SandboxSpec(ports=[bad])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="absolute URL"):
        SandboxEndpoint(endpoint="/relative")
    assert SandboxStatus("running") is SandboxStatus.RUNNING and SandboxStatus.RUNNING == "running"
