"""Data preparation: validate the agents' datasets, record their statistics, and collate them for training.

Driven by the same config as ``gym env start``: every agent instance may declare ``datasets:``; the mode picks which
types are in scope (``example_validation``: ``example``; ``train_preparation``: ``train``, ``validation`` and
``benchmark``). The steps, in order:

1. **Plan and locate.** Every in-scope dataset file is looked up (relative paths against the search roots). All
   missing files (and train/validation datasets without a ``license``) are reported together before any work starts.
   With ``should_download`` a missing file whose dataset declares a ``source:`` is downloaded first.
2. **One streaming pass per dataset.** Each line is checked (a JSON object with valid ``responses_create_params``;
   benchmark rows are first rendered with the dataset's ``prompt_config``). Every offending line is reported as
   ``file:line: reason`` and is *not* written to the output. Valid rows are folded into the dataset's statistics and
   written ``num_repeats`` times in a row (``aabb``), each carrying ``agent_ref`` naming its agent (the config is
   authoritative: a row's own ``agent_ref`` is replaced).
3. **Metrics files.** ``<stem>_metrics.json`` beside each dataset, and ``<type>_metrics.json`` beside each collated
   ``<output_dir>/<type>.jsonl``, reconciled with what is on disk (see :mod:`nemo_gym.datasets.metrics_file`).

Unlike the original tool, no ``<stem>_prepare.jsonl`` copies are written beside the datasets: rows go straight into
the collated files, so dataset directories only ever gain metrics files.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Literal

import orjson
from omegaconf import DictConfig, OmegaConf
from pydantic import ConfigDict, Field

from nemo_gym.config.command_config import BaseNeMoGymCLIConfig
from nemo_gym.config.datasets import AGENT_REF_KEY, BenchmarkDatasetConfig, DatasetConfig
from nemo_gym.config.roots import find_path
from nemo_gym.config.servers import find_server_instances
from nemo_gym.config.tree import plain_dict
from nemo_gym.datasets.metrics_file import MetricsFileResult, metrics_path_for, reconcile_metrics_file
from nemo_gym.datasets.render import PromptRenderError, PromptTemplate
from nemo_gym.datasets.statistics import DatasetStatistics
from nemo_gym.datasets.validation import iter_checked_lines, row_problem
from nemo_gym.errors import ConfigError

CollateMode = Literal["train_preparation", "example_validation"]
MODE_TYPES: dict[str, tuple[str, ...]] = {
    "train_preparation": ("train", "validation", "benchmark"),
    "example_validation": ("example",),
}
"""Dataset types each mode collates, in output order."""
LICENSED_TYPES = ("train", "validation")
"""Dataset types that must declare a license before they are prepared for training."""

AnyDatasetConfig = DatasetConfig | BenchmarkDatasetConfig


class CollateConfig(BaseNeMoGymCLIConfig):
    """Validate the agents' datasets, save their statistics, and collate them into one JSONL file per dataset type.

    Examples:

        gym dataset collate --resources-server example_multi_step --mode example_validation --output-dir data/ms

        gym dataset collate --config env_a.yaml --config env_b.yaml --mode train_preparation --output-dir data/mix \
--download
    """

    model_config = ConfigDict(extra="ignore")

    output_dirpath: str = Field(description="Directory for the collated <type>.jsonl files (--output-dir).")
    mode: CollateMode = Field(description="train_preparation (train, validation, benchmark) or example_validation.")
    should_download: bool = Field(
        default=False, description="Download missing datasets from their source (--download)."
    )
    data_source: Literal["gitlab", "huggingface"] = Field(
        default="huggingface", description="Which legacy identifier to download from when a dataset has both."
    )
    overwrite_metrics_conflicts: bool = Field(
        default=False, description="Replace metrics files that disagree with the data (--overwrite-metrics)."
    )


@dataclass
class DatasetJob:
    """One declared dataset of one agent, and where its file (and prompt config) turned out to be."""

    agent: str
    dataset: AnyDatasetConfig
    path: Path | None = None
    template: PromptTemplate | None = None

    @property
    def label(self) -> str:
        return f"{self.agent}/{self.dataset.name} ({self.dataset.type})"

    def description(self) -> dict[str, Any]:
        """The dataset's declaration as it heads its metrics file (legacy identifier mirrors left out)."""
        return self.dataset.model_dump(
            mode="json", exclude_none=True, exclude={"gitlab_identifier", "huggingface_identifier"}
        )


@dataclass
class DatasetReport:
    job: DatasetJob
    statistics: DatasetStatistics
    rows_written: int
    problems: list[str]
    metrics_file: MetricsFileResult | None
    """None when another declaration of the same file already wrote its metrics in this run."""


