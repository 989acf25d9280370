"""The venvs a config's servers will run in, known before anything starts: ``gym env packages`` and ``gym env prefetch``.

A launch builds one venv per implementation (:mod:`nemo_gym.launcher.venvs`); this module computes the same
:class:`VenvSpec` for each implementation of a composed config, so what ``prefetch`` builds is exactly what the next
launch finds in its cache (same key, same path) and reuses without touching a package index. Builds here run one at a
time, as NeMo Gym 0.5's ``prefetch`` does: a container build or a login node is usually short of disk for uv's cache,
and one build at a time keeps its peak small.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import time
import tomllib
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from nemo_gym.config.compose import ComposedConfig
from nemo_gym.config.tree import plain_dict
from nemo_gym.errors import ConfigError, LaunchError
from nemo_gym.launcher.preflight import find_implementation
from nemo_gym.launcher.venvs import BuildContext, VenvSpec, build_venv, find_uv, rewrite_requirements, venv_spec

LOG_TAIL_LINES = 20
"""Lines of uv's output quoted when a prefetch build fails."""

__all__ = [
    "PlannedVenv",
    "PrefetchOutcome",
    "declared_requirements",
    "installed_packages",
    "plan_implementation",
    "plan_venvs",
    "prefetch",
]


@dataclass(frozen=True)
class PlannedVenv:
    """One implementation's venv and the server instances of the config that run in it."""

    spec: VenvSpec
    instances: tuple[str, ...]

    @property
    def label(self) -> str:
        return self.spec.label


@dataclass(frozen=True)
class PrefetchOutcome:
    """What ``prefetch`` did for one venv: built it now, or found it already built."""

    venv: PlannedVenv
    action: Literal["built", "cached"]
    seconds: float


def _cache_and_python(config: dict[str, object]) -> tuple[Path, str]:
    """``cache_dir`` and ``python_version`` as a launch reads them, so the venv paths are the launch's own."""
    cache_dir = Path(str(config.get("cache_dir") or "cache")).resolve()
    return cache_dir, str(config.get("python_version") or platform.python_version())


def plan_venvs(composed: ComposedConfig) -> list[PlannedVenv]:
    """The distinct venvs the servers of ``composed`` run in, in the order the config names them.

    Raises ConfigError naming the instance when an implementation is missing or has no dependency file.
    """
    config = plain_dict(composed.config)
    cache_dir, python_version = _cache_and_python(config)
    by_path: dict[Path, tuple[VenvSpec, list[str]]] = {}
    for instance in composed.instances:
        inner = config[instance.name][instance.SERVER_TYPE][instance.implementation]
        located = (composed.sources,) if composed.sources is not None else ()
        directory = find_implementation(instance, inner, *located).directory
        try:
            spec = venv_spec(instance.SERVER_TYPE, instance.implementation, directory, cache_dir, python_version)
        except ConfigError as e:
            raise ConfigError(f"server {instance.name!r}: {e}") from e
        by_path.setdefault(spec.path, (spec, []))[1].append(instance.name)
    return [PlannedVenv(spec, tuple(names)) for spec, names in by_path.values()]


def plan_implementation(composed: ComposedConfig, label: str) -> PlannedVenv:
    """The venv of one implementation folder, ``<server type>/<implementation>`` (NeMo Gym's ``+entrypoint=``), found
    in the search roots as a launch finds it, whether or not a config names it."""
    from nemo_gym.roots import candidate_paths

    server_type, _, implementation = label.partition("/")
    directory = next((c.resolve() for c in candidate_paths(label) if c.is_dir()), None)
    if not implementation or "/" in implementation or directory is None:
        raise ConfigError(f"entrypoint {label!r}: no <server type>/<implementation> folder of that name is found")
    cache_dir, python_version = _cache_and_python(plain_dict(composed.config))
    return PlannedVenv(venv_spec(server_type, implementation, directory, cache_dir, python_version), ())


def declared_requirements(spec: VenvSpec) -> list[str]:
    """What the venv is asked to install, one requirement a line, as the launch passes it to uv: the framework's own
    line first, paths made absolute (a requirements file), or the pyproject's ``[project] dependencies``."""
    if spec.kind == "requirements":
        text = rewrite_requirements(spec.spec_file.read_text(encoding="utf-8"), spec.impl_dir, spec.framework_dir)
        return [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    try:
        project = tomllib.loads(spec.spec_file.read_text(encoding="utf-8")).get("project") or {}
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{spec.spec_file}: not valid TOML ({e})") from e
    return [str(dependency) for dependency in project.get("dependencies") or []]


def installed_packages(python: Path, *, outdated: bool = False) -> list[dict[str, str]]:
    """``uv pip list`` of the environment ``python`` runs in, as ``{"name", "version"[, "latest_version"]}`` rows;
    ``outdated`` keeps only the packages with a newer release (that asks the package index)."""
    command = [find_uv(), "pip", "list", "--python", str(python), "--format", "json"]
    if outdated:
        command.append("--outdated")
    done = subprocess.run(command, capture_output=True, text=True, env=_uv_env(), check=False)
    if done.returncode != 0:
        detail = (done.stderr or done.stdout).strip().splitlines()
        raise LaunchError(
            f"`uv pip list --python {python}` exited with code {done.returncode}: {' '.join(detail[-3:])}"
        )
    rows = json.loads(done.stdout or "[]")
    return [{key: str(value) for key, value in row.items()} for row in rows]


def _uv_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "CONDA_PREFIX")} | {"UV_NO_PROGRESS": "1"}


def prefetch(
    venvs: Sequence[PlannedVenv],
    *,
    report: Callable[[str], None],
    uv_cache_dir: str | None = None,
    verbose: bool = False,
    echo: Callable[[bytes], object] | None = None,
) -> list[PrefetchOutcome]:
    """Build every venv in ``venvs`` that is not built yet, one after another, telling ``report`` one line as each
    starts and ends. ``echo`` receives uv's output as it comes (``-v``); otherwise its last lines are quoted in the
    :class:`~nemo_gym.launcher.venvs.VenvBuildError` raised for the first build that fails."""
    outcomes: list[PrefetchOutcome] = []
    total = len(venvs)
    for number, venv in enumerate(venvs, 1):
        step = f"[{number}/{total}] {venv.label}"
        if venv.spec.is_ready:
            report(f"{step}: already built ({venv.spec.path})")
            outcomes.append(PrefetchOutcome(venv, "cached", 0.0))
            continue
        serving = f" for {', '.join(venv.instances)}" if venv.instances else ""
        report(f"{step}: building its venv{serving} ...")
        tail: deque[str] = deque(maxlen=LOG_TAIL_LINES)

        def log(line: bytes, tail: deque[str] = tail) -> None:
            tail.append(line.decode(errors="replace").rstrip("\n"))
            if echo is not None:
                echo(line)

        started = time.monotonic()
        try:
            build_venv(venv.spec, BuildContext(log=log, uv_cache_dir=uv_cache_dir, verbose=verbose))
        except LaunchError as e:
            quoted = "\n".join(f"  | {line}" for line in tail)
            raise type(e)(f"{step}: building its venv failed: {e}. Last lines of uv's output:\n{quoted}") from e
        seconds = time.monotonic() - started
        report(f"{step}: built in {seconds:.1f} s ({venv.spec.path})")
        outcomes.append(PrefetchOutcome(venv, "built", seconds))
    return outcomes
