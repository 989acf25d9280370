"""Container providers import without their runtime, and say in one line what is missing when a sandbox is made."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from nemo_gym.errors import LaunchError, NeMoGymError
from nemo_gym.sandbox import AsyncSandbox, SandboxCreateError, SandboxSpec, create_provider
from nemo_gym.sandbox.providers.apptainer import ApptainerProvider
from nemo_gym.sandbox.providers.apptainer import provider as apptainer_provider
from nemo_gym.sandbox.providers.docker import DockerCreateConfig, DockerProvider


@pytest.fixture
def empty_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A PATH with nothing on it but what a test puts there."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", str(bin_dir))
    return bin_dir


def _fake_cli(bin_dir: Path, name: str, stderr: str, code: int) -> None:
    script = bin_dir / name
    script.write_text(f"#!/bin/sh\necho '{stderr}' >&2\nexit {code}\n", encoding="utf-8")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)


def _assert_one_clear_line(error: SandboxCreateError, *needles: str) -> None:
    message = str(error)
    assert "\n" not in message
    assert all(needle in message for needle in needles), message
    assert isinstance(error, LaunchError) and isinstance(error, NeMoGymError) and isinstance(error, RuntimeError)


def test_importing_the_sandbox_package_loads_no_provider() -> None:
    code = "import sys, nemo_gym.sandbox; print(sorted(m for m in sys.modules if '.providers.' in m))"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "docker" not in loaded and "apptainer" not in loaded and "local" not in loaded


def test_providers_construct_without_their_runtime(empty_path: Path) -> None:
    docker = DockerProvider(create=DockerCreateConfig(network="host", extra_run_args=["-v", "/a:/b"]))
    assert docker._create_config.extra_run_args == ["-v", "/a:/b"]
    apptainer = ApptainerProvider(exec={"default_binds": ["/a:/b"]}, create={"extra_start_args": ["--fakeroot"]})
    assert apptainer._exec_config.default_binds == ["/a:/b"]
    assert isinstance(create_provider({"apptainer": {}}), ApptainerProvider)
    with pytest.raises(ValueError, match="publish_host"):
        DockerProvider(create={"publish_host": "localhost"})


async def test_docker_missing_binary(empty_path: Path) -> None:
    with pytest.raises(SandboxCreateError) as error:
        await AsyncSandbox({"docker": {}}).start(SandboxSpec(image="ubuntu:22.04"))
    _assert_one_clear_line(error.value, "no `podman` or `docker` command on PATH", "install podman", "Docker Engine")


async def test_docker_daemon_not_running(empty_path: Path) -> None:
    _fake_cli(empty_path, "docker", "Cannot connect to the Docker daemon at unix:///var/run/docker.sock.", 1)
    with pytest.raises(SandboxCreateError) as error:
        await AsyncSandbox({"docker": {}}).start(SandboxSpec(image="ubuntu:22.04"))
    _assert_one_clear_line(error.value, "Docker daemon is not reachable", "start it")


async def test_docker_needs_an_image() -> None:
    with pytest.raises(SandboxCreateError, match="spec.image is required"):
        await DockerProvider().create(SandboxSpec())


async def test_apptainer_missing_binary(empty_path: Path, tmp_path: Path) -> None:
    with pytest.raises(SandboxCreateError) as error:
        await AsyncSandbox({"apptainer": {}}).start(SandboxSpec(image="ubuntu:22.04"))
    _assert_one_clear_line(error.value, "`apptainer` command is not on PATH", "install Apptainer")
    with pytest.raises(SandboxCreateError) as error:
        await ApptainerProvider(bin_path=str(tmp_path / "nowhere")).create(SandboxSpec(image="ubuntu:22.04"))
    _assert_one_clear_line(error.value, "no executable `apptainer`", "nowhere")


async def test_apptainer_start_failure_leaves_no_staging_dir(
    empty_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_cli(empty_path, "apptainer", "FATAL: could not pull image", 255)
    monkeypatch.setattr(apptainer_provider.tempfile, "tempdir", str(tmp_path))
    with pytest.raises(SandboxCreateError, match="could not pull image"):
        await ApptainerProvider().create(SandboxSpec(image="ubuntu:22.04", env={"A": "it's"}))
    assert not [p for p in os.listdir(tmp_path) if p.startswith("nemo-gym-apptainer-")]
