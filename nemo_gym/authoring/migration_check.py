"""``gym env test --checkout PATH``: the tests of every server folder of a NeMo Gym checkout, run against our core.

This is how a NeMo Gym user sees what runs here unchanged. Each folder is tested the way NeMo Gym's own ``ng_test``
tests it: a venv built from the folder's ``requirements.txt`` (or ``pyproject.toml``, with ``overrides.txt`` as an
override file) in which *our* ``nemo_gym`` replaces theirs, then a bare ``pytest`` in the folder, with the folder and
the checkout root on ``PYTHONPATH`` (so ``from app import ...`` and ``from resources_servers.x.app import ...`` both
work) and asyncio's auto mode (async tests carry no marker). The checkout's own pytest settings apply, as they do
upstream. ``--nemo-gym PATH`` installs another framework source tree instead: the same folders against NeMo Gym's own
core is the control that tells our gaps from the folder's own needs.

The checkout may be a git checkout of NeMo Gym or its released wheel unpacked (``nemo_gym-<version>.dist-info/``
instead of a ``pyproject.toml``; see :mod:`nemo_gym.authoring.unpacked_wheel`), and so may ``--nemo-gym``'s tree: a
wheel's core is installed from the wheel packed again. Folders are walked in the five kinds a release ships them in
(:data:`CHECKOUT_FOLDERS`); ``dry_run`` lists them without building anything.
"""

from __future__ import annotations

import contextlib
import fnmatch
import functools
import hashlib
import os
import platform
import re
import subprocess
import tempfile
import threading
import time
import tomllib
import xml.etree.ElementTree as ElementTree
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from nemo_gym.authoring.failure_causes import Cause, classify_failure, first_error_line
from nemo_gym.authoring.server_tests import PYTEST_OPTIONS, SERVER_TYPES
from nemo_gym.authoring.unpacked_wheel import find_unpacked_wheel
from nemo_gym.errors import UserError
from nemo_gym.jsonl import write_json_atomic
from nemo_gym.launcher.processes import kill_group, spawn
from nemo_gym.launcher.venvs import (
    PYPROJECT_FILE,
    REQUIREMENTS_FILE,
    BuildCancelled,
    BuildContext,
    build_venv,
    find_uv,
    venv_spec,
)

CHECKOUT_FOLDERS: tuple[str, ...] = (*SERVER_TYPES, "environments")
"""The folder kinds whose folders are tested: the four server kinds and ``environments/`` (one with dependencies)."""
DEFAULT_TIMEOUT_S = 900.0
OUTPUT_TAIL_CHARS = 20_000
"""How much of a failed run's output is kept for classification when pytest wrote no report."""


@dataclass(frozen=True)
class CheckOptions:
    checkout: Path
    cache_dir: Path
    patterns: tuple[str, ...] = ()
    """Folder names or globs (``resources_servers/example_*``, ``math*``); none: every folder."""
    jobs: int = 1
    timeout_s: float = DEFAULT_TIMEOUT_S
    """Bound on each folder's venv build, and separately on its test run."""
    framework_dir: Path | None = None
    """Another framework source tree to install instead of ours (the control)."""
    python: str | None = None
    """The venvs' interpreter (a version such as ``3.13`` or a path); none: this one."""


@dataclass(frozen=True)
class Interpreter:
    """What the venvs are built with: the request handed to uv, its version, and extra install arguments."""

    request: str
    version: str
    install_args: tuple[str, ...] = ()
    note: str = ""


@dataclass
class FolderResult:
    folder: str
    result: str
    """passed, failed, no tests, venv failed or timeout."""
    passed: int = 0
    failed: int = 0
    skipped: int = 0
    cause: Cause | None = None
    first_error: str = ""
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.result in ("passed", "no tests")


@dataclass
class _Failure:
    text: str
    stage: str = "tests"


@dataclass
class _Report:
    passed: int = 0
    failed: int = 0
    skipped: int = 0
    failures: list[_Failure] = field(default_factory=list)


