"""Per-implementation venvs: requirement rewriting, cache keys, failed builds, and two conflicting pins at once."""

from __future__ import annotations

import fcntl
import json
import platform
import re
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from nemo_gym import INSTALL_DIR
from nemo_gym.errors import ConfigError
from nemo_gym.launcher import ServerLaunchError, running_servers
from nemo_gym.launcher.venvs import (
    COMPAT_EXTRA,
    NEMO_GYM_OPENAI_PIN,
    READY_MARKER,
    BuildCancelled,
    BuildContext,
    _framework_source,
    build_venv,
    framework_requirement,
    rewrite_requirements,
    shared_venv_enabled,
    venv_spec,
)
from tests.helpers import run_headers, write
from tests.launcher.conftest import base_overrides, make_server, server_block

PY = platform.python_version()
HANG_GUARD_S = 60.0
"""The longest a wait below may take: reached only when something hangs (each wait ends when its condition holds)."""


def wait_for_line(lines: list[bytes], text: bytes) -> None:
    """Wait until a build thread has logged ``text`` (it is then at that point of its work, not merely started)."""
    deadline = time.monotonic() + HANG_GUARD_S
    while not any(text in line for line in lines):
        assert time.monotonic() < deadline, f"never logged {text!r}"
        time.sleep(0.02)


def test_framework_lines_are_replaced_and_paths_made_absolute(tmp_path: Path) -> None:
    (tmp_path / "extra.txt").write_text("six\n")
    text = "\n".join(
        [
            "# pinned for the tests",
            "-e nemo-gym[dev] @ ../../",
            "nemo_gym==0.0.1",
            "-r extra.txt",
            "-e ./local_pkg",
            "nemo-gym-plugin==1.0  # another project, kept",
            "requests>=2",
        ]
    )
    lines = rewrite_requirements(text, tmp_path).splitlines()
    assert framework_requirement(COMPAT_EXTRA) in lines
    assert not any("nemo_gym==" in line or "@ ../../" in line for line in lines)
    assert f"-r {tmp_path / 'extra.txt'}" in lines
    assert f"-e {tmp_path / 'local_pkg'}" in lines
    assert "nemo-gym-plugin==1.0" in lines and "requests>=2" in lines
    assert framework_requirement() == f"-e {INSTALL_DIR}"


def test_framework_is_added_when_not_named_and_a_path_to_it_counts(tmp_path: Path) -> None:
    assert rewrite_requirements("six==1.16.0\n", tmp_path).splitlines()[1:] == [framework_requirement(), "six==1.16.0"]
    relative = "../" * (len(tmp_path.parts) - 1) + str(INSTALL_DIR).lstrip("/")
    lines = rewrite_requirements(f"-e {relative}\n", tmp_path).splitlines()
    assert lines[1:] == [framework_requirement()]


def test_a_folder_written_inside_a_nemo_gym_checkout_gets_the_compat_extra(tmp_path: Path) -> None:
    """NeMo Gym's folders import pandas, datasets, ray ... that only its core declares: naming nemo-gym by a path that
    is not this framework marks such a folder, and its venv gets our ``compat`` extra with those libraries (and NeMo Gym's
    test tools in place of our ``dev``)."""
    write(tmp_path / "Gym" / "pyproject.toml", '[project]\nname = "nemo-gym"\n')
    folder = tmp_path / "Gym" / "resources_servers" / "env"
    for line in ("-e nemo-gym[dev] @ ../../", "-e nemo-gym @ ../..", "-e ../..[dev]"):
        framework = rewrite_requirements(line + "\n", folder).splitlines()[1]
        assert framework == framework_requirement(COMPAT_EXTRA), line
    ours = "../" * (len(folder.parts) - 1) + str(INSTALL_DIR).lstrip("/")
    for line, extras in (
        ("nemo-gym", ""),
        ("nemo-gym[dev]", "dev"),
        (f"-e nemo-gym[dev] @ {ours}", "dev"),
        (f"-e {ours}", ""),
    ):
        assert rewrite_requirements(line + "\n", folder).splitlines()[1] == framework_requirement(extras), line
    control = rewrite_requirements("-e nemo-gym[dev] @ ../../\n", folder, framework_dir=tmp_path / "Gym")
    assert control.splitlines()[1] == f"-e {tmp_path / 'Gym'}[dev]", "the control's own core brings its libraries"


