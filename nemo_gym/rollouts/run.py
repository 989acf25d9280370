"""One collection run end to end: inputs → materialized rows → rollouts → metrics → summary."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from nemo_gym.config.servers import find_server_instances
from nemo_gym.config_types import AGENT_REF_KEY, ConfigError
from nemo_gym.rollouts.aggregate import aggregate_metrics_path, compute_metrics, rows_by_agent, write_metrics
from nemo_gym.rollouts.collector import CollectionOptions, CollectionSummary, RolloutCollector
from nemo_gym.rollouts.config import RolloutCollectionConfig
from nemo_gym.rollouts.jsonl import JsonlWriter, iter_jsonl
from nemo_gym.rollouts.materialize import Materialized, MaterializeOptions, materialize
from nemo_gym.servers import http_client


@dataclass
class RunResult:
    summary: CollectionSummary
    materialized: Materialized
    metrics: list[dict[str, Any]] | None
    metrics_path: Path | None


def agent_urls(config: DictConfig) -> dict[str, str]:
    """Base URL of every agent instance in a config whose ports are assigned."""
    instances, _ = find_server_instances(OmegaConf.to_container(config, resolve=True))
    urls = {}
    for instance in instances:
        if instance.SERVER_TYPE == "responses_api_agents":
            inner = instance.get_inner_run_server_config()
            urls[instance.name] = f"http://{inner.host}:{inner.port}"
    return urls


def prepare_split_input(config: DictConfig, split: str, path: Path) -> Path:
    """Concatenate the agents' datasets of type ``split`` into one file, each row tagged with its agent."""
    instances, _ = find_server_instances(OmegaConf.to_container(config, resolve=True))
    found = []
    with JsonlWriter(path, append=False) as writer:
        for instance in instances:
            for dataset in instance.datasets or []:
                if dataset.type != split:
                    continue
                source = Path(dataset.jsonl_fpath)
                if not source.is_absolute():
                    from nemo_gym.config.roots import find_path

                    source = find_path(source) or source
                found.append(str(source))
                for _, row in iter_jsonl(source):
                    row.setdefault(AGENT_REF_KEY, {"type": "responses_api_agents", "name": instance.name})
                    writer.write(row)
    if not found:
        raise ConfigError(f"no agent in the config declares a dataset of type {split!r}; pass --input PATH instead")
    return path


def run_collection(settings: RolloutCollectionConfig, config: DictConfig, show_progress: bool = True) -> RunResult:
    output = Path(settings.output_jsonl_fpath).expanduser().resolve()
    urls = agent_urls(config)
    if settings.input_jsonl_fpath:
        input_path = Path(settings.input_jsonl_fpath).expanduser()
    elif settings.split:
        input_path = prepare_split_input(
            config, settings.split, output.with_name(f"{output.stem}_{settings.split}.jsonl")
        )
    else:
        raise ConfigError("say what to run: --input PATH, or --split train|validation|example for the agents' datasets")
    materialized = materialize(
        MaterializeOptions(
            input_path=input_path,
            output_path=output,
            agent_name=settings.agent_name,
            limit=settings.limit,
            num_repeats=settings.num_repeats,
            responses_create_params=settings.responses_create_params,
            num_repeats_add_seed=settings.num_repeats_add_seed,
            known_agents=list(urls),
        )
    )
    options = CollectionOptions(
        output_path=output,
        concurrency=settings.num_samples_in_parallel,
        resume=settings.resume_from_cache,
        rollout_timeout_s=settings.rollout_timeout_seconds,
        show_progress=show_progress,
    )
    return asyncio.run(_collect_and_aggregate(materialized, urls, options, settings.disable_aggregation))


async def _collect_and_aggregate(
    materialized: Materialized, urls: dict[str, str], options: CollectionOptions, disable_aggregation: bool
) -> RunResult:
    try:
        summary = await RolloutCollector(materialized, urls, options).run()
        metrics = metrics_path = None
        if not disable_aggregation and options.output_path.exists():
            grouped = rows_by_agent([options.output_path])
            if grouped:
                metrics = await compute_metrics(grouped, urls)
                metrics_path = aggregate_metrics_path(options.output_path)
                write_metrics(metrics_path, metrics)
        return RunResult(summary, materialized, metrics, metrics_path)
    finally:
        await http_client.close_session()
