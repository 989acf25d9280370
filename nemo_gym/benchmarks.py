"""Evaluation benchmarks: preparing their data (``gym eval prepare --benchmark NAME``).

A benchmark is an agent instance with exactly one ``type: benchmark`` dataset. Its data is not checked in: the
dataset's ``prepare_script`` (a Python file with ``prepare(**kwargs) -> path``) builds it, and must write it exactly
where the dataset's ``jsonl_fpath`` says, so later commands find it. Every script is checked (it exists, it defines a
callable ``prepare``) before any of them runs, so one bad benchmark in a long list fails in seconds, not after an
hour of preparing the others.

Scripts are loaded from their file rather than by module name, so a benchmark under a ``--search-dir`` root works
without being importable from ``sys.path``.
"""

from __future__ import annotations

import importlib.util
import multiprocessing
import sys
from collections.abc import Callable, Mapping
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from omegaconf import DictConfig
from pydantic import ConfigDict, Field

from nemo_gym.config.command_config import BaseNeMoGymCLIConfig
from nemo_gym.config.datasets import BenchmarkDatasetConfig
from nemo_gym.config.roots import candidate_paths, search_roots
from nemo_gym.config.servers import find_server_instances
from nemo_gym.config.tree import plain_dict
from nemo_gym.errors import ConfigError


class PrepareBenchmarksConfig(BaseNeMoGymCLIConfig):
    """Generate or download the data of every benchmark in the config by running its ``prepare_script``.

    Examples:

        gym eval prepare --benchmark arithmetic
        gym eval prepare --benchmark arithmetic +prepare_script_args={num_problems: 50}
    """

    model_config = ConfigDict(extra="ignore")

    use_cached_prepared_benchmarks: bool = Field(
        default=False, description="Skip benchmarks whose jsonl_fpath already exists."
    )
    num_prepare_benchmark_processes: int = Field(
        default=1, ge=1, description="Run this many prepare scripts at once (separate processes)."
    )
    prepare_script_args: dict[str, Any] = Field(
        default_factory=dict, description="Keyword arguments passed to every prepare(...), e.g. {num_problems: 50}."
    )


@dataclass
class BenchmarkJob:
    agent: str
    dataset: BenchmarkDatasetConfig
    script: Path | None = None
    """The located prepare script (None until :func:`check_jobs` found it)."""
    expected_path: Path | None = None
    """Where the script must write the data: ``jsonl_fpath`` resolved against the root the script came from."""
    module: ModuleType | None = None

    @property
    def label(self) -> str:
        return f"benchmark {self.dataset.name!r} (agent {self.agent})"


@dataclass
class PreparedBenchmark:
    job: BenchmarkJob
    path: Path
    cached: bool


def benchmark_jobs(config: DictConfig | Mapping[str, Any]) -> list[BenchmarkJob]:
    """One job per agent instance that declares exactly one ``type: benchmark`` dataset."""
    instances, _ = find_server_instances(plain_dict(config))
    jobs = []
    for instance in instances:
        if instance.SERVER_TYPE != "responses_api_agents":
            continue
        benchmarks = [d for d in instance.datasets or [] if isinstance(d, BenchmarkDatasetConfig)]
        if len(benchmarks) == 1:
            jobs.append(BenchmarkJob(instance.name, benchmarks[0]))
    if not jobs:
        raise ConfigError(
            "no agent in the config declares exactly one `type: benchmark` dataset; pick one with --benchmark NAME "
            "(see `gym list benchmarks`)"
        )
    return jobs


def _locate(job: BenchmarkJob) -> tuple[Path | None, Path]:
    """The prepare script (first existing candidate) and the data path in the same root."""
    script = job.dataset.prepare_script
    data = job.dataset.jsonl_fpath
    if script.is_absolute() or data.is_absolute():
        found = next((p for p in candidate_paths(script) if p.is_file()), None)
        return found, data if data.is_absolute() else candidate_paths(data)[0]
    for root in search_roots():
        if (root / script).is_file():
            return (root / script).resolve(), (root / data).resolve()
    return None, candidate_paths(data)[0]


SCRIPT_MODULE_PREFIX = "_gym_prepare_scripts"


def load_script(path: Path) -> ModuleType:
    """Import a prepare script from its file, as ``_gym_prepare_scripts.<dir>.<dir>.<stem>`` (the prefix keeps a
    script from replacing a real module of the same dotted name)."""
    name = ".".join((SCRIPT_MODULE_PREFIX, *path.with_suffix("").parts[-3:]))
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ConfigError(f"prepare script {path} cannot be loaded as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickling look their module up by name
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        sys.modules.pop(name, None)
        raise ConfigError(f"prepare script {path} failed to import: {type(e).__name__}: {e}") from e
    return module


def check_jobs(jobs: list[BenchmarkJob]) -> None:
    """Locate and import every prepare script; all problems are reported together, before anything runs."""
    problems = []
    for job in jobs:
        job.script, job.expected_path = _locate(job)
        if job.script is None:
            tried = ", ".join(str(p) for p in candidate_paths(job.dataset.prepare_script))
            problems.append(f"{job.label}: prepare_script {job.dataset.prepare_script} not found (tried {tried})")
            continue
        try:
            module = load_script(job.script)
        except ConfigError as e:
            problems.append(f"{job.label}: {e}")
            continue
        job.module = module
        if not callable(getattr(module, "prepare", None)):
            problems.append(f"{job.label}: prepare_script {job.script} defines no prepare(**kwargs) function")
    if problems:
        raise ConfigError("; ".join(problems))


def run_prepare_script(script: str, kwargs: dict[str, Any]) -> str:
    """Load a prepare script and call its ``prepare``; module-level so a worker process can run it."""
    prepare: Callable[..., Any] = load_script(Path(script)).prepare
    return str(prepare(**kwargs))


def prepare_benchmarks(
    config: DictConfig | Mapping[str, Any], settings: PrepareBenchmarksConfig
) -> list[PreparedBenchmark]:
    """Run the prepare script of every benchmark in the config (see the module docstring)."""
    jobs = benchmark_jobs(config)
    check_jobs(jobs)
    results: list[PreparedBenchmark] = []
    pending = []
    for job in jobs:
        assert job.expected_path is not None
        if settings.use_cached_prepared_benchmarks and job.expected_path.is_file():
            results.append(PreparedBenchmark(job, job.expected_path, cached=True))
        else:
            pending.append(job)
    kwargs = dict(settings.prepare_script_args)
    if settings.num_prepare_benchmark_processes > 1 and len(pending) > 1:
        context = multiprocessing.get_context("spawn")  # no fork of a process that may hold threads and sockets
        workers = min(settings.num_prepare_benchmark_processes, len(pending))
        with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
            futures = [pool.submit(run_prepare_script, str(job.script), kwargs) for job in pending]
            returned = [future.result() for future in futures]
    else:
        returned = [str(job.module.prepare(**kwargs)) for job in pending if job.module is not None]
    for job, path in zip(pending, returned, strict=True):
        assert job.expected_path is not None
        actual = Path(path).expanduser().resolve()
        if actual != job.expected_path.resolve():
            raise ConfigError(
                f"{job.label}: prepare() returned {actual}, but the dataset's jsonl_fpath is {job.expected_path}; "
                "a prepare script must write its data exactly where jsonl_fpath points"
            )
        results.append(PreparedBenchmark(job, actual, cached=False))
    return results
