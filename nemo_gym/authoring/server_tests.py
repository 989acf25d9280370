"""``gym env test``: each server's own tests, run inside that server's venv, and the data every environment ships.

A server is tested the way it runs: its venv is built (or reused) from its own requirements, and pytest runs there
with the server's root on ``PYTHONPATH`` so ``from resources_servers.<name>.app import …`` works. Exit codes of
pytest are classified: 0 passed, 1/2 failed, 5 no tests (a failure too: every server must have tests).
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from nemo_gym.config.roots import child_env, search_roots
from nemo_gym.errors import ConfigError
from nemo_gym.launcher.venvs import BuildContext, build_venv, venv_spec

SERVER_TYPES = ("resources_servers", "responses_api_agents", "responses_api_models", "environment_servers")
"""The folders a root holds server implementations in (``nemo_gym.checkout.SERVER_FOLDERS``, in the order tested)."""
EXAMPLE_ROWS = 5
PYTEST_OPTIONS = ("-o", "asyncio_mode=auto", "-o", "asyncio_default_fixture_loop_scope=function")
"""Server tests are written like the core's: async tests without markers."""
PYTEST_OUTCOMES = {0: "passed", 1: "failed", 2: "interrupted", 5: "no tests"}


@dataclass
class ServerTestResult:
    label: str
    outcome: str
    seconds: float
    summary: str = ""
    data_problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.outcome == "passed" and not self.data_problems


def find_server_dirs(only: str | None = None) -> list[Path]:
    """Implementation directories (with an app.py) across the search roots; an earlier root shadows a later one.

    ``only`` is ``<server_type>/<impl>`` (or a bare resources-server name).
    """
    found: dict[str, Path] = {}
    for root in search_roots():
        for server_type in SERVER_TYPES:
            for app in sorted((root / server_type).glob("*/app.py")):
                found.setdefault(f"{server_type}/{app.parent.name}", app.parent)
    if only is None:
        return [found[label] for label in sorted(found)]
    label = only if "/" in only else f"resources_servers/{only}"
    if label.rstrip("/") not in found:
        import difflib

        close = difflib.get_close_matches(label, list(found), n=3, cutoff=0.8)
        hint = f" Did you mean: {', '.join(close)}?" if close else ""
        raise ConfigError(f"no server {label!r} (a directory with app.py) in the search roots.{hint}")
    return [found[label.rstrip("/")]]


def validate_server_data(server_dir: Path) -> list[str]:
    """What a resources server must ship: 5 example rows, their metrics, 5 example rollouts, no conflict files."""
    data = server_dir / "data"
    problems = []
    example = data / "example.jsonl"
    if not example.is_file():
        problems.append("data/example.jsonl is missing")
    elif (count := _count_lines(example)) != EXAMPLE_ROWS:
        problems.append(f"data/example.jsonl has {count} rows, expected {EXAMPLE_ROWS}")
    metrics = data / "example_metrics.json"
    if not metrics.is_file():
        problems.append(
            "data/example_metrics.json is missing (make it with: gym dataset collate --mode example_validation "
            f"--resources-server {server_dir.name})"
        )
    else:
        examples = _number_of_examples(metrics)
        if examples != EXAMPLE_ROWS:
            problems.append(f"data/example_metrics.json reports {examples} examples, expected {EXAMPLE_ROWS}")
    rollouts = data / "example_rollouts.jsonl"
    if not rollouts.is_file():
        problems.append("data/example_rollouts.jsonl is missing (collect 5 rollouts with gym eval run)")
    elif (count := _count_lines(rollouts)) != EXAMPLE_ROWS:
        problems.append(f"data/example_rollouts.jsonl has {count} rows, expected {EXAMPLE_ROWS}")
    problems.extend(
        f"{p.relative_to(server_dir)}: a metrics conflict file is left over" for p in data.glob("*conflict*")
    )
    return problems


def _count_lines(path: Path) -> int:
    with path.open("rb") as f:
        return sum(1 for line in f if line.strip())


def _number_of_examples(path: Path) -> int | None:
    try:
        metrics = orjson.loads(path.read_bytes())
    except orjson.JSONDecodeError:
        return None
    if isinstance(metrics, dict):
        for key in ("Number of examples", "number_of_examples", "num_examples"):
            if key in metrics:
                return int(metrics[key])
    return None


def run_server_tests(
    server_dir: Path, cache_dir: Path, shared_venv: bool = False, pytest_args: list[str] | None = None, log=None
) -> ServerTestResult:
    """Run one server's tests in its venv (or this interpreter with ``shared_venv``)."""
    server_type, implementation = server_dir.parent.name, server_dir.name
    label = f"{server_type}/{implementation}"
    started = time.monotonic()
    write = log or (lambda line: sys.stdout.write(line))
    if not (server_dir / "tests").is_dir():
        return ServerTestResult(label, "no tests", 0.0, "no tests/ directory")
    if shared_venv:
        python = Path(sys.executable)
    else:
        spec = venv_spec(server_type, implementation, server_dir, cache_dir, platform.python_version())
        uv_output: list[str] = []

        def build_log(chunk: bytes) -> None:
            """Our own notes as they come; uv's package list only if the build fails, where it says why."""
            line = chunk.decode(errors="replace").rstrip("\n") + "\n"
            if line.startswith("[nemo-gym]"):
                write(line)
            else:
                uv_output.append(line)

        try:
            python = build_venv(spec, BuildContext(log=build_log))
        except Exception as e:  # a failed build is this server's failure, not the whole run's
            write("".join(uv_output))
            return ServerTestResult(label, "venv failed", time.monotonic() - started, str(e).splitlines()[0])
    env = child_env(dict(os.environ))  # the server's tests see the same --search-dir roots as this command
    root = server_dir.parent.parent
    env["PYTHONPATH"] = os.pathsep.join([str(root), str(server_dir), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    command = [
        str(python),
        "-m",
        "pytest",
        "tests",
        "-q",
        "-p",
        "no:cacheprovider",
        *PYTEST_OPTIONS,
        *(pytest_args or []),
    ]
    process = subprocess.run(command, cwd=server_dir, env=env, capture_output=True, text=True)
    write(process.stdout[-4000:] if process.returncode else "")
    write(process.stderr[-2000:] if process.returncode else "")
    lines = [line for line in process.stdout.strip().splitlines() if line.strip()]
    outcome = PYTEST_OUTCOMES.get(process.returncode, f"exit {process.returncode}")
    return ServerTestResult(label, outcome, time.monotonic() - started, lines[-1] if lines else "")
