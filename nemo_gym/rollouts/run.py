"""One collection run end to end: inputs → materialized rows → rollouts → metrics → summary."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig

from nemo_gym.config.compose import ComposedConfig
from nemo_gym.config.placement import RAY_ADDRESS_KEY
from nemo_gym.observability.capture import capture_dirs_from_config
from nemo_gym.rollouts.aggregate import (
    EncodedRows,
    agent_name_of,
    aggregate_metrics_path,
    compute_metrics,
    encoded_rows_by_agent,
    strip_row,
    write_metrics,
)
from nemo_gym.rollouts.breaker import Server
from nemo_gym.rollouts.claim import claim_output
from nemo_gym.rollouts.collector import CollectionOptions, CollectionSummary, RolloutCollector
from nemo_gym.rollouts.config import RolloutCollectionConfig
from nemo_gym.rollouts.counted_failures import counted_as_zero
from nemo_gym.rollouts.inputs import SplitInput as SplitInput  # re-exported: where callers have found them
from nemo_gym.rollouts.inputs import agent_names as agent_names
from nemo_gym.rollouts.inputs import prepare_inputs as prepare_inputs
from nemo_gym.rollouts.inputs import prepare_split_input as prepare_split_input
from nemo_gym.rollouts.materialize import Materialized
from nemo_gym.rollouts.routing import Routes, routes_for
from nemo_gym.transport import heap, http_client

if TYPE_CHECKING:
    from nemo_gym.health.run import HealthCheckResult


@dataclass
class RunResult:
    summary: CollectionSummary
    materialized: Materialized
    metrics: list[dict[str, Any]] | None
    metrics_path: Path | None
    counted_failures: int = 0
    """Failed rollouts counted as reward 0 in the metrics (``count_failure_classes_as_zero``)."""
    health: HealthCheckResult | None = None
    """The rollout health checks over the run's rollouts (``health/report.py``), unless turned off."""


def agent_urls(config: ComposedConfig | DictConfig) -> dict[str, str]:
    """Base URL of every agent instance in a config whose ports are assigned."""
    return {server.name: server.url for server in run_servers(config) if server.kind == "responses_api_agents"}


def run_routes(settings: RolloutCollectionConfig, config: ComposedConfig) -> Routes:
    """Which environment server each agent's rows go through (``rollouts/routing.py``)."""
    urls = {server.name: server.url for server in run_servers(config) if server.kind == "environment_servers"}
    return routes_for(
        config.config,
        urls,
        settings.environment_routing_mode,
        settings.environment_server_name,
        settings.environment_server_routes,
    )


def run_servers(config: ComposedConfig | DictConfig, placed: list[dict[str, Any]] | None = None) -> list[Server]:
    """Every server instance of a config with its base URL: what the collector's breakers name and probe.

    ``placed``: the launcher's ``server_instances()`` (what the head server lists), which name each replica of a
    replicated instance and its node (a launch on a Ray cluster); without it, one server per instance of the config.
    """
    if placed:
        return [
            Server(p["name"], p["server_type"], p["url"], group=p["instance"] if p["instance"] != p["name"] else "",
                   node=str(p.get("node") or ""))
            for p in placed
        ]  # fmt: skip
    servers = []
    for instance in ComposedConfig.of(config).instances:
        inner = instance.get_inner_run_server_config()
        servers.append(Server(instance.name, instance.SERVER_TYPE, f"http://{inner.host}:{inner.port}"))
    return servers


def placed_servers(config: ComposedConfig) -> list[dict[str, Any]]:
    """The servers of a launch on a Ray cluster as its head server lists them: each replica, with its node."""
    from nemo_gym.launcher.status import query_status

    head = config.config.get("head_server") or {}
    host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(str(head.get("host")), str(head.get("host") or "127.0.0.1"))
    return query_status(host, int(head.get("port") or 11000))