def find_checkout_folders(checkout: Path, patterns: tuple[str, ...] = ()) -> list[Path]:
    """Server folders of a checkout: directories under :data:`CHECKOUT_FOLDERS` that declare dependencies."""
    if not any((checkout / kind).is_dir() for kind in CHECKOUT_FOLDERS):
        raise UserError(
            f"--checkout {checkout}: no {', '.join(CHECKOUT_FOLDERS)} folder there (is it a NeMo Gym checkout or an "
            "unpacked nemo_gym wheel?)"
        )
    folders = [
        folder
        for kind in CHECKOUT_FOLDERS
        for folder in sorted((checkout / kind).glob("*"))
        if (folder / REQUIREMENTS_FILE).is_file() or (folder / PYPROJECT_FILE).is_file()
    ]
    if not patterns:
        return folders
    chosen = [f for f in folders if any(_matches(f"{f.parent.name}/{f.name}", p) for p in patterns)]
    if not chosen:
        raise UserError(f"--folder {', '.join(patterns)}: no server folder of {checkout} matches")
    return chosen


def _matches(label: str, pattern: str) -> bool:
    pattern = pattern.rstrip("/")
    return fnmatch.fnmatchcase(label, pattern) or fnmatch.fnmatchcase(label.split("/", 1)[1], pattern)


def resolve_interpreter(python: str | None, framework_dir: Path | None, checkout: Path | None = None) -> Interpreter:
    """The venvs' interpreter, checked against the control framework's ``requires-python`` before anything builds.

    An interpreter of the right minor version but an older patch release resolves as if it were the required one
    (``uv pip install --python-version``), and says so; a wrong minor version is one error line naming what is missing.
    Against our core, the checkout's own ``requires-python`` gets the same patch-level allowance (its folders were
    written for it, and some repeat it in their own pyproject), but never an error: our core runs on older Pythons.
    """
    if python is None:
        interpreter = Interpreter(platform.python_version(), platform.python_version())
    else:
        path = python if os.sep in python else _find_python(python)
        if not path:
            raise UserError(f"--python {python}: no such interpreter here (neither uv nor pyenv has one)")
        interpreter = Interpreter(path, _version_of(path))
    if framework_dir is not None:
        return _meet(interpreter, framework_dir, _required_python(framework_dir), strict=True)
    if checkout is not None and (checkout / "nemo_gym").is_dir():
        if (checkout / PYPROJECT_FILE).is_file():
            return _meet(interpreter, checkout, _required_python(checkout), strict=False)
        if (wheel := find_unpacked_wheel(checkout)) is not None:
            return _meet(interpreter, checkout, wheel.requires_python, strict=False)
    return interpreter


def _meet(interpreter: Interpreter, tree: Path, minimum: str | None, strict: bool) -> Interpreter:
    if minimum is None:
        return interpreter
    have = _version_tuple(interpreter.version)
    want = _version_tuple(minimum)
    if have >= want:
        return interpreter
    if have[:2] == want[:2]:
        note = f"{tree} asks for Python >={minimum}; using {interpreter.version}, resolved as {minimum}"
        return Interpreter(interpreter.request, interpreter.version, ("--python-version", minimum), note)
    if not strict:
        return interpreter
    wanted = ".".join(str(part) for part in want[:2])
    found = _find_python(wanted)
    hint = f"one is at {found}" if found else "none is installed here, and uv cannot download one without network"
    raise UserError(
        f"--nemo-gym {tree} needs Python >={minimum}, but the venvs would use Python {interpreter.version}: "
        f"pass --python with a Python {wanted} interpreter ({hint})"
    )


def _version_of(path: str) -> str:
    try:
        out = subprocess.run([path, "-c", "import platform; print(platform.python_version())"], capture_output=True,
                             text=True, check=True, timeout=60)  # fmt: skip
    except (OSError, subprocess.SubprocessError) as e:
        raise UserError(f"--python {path}: cannot run it ({e})") from None
    return out.stdout.strip()