@dataclass
class CollateResult:
    mode: str
    output_dir: Path
    datasets: list[DatasetReport] = field(default_factory=list)
    outputs: dict[str, Path] = field(default_factory=dict)
    rows_per_type: dict[str, int] = field(default_factory=dict)
    aggregates: dict[str, MetricsFileResult] = field(default_factory=dict)
    agents_without_datasets: list[str] = field(default_factory=list)
    downloaded: list[str] = field(default_factory=list)

    @property
    def problems(self) -> list[str]:
        """Every offending row, as ``file:line: reason``."""
        return [problem for report in self.datasets for problem in report.problems]

    @property
    def conflicts(self) -> list[MetricsFileResult]:
        files = [r.metrics_file for r in self.datasets if r.metrics_file is not None] + list(self.aggregates.values())
        return [f for f in files if f.status == "conflict"]


def plan_datasets(config: DictConfig | Mapping[str, Any], mode: str) -> tuple[list[DatasetJob], list[str]]:
    """The in-scope datasets of every agent, in config order, and the agents that declare no datasets at all."""
    wanted = MODE_TYPES[mode]
    instances, _ = find_server_instances(plain_dict(config))
    jobs: list[DatasetJob] = []
    without: list[str] = []
    for instance in instances:
        if instance.SERVER_TYPE != "responses_api_agents":
            continue
        if not instance.datasets:
            without.append(instance.name)
            continue
        jobs.extend(DatasetJob(instance.name, d) for d in instance.datasets if d.type in wanted)
    return jobs, without


def _missing_reason(job: DatasetJob, download: bool) -> str:
    dataset = job.dataset
    where = f"{job.label}: {dataset.jsonl_fpath} not found"
    if isinstance(dataset, BenchmarkDatasetConfig):
        return f"{where}; prepare it first with `gym eval prepare` for this benchmark"
    if dataset.source is None:
        return f"{where}, and the dataset declares no `source:` to download it from"
    if not download:
        return f"{where}; pass --download (+should_download=true) to fetch it from its {dataset.source.type} source"
    return where


def locate_datasets(
    jobs: list[DatasetJob], mode: str, download: bool, global_config: DictConfig | Mapping[str, Any]
) -> list[str]:
    """Resolve every dataset file, reporting all problems at once before downloading; returns downloaded labels."""
    problems: list[str] = []
    to_download: list[DatasetJob] = []
    for job in jobs:
        dataset = job.dataset
        if mode == "train_preparation" and dataset.type in LICENSED_TYPES and getattr(dataset, "license", None) is None:
            problems.append(f"{job.label}: declares no `license:` (required for train and validation datasets)")
        found = find_path(dataset.jsonl_fpath)
        if found is not None and found.is_file():
            job.path = found
        elif download and isinstance(dataset, DatasetConfig) and dataset.source is not None:
            to_download.append(job)
        else:
            problems.append(_missing_reason(job, download))
        if isinstance(dataset, BenchmarkDatasetConfig) and dataset.prompt_config is not None:
            try:
                job.template = PromptTemplate.load(dataset.prompt_config)
            except ConfigError as e:
                problems.append(f"{job.label}: {e}")
    if problems:
        raise ConfigError(
            f"{len(problems)} problem(s) with the declared datasets; nothing was processed:\n  " + "\n  ".join(problems)
        )
    for job in to_download:
        job.path = download_dataset(job, global_config)
    return [job.label for job in to_download]


def download_dataset(job: DatasetJob, global_config: DictConfig | Mapping[str, Any]) -> Path:
    """Fetch a dataset from its ``source:`` through the dataset registry; the file must exist afterwards."""
    try:
        from nemo_gym.datasets.storage import download_dataset_source
    except ImportError as e:
        raise ConfigError(
            f"{job.label}: --download needs dataset download support (nemo_gym.datasets.storage), "
            f"which cannot be imported: {e}"
        ) from e
    dataset = job.dataset
    if not isinstance(dataset, DatasetConfig):
        raise ConfigError(f"{job.label}: a benchmark dataset is prepared (gym eval prepare), not downloaded")
    returned = download_dataset_source(dataset, global_config)
    path = Path(returned) if returned is not None else find_path(dataset.jsonl_fpath)
    if path is None or not path.is_file():
        raise ConfigError(f"{job.label}: the download finished but {dataset.jsonl_fpath} still does not exist")
    return path.resolve()


def _check_outputs(jobs: list[DatasetJob], output_dir: Path, types: tuple[str, ...]) -> None:
    outputs = {(output_dir / f"{t}.jsonl").resolve() for t in types}
    for job in jobs:
        if job.path is not None and job.path.resolve() in outputs:
            raise ConfigError(f"{job.label}: the output directory would overwrite its dataset {job.path}")


