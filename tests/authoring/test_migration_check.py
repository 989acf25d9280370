"""gym env test --checkout: a NeMo Gym-style checkout's server folders run against our nemo_gym, each in its venv."""

from __future__ import annotations

import json
import platform
import sys
from pathlib import Path

import pytest

from nemo_gym import INSTALL_DIR
from nemo_gym.authoring.migration_check import (
    CheckOptions,
    Interpreter,
    check_folder,
    find_checkout_folders,
    import_root,
    resolve_interpreter,
)
from nemo_gym.cli.main import main
from nemo_gym.errors import UserError
from nemo_gym.launcher.venvs import framework_requirement, rewrite_requirements, venv_spec
from tests.helpers import write

UPSTREAM_PYPROJECT = """[project]
name = "nemo-gym"
version = "0.0.0"
requires-python = ">=3.99"

[tool.pytest.ini_options]
asyncio_mode = "auto"
"""
BROKEN_CORE = 'raise ImportError("the checkout\'s own nemo_gym was imported instead of the one in the venv")\n'
GOOD_APP = """from nemo_gym.base_resources_server import BaseResourcesServerConfig


class EchoConfig(BaseResourcesServerConfig):
    pass


async def echo(text: str) -> str:
    return text
"""
GOOD_TESTS = """import pytest

from app import EchoConfig, echo
from resources_servers.echo.app import echo as same_echo


@pytest.fixture
def word():
    return "hi"


async def test_echo(word):
    assert await echo(word) == await same_echo(word) == "hi"


def test_config_is_ours():
    assert EchoConfig.__module__ == "app"


@pytest.mark.skip(reason="shows in the skipped column")
def test_skipped():
    pass
"""
OUR_API_TESTS = """from nemo_gym.server_utils import a_name_no_nemo_gym_has


def test_uses_it():
    assert a_name_no_nemo_gym_has
"""


def make_checkout(root: Path) -> Path:
    """A NeMo Gym checkout in miniature: its own (here: broken) nemo_gym at the root, folders in its layout."""
    write(root / "pyproject.toml", UPSTREAM_PYPROJECT)
    write(root / "nemo_gym" / "__init__.py", BROKEN_CORE)
    for name, tests in (("echo", GOOD_TESTS), ("needs_more_api", OUR_API_TESTS)):
        folder = root / "resources_servers" / name
        write(folder / "requirements.txt", "-e nemo-gym[dev] @ ../../\n")
        write(folder / "app.py", GOOD_APP)
        write(folder / "tests" / "test_app.py", tests)
    write(root / "responses_api_agents" / "notes" / "README.md", "not a server folder: no dependency file\n")
    return root


def test_upstream_style_requirement_lines_install_our_framework_or_the_control(tmp_path: Path) -> None:
    checkout = make_checkout(tmp_path / "ck")
    base = checkout / "resources_servers" / "echo"
    for line in ("-e nemo-gym[dev] @ ../../", "-e nemo-gym[dev,sandbox] @ ../..", "-e ../..[dev]"):
        lines = rewrite_requirements(line + "\nrequests\n", base).splitlines()
        assert lines[1] in (framework_requirement("compat"), framework_requirement("compat,sandbox")), line
        assert str(checkout) not in "\n".join(lines), "a path to the checkout's own nemo-gym is never installed"
    control = rewrite_requirements("-e nemo-gym[dev] @ ../../\n", base, framework_dir=checkout).splitlines()
    assert control[1] == f"-e {checkout}[dev]"
    assert framework_requirement(framework_dir=checkout) == f"-e {checkout}"


def test_control_framework_overrides_and_install_args_key_the_venv(tmp_path: Path) -> None:
    checkout = make_checkout(tmp_path / "ck")
    folder = checkout / "resources_servers" / "echo"
    cache, python = tmp_path / "cache", platform.python_version()
    ours = venv_spec("resources_servers", "echo", folder, cache, python)
    assert ours.framework_dir is None and ours.install_args == ()
    control = venv_spec("resources_servers", "echo", folder, cache, python, framework_dir=checkout)
    resolved = venv_spec("resources_servers", "echo", folder, cache, python, install_args=("--python-version", "3.99"))
    assert len({ours.key, control.key, resolved.key}) == 3
    write(folder / "overrides.txt", "openai==1.99.0\n")
    assert venv_spec("resources_servers", "echo", folder, cache, python).key != ours.key