def _find_python(version: str) -> str | None:
    """An installed interpreter of ``version`` (``3.13``): uv's discovery, else pyenv's versions directly (uv stops
    at a pyenv shim that is not activated)."""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run([find_uv(), "python", "find", "--no-python-downloads", version], capture_output=True,
                             text=True, timeout=60)  # fmt: skip
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip().splitlines()[-1]
    pyenv = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv") / "versions"
    found = sorted(pyenv.glob(f"{version}.*/bin/python{version}"), key=lambda p: _version_tuple(p.parent.parent.name))
    return str(found[-1]) if found else None


def _required_python(framework_dir: Path) -> str | None:
    pyproject = framework_dir / PYPROJECT_FILE
    if not pyproject.is_file() and (wheel := find_unpacked_wheel(framework_dir)) is not None:
        return wheel.requires_python
    if not pyproject.is_file() or not (framework_dir / "nemo_gym").is_dir():
        raise UserError(
            f"--nemo-gym {framework_dir}: not a nemo_gym source tree (it needs pyproject.toml and nemo_gym/) nor an "
            "unpacked nemo_gym wheel (nemo_gym/ and nemo_gym-<version>.dist-info/)"
        )
    match = re.search(r'(?m)^requires-python\s*=\s*">=\s*([\d.]+)', pyproject.read_text(encoding="utf-8"))
    return match.group(1) if match else None


def _version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version)[:3])


def import_root(checkout: Path, cache_dir: Path) -> Path:
    """A directory that mirrors the checkout's top-level folders except its own ``nemo_gym``, for ``PYTHONPATH``.

    NeMo Gym puts the checkout root on ``PYTHONPATH`` so that ``from resources_servers.x.app import ...`` works; that
    root also holds the checkout's ``nemo_gym`` package, which would shadow the one installed in the venv.
    """
    root = cache_dir / "checkouts" / hashlib.sha256(str(checkout).encode()).hexdigest()[:16]
    root.mkdir(parents=True, exist_ok=True)
    for entry in sorted(checkout.iterdir()):
        link = root / entry.name
        if (
            entry.is_dir()
            and entry.name != "nemo_gym"
            and not entry.name.startswith(".")
            and not entry.name.endswith(".dist-info")  # an unpacked wheel's: it would shadow the installed metadata
            and not link.exists()
        ):
            with contextlib.suppress(FileExistsError):
                link.symlink_to(entry, target_is_directory=True)
    return root


def check_folder(
    folder: Path, options: CheckOptions, interpreter: Interpreter, python_path_root: Path | None = None
) -> FolderResult:
    """Build one folder's venv and run its tests there; every failure becomes a row, never an exception.

    ``python_path_root`` stands for the checkout root on ``PYTHONPATH`` (see :func:`import_root`).
    """
    label = f"{folder.parent.name}/{folder.name}"
    started = time.monotonic()
    if not _has_test_files(folder):
        return FolderResult(label, "no tests")
    try:
        python = _build(folder, options, interpreter)
    except _Stopped as stopped:
        cause = classify_failure(stopped.text, stopped.stage)  # type: ignore[arg-type]
        result = "timeout" if stopped.stage == "timeout" else "venv failed"
        return FolderResult(label, result, cause=cause, first_error=stopped.line, seconds=time.monotonic() - started)
    report = _run_pytest(folder, options, python, python_path_root or options.checkout)
    seconds = time.monotonic() - started
    if report.failures and report.failures[0].stage == "timeout":
        return FolderResult(label, "timeout", report.passed, report.failed, report.skipped, "timeout",
                            report.failures[0].text, seconds)  # fmt: skip
    if not report.failures:
        outcome = "passed" if report.passed or report.skipped else "no tests"
        return FolderResult(label, outcome, report.passed, report.failed, report.skipped, seconds=seconds)
    causes = [classify_failure(f.text) for f in report.failures]
    cause = Counter(causes).most_common(1)[0][0]
    first = first_error_line(report.failures[causes.index(cause)].text)
    return FolderResult(label, "failed", report.passed, report.failed, report.skipped, cause, first, seconds)


