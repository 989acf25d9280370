"""The programmatic face of rollout collection, for RL frameworks that drive rollouts themselves.

``gym eval run`` is the command-line path (:mod:`nemo_gym.rollouts`). A trainer instead hands rows to
:class:`RolloutCollectionHelper` and consumes results as they finish, doing its own batching; the servers are found
through the head server (or the config this process already has). Each rollout goes through the collector's
:func:`~nemo_gym.rollouts.collector.run_rollout`, so a failure gets the same class here as in ``gym eval run``.

:meth:`RolloutCollectionHelper.run_from_config` is ``gym eval run``'s collection (materialized inputs, rollouts,
failures sidecar, aggregate metrics, resume) run in this process against servers that are already up. As in NeMo Gym,
its seams are methods a subclass overrides: ``setup_server_client`` (every ``/run`` goes through its ``post``) and
``_call_aggregate_metrics``; and it reads the config through this module's ``get_global_config_dict`` at call time, so
patching that name here changes what it reads.

The ``NG_*_KEY`` names are the result fields an agent sets to route a failure (``row_fields.py``):
``NG_FAILURE_CLASS_KEY`` makes it a failure, ``NG_TERMINAL_KEY`` stops resume from retrying it, ``NG_NO_PERSIST_KEY``
keeps it out of every file so resume runs it again.

For drivers that run their own collection loop (NeMo Gym 0.7's multi-stage GDPVal, say) it also offers the rules the
collector applies to rows: :func:`is_terminal_failure`, :func:`observed_elapsed`, :func:`get_max_rollout_attempts`,
:func:`migrate_invalid_judge_main_rows` (``rollouts/failure_rules.py``), :class:`DispatchLatencyTracker`
(``rollouts/latency.py``), ``_attach_ng_perf`` (``observability/perf.py``), and the environment-server routing helpers
of ``rollouts/routing.py``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Coroutine, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nemo_gym.config.datasets import AGENT_REF_KEY
from nemo_gym.config.roots import find_path as _find_path
from nemo_gym.config.server_models import BaseServerConfig
from nemo_gym.config.server_models import environment_servers_by_agent as _environment_servers_by_agent
from nemo_gym.errors import ConfigError
from nemo_gym.errors import NeMoGymError as _NeMoGymError
from nemo_gym.global_config import get_global_config_dict
from nemo_gym.jsonl import iter_jsonl as _iter_jsonl
from nemo_gym.observability.capture import capture_dirs_from_config as _capture_dirs_from_config
from nemo_gym.observability.perf import attach_ng_perf as _attach_ng_perf
from nemo_gym.observability.trajectory import TRAJECTORY_KEY as NG_TRAJECTORY_KEY
from nemo_gym.observability.trajectory import attach_trajectory_record as _attach_trajectory_record
from nemo_gym.observability.trajectory import build_trajectory_record as _build_trajectory_record
from nemo_gym.observability.trajectory import trajectory_identity as _trajectory_identity
from nemo_gym.rollouts import aggregate as _aggregate
from nemo_gym.rollouts.collector import CollectionOptions as _CollectionOptions
from nemo_gym.rollouts.collector import RolloutCollector as _RolloutCollector
from nemo_gym.rollouts.collector import RolloutFailure as _RolloutFailure
from nemo_gym.rollouts.collector import RunSender as _RunSender
from nemo_gym.rollouts.collector import default_max_attempts as _get_max_rollout_attempts
from nemo_gym.rollouts.collector import default_max_attempts as get_max_rollout_attempts
from nemo_gym.rollouts.collector import judge_rollout as _judge_rollout
from nemo_gym.rollouts.collector import recorded_fingerprint as _recorded_fingerprint
from nemo_gym.rollouts.config import DEFAULT_CONCURRENCY as _DEFAULT_CONCURRENCY
from nemo_gym.rollouts.config import AggregateRolloutsConfig as RolloutAggregationConfig
from nemo_gym.rollouts.config import RolloutCollectionConfig
from nemo_gym.rollouts.counted_failures import counted_as_zero as _counted_as_zero
from nemo_gym.rollouts.failure_rules import (
    SharedRolloutCollectionConfig,
    is_terminal_failure,
    migrate_invalid_judge_main_rows,
    observed_elapsed,
)
from nemo_gym.rollouts.fd_limit import check_open_file_limit as _check_open_file_limit
from nemo_gym.rollouts.latency import DispatchLatencyTracker
from nemo_gym.rollouts.materialize import MaterializeOptions as _MaterializeOptions
from nemo_gym.rollouts.materialize import materialize as _materialize
from nemo_gym.rollouts.materialize import rollout_key as _rollout_key
from nemo_gym.rollouts.routing import environment_server_for_agent as _environment_server_for_agent
from nemo_gym.rollouts.routing import episode_record as _episode_record
from nemo_gym.rollouts.run import run_servers as _run_servers
from nemo_gym.rollouts.shards import aggregate_shards as _aggregate_shards
from nemo_gym.row_fields import FAILURE_CLASS_KEY as NG_FAILURE_CLASS_KEY
from nemo_gym.row_fields import FAILURE_TERMINAL_KEY as NG_TERMINAL_KEY
from nemo_gym.row_fields import NO_PERSIST_KEY as NG_NO_PERSIST_KEY
from nemo_gym.server_utils import ServerClient
from nemo_gym.server_utils import setup_server_client as setup_server_client_utils
from nemo_gym.transport.http_client import TransportConfig as _TransportConfig

__all__ = [
    "AGENT_REF_KEY",
    "BaseServerConfig",
    "ConfigError",
    "DispatchLatencyTracker",
    "NG_FAILURE_CLASS_KEY",
    "NG_NO_PERSIST_KEY",
    "NG_TERMINAL_KEY",
    "NG_TRAJECTORY_KEY",
    "NoRolloutResultError",
    "RolloutAggregationConfig",
    "RolloutAggregationHelper",
    "RolloutCollectionConfig",
    "RolloutCollectionHelper",
    "ServerClient",
    "SharedRolloutCollectionConfig",
    "_CompletedRollout",
    "_attach_ng_perf",
    "_attach_trajectory_record",
    "_build_trajectory_record",
    "_environment_server_for_agent",
    "_environment_servers_by_agent",
    "_episode_record",
    "_get_max_rollout_attempts",
    "_trajectory_identity",
    "get_global_config_dict",
    "get_max_rollout_attempts",
    "is_terminal_failure",
    "migrate_invalid_judge_main_rows",
    "observed_elapsed",
    "setup_server_client_utils",
]


class NoRolloutResultError(_NeMoGymError, RuntimeError):
    """A collection dispatched rollouts and none produced a result (nor a failure counted as zero): there is no score.

    A ``RuntimeError`` too, as NeMo Gym 0.7 raises it. The failures file says why each failed."""


@dataclass(frozen=True)
class _CompletedRollout:
    """One finished ``/run``: the row sent, the agent's answer, and how long it took (kept beside the answer, not in
    it, until ``_attach_ng_perf`` records it). NeMo Gym 0.7's record for drivers that run their own dispatch loop."""

    row: dict[str, Any]
    result: dict[str, Any]
    rollout_latency_ms: float | None
    environment_server: str | None = None
    environment_server_type: str | None = None