def test_the_compat_extra_lists_what_nemo_gym_folders_import_undeclared() -> None:
    """The extra exists in our pyproject, so the rewritten line installs something (uv ignores an unknown extra)."""
    import tomllib

    extras = tomllib.loads((INSTALL_DIR / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    names = {re.split(r"[\[<>=]", requirement)[0].lower() for requirement in extras[COMPAT_EXTRA]}
    assert {"datasets", "ray", "requests", "mlflow"} <= names
    assert NEMO_GYM_OPENAI_PIN in extras[COMPAT_EXTRA], "a pyproject folder gets the same pin as an override"


def test_a_pyproject_folder_sourcing_nemo_gym_from_a_checkout_gets_the_compat_extra(tmp_path: Path) -> None:
    folder = tmp_path / "Gym" / "responses_api_models" / "m"
    write(
        folder / "pyproject.toml",
        '[project]\nname = "m"\n\n[tool.uv.sources]\nnemo-gym = { path = "../..", editable = true }\n',
    )
    assert _framework_source(folder / "pyproject.toml") == "../.."
    write(folder / "pyproject.toml", '[project]\nname = "m"\n\n[tool.uv.sources]\nother = { path = "../.." }\n')
    assert _framework_source(folder / "pyproject.toml") is None


def test_two_source_checkouts_of_the_framework_never_share_a_venv(tmp_path: Path, monkeypatch) -> None:
    """Each venv installs the framework editable from one checkout; another checkout with the same pyproject (a git
    worktree) must get its own venv, or its servers would run the first checkout's code."""
    import nemo_gym.launcher.venvs as venvs

    impl = make_server(tmp_path, "env", requirements="six\n")
    first = venv_spec("resources_servers", "env", impl, tmp_path / "cache", PY)
    other = tmp_path / "worktree"
    write(other / "pyproject.toml", (INSTALL_DIR / "pyproject.toml").read_text())
    monkeypatch.setattr(venvs, "INSTALL_DIR", other)
    assert venv_spec("resources_servers", "env", impl, tmp_path / "cache", PY).key != first.key


def test_exactly_one_dependency_file_is_required(tmp_path: Path) -> None:
    impl = make_server(tmp_path, "both", requirements="six\n")
    write(impl / "pyproject.toml", "[project]\nname = 'x'\n")
    with pytest.raises(ConfigError, match=rf"{impl} has both requirements.txt and pyproject.toml"):
        venv_spec("resources_servers", "both", impl, tmp_path / "cache", PY)
    bare = make_server(tmp_path, "bare")
    with pytest.raises(ConfigError, match=rf"{bare} has neither requirements.txt nor pyproject.toml"):
        venv_spec("resources_servers", "bare", bare, tmp_path / "cache", PY)


def test_cache_key_follows_requirements_and_python_version(tmp_path: Path) -> None:
    impl = make_server(tmp_path, "keyed", requirements="six==1.16.0\n")
    first = venv_spec("resources_servers", "keyed", impl, tmp_path / "cache", PY)
    assert first.path.parent == tmp_path / "cache" / "venvs" / "resources_servers"
    assert first.path.name == f"keyed-{first.key}"
    assert venv_spec("resources_servers", "keyed", impl, tmp_path / "cache", PY) == first
    assert venv_spec("resources_servers", "keyed", impl, tmp_path / "cache", "3.99.0").key != first.key
    write(impl / "requirements.txt", "six==1.17.0\n")
    assert venv_spec("resources_servers", "keyed", impl, tmp_path / "cache", PY).key != first.key


def test_shared_venv_switches(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NEMO_GYM_SHARED_VENV", raising=False)
    assert not shared_venv_enabled(None) and shared_venv_enabled(True)
    monkeypatch.setenv("NEMO_GYM_SHARED_VENV", "1")
    assert shared_venv_enabled(None)


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_failed_build_names_the_server_and_is_not_reused(server_root: Path) -> None:
    # A local path that does not exist makes uv fail at once, without touching the network.
    make_server(server_root, "broken", requirements="-e ./no_such_package\n")
    config = write(server_root / "config.yaml", server_block("breaks", "broken"))
    overrides = base_overrides(server_root, config, shared=False)
    for _ in range(2):
        with pytest.raises(ServerLaunchError) as info:
            with running_servers(overrides):
                pytest.fail("the launch should have failed")
        message = str(info.value)
        assert "server 'breaks': building its venv (resources_servers/broken) failed" in message
        assert "`uv pip install` exited with code" in message
        assert "no_such_package" in message  # uv's own complaint, quoted from the log tail
        venvs = server_root / "cache" / "venvs" / "resources_servers"
        assert not any(p.is_dir() for p in venvs.glob("broken-*"))  # deleted, so never taken for a good venv
        log = (server_root / "results" / "logs" / "breaks.log").read_text()
        assert "building venv for resources_servers/broken" in log and "using cached venv" not in log


def get_json(url: str) -> dict:
    with urllib.request.urlopen(
        urllib.request.Request(url, headers=run_headers(url)), timeout=HANG_GUARD_S
    ) as response:
        return json.loads(response.read())


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_conflicting_pins_run_side_by_side_and_the_cache_is_reused(server_root: Path) -> None:
    # The seeds' own example: two resources servers pinning different math-verify releases, running at once.
    make_server(server_root, "math_old", requirements="math-verify==0.7.0\n-e nemo-gym @ ../../\n")
    make_server(server_root, "math_new", requirements="math-verify==0.8.0\n")
    config = write(
        server_root / "config.yaml",
        server_block("old", "math_old") + server_block("new", "math_new") + server_block("new_twin", "math_new"),
    )
    overrides = [*base_overrides(server_root, config, shared=False), "++server_startup_timeout_seconds=500"]
    with running_servers(overrides) as run:
        info = {name: get_json(url + "/info") for name, url in run.urls.items()}
        venvs = {name: next(s.venv for s in run.servers if s.name == name) for name in info}
    assert info["old"]["math_verify"] == "0.7.0"
    assert info["new"]["math_verify"] == info["new_twin"]["math_verify"] == "0.8.0"
    assert info["old"]["python"] != sys.executable
    assert Path(info["old"]["python"]).parent.parent == venvs["old"].path
    assert venvs["new"] == venvs["new_twin"]  # one venv (one build) per implementation
    marker = venvs["new"].path / READY_MARKER
    built_at = marker.stat().st_mtime

    with running_servers(overrides) as run:
        assert get_json(run.urls["old"] + "/info")["math_verify"] == "0.7.0"
    assert marker.stat().st_mtime == built_at  # reused, not rebuilt (whatever the time it took)
    assert "using cached venv" in (server_root / "results" / "logs" / "new.log").read_text()


def test_a_venv_being_built_by_another_launch_is_waited_for_then_reused(tmp_path: Path) -> None:
    impl = make_server(tmp_path, "locked", requirements="six\n")
    spec = venv_spec("resources_servers", "locked", impl, tmp_path / "cache", PY)
    spec.path.parent.mkdir(parents=True)
    lines: list[bytes] = []
    result: list[object] = []
    ctx = BuildContext(log=lines.append)
    with open(spec.lock_path, "a+b") as other_launch:
        fcntl.flock(other_launch.fileno(), fcntl.LOCK_EX)
        thread = threading.Thread(target=lambda: result.append(build_venv(spec, ctx)))
        thread.start()
        wait_for_line(lines, b"another launch is building")
        assert thread.is_alive()
        # The other launch finishes its build: a venv with its completion marker appears, then the lock is released.
        (spec.path / "bin").mkdir(parents=True)
        (spec.path / "bin" / "python").symlink_to(sys.executable)
        (spec.path / READY_MARKER).write_text("{}")
        fcntl.flock(other_launch.fileno(), fcntl.LOCK_UN)
    thread.join(timeout=HANG_GUARD_S)
    assert result == [spec.python]
    assert any(b"using cached venv" in line for line in lines)


def test_waiting_for_a_lock_stops_when_the_launch_is_cancelled(tmp_path: Path) -> None:
    impl = make_server(tmp_path, "locked", requirements="six\n")
    spec = venv_spec("resources_servers", "locked", impl, tmp_path / "cache", PY)
    spec.path.parent.mkdir(parents=True)
    lines: list[bytes] = []
    ctx = BuildContext(log=lines.append)
    errors: list[BaseException] = []

    def build() -> None:
        try:
            build_venv(spec, ctx)
        except BaseException as e:
            errors.append(e)

    with open(spec.lock_path, "a+b") as other_launch:
        fcntl.flock(other_launch.fileno(), fcntl.LOCK_EX)
        thread = threading.Thread(target=build)
        thread.start()
        wait_for_line(lines, b"another launch is building")  # it is waiting for the lock now
        ctx.kill_running()
        thread.join(timeout=HANG_GUARD_S)
    assert not thread.is_alive() and isinstance(errors[0], BuildCancelled)
    assert not spec.path.exists()


def test_a_server_venv_gets_the_launchers_torch_build_when_it_can_be_installed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib.metadata

    from nemo_gym.launcher import venvs

    installed = {"torch": "2.13.0+cpu"}

    def version(name: str) -> str:
        if name not in installed:
            raise importlib.metadata.PackageNotFoundError(name)
        return installed[name]

    monkeypatch.setattr(importlib.metadata, "version", version)
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    monkeypatch.setenv("NEMO_GYM_WHEELHOUSE", str(tmp_path / "none"))
    monkeypatch.setenv("PIP_FIND_LINKS", f"{wheels} {tmp_path / 'missing'}")
    assert venvs.local_wheel_folders() == [wheels]
    assert venvs.launcher_torch_pin() is None  # a local build that no wheel folder holds: PyPI cannot give it
    (wheels / "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl").touch()
    assert venvs.launcher_torch_pin() == "torch==2.13.0+cpu"
    impl = make_server(tmp_path, "needs_torch", requirements="six==1.16.0\n")
    pinned = venv_spec("resources_servers", "needs_torch", impl, tmp_path / "cache", platform.python_version())
    assert pinned.constraints == ("torch==2.13.0+cpu",)
    assert venv_spec("resources_servers", "needs_torch", impl, tmp_path / "cache", "3.99.0").constraints == ()
    installed["torch"] = "2.15.0"  # from the package index: always installable
    assert venvs.launcher_torch_pin() == "torch==2.15.0"
    repinned = venv_spec("resources_servers", "needs_torch", impl, tmp_path / "cache", platform.python_version())
    assert repinned.key != pinned.key  # another torch, another venv
    del installed["torch"]
    assert venvs.launcher_torch_pin() is None