def _has_test_files(folder: Path) -> bool:
    """Whether pytest would find a test file here; hidden folders (a ``.venv`` left by ``ng_test``) are skipped,
    as NeMo Gym's pytest settings skip them."""
    for _, subdirs, files in os.walk(folder):
        subdirs[:] = [d for d in subdirs if not d.startswith(".") and d not in ("venv", "__pycache__", "node_modules")]
        if any(name.endswith(".py") and (name.startswith("test_") or name.endswith("_test.py")) for name in files):
            return True
    return False


class _Stopped(Exception):
    def __init__(self, stage: str, text: str, line: str) -> None:
        super().__init__(line)
        self.stage, self.text, self.line = stage, text, line


def _build(folder: Path, options: CheckOptions, interpreter: Interpreter) -> Path:
    uv_output: list[str] = []
    ctx = BuildContext(log=lambda chunk: uv_output.append(chunk.decode(errors="replace")))
    timer = threading.Timer(options.timeout_s, ctx.kill_running)
    timer.start()
    try:
        pin = checkout_requirement(options.checkout, "openai") if options.framework_dir is None else None
        spec = venv_spec(folder.parent.name, folder.name, folder, options.cache_dir, interpreter.request,
                         framework_dir=options.framework_dir, install_args=interpreter.install_args,
                         overrides=(pin,) if pin else ())  # fmt: skip
        return build_venv(spec, ctx)
    except BuildCancelled:
        raise _Stopped("timeout", "", f"venv build took over {options.timeout_s:.0f} s") from None
    except Exception as e:
        text = "".join(line for line in uv_output if not line.startswith("[nemo-gym]")) + f"\n{e}"
        raise _Stopped("build", text, _build_error_line(text) or str(e).splitlines()[0]) from None
    finally:
        timer.cancel()


def _build_error_line(output: str) -> str:
    """uv's reason for a failed install: its ``cause:`` line (``╰─▶`` on a terminal), else its ``error:`` line."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    for marker in ("╰─▶", "cause:", "error:", "×"):
        for line in lines:
            if line.startswith(marker):
                return line.removeprefix(marker).strip()
    return ""


def _run_pytest(folder: Path, options: CheckOptions, python: Path, root: Path) -> _Report:
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "CONDA_PREFIX")}
    entries = [str(folder), str(root), env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(entry for entry in entries if entry)
    with tempfile.TemporaryDirectory(prefix="nemo-gym-check-") as tmp:
        junit = Path(tmp) / "report.xml"
        command = [str(python), "-m", "pytest", "-p", "no:cacheprovider", *PYTEST_OPTIONS, f"--junitxml={junit}"]
        process = spawn(command, cwd=folder, env=env)
        try:
            output, _ = process.communicate(timeout=options.timeout_s)
        except subprocess.TimeoutExpired:
            kill_group(process, 9)
            process.communicate()
            report = _read_junit(junit) if junit.is_file() else _Report()
            report.failures.insert(0, _Failure(f"tests took over {options.timeout_s:.0f} s", "timeout"))
            return report
        text = output.decode(errors="replace")
        report = _read_junit(junit) if junit.is_file() else _Report()
    if process.returncode not in (0, 5) and not report.failures:
        report.failures.append(_Failure(text[-OUTPUT_TAIL_CHARS:]))  # pytest stopped before reporting (e.g. conftest)
    return report


def _read_junit(path: Path) -> _Report:
    report = _Report()
    try:
        root = ElementTree.parse(path).getroot()
    except ElementTree.ParseError:
        return report
    for case in root.iter("testcase"):
        problems = [child for child in case if child.tag in ("failure", "error")]
        if problems:
            report.failed += 1
            first = problems[0]
            report.failures.append(_Failure((first.text or "") + "\n" + (first.get("message") or "")))
        elif case.find("skipped") is not None:
            report.skipped += 1
        else:
            report.passed += 1
    return report


def run_check(
    options: CheckOptions, interpreter: Interpreter, on_result: Callable[[FolderResult], None] | None = None
) -> list[FolderResult]:
    """Every selected folder, ``options.jobs`` at a time; results in folder order."""
    folders = find_checkout_folders(options.checkout, options.patterns)
    root = import_root(options.checkout, options.cache_dir)
    options = installable_framework(options)

    def one(folder: Path) -> FolderResult:
        result = check_folder(folder, options, interpreter, root)
        if on_result is not None:
            on_result(result)
        return result

    with ThreadPoolExecutor(max_workers=max(1, options.jobs)) as pool:
        return list(pool.map(one, folders))


def installable_framework(options: CheckOptions) -> CheckOptions:
    """``options`` with an unpacked wheel as ``framework_dir`` replaced by that wheel packed again (a source tree is
    installed as it is)."""
    framework = options.framework_dir
    if framework is None or (framework / PYPROJECT_FILE).is_file():
        return options
    wheel = find_unpacked_wheel(framework)
    return replace(options, framework_dir=wheel.pack(options.cache_dir)) if wheel is not None else options


def dry_run_lines(options: CheckOptions) -> list[str]:
    """What a check would test, one folder a line, built and run nothing: ``<kind>/<folder>`` and, for a folder
    without a test file, ``(no tests)``."""
    return [
        f"{folder.parent.name}/{folder.name}" + ("" if _has_test_files(folder) else "  (no tests)")
        for folder in find_checkout_folders(options.checkout, options.patterns)
    ]


def checkout_version(checkout: Path) -> str | None:
    """The checkout's own nemo_gym version: an unpacked wheel's, or its ``pyproject.toml``'s ``version``."""
    if (wheel := find_unpacked_wheel(checkout)) is not None:
        return wheel.version
    with contextlib.suppress(OSError):
        match = re.search(r'(?m)^version\s*=\s*"([^"]+)"', (checkout / PYPROJECT_FILE).read_text(encoding="utf-8"))
        return match.group(1) if match else None
    return None