def process_dataset(job: DatasetJob, output: BinaryIO) -> tuple[DatasetStatistics, int, list[str]]:
    """Stream one dataset: check each line, fold valid rows into statistics, write them with repeats and agent_ref."""
    assert job.path is not None, "locate_datasets resolves every path first"
    statistics = DatasetStatistics()
    problems: list[str] = []
    repeats = job.dataset.num_repeats
    agent_ref = {"type": "responses_api_agents", "name": job.agent}
    written = 0
    for line in iter_checked_lines(job.path):
        row, problem = line.row, line.problem
        if row is not None and job.template is not None:
            try:
                row = job.template.apply(row)
            except PromptRenderError as e:
                row, problem = None, str(e)
        if row is not None:
            problem = row_problem(row)
        if problem is not None or row is None:
            statistics.invalid += 1
            problems.append(f"{job.path}:{line.number}: {problem}")
            continue
        statistics.add(row, repeats)
        line_bytes = orjson.dumps({**row, AGENT_REF_KEY: agent_ref}, option=orjson.OPT_APPEND_NEWLINE)
        output.write(line_bytes * repeats)
        written += repeats
    return statistics, written, problems


def collate(settings: CollateConfig, global_config: DictConfig | Mapping[str, Any]) -> CollateResult:
    """Run data preparation end to end (see the module docstring); raises ConfigError before any work on bad input."""
    jobs, without = plan_datasets(global_config, settings.mode)
    types = MODE_TYPES[settings.mode]
    if not jobs:
        agents = ", ".join(without) or "none"
        raise ConfigError(
            f"no agent in the config declares a dataset of type {' / '.join(types)} (mode {settings.mode}); "
            f"agents without datasets: {agents}"
        )
    download_config = _with_setting(global_config, "data_source", settings.data_source)
    downloaded = locate_datasets(jobs, settings.mode, settings.should_download, download_config)
    output_dir = Path(settings.output_dirpath).expanduser().resolve()
    _check_outputs(jobs, output_dir, types)
    output_dir.mkdir(parents=True, exist_ok=True)
    result = CollateResult(settings.mode, output_dir, agents_without_datasets=without, downloaded=downloaded)
    present = [t for t in types if any(job.dataset.type == t for job in jobs)]
    temporaries = {t: output_dir / f".{t}.jsonl.tmp" for t in present}
    writers = {t: temporaries[t].open("wb") for t in present}
    finished = False
    try:
        seen_metrics: set[Path] = set()
        for job in jobs:
            statistics, written, problems = process_dataset(job, writers[job.dataset.type])
            assert job.path is not None, "locate_datasets found every file or raised"
            metrics_path = metrics_path_for(job.path)
            metrics_file = None
            if metrics_path not in seen_metrics:
                seen_metrics.add(metrics_path)
                metrics = statistics.to_metrics(header=job.description())
                metrics_file = reconcile_metrics_file(metrics_path, metrics, settings.overwrite_metrics_conflicts)
            result.datasets.append(DatasetReport(job, statistics, written, problems, metrics_file))
        finished = True
    finally:
        for writer in writers.values():
            writer.close()
        if not finished:
            for temporary in temporaries.values():
                temporary.unlink(missing_ok=True)
    for dataset_type in present:
        output = output_dir / f"{dataset_type}.jsonl"
        temporaries[dataset_type].replace(output)
        reports = [r for r in result.datasets if r.job.dataset.type == dataset_type]
        merged = DatasetStatistics()
        for report in reports:
            merged.merge(report.statistics)
        metrics = merged.to_metrics(header={"datasets": [_aggregate_entry(r.job) for r in reports]})
        result.outputs[dataset_type] = output
        result.rows_per_type[dataset_type] = sum(r.rows_written for r in reports)
        result.aggregates[dataset_type] = reconcile_metrics_file(
            metrics_path_for(output), metrics, settings.overwrite_metrics_conflicts
        )
    return result


def _with_setting(config: DictConfig | Mapping[str, Any], key: str, value: Any) -> DictConfig:
    """A copy of the config with a defaulted setting filled in, so the downloader sees the effective value."""
    copy = OmegaConf.create(plain_dict(config))
    copy[key] = value
    return copy


def _aggregate_entry(job: DatasetJob) -> dict[str, Any]:
    return {
        "agent_name": job.agent,
        "name": job.dataset.name,
        "jsonl_fpath": str(job.dataset.jsonl_fpath),
        "num_repeats": job.dataset.num_repeats,
    }
