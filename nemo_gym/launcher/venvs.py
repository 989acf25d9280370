"""One uv virtualenv per server implementation, cached by what goes into it.

Servers pin conflicting dependencies, so each implementation directory gets its own venv, built with ``uv`` from its
``requirements.txt`` or ``pyproject.toml``. The framework itself is always installed into it from the launcher's own
install root, so every server runs the same framework code as the launcher. A folder written inside a NeMo Gym
checkout (its requirements name ``nemo-gym`` by a path that is not this framework) gets the ``compat`` extra instead
of ``dev``: the libraries NeMo Gym's core and its ``dev`` extra install into every venv, which such folders import
without declaring, and the same ``openai`` pin.

Cache layout: ``<cache_dir>/venvs/<server_type>/<impl>-<key>/``, where the key hashes the requirements (or
pyproject) text, the implementation directory, the Python version, the framework's pyproject and the torch build
pinned from the launcher's environment (:func:`launcher_torch_pin`). A venv counts only
once its completion marker exists; the marker is written last, so a failed or interrupted build is never reused (the
next launch deletes the leftover and builds again). A file lock next to the venv keeps two launches from building the
same venv at once; the second waits and then reuses the first one's result.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from nemo_gym import INSTALL_DIR, __version__
from nemo_gym.errors import ConfigError, LaunchError
from nemo_gym.launcher.processes import kill_group, spawn

SHARED_VENV_ENV_VAR = "NEMO_GYM_SHARED_VENV"
"""``1``/``true``: run every server with the launcher's own interpreter (same as config ``shared_venv: true``)."""
READY_MARKER = ".nemo_gym_venv_ready"
"""Written last into a venv; its presence is what makes a venv usable."""
REQUIREMENTS_FILE = "requirements.txt"
PYPROJECT_FILE = "pyproject.toml"
OVERRIDES_FILE = "overrides.txt"
"""NeMo Gym's convention: ``uv pip install --override overrides.txt`` beside a requirements.txt."""
_LAYOUT_VERSION = "1"
"""Bumped when the way venvs are built changes, so old venvs are not reused."""

__all__ = [
    "READY_MARKER",
    "SHARED_VENV_ENV_VAR",
    "BuildCancelled",
    "BuildContext",
    "VenvBuildError",
    "VenvSpec",
    "build_venv",
    "find_uv",
    "framework_requirement",
    "rewrite_requirements",
    "shared_venv_enabled",
    "venv_spec",
]


class VenvBuildError(LaunchError):
    """Building a server's venv failed; the message says which command failed (the caller adds the log tail)."""


class BuildCancelled(Exception):
    """The launch was stopped (Ctrl-C, another server failed, startup deadline) while this venv was being built."""


def shared_venv_enabled(config_value: object) -> bool:
    """Shared mode from the config key ``shared_venv`` or the environment variable."""
    env = os.environ.get(SHARED_VENV_ENV_VAR, "").strip().lower()
    return bool(config_value) or env in ("1", "true", "yes", "on")


def find_uv() -> str:
    """The ``uv`` binary: next to this interpreter first (the framework depends on the ``uv`` package), then PATH."""
    sibling = Path(sys.executable).parent / "uv"
    if sibling.is_file() and os.access(sibling, os.X_OK):
        return str(sibling)
    with contextlib.suppress(ImportError, FileNotFoundError):
        from uv import find_uv_bin

        return find_uv_bin()
    found = shutil.which("uv")
    if found:
        return found
    raise ConfigError(
        "cannot build server venvs: `uv` was not found next to the Python interpreter or on PATH. "
        "Install it (`pip install uv`), or run with +shared_venv=true to use the current environment"
    )


def framework_requirement(extras: str = "", framework_dir: Path | None = None) -> str:
    """How a venv installs the framework: editable from a source checkout, else the launcher's exact version.

    ``framework_dir`` installs another source tree of the framework instead (a migration check's control run), or
    a built ``.whl`` of it (a released wheel, packed again from its unpacked files).
    """
    suffix = f"[{extras}]" if extras else ""
    if framework_dir is not None and framework_dir.suffix == ".whl":
        return f"nemo-gym{suffix}@{framework_dir.resolve().as_uri()}"  # one token: no space before the URL
    if framework_dir is not None:
        return f"-e {framework_dir}{suffix}"
    if (INSTALL_DIR / PYPROJECT_FILE).is_file():
        return f"-e {INSTALL_DIR}{suffix}"
    return f"nemo-gym{suffix}=={__version__}"


