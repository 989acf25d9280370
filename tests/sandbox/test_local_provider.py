"""The local provider end to end: real commands on this machine, under the real Landlock restriction.

Every test bounds itself with pytest's timeout and checks outcomes (output, exit codes, files, processes), never how
long anything took.
"""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import psutil
import pytest

from nemo_gym.errors import LaunchError
from nemo_gym.sandbox import AsyncSandbox, Sandbox, SandboxCreateError, SandboxSpec, SandboxStatus, landlock
from nemo_gym.sandbox.providers.local import LocalProvider

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(landlock.abi() < 1, reason="the local provider needs Landlock (Linux >= 5.13)"),
]
needs_tcp_rules = pytest.mark.skipif(landlock.abi() < 4, reason="blocking TCP needs Landlock ABI >= 4")


@pytest.fixture
def provider_config(tmp_path: Path) -> dict:
    root = tmp_path / "sandboxes"
    root.mkdir()
    return {"local": {"root": str(root)}}


async def test_commands_files_status_and_close(provider_config: dict, tmp_path: Path) -> None:
    spec = SandboxSpec(workdir="project", env={"GREETING": "hello"}, files={"project/main.py": "print(6 * 7)\n"})
    sandbox = AsyncSandbox(provider_config)
    assert await sandbox.status() == SandboxStatus.UNKNOWN
    await sandbox.start(spec)
    home = Path(sandbox._handle.raw.home)
    assert await sandbox.status() == SandboxStatus.RUNNING

    result = await sandbox.exec("python3 main.py && echo $GREETING && pwd")
    assert result.return_code == 0 and result.error_type is None
    assert result.stdout == f"42\nhello\n{home / 'project'}\n"

    failed = await sandbox.exec("echo oops >&2; exit 3", cwd=".", env={"EXTRA": "1"})
    assert (failed.stdout, failed.stderr, failed.return_code) == ("", "oops\n", 3)

    source = tmp_path / "upload.txt"
    source.write_text("uploaded", encoding="utf-8")
    await sandbox.upload(source, "project/data/in.txt")
    assert (await sandbox.exec("cat data/in.txt > out.txt")).return_code == 0
    await sandbox.download("project/out.txt", tmp_path / "back" / "out.txt")
    assert (tmp_path / "back" / "out.txt").read_text(encoding="utf-8") == "uploaded"

    await sandbox.stop()
    await sandbox.stop()  # a second stop does nothing
    assert await sandbox.status() == SandboxStatus.STOPPED
    assert not home.exists()
    with pytest.raises(RuntimeError, match="not been started"):
        await sandbox.exec("true")


async def test_writes_outside_the_sandbox_are_refused(provider_config: dict, tmp_path: Path) -> None:
    outside = tmp_path / "outside.txt"
    async with AsyncSandbox(provider_config, SandboxSpec()) as sandbox:
        await sandbox.start()
        result = await sandbox.exec(f"echo escaped > {outside}; echo status=$?; touch $HOME/inside && echo inside")
        assert "Permission denied" in result.stderr
        assert result.stdout == "status=1\ninside\n"
        with pytest.raises(PermissionError, match="outside the sandbox directory"):
            await sandbox.upload(__file__, str(outside))
        with pytest.raises(PermissionError, match="outside the sandbox directory"):
            await sandbox.download("../../outside.txt", tmp_path / "copy.txt")
    assert not outside.exists()