@functools.cache
def checkout_requirement(checkout: Path, name: str) -> str | None:
    """The checkout's own core requirement on ``name`` (e.g. 0.7.0's ``openai==2.44.0``), from the unpacked wheel's
    metadata or ``pyproject.toml``'s ``dependencies``. Against our core, its folders get that ``openai`` (their tests
    compare SDK objects and import its newer types), in place of the ``compat`` extra's default."""
    if (wheel := find_unpacked_wheel(checkout)) is not None:
        return wheel.requirement(name)
    with contextlib.suppress(OSError, tomllib.TOMLDecodeError):
        project = tomllib.loads((checkout / PYPROJECT_FILE).read_text(encoding="utf-8")).get("project", {})
        for spec in project.get("dependencies", []):
            if re.match(rf"{re.escape(name)}(?![\w.-])", spec, re.IGNORECASE) and ";" not in spec:
                return str(spec).strip()
    return None


def checkout_commit(checkout: Path) -> str | None:
    """The checkout's git commit, when it is a git work tree (named in the JSON report)."""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(["git", "-C", str(checkout), "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=30)  # fmt: skip
        if out.returncode == 0:
            return out.stdout.strip()
    return None


def report_header(options: CheckOptions, interpreter: Interpreter) -> dict[str, str | None]:
    """What was checked against what: the checkout, its commit, the ``nemo_gym`` installed, the Python."""
    return {
        "checkout": str(options.checkout),
        "commit": checkout_commit(options.checkout),
        "version": checkout_version(options.checkout),
        "nemo_gym": str(options.framework_dir or Path(__file__).resolve().parents[2]),
        "python": interpreter.version,
    }


def write_report(path: Path, options: CheckOptions, interpreter: Interpreter, results: list[FolderResult]) -> None:
    """The results as JSON: :func:`report_header`, then one object per folder."""
    write_json_atomic(path, {**report_header(options, interpreter), "folders": [asdict(result) for result in results]})


__all__ = [
    "CHECKOUT_FOLDERS",
    "CheckOptions",
    "FolderResult",
    "Interpreter",
    "check_folder",
    "dry_run_lines",
    "find_checkout_folders",
    "report_header",
    "resolve_interpreter",
    "run_check",
    "write_report",
]