def _framework_fingerprint(framework_dir: Path | None = None) -> bytes:
    """Which framework a venv installs and from where: two source checkouts (an editable install each) never share
    a venv, even with the same pyproject."""
    where = framework_requirement(framework_dir=framework_dir).encode()
    pyproject = (framework_dir or INSTALL_DIR) / PYPROJECT_FILE
    if pyproject.is_file():
        return where + b"\n" + pyproject.read_bytes()
    return where


_FRAMEWORK_LINE = re.compile(
    r"^(?:(?:-e|--editable)\s+)?nemo[-_.]?gym(?![\w.-])\s*(?:\[(?P<extras>[^\]]*)\])?(?:\s*@\s*(?P<url>\S+))?", re.I
)
COMPAT_EXTRA = "compat"
NEMO_GYM_OPENAI_PIN = "openai==2.7.2"
"""NeMo Gym's ``openai<=2.7.2`` as our core's floor leaves it; the ``compat`` extra in pyproject.toml says the same."""
"""Our extra with the third-party libraries NeMo Gym's core brings into every server venv (pyproject.toml)."""
_PATH_OPTION = re.compile(
    r"^(?P<option>-r|--requirement|-c|--constraint|-e|--editable)(?P<sep>\s+|=)(?P<path>\S+)(?P<rest>.*)$"
)


def _is_local_path(value: str) -> bool:
    return value.startswith((".", "/", "~")) and "://" not in value


def _names_framework_dir(value: str, base: Path) -> bool:
    """A local path to this framework, or to any source tree of a package named nemo-gym (e.g. ``-e ../..`` in a
    NeMo Gym checkout), which must never be installed beside ours."""
    path = value.split("[", 1)[0]
    if not _is_local_path(path):
        return False
    with contextlib.suppress(OSError):
        target = (base / Path(path).expanduser()).resolve()
        pyproject = target / PYPROJECT_FILE
        return target == INSTALL_DIR or (
            pyproject.is_file() and re.search(r'(?m)^name\s*=\s*"nemo[-_.]?gym"', pyproject.read_text()) is not None
        )
    return False


def _written_for_nemo_gym(path: str, base: Path) -> bool:
    """Whether a local path given for the framework points somewhere other than this framework: the folder was written
    inside a NeMo Gym checkout (``-e nemo-gym[dev] @ ../../``), or copied out of one."""
    if not _is_local_path(path):
        return False
    with contextlib.suppress(OSError):
        return (base / Path(path.split("[", 1)[0]).expanduser()).resolve() != INSTALL_DIR
    return True


def rewrite_requirements(text: str, base: Path, framework_dir: Path | None = None) -> str:
    """Requirements with every line naming the framework replaced by :func:`framework_requirement`.

    Relative paths (``-r other.txt``, ``-e ./pkg``, ``../lib``) are made absolute against ``base``, the requirement
    file's directory, because the rewritten file lives elsewhere. The framework is added if no line named it. A
    folder written for NeMo Gym gets our ``compat`` extra as well, unless another framework (``framework_dir``, the
    migration check's control) is installed, which brings its own libraries.
    """
    out: list[str] = []
    framework_extras: set[str] = set()
    named_framework = written_for_nemo_gym = False
    for raw in text.splitlines():
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            out.append(raw)
            continue
        match = _FRAMEWORK_LINE.match(line)
        editable_path = re.sub(r"^(?:-e|--editable)\s+", "", line)
        if match or _names_framework_dir(editable_path, base):
            named_framework = True
            extras = match.group("extras") if match else (editable_path.split("[", 1) + [""])[1].rstrip("]")
            framework_extras.update(e.strip() for e in (extras or "").split(",") if e.strip())
            path = match["url"] if match and match["url"] else editable_path
            if framework_dir is None and _written_for_nemo_gym(path, base):
                written_for_nemo_gym = True
            continue
        option = _PATH_OPTION.match(line)
        is_file_option = option is not None and option["option"] in ("-r", "--requirement", "-c", "--constraint")
        if option and (_is_local_path(option["path"]) or (is_file_option and "://" not in option["path"])):
            absolute = (base / Path(option["path"]).expanduser()).resolve()
            out.append(f"{option['option']} {absolute}{option['rest']}")
        elif _is_local_path(line):
            out.append(str((base / Path(line).expanduser()).resolve()))
        else:
            out.append(line)
    if written_for_nemo_gym:
        # NeMo Gym's ``dev`` extra is its test tools, which ``compat`` has; ours (lint, type checking, a newer openai
        # for our own suite) is not what the folder asked for.
        framework_extras = (framework_extras - {"dev"}) | {COMPAT_EXTRA}
    framework = framework_requirement(",".join(sorted(framework_extras)), framework_dir)
    header = "# framework (replaces any nemo-gym line)" if named_framework else "# framework (always installed)"
    return "\n".join([header, framework, *out]) + "\n"


