"""The docker provider against the real container runtime (podman, set up by `make containers`): limits hold inside
the container, a command's deadline is enforced there, and a server killed with SIGKILL leaves no container behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from nemo_gym.sandbox import AsyncSandbox, SandboxSpec
from nemo_gym.sandbox.providers.docker import DockerProvider
from nemo_gym.sandbox.providers.docker.provider import OWNER_LABEL
from nemo_gym.sandbox.providers.docker.runtime import (
    ContainerRuntime,
    ContainerRuntimeError,
    base_image_tag,
    build_image,
    find_runtime,
    image_exists,
)
from nemo_gym.sandbox.utils import command_leaving_nothing


@pytest.fixture(scope="module")
def runtime() -> ContainerRuntime:
    try:
        found = find_runtime()
    except ContainerRuntimeError:
        pytest.skip("no container runtime: `make test` installs podman (`make containers`)")
    if not image_exists(found, base_image_tag()):
        pytest.skip(f"the base image {base_image_tag()} is not built: `make containers` (gym env containers) builds it")
    return found


@pytest.fixture
async def sandbox(runtime: ContainerRuntime) -> AsyncIterator[AsyncSandbox]:
    provider = DockerProvider(create={"pids_limit": 128})
    async with AsyncSandbox(provider) as box:
        await box.start(SandboxSpec(image=base_image_tag(), resources={"memory_mib": 128, "cpu": 1}))
        yield box


def _containers_of(runtime: ContainerRuntime, owner: str) -> list[str]:
    return runtime.run("ps", "-aq", "--filter", f"label={OWNER_LABEL}={owner}").stdout.split()


async def test_limits_hold_inside_the_container(sandbox: AsyncSandbox) -> None:
    memory_bomb = await sandbox.exec("python3 -c 'x = bytearray(400 * 1024 * 1024)'", timeout_s=60)
    assert memory_bomb.return_code == 137 and memory_bomb.error_type is None  # the kernel's OOM kill, not a timeout
    network = await sandbox.exec(
        "python3 -c 'import socket; socket.create_connection((\"1.1.1.1\", 80), timeout=3)'", timeout_s=60
    )
    assert network.return_code != 0 and "unreachable" in (network.stderr or "").lower()
    root = await sandbox.exec("touch /etc/owned", timeout_s=30)
    assert root.return_code != 0 and "read-only" in (root.stderr or "").lower()
    work = await sandbox.exec("echo ok > /work/note && cat /work/note", timeout_s=30)
    assert (work.return_code, work.stdout) == (0, "ok\n")


async def test_a_fork_bomb_is_held_to_the_process_limit_and_dies_with_its_command(sandbox: AsyncSandbox) -> None:
    bomb = command_leaving_nothing("f() { f | f & }; f; sleep 2", 20)
    await sandbox.exec(bomb, timeout_s=60)
    left = await sandbox.exec("ls /proc | grep -c '^[0-9]'", timeout_s=30)
    assert left.return_code == 0 and int(left.stdout or "0") < 10, left
    assert (await sandbox.exec("echo alive", timeout_s=30)).stdout == "alive\n"


async def test_a_commands_deadline_is_enforced_inside_the_container(sandbox: AsyncSandbox) -> None:
    slow = await sandbox.exec("sleep 60", timeout_s=2)
    assert slow.error_type == "timeout" and slow.return_code == 125
    running = await sandbox.exec("ps -eo args | grep -c '^sleep 60' || true", timeout_s=30)
    assert running.stdout is not None and running.stdout.strip() == "0"
    leftover = await sandbox.exec(command_leaving_nothing("sleep 300 & echo started", 10), timeout_s=30)
    assert leftover.stdout == "started\n"
    after = await sandbox.exec("ps -eo args | grep -c '^sleep 300' || true", timeout_s=30)
    assert after.stdout is not None and after.stdout.strip() == "0"


async def test_task_images_are_built_once_per_content(runtime: ContainerRuntime) -> None:
    files = {"pkg/mod.py": "VALUE = 41 + 1\n"}
    tag = await build_image(runtime, "nemo-gym-test-image", files, target_dir="/task/repo")
    assert image_exists(runtime, tag)
    assert await build_image(runtime, "nemo-gym-test-image", dict(files), target_dir="/task/repo") == tag
    assert await build_image(runtime, "nemo-gym-test-image", {"pkg/mod.py": "VALUE = 0\n"}, target_dir="/x") != tag
    async with AsyncSandbox(DockerProvider()) as box:
        await box.start(SandboxSpec(image=tag))
        read = await box.exec("python3 -c 'import pkg.mod; print(pkg.mod.VALUE)'", cwd="/task/repo", timeout_s=60)
        assert read.stdout == "42\n", read


def test_a_server_killed_with_sigkill_leaves_no_container(runtime: ContainerRuntime, tmp_path: Path) -> None:
    """The watchdog removes what a dead provider's process made (within 15 s of the kill)."""
    ready = tmp_path / "ready.json"
    script = textwrap.dedent(
        f"""
        import asyncio, json, time
        from nemo_gym.sandbox import AsyncSandbox, SandboxSpec
        from nemo_gym.sandbox.providers.docker import DockerProvider

        async def main():
            provider = DockerProvider()
            for _ in range(2):
                await AsyncSandbox(provider, owns_provider=False).start(SandboxSpec(image={base_image_tag()!r}))
            open({str(ready)!r}, "w").write(json.dumps(provider.owner))
            await asyncio.sleep(600)

        asyncio.run(main())
        """
    )
    child = subprocess.Popen([sys.executable, "-c", script])
    try:
        deadline = time.monotonic() + 120
        while not ready.exists() and child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert ready.exists(), "the child never made its containers"
        owner = json.loads(ready.read_text())
        assert len(_containers_of(runtime, owner)) == 2
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        killed_at = time.monotonic()
        while _containers_of(runtime, owner) and time.monotonic() - killed_at < 15:
            time.sleep(0.5)
        assert _containers_of(runtime, owner) == []
    finally:
        if child.poll() is None:
            child.kill()


async def test_files_copy_in_and_out_of_the_tmpfs_work_dir(runtime: ContainerRuntime, tmp_path: Path) -> None:
    async with AsyncSandbox(DockerProvider()) as box:
        await box.start(SandboxSpec(image=base_image_tag(), files={"/work/task/in.txt": "hello\n"}))
        made = await box.exec("cat /work/task/in.txt && echo out > /work/task/out.txt", timeout_s=30)
        assert (made.return_code, made.stdout) == (0, "hello\n")
        await box.download("/work/task/out.txt", tmp_path / "out.txt")
        assert (tmp_path / "out.txt").read_text() == "out\n"
