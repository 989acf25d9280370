"""gym env test --checkout on an unpacked nemo_gym wheel: all five folder kinds, and the wheel's core as the control.

The wheel here is a miniature one written into tmp (no network, no dependency on a real release): ``nemo_gym/`` and a
``nemo_gym-9.9.0.dist-info/`` whose RECORD lists its files, folders of the five kinds beside them.
"""

from __future__ import annotations

import hashlib
import platform
import sys
import zipfile
from base64 import urlsafe_b64encode
from pathlib import Path

import pytest

from nemo_gym.authoring.compat_report import CheckReport, compare, render_markdown, summary_lines
from nemo_gym.authoring.migration_check import (
    CHECKOUT_FOLDERS,
    CheckOptions,
    FolderResult,
    check_folder,
    dry_run_lines,
    find_checkout_folders,
    import_root,
    installable_framework,
    report_header,
    resolve_interpreter,
)
from nemo_gym.authoring.unpacked_wheel import find_unpacked_wheel
from nemo_gym.cli.main import main
from nemo_gym.launcher.venvs import framework_requirement, rewrite_requirements
from tests.helpers import write

VERSION = "9.9.0"
CORE = f'__version__ = "{VERSION}"\nFROM_THE_WHEEL = True\n'
TESTS = """import nemo_gym


def test_runs_on_the_wheels_core():
    assert nemo_gym.FROM_THE_WHEEL and nemo_gym.__version__ == "9.9.0"
"""