@dataclass(frozen=True)
class VenvSpec:
    """Everything that decides one implementation's venv; ``path`` embeds the cache key."""

    server_type: str
    implementation: str
    impl_dir: Path
    kind: Literal["requirements", "pyproject"]
    spec_file: Path
    python_version: str
    key: str
    path: Path
    framework_dir: Path | None = None
    """Another framework source tree installed in place of ours (None: ours)."""
    install_args: tuple[str, ...] = ()
    """Extra ``uv pip install`` arguments (e.g. ``--python-version``)."""
    constraints: tuple[str, ...] = ()
    """Pins applied if the venv needs the package at all (see :func:`launcher_torch_pin`)."""
    overrides: tuple[str, ...] = ()
    """Requirements that replace whatever the folder and its dependencies ask for the same package (uv's
    ``--override``): the migration check's ``openai`` pin of the NeMo Gym release whose folders are tested."""

    @property
    def python(self) -> Path:
        return self.path / "bin" / "python"

    @property
    def lock_path(self) -> Path:
        return self.path.with_name(self.path.name + ".lock")

    @property
    def is_ready(self) -> bool:
        return (self.path / READY_MARKER).is_file() and self.python.exists()

    @property
    def label(self) -> str:
        return f"{self.server_type}/{self.implementation}"


def venv_spec(
    server_type: str,
    implementation: str,
    impl_dir: Path,
    cache_dir: Path,
    python_version: str,
    *,
    framework_dir: Path | None = None,
    install_args: tuple[str, ...] = (),
    overrides: tuple[str, ...] = (),
) -> VenvSpec:
    """The venv an implementation directory needs; raises ConfigError unless it has exactly one dependency file."""
    requirements = impl_dir / REQUIREMENTS_FILE
    pyproject = impl_dir / PYPROJECT_FILE
    if requirements.is_file() and pyproject.is_file():
        raise ConfigError(
            f"{impl_dir} has both {REQUIREMENTS_FILE} and {PYPROJECT_FILE}; keep one so it is clear what its venv "
            "installs"
        )
    if not requirements.is_file() and not pyproject.is_file():
        raise ConfigError(
            f"{impl_dir} has neither {REQUIREMENTS_FILE} nor {PYPROJECT_FILE}, so its venv cannot be built. Add one "
            "(a requirements.txt may be a single line: nemo-gym), or run with +shared_venv=true"
        )
    kind: Literal["requirements", "pyproject"] = "requirements" if requirements.is_file() else "pyproject"
    spec_file = requirements if kind == "requirements" else pyproject
    torch_pin = launcher_torch_pin() if python_version == platform.python_version() else None
    constraints = (torch_pin,) if torch_pin else ()
    digest = hashlib.sha256()
    for part in (
        _LAYOUT_VERSION.encode(),
        kind.encode(),
        spec_file.read_bytes(),
        str(impl_dir.resolve()).encode(),
        python_version.encode(),
        _framework_fingerprint(framework_dir),
        *_optional_key_parts(impl_dir, framework_dir, install_args + constraints),
        *([("overrides:" + " ".join(overrides)).encode()] if overrides else []),
    ):
        digest.update(len(part).to_bytes(8, "little"))
        digest.update(part)
    key = digest.hexdigest()[:16]
    path = cache_dir / "venvs" / server_type / f"{implementation}-{key}"
    return VenvSpec(
        server_type, implementation, impl_dir.resolve(), kind, spec_file, python_version, key, path,
        framework_dir, install_args, constraints, overrides,
    )  # fmt: skip