class RolloutCollectionHelper:
    """Run rows through their agents' ``/run`` and yield ``(row, result)`` in completion order."""

    def __init__(self, server_client: ServerClient | None = None) -> None:
        self._client = server_client

    def setup_server_client(self, head_server_config: BaseServerConfig | None = None) -> ServerClient:
        """The client this helper's calls go through: the one it was given, else one for this process's servers.

        NeMo Gym's seams: a subclass returns its own client (an in-process app, a fake) to route every call there, or
        a test replaces this module's ``setup_server_client_utils`` (read at call time) to hand in a client."""
        if self._client is None:
            self._client = setup_server_client_utils(head_server_config)
        return self._client

    async def run_from_config(self, config: RolloutCollectionConfig) -> list[dict[str, Any]]:
        """Collect ``config.input_jsonl_fpath`` as ``gym eval run`` does, against servers already running.

        Writes the same files (``<stem>_materialized_inputs.jsonl``, the rollouts, ``<stem>_failures.jsonl``, then
        ``<stem>_aggregate_metrics.json`` unless ``disable_aggregation``) and judges each rollout by the same rules;
        each ``/run`` goes through ``setup_server_client().post``. Returns the scored rollouts, by task and rollout
        index."""
        global_config = get_global_config_dict()
        _check_open_file_limit(config.num_samples_in_parallel, serving=False)
        output = Path(config.output_jsonl_fpath).expanduser().resolve()
        output.parent.mkdir(parents=True, exist_ok=True)
        if not config.input_jsonl_fpath:
            raise ConfigError("run_from_config needs input_jsonl_fpath, the rows to collect")
        input_path = _find_path(config.input_jsonl_fpath) or Path(config.input_jsonl_fpath)
        materialized = _materialize(
            _MaterializeOptions(
                input_path=input_path, output_path=output, agent_name=config.agent_name, limit=config.limit,
                num_repeats=config.num_repeats, responses_create_params=config.responses_create_params,
                num_repeats_add_seed=config.num_repeats_add_seed,
                resume_fingerprint=_recorded_fingerprint(output) if config.resume_from_cache else None,
            )
        )  # fmt: skip
        deadline = _TransportConfig(total_timeout_s=config.rollout_timeout_seconds, max_attempts=1)
        send = _run_sender(self.setup_server_client(), deadline)
        options = _CollectionOptions(
            output_path=output, concurrency=config.num_samples_in_parallel, resume=config.resume_from_cache,
            rollout_timeout_s=config.rollout_timeout_seconds, capture_dirs=_capture_dirs_from_config(global_config),
            servers=_run_servers(global_config), server_down_deadline_s=config.server_down_deadline_seconds,
            retry_terminal_timeouts=config.retry_terminal_timeouts,
            retry_invalid_judge_responses=config.retry_invalid_judge_responses,
        )  # fmt: skip
        summary = await _RolloutCollector(materialized, {}, options, send=send).run()
        results = sorted((row for _, row in _iter_jsonl(output)), key=_rollout_key) if output.exists() else []
        counted = _counted_as_zero(
            [summary.failures_path], config.count_failure_classes_as_zero, {_rollout_key(r) for r in results}
        )
        dispatched = summary.succeeded + summary.failed
        if dispatched and not results and not counted:
            raise NoRolloutResultError(
                f"None of the {dispatched} dispatched rollouts produced a result "
                f"{dict(summary.failure_classes)}: see {summary.failures_path}; the run has no score to report"
            )
        if (results or counted) and not config.disable_aggregation:
            inputs = {_rollout_key(row): row for _, row in _iter_jsonl(materialized.path)}
            scored = sorted(results + counted, key=_rollout_key)
            await self._call_aggregate_metrics(scored, [inputs.get(_rollout_key(r), r) for r in scored], output)
            if not config.disable_health_check:
                from nemo_gym.health.report import check_after_run, format_health_report

                health = await asyncio.to_thread(  # CPU work: off the event loop
                    check_after_run, output, config.health_check_workers, config.health_check_ignored_checks
                )
                if health is not None:
                    print(format_health_report(health))
        return results

    async def _call_aggregate_metrics(
        self, results: list[dict[str, Any]], rows: list[dict[str, Any]], output_fpath: Path
    ) -> Path | None:
        """Each agent's ``/aggregate_metrics`` over its scored rollouts (``rows`` are their inputs), written to
        ``<stem>_aggregate_metrics.json``; an agent whose server cannot answer gets the default metrics."""
        if not results:
            return None
        grouped: dict[str, list[dict[str, Any]]] = {}
        for row, result in zip(rows, results, strict=True):
            grouped.setdefault(_aggregate.agent_name_of(row), []).append(_aggregate.strip_row(result))
        client = self.setup_server_client()
        urls = {}
        for agent in grouped:
            try:
                urls[agent] = client.server_base_url(agent)
            except ConfigError:
                continue  # not in the config: its metrics are computed here
        path = _aggregate.aggregate_metrics_path(output_fpath)
        _aggregate.write_metrics(path, await _aggregate.compute_metrics(grouped, urls))
        return path

    def run_examples(
        self,
        examples: Iterable[dict[str, Any]],
        head_server_config: BaseServerConfig | None = None,
        semaphore: asyncio.Semaphore | None = None,
    ) -> _RolloutCompletions:
        """Each row needs ``agent_ref`` (``{"name": ...}``). ``examples`` is one batch: all of it is scheduled at once
        and at most ``semaphore`` rollouts are in flight (default: the default of ``gym eval run --concurrency``).

        The answer is consumed either way, in completion order: ``async for row, result in ...`` (ours), or NeMo
        Gym's ``for task in ...: row, result = await task``, which NeMo RL uses. A failed rollout yields a result with
        ``_ng_failure_class`` / ``_ng_failure_message`` instead of raising, so one bad row never stops a batch; the
        classes and rules are the collector's (``timeout``, ``verify_failed``, ``invalid_response``, ...). A row
        without ``agent_ref``, or naming no server of the config, is a ``ConfigError``."""
        send = _run_sender(self.setup_server_client(head_server_config))
        limit = semaphore or asyncio.Semaphore(_DEFAULT_CONCURRENCY)

        async def run_one(row: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
            ref = row.get(AGENT_REF_KEY)
            name = ref.get("name") if isinstance(ref, dict) else ref
            if not name:
                raise ConfigError("every row needs agent_ref: {name: <agent instance>}")
            async with limit:
                result = await _judge_rollout(send(name, row))
            return row, result.as_result() if isinstance(result, _RolloutFailure) else result

        return _RolloutCompletions(run_one(row) for row in examples)


class _RolloutCompletions:
    """The rollouts of one ``run_examples`` batch, started when first iterated (inside the caller's event loop).

    Two ways to read them, both in completion order: ``async for`` yields each ``(row, result)``; plain ``for``
    yields awaitables of it, as ``asyncio.as_completed`` does, which is how NeMo Gym's callers read the batch.
    Leaving an ``async for`` early cancels the rollouts still running."""

    def __init__(self, rollouts: Iterable[Coroutine[Any, Any, tuple[dict[str, Any], dict[str, Any]]]]) -> None:
        self._rollouts = rollouts
        self._started = False

    def _start(self) -> set[asyncio.Task[tuple[dict[str, Any], dict[str, Any]]]]:
        if self._started:
            raise RuntimeError("a run_examples batch can be iterated once; call run_examples again for another pass")
        self._started = True
        return {asyncio.ensure_future(rollout) for rollout in self._rollouts}

    def __iter__(self) -> Iterator[Awaitable[tuple[dict[str, Any], dict[str, Any]]]]:
        return iter(asyncio.as_completed(self._start()))

    async def __aiter__(self) -> AsyncIterator[tuple[dict[str, Any], dict[str, Any]]]:
        pending = self._start()
        try:
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    yield task.result()
        finally:
            for task in pending:
                task.cancel()


def _run_sender(client: ServerClient, transport: _TransportConfig | None = None) -> _RunSender:
    """How a ``/run`` reaches its agent through ``client``. Our own ``ServerClient`` sends it as ``gym eval run`` does
    (one attempt, ``transport``'s deadline); a client a subclass put in its place is called as NeMo Gym calls it,
    ``post(server_name=, url_path=, json=)``, and its answer read with ``read()``."""
    own_client = getattr(type(client), "post", None) is ServerClient.post
    options: dict[str, Any] = {"retry": False, "config": transport} if own_client else {}

    async def send(agent: str, row: dict[str, Any]) -> tuple[int, bytes]:
        response = await client.post(server_name=agent, url_path="/run", json=row, **options)
        return response.status, await response.read()

    return send


class RolloutAggregationHelper:
    """Merge rollout shards and compute their metrics, as ``gym eval aggregate`` does, from a running process.

    Each agent computes its metrics through its ``/aggregate_metrics`` where this process's servers are known
    (:meth:`RolloutCollectionHelper.setup_server_client`), else the default metrics are computed here."""

    def __init__(self, server_client: ServerClient | None = None) -> None:
        self._collection = RolloutCollectionHelper(server_client)

    async def run_from_config(self, config: RolloutAggregationConfig) -> Path:
        """Write ``config.output_jsonl_fpath`` (unless ``merge_shards`` is false) and the metrics beside it; returns
        the metrics file."""
        result = await _aggregate_shards(
            config.input_glob, Path(config.output_jsonl_fpath), config.merge_shards, self._agent_url,
            config.count_failure_classes_as_zero,
        )  # fmt: skip
        return result.metrics_path

    def _agent_url(self, agent: str) -> str | None:
        try:
            return self._collection.setup_server_client().server_base_url(agent)
        except ConfigError:
            return None  # not in the config: its metrics are computed here