def test_folders_are_chosen_by_name_or_glob(tmp_path: Path) -> None:
    checkout = make_checkout(tmp_path / "ck")
    every = [f"{p.parent.name}/{p.name}" for p in find_checkout_folders(checkout)]
    assert every == ["resources_servers/echo", "resources_servers/needs_more_api"]
    assert [p.name for p in find_checkout_folders(checkout, ("echo",))] == ["echo"]
    assert [p.name for p in find_checkout_folders(checkout, ("resources_servers/needs_*",))] == ["needs_more_api"]
    with pytest.raises(UserError, match="no server folder of .* matches"):
        find_checkout_folders(checkout, ("nothing_like_it",))
    with pytest.raises(UserError, match="is it a NeMo Gym checkout"):
        find_checkout_folders(tmp_path)


def test_a_folder_whose_only_tests_are_in_a_left_over_venv_has_no_tests(tmp_path: Path) -> None:
    folder = tmp_path / "ck" / "resources_servers" / "bare"
    write(folder / "requirements.txt", "-e nemo-gym[dev] @ ../../\n")
    write(folder / ".venv" / "lib" / "site-packages" / "pkg" / "test_pkg.py", "def test_x():\n    pass\n")
    options = CheckOptions(checkout=tmp_path / "ck", cache_dir=tmp_path / "cache")
    result = check_folder(folder, options, Interpreter(sys.executable, platform.python_version()))
    assert (result.folder, result.result, result.ok) == ("resources_servers/bare", "no tests", True)
    assert not (tmp_path / "cache").exists(), "nothing was built"


def test_tests_that_never_end_are_stopped_and_reported_as_a_timeout(tmp_path: Path) -> None:
    from nemo_gym.authoring.migration_check import _run_pytest

    folder = tmp_path / "ck" / "resources_servers" / "stuck"
    write(folder / "tests" / "test_stuck.py", "import threading\n\n\ndef test_waits_forever():\n"
                                               "    threading.Event().wait()\n")  # fmt: skip
    options = CheckOptions(checkout=tmp_path / "ck", cache_dir=tmp_path / "cache", timeout_s=3)
    report = _run_pytest(folder, options, Path(sys.executable), tmp_path / "ck")
    assert [(f.stage, f.text) for f in report.failures] == [("timeout", "tests took over 3 s")]


def test_the_import_root_hides_the_checkouts_own_nemo_gym(tmp_path: Path) -> None:
    checkout = make_checkout(tmp_path / "ck")
    root = import_root(checkout, tmp_path / "cache")
    assert sorted(p.name for p in root.iterdir()) == ["resources_servers", "responses_api_agents"]
    assert (root / "resources_servers" / "echo" / "app.py").is_file()
    assert import_root(checkout, tmp_path / "cache") == root  # idempotent


def test_a_control_that_needs_another_python_is_one_line_naming_it(tmp_path: Path) -> None:
    checkout = make_checkout(tmp_path / "ck")
    with pytest.raises(UserError, match=r"needs Python >=3\.99, but the venvs would use Python .*pass --python"):
        resolve_interpreter(None, checkout)
    major, minor, patch = platform.python_version_tuple()
    newer_patch = f"{major}.{minor}.{int(patch) + 1}"
    write(checkout / "pyproject.toml", UPSTREAM_PYPROJECT.replace(">=3.99", f">={newer_patch}"))
    interpreter = resolve_interpreter(None, checkout)
    assert interpreter.install_args == ("--python-version", newer_patch)
    assert f"resolved as {newer_patch}" in interpreter.note
    write(checkout / "pyproject.toml", UPSTREAM_PYPROJECT.replace(">=3.99", f">={major}.{minor}"))
    assert resolve_interpreter(None, checkout).install_args == ()
    with pytest.raises(UserError, match="not a nemo_gym source tree"):
        resolve_interpreter(None, tmp_path)