async def test_other_users_files_are_not_readable(provider_config: dict, tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("do not read", encoding="utf-8")
    async with AsyncSandbox(provider_config, SandboxSpec()) as sandbox:
        await sandbox.start()
        result = await sandbox.exec(f"cat {secret}")
    assert result.return_code != 0 and "do not read" not in result.stdout


async def test_timeout_kills_the_command_and_what_it_started(provider_config: dict) -> None:
    async with AsyncSandbox(provider_config, SandboxSpec()) as sandbox:
        await sandbox.start()
        pid_file = Path(sandbox._handle.raw.home) / "pid"
        result = await sandbox.exec(f"sleep 600 & echo $! > {pid_file}; wait", timeout_s=1)
        assert (result.stdout, result.return_code, result.error_type) == (None, 125, "timeout")
        assert "timed out" in result.stderr
        _assert_exits(int(pid_file.read_text()))


async def test_stop_kills_background_processes(provider_config: dict) -> None:
    async with AsyncSandbox(provider_config, SandboxSpec()) as sandbox:
        await sandbox.start()
        started = await sandbox.exec("sleep 600 > /dev/null 2>&1 & echo $!")
        assert started.return_code == 0
        assert psutil.pid_exists(int(started.stdout))
    _assert_exits(int(started.stdout))


@needs_tcp_rules
async def test_tcp_is_blocked_unless_network_is_on(provider_config: dict) -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        connect = f"python3 -I -c \"import socket; socket.create_connection(('127.0.0.1', {port}))\""
        async with AsyncSandbox(provider_config, SandboxSpec()) as sandbox:
            await sandbox.start()
            blocked = await sandbox.exec(connect)
        assert blocked.return_code != 0 and "PermissionError" in blocked.stderr
        open_config = {"local": {**provider_config["local"], "network": True}}
        async with AsyncSandbox(open_config, SandboxSpec(ports=[port])) as sandbox:
            await sandbox.start()
            assert (await sandbox.exec(connect)).return_code == 0
            assert (await sandbox.endpoint(port)).endpoint == f"http://127.0.0.1:{port}"


async def test_refusals_are_results_or_clear_errors(provider_config: dict) -> None:
    with pytest.raises(SandboxCreateError, match="outside the sandbox"):
        await AsyncSandbox(provider_config).start(SandboxSpec(workdir="/etc"))
    async with AsyncSandbox(provider_config, SandboxSpec()) as sandbox:
        await sandbox.start()
        as_other = await sandbox.exec("id", user="nobody-at-all")
        assert (as_other.return_code, as_other.error_type) == (125, "sandbox")
        bad_cwd = await sandbox.exec("true", cwd="missing")
        assert (bad_cwd.return_code, bad_cwd.error_type) == (125, "sandbox")
        with pytest.raises(RuntimeError, match="network is off"):
            await LocalProvider().endpoint(sandbox._handle, 8000)


async def test_no_landlock_is_refused_unless_allowed(provider_config: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(landlock, "abi", lambda: 0)
    with pytest.raises(SandboxCreateError, match="no Landlock") as refused:
        await AsyncSandbox(provider_config).start(SandboxSpec())
    assert isinstance(refused.value, LaunchError) and "\n" not in str(refused.value)
    # `auto` runs unrestricted with a warning instead (the launcher still tries, and succeeds on this kernel).
    lenient = {"local": {**provider_config["local"], "landlock": "auto"}}
    async with AsyncSandbox(lenient, SandboxSpec()) as sandbox:
        await sandbox.start()
        assert (await sandbox.exec("echo ok")).stdout == "ok\n"


async def test_serialize_and_connect_share_one_sandbox(provider_config: dict) -> None:
    async with AsyncSandbox(provider_config, SandboxSpec(workdir="w")) as first:
        await first.start()
        await first.exec("echo shared > note.txt")
        descriptor = await first.serialize()
        second = await AsyncSandbox.connect(descriptor, provider=LocalProvider(**provider_config["local"]))
        assert (await second.exec("cat note.txt")).stdout == "shared\n"


async def test_workspace_root_is_0_7s_name_for_root(tmp_path: Path) -> None:
    """NeMo Gym 0.7 configs say ``workspace_root`` (not made yet) and read ``raw["workspace"]`` off a handle."""
    root = tmp_path / "outputs" / "local_sandbox"
    provider = LocalProvider(workspace_root=str(root))
    handle = await provider.create(SandboxSpec())
    try:
        workspace = handle.raw["workspace"]
        assert isinstance(workspace, Path) and workspace.is_dir() and workspace.is_relative_to(root)
        assert handle.raw["owned"] is True and handle.raw["env"]["HOME"] == str(workspace)
        written = await provider.exec(handle, "mkdir -p logs && echo 1 > logs/reward.txt")
        assert written.return_code == 0
        assert (workspace / "logs" / "reward.txt").read_text(encoding="utf-8") == "1\n"
    finally:
        await provider.close(handle)
    assert not workspace.exists()
    with pytest.raises(ValueError, match="not both"):
        LocalProvider(root=str(root), workspace_root=str(tmp_path / "other"))


def test_sync_sandbox_runs_the_same_provider(provider_config: dict) -> None:
    with Sandbox(provider_config, SandboxSpec(files={"a.txt": "sync"})) as sandbox:
        sandbox.start()
        assert sandbox.exec("cat a.txt").stdout == "sync"
        assert sandbox.status() == SandboxStatus.RUNNING
    assert sandbox.status() == SandboxStatus.STOPPED


def test_sync_sandbox_refuses_to_block_an_event_loop(provider_config: dict) -> None:
    async def make() -> None:
        Sandbox(provider_config)

    with pytest.raises(RuntimeError, match="use AsyncSandbox in async code"):
        asyncio.run(make())


def _assert_exits(pid: int) -> None:
    """The process ends (SIGKILL is asynchronous, so wait for it, bounded)."""
    try:
        psutil.Process(pid).wait(timeout=30)
    except psutil.NoSuchProcess:
        pass
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