def run_collection(
    settings: RolloutCollectionConfig,
    config: ComposedConfig | DictConfig,
    show_progress: bool = True,
    materialized: Materialized | None = None,
    placed: list[dict[str, Any]] | None = None,
) -> RunResult:
    """Collect every rollout against running servers, holding the output's claim (:func:`claim_output`) throughout.

    ``materialized``: the caller's :func:`prepare_inputs`, done inside the caller's own :func:`claim_output` (which
    then spans this call too). ``placed``: the servers as the launcher started them (:func:`run_servers`); on a
    Ray cluster, asked of the head server when not given (:func:`placed_servers`), so ``--no-serve`` sees the replicas.
    """
    if materialized is None:
        with claim_output(settings):
            return run_collection(settings, config, show_progress, prepare_inputs(settings, config), placed)
    composed = ComposedConfig.of(config)
    options = collection_options(settings, composed, show_progress, placed)
    with asyncio.Runner(loop_factory=collector_loop_factory()) as runner:
        result = runner.run(_collect_and_aggregate(materialized, agent_urls(composed), options, settings))
    if not settings.disable_aggregation and not settings.disable_health_check:
        from nemo_gym.health.report import check_after_run

        output = options.output_path
        result.health = check_after_run(output, settings.health_check_workers, settings.health_check_ignored_checks)
    return result


def collection_options(
    settings: RolloutCollectionConfig,
    composed: ComposedConfig,
    show_progress: bool = True,
    placed: list[dict[str, Any]] | None = None,
) -> CollectionOptions:
    """The collector's options for ``settings`` against the servers of ``composed`` (see :func:`run_collection`)."""
    if placed is None and composed.config.get(RAY_ADDRESS_KEY):
        placed = placed_servers(composed)
    return CollectionOptions(
        servers=run_servers(composed, placed),
        server_down_deadline_s=settings.server_down_deadline_seconds,
        output_path=Path(settings.output_jsonl_fpath).expanduser().resolve(),
        concurrency=settings.num_samples_in_parallel,
        resume=settings.resume_from_cache,
        retry_terminal_timeouts=settings.retry_terminal_timeouts,
        retry_invalid_judge_responses=settings.retry_invalid_judge_responses,
        rollout_timeout_s=settings.rollout_timeout_seconds,
        show_progress=show_progress,
        capture_dirs=capture_dirs_from_config(composed.config),
        routes=run_routes(settings, composed),
    )


COLLECTOR_GC_GEN0_THRESHOLD = 20_000
"""Allocations between young garbage collections in the collect command (CPython's default is 700)."""


def tune_garbage_collector() -> None:
    """For a process whose work from here on is collecting (the ``gym eval run`` command), as the servers do
    (``transport/runtime.py``): what start-up made (imports, config) leaves every later collection, and young
    collections come less often. Measured: the collector's time in garbage collection -60% (~8% of its CPU before).
    Not for a caller's own process (a test, a trainer): frozen objects are never collected."""
    gc.freeze()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(COLLECTOR_GC_GEN0_THRESHOLD, gen1, gen2)


def collector_loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop where it is installed, as the servers run (``transport/runtime.py``), else asyncio's own loop: the
    collector spends much of its CPU in the event loop."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


async def _collect_and_aggregate(
    materialized: Materialized, urls: dict[str, str], options: CollectionOptions, settings: RolloutCollectionConfig
) -> RunResult:
    try:
        summary = await RolloutCollector(materialized, urls, options).run()
        metrics = metrics_path = None
        counted: list[dict[str, Any]] = []
        if not settings.disable_aggregation:
            output = options.output_path
            grouped = encoded_rows_by_agent([output]) if output.exists() else {}
            if settings.count_failure_classes_as_zero:
                succeeded = {key for rows in grouped.values() for key in rows.keys()}
                counted = counted_as_zero([summary.failures_path], settings.count_failure_classes_as_zero, succeeded)
                add_rows(grouped, counted)
            # What the run freed (its waiting rows, its answers) handed back before the metrics' moment, the stack's
            # peak: ~2 MB of the collector's RSS at 4,096 in flight.
            heap.release_freed_memory()
            if grouped:
                metrics = await compute_metrics(grouped, urls)
                metrics_path = aggregate_metrics_path(output)
                write_metrics(metrics_path, metrics)
        return RunResult(summary, materialized, metrics, metrics_path, len(counted))
    finally:
        await http_client.close_session()


def add_rows(grouped: dict[str, EncodedRows], rows: list[dict[str, Any]]) -> None:
    """Add rows (failures counted as zeros) to each agent's metric rows, keeping (task, rollout) order."""
    for row in rows:
        grouped.setdefault(agent_name_of(row), EncodedRows()).append(strip_row(row))
    for encoded in grouped.values():
        encoded.sort()