def test_against_our_core_the_checkouts_python_gets_the_patch_allowance_and_never_an_error(tmp_path: Path) -> None:
    """Folders of a checkout that asks for 3.13.14 may ask for it in their own pyproject too: on a 3.13.0 they must
    resolve as on the control. A checkout asking for another minor version is no reason to stop: ours runs there."""
    checkout = make_checkout(tmp_path / "ck")
    assert resolve_interpreter(None, None, checkout).install_args == ()  # asks for 3.99
    major, minor, patch = platform.python_version_tuple()
    newer_patch = f"{major}.{minor}.{int(patch) + 1}"
    write(checkout / "pyproject.toml", UPSTREAM_PYPROJECT.replace(">=3.99", f">={newer_patch}"))
    assert resolve_interpreter(None, None, checkout).install_args == ("--python-version", newer_patch)
    assert resolve_interpreter(None, None, tmp_path).install_args == ()  # not a framework tree: nothing asked


def test_checkout_only_flags_need_a_checkout(workdir, capsys) -> None:
    assert main(["env", "test", "--jobs", "2"]) == 1
    assert "--jobs goes with --checkout PATH" in capsys.readouterr().err
    assert main(["env", "test", "--checkout", str(workdir), "--jobs", "0"]) == 1
    assert "--jobs must be at least 1" in capsys.readouterr().err


def test_a_comparison_needs_a_control_report_it_can_read(workdir, capsys) -> None:
    checkout = make_checkout(workdir / "Gym")
    assert main(["env", "test", "--checkout", str(checkout), "--markdown", "out.md"]) == 1
    assert "--markdown writes ours beside a control: add --control JSON" in capsys.readouterr().err
    write(workdir / "results.jsonl", '{"reward": 1.0}\n')
    assert main(["env", "test", "--checkout", str(checkout), "--control", "results.jsonl"]) == 1
    err = capsys.readouterr().err
    assert "results.jsonl: not a report of `gym env test --checkout ... --json PATH`" in err and "Traceback" not in err
    assert main(["env", "test", "--checkout", str(checkout), "--control", "missing.json"]) == 1
    assert "missing.json: cannot read the control report" in capsys.readouterr().err


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_a_nemo_gym_checkout_runs_against_our_nemo_gym(workdir, capsys) -> None:
    """Two folders, each in its own venv built from its upstream-style requirements: one passes with both import
    styles, an async test without a marker, a fixture and a skip; the other imports a name we lack."""
    checkout = make_checkout(workdir / "Gym")
    report, control, markdown = workdir / "check.json", workdir / "control.json", workdir / "compatibility.md"
    write(control, json.dumps({"checkout": str(checkout), "commit": None, "nemo_gym": str(checkout), "python": "3.13",
                               "folders": [{"folder": "resources_servers/echo", "result": "failed", "failed": 1},
                                           {"folder": "resources_servers/needs_more_api", "result": "passed"}]}))  # fmt: skip
    code = main(["env", "test", "--checkout", str(checkout), "--jobs", "2", "--timeout", "240", "--json", str(report),
                 "--control", str(control), "--markdown", str(markdown), f"+cache_dir={workdir / 'cache'}"])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 1, out
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.startswith("resources_servers/")}
    assert rows["resources_servers/echo"][:6] == ["resources_servers/echo", "passed", "2", "0", "1", "failed"], out
    assert rows["resources_servers/needs_more_api"][:7] == [
        "resources_servers/needs_more_api", "failed", "0", "1", "0", "passed", "our-api"
    ], out  # fmt: skip
    assert "cannot import name 'a_name_no_nemo_gym_has' from 'nemo_gym.server_utils'" in out
    assert "1 passed, 1 failed" in out
    assert "Parity: 0 of the 1 folders that pass on the control pass on ours; 1 do not; 1 pass only on ours." in out
    written = markdown.read_text()
    assert "- `resources_servers/needs_more_api`: our-api: ImportError: cannot import name" in written
    assert "| `resources_servers/echo` | passed (2/0/1) | failed (0/1/0) |  |  |" in written
    saved = json.loads(report.read_text())
    assert saved["checkout"] == str(checkout) and saved["nemo_gym"] == str(INSTALL_DIR)
    assert [(f["folder"], f["result"], f["cause"]) for f in saved["folders"]] == [
        ("resources_servers/echo", "passed", None),
        ("resources_servers/needs_more_api", "failed", "our-api"),
    ]