def make_wheel(root: Path, requires_python: str | None = None) -> Path:
    """An unpacked wheel: its core and dist-info (RECORD included), then one folder of each kind beside them."""
    write(root / "nemo_gym" / "__init__.py", CORE)
    dist_info = root / f"nemo_gym-{VERSION}.dist-info"
    metadata = f"Metadata-Version: 2.4\nName: nemo-gym\nVersion: {VERSION}\n"
    metadata += "License:    Apache License\n           Version 2.0\n        \n           TERMS AND CONDITIONS\n"
    metadata += 'Provides-Extra: dev\nRequires-Dist: pytest; extra == "dev"\n'  # what the folders' tests run with
    if requires_python:
        metadata += f"Requires-Python: >={requires_python}\n"
    write(dist_info / "METADATA", metadata + "\nThe README would be here.\n")
    write(dist_info / "WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
    write(dist_info / "top_level.txt", "nemo_gym\n")
    record = []
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        digest = urlsafe_b64encode(hashlib.sha256(path.read_bytes()).digest()).rstrip(b"=").decode()
        record.append(f"{path.relative_to(root)},sha256={digest},{path.stat().st_size}")
    record.append(f"{dist_info.name}/RECORD,,")
    write(dist_info / "RECORD", "\n".join(record) + "\n")
    for kind in CHECKOUT_FOLDERS:
        folder = root / kind / f"one_{kind}"
        write(folder / "requirements.txt", "-e nemo-gym[dev] @ ../../\n")
        write(folder / "tests" / "test_it.py", TESTS)
    write(root / "environments" / "only_data" / "config.yaml", "x: 1\n")  # no dependency file: not a test folder
    write(root / "environment_servers" / "untested" / "requirements.txt", "-e nemo-gym[dev] @ ../../\n")
    return root


def test_a_wheel_is_recognised_by_its_dist_info(tmp_path: Path) -> None:
    wheel = find_unpacked_wheel(make_wheel(tmp_path / "w", requires_python="3.13.14"))
    assert wheel is not None
    assert (wheel.version, wheel.requires_python, wheel.tag) == (VERSION, "3.13.14", "py3-none-any")
    assert find_unpacked_wheel(tmp_path) is None


def test_every_folder_kind_of_a_wheel_is_walked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    checkout = make_wheel(tmp_path / "w")
    labels = [f"{p.parent.name}/{p.name}" for p in find_checkout_folders(checkout)]
    assert labels == [
        "resources_servers/one_resources_servers",
        "responses_api_agents/one_responses_api_agents",
        "responses_api_models/one_responses_api_models",
        "environment_servers/one_environment_servers",
        "environment_servers/untested",
        "environments/one_environments",
    ]
    lines = dry_run_lines(CheckOptions(checkout=checkout, cache_dir=tmp_path / "cache", patterns=("environment*",)))
    assert lines == [
        "environment_servers/one_environment_servers",
        "environment_servers/untested  (no tests)",
        "environments/one_environments",
    ]
    assert main(["env", "test", "--checkout", str(checkout), "--dry-run", f"+cache_dir={tmp_path / 'cache'}"]) == 0
    out = capsys.readouterr().out
    assert "environment_servers/one_environment_servers" in out and "6 folders of" in out
    assert not (tmp_path / "cache" / "venvs").exists(), "a dry run builds nothing"


def test_the_import_root_leaves_out_the_wheels_core_and_metadata(tmp_path: Path) -> None:
    root = import_root(make_wheel(tmp_path / "w"), tmp_path / "cache")
    assert sorted(p.name for p in root.iterdir()) == sorted(CHECKOUT_FOLDERS)


def test_the_wheels_python_floor_gets_the_patch_allowance(tmp_path: Path) -> None:
    major, minor, patch = platform.python_version_tuple()
    newer_patch = f"{major}.{minor}.{int(patch) + 1}"
    checkout = make_wheel(tmp_path / "w", requires_python=newer_patch)
    assert resolve_interpreter(None, None, checkout).install_args == ("--python-version", newer_patch)  # ours
    assert resolve_interpreter(None, checkout).install_args == ("--python-version", newer_patch)  # the control
    assert "resolved as" in resolve_interpreter(None, checkout).note


def test_the_wheel_is_packed_again_from_its_record_only(tmp_path: Path) -> None:
    checkout = make_wheel(tmp_path / "w")
    write(checkout / "nemo_gym" / "left_over.pyc", "not part of the release")
    packed = installable_framework(CheckOptions(checkout, tmp_path / "cache", framework_dir=checkout)).framework_dir
    assert packed is not None and packed.name == f"nemo_gym-{VERSION}-py3-none-any.whl"
    with zipfile.ZipFile(packed) as archive:
        names = set(archive.namelist())
    assert "nemo_gym/__init__.py" in names and f"nemo_gym-{VERSION}.dist-info/RECORD" in names
    assert "nemo_gym/left_over.pyc" not in names and not any(n.startswith("environment_servers/") for n in names)
    again = installable_framework(CheckOptions(checkout, tmp_path / "cache", framework_dir=checkout)).framework_dir
    assert again == packed  # built once
    source = CheckOptions(checkout, tmp_path / "cache", framework_dir=None)
    assert installable_framework(source) is source

    line = rewrite_requirements("-e nemo-gym[dev] @ ../../\n", checkout / "environment_servers", packed)
    assert line.splitlines()[1] == framework_requirement("dev", packed) == f"nemo-gym[dev]@{packed.as_uri()}"


def test_the_report_names_the_wheels_version(tmp_path: Path) -> None:
    checkout = make_wheel(tmp_path / "w")
    header = report_header(CheckOptions(checkout, tmp_path / "cache"), resolve_interpreter(None, None, checkout))
    assert header["version"] == VERSION and header["commit"] is None
    ours = [FolderResult("environment_servers/a", "passed", 1), FolderResult("resources_servers/b", "failed", 0, 1)]
    control = CheckReport(
        str(checkout), None, str(checkout), "3.13", (FolderResult("environment_servers/a", "passed"),)
    )
    comparison = compare(ours, control)
    assert "On ours by folder kind: environment_servers 1 of 1, resources_servers 0 of 1." in summary_lines(comparison)
    assert f"(nemo_gym {VERSION})" in render_markdown(comparison, header, control)


@pytest.mark.e2e
@pytest.mark.timeout(600)
def test_the_control_runs_on_the_wheels_own_core(tmp_path: Path) -> None:
    """An environment_servers folder of the wheel, in a venv where the wheel itself (packed again) is the framework."""
    checkout = make_wheel(tmp_path / "w")
    options = installable_framework(
        CheckOptions(checkout=checkout, cache_dir=tmp_path / "cache", framework_dir=checkout, timeout_s=500)
    )
    interpreter = resolve_interpreter(sys.executable, checkout)
    folder = checkout / "environment_servers" / "one_environment_servers"
    result = check_folder(folder, options, interpreter, import_root(checkout, tmp_path / "cache"))
    assert (result.folder, result.result, result.passed) == (
        "environment_servers/one_environment_servers",
        "passed",
        1,
    ), result.first_error