def _optional_key_parts(impl_dir: Path, framework_dir: Path | None, install_args: tuple[str, ...]) -> list[bytes]:
    """Key parts that exist only when used, so the keys of ordinary venvs never change."""
    parts = []
    if (overrides := impl_dir / OVERRIDES_FILE).is_file():
        parts.append(b"overrides:" + overrides.read_bytes())
    if framework_dir is not None:
        parts.append(f"framework:{framework_dir.resolve()}".encode())
    if install_args:
        parts.append(("args:" + " ".join(install_args)).encode())
    return parts


@dataclass
class BuildContext:
    """What a build needs from the launch: where output goes, and how it is stopped early."""

    log: Callable[[bytes], None]
    cancel: threading.Event = field(default_factory=threading.Event)
    uv_cache_dir: str | None = None
    verbose: bool = False
    _procs: set[subprocess.Popen] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def kill_running(self) -> None:
        """Stop the uv commands in flight (called by the launcher when the launch is abandoned)."""
        self.cancel.set()
        with self._lock:
            for proc in list(self._procs):
                kill_group(proc, signal.SIGKILL)

    def note(self, message: str) -> None:
        self.log(f"[nemo-gym] {message}".encode())


def build_venv(spec: VenvSpec, ctx: BuildContext) -> Path:
    """Return the python of a ready venv for ``spec``, building it first unless a completed one is cached."""
    spec.path.parent.mkdir(parents=True, exist_ok=True)
    with _file_lock(spec.lock_path, ctx):
        if spec.is_ready:
            ctx.note(f"using cached venv {spec.path}")
            return spec.python
        if spec.path.exists():
            ctx.note(f"removing incomplete venv {spec.path} (an earlier build failed or was interrupted)")
            shutil.rmtree(spec.path, ignore_errors=True)
        ctx.note(f"building venv for {spec.label} from {spec.spec_file} into {spec.path}")
        started = time.monotonic()
        try:
            _build(spec, ctx)
        except BaseException:
            shutil.rmtree(spec.path, ignore_errors=True)
            raise
        marker = {"key": spec.key, "spec_file": str(spec.spec_file), "python_version": spec.python_version}
        tmp = spec.path / (READY_MARKER + ".tmp")
        tmp.write_text(json.dumps(marker, indent=2) + "\n", encoding="utf-8")
        os.replace(tmp, spec.path / READY_MARKER)
        ctx.note(f"venv for {spec.label} ready in {time.monotonic() - started:.1f} s")
        return spec.python


WHEELHOUSE_ENV_VAR = "NEMO_GYM_WHEELHOUSE"


def wheelhouse_dir() -> Path:
    """A folder of locally built wheels (``NEMO_GYM_WHEELHOUSE``) offered to every venv build, when it exists.

    A package that compiles from source can be built once into it and reused by every server venv, whatever the
    package index's caching headers allow uv's own cache to keep.
    """
    return Path(os.environ.get(WHEELHOUSE_ENV_VAR) or Path.home() / ".cache" / "nemo-gym" / "wheels")


def local_wheel_folders() -> list[Path]:
    """Folders of wheel files offered to every venv build: the wheelhouse, then pip's own find-links
    (``PIP_FIND_LINKS``, which uv does not read), those that exist."""
    folders = [wheelhouse_dir(), *(Path(p) for p in os.environ.get("PIP_FIND_LINKS", "").split())]
    return [folder for folder in dict.fromkeys(folders) if folder.is_dir()]


def launcher_torch_pin() -> str | None:
    """``torch==<version>`` of the torch beside the launcher, when a server venv can install that same build.

    PyPI's Linux torch brings several GB of CUDA runtime; a server that needs torch (``hf_policy_model``: the
    ``train`` extra) gets the build the core venv already has instead, a CPU build from a local wheel folder
    included. None when the launcher has no torch, or has a local build (``+cpu``) no wheel folder holds.
    """
    from importlib.metadata import PackageNotFoundError, version

    try:
        installed = version("torch")
    except PackageNotFoundError:
        return None
    if "+" in installed and not any(any(f.glob(f"torch-{installed}-*.whl")) for f in local_wheel_folders()):
        return None
    return f"torch=={installed}"


def _build(spec: VenvSpec, ctx: BuildContext) -> None:
    uv = find_uv()
    python = sys.executable if spec.python_version == platform.python_version() else spec.python_version
    _run(ctx, [uv, "venv", "--python", python, str(spec.path)], spec.impl_dir)
    install = [uv, "pip", "install", "--python", str(spec.python)]
    for folder in local_wheel_folders():
        install += ["--find-links", str(folder)]
    if spec.constraints:
        pins = spec.path / "nemo_gym_constraints.txt"
        pins.write_text("\n".join(spec.constraints) + "\n")
        install += ["--constraint", str(pins)]
    if ctx.verbose:
        install.append("-v")
    install += spec.install_args
    if spec.kind == "requirements":
        rewritten = spec.path / "nemo_gym_requirements.txt"
        text = spec.spec_file.read_text(encoding="utf-8")
        rewritten.write_text(rewrite_requirements(text, spec.impl_dir, spec.framework_dir))
        install += ["-r", str(rewritten)]
        if (spec.impl_dir / OVERRIDES_FILE).is_file():
            install += ["--override", str(spec.impl_dir / OVERRIDES_FILE)]
        if spec.overrides:
            pinned = spec.path / "nemo_gym_overrides.txt"
            pinned.write_text("\n".join(spec.overrides) + "\n")
            install += ["--override", str(pinned)]
    else:
        extras = ""
        if (source := _framework_source(spec.spec_file)) is not None:
            install.append("--no-sources")  # its [tool.uv.sources] would install the other framework beside ours
            if spec.framework_dir is None and _written_for_nemo_gym(source, spec.impl_dir):
                extras = COMPAT_EXTRA
        framework = framework_requirement(extras, spec.framework_dir)
        install += [*framework.split(" ", 1), "-e", str(spec.impl_dir)]
        if extras:
            # Its own dependencies may still name nemo-gym[dev], whose openai floor (our suite's) would clash with
            # NeMo Gym's pin: the pin wins, as it does in NeMo Gym.
            pin = spec.path / "nemo_gym_overrides.txt"
            pin.write_text("\n".join(spec.overrides or (NEMO_GYM_OPENAI_PIN,)) + "\n")
            install += ["--override", str(pin)]
    _run(ctx, install, spec.impl_dir)


def _framework_source(pyproject: Path) -> str | None:
    """Where a server's pyproject points ``nemo-gym`` in ``[tool.uv.sources]`` (its ``path``, or ``""`` for another
    kind of source); None when it names no source for it."""
    text = pyproject.read_text(encoding="utf-8")
    sources = text.split("[tool.uv.sources]", 1)[1].split("\n[", 1)[0] if "[tool.uv.sources]" in text else ""
    line = re.search(r"(?m)^\s*nemo[-_.]?gym\s*=(?P<source>.*)$", sources)
    if line is None:
        return None
    path = re.search(r'\bpath\s*=\s*"(?P<path>[^"]+)"', line["source"])
    return path["path"] if path else ""


def _run(ctx: BuildContext, args: list[str], cwd: Path) -> None:
    if ctx.cancel.is_set():
        raise BuildCancelled()
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "CONDA_PREFIX", "PYTHONPATH")}
    env["UV_NO_PROGRESS"] = "1"
    if ctx.uv_cache_dir:
        env["UV_CACHE_DIR"] = ctx.uv_cache_dir
    ctx.note("$ " + " ".join(args))
    proc = spawn(args, cwd=cwd, env=env)
    with ctx._lock:
        ctx._procs.add(proc)
    try:
        assert proc.stdout is not None
        for line in iter(proc.stdout.readline, b""):
            ctx.log(line)
        code = proc.wait()
    finally:
        with ctx._lock:
            ctx._procs.discard(proc)
        if proc.poll() is None:
            kill_group(proc, signal.SIGKILL)
            proc.wait()
    if ctx.cancel.is_set():
        raise BuildCancelled()
    if code != 0:
        command = "uv " + " ".join(args[1:3] if args[1] == "pip" else args[1:2])
        raise VenvBuildError(f"`{command}` exited with code {code}")


@contextlib.contextmanager
def _file_lock(path: Path, ctx: BuildContext) -> Iterator[None]:
    """An exclusive lock shared with other launches; waits politely and gives up when the launch is cancelled."""
    with open(path, "a+b") as f:
        announced = False
        while True:
            try:
                fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not announced:
                    ctx.note(f"another launch is building this venv; waiting for it ({path})")
                    announced = True
                if ctx.cancel.wait(0.5):
                    raise BuildCancelled() from None
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)
