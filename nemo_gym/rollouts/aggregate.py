"""Aggregate metrics of collected rollouts, per agent, written to ``<stem>_aggregate_metrics.json``.

Each agent's rows (only scored rollouts: failures are never metrics) are stripped of their heavy parts (the
trajectory and the create params; token usage is kept) and either sent to the agent's ``/aggregate_metrics`` (so an
environment's own metric code runs) or computed here with the default statistics, from files alone.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine, Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import orjson
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from nemo_gym.config.datasets import AGENT_REF_KEY
from nemo_gym.jsonl import iter_jsonl, write_json_atomic
from nemo_gym.metrics import AggregateMetrics, aggregate_verify_responses
from nemo_gym.observability.capture import CAPTURE_KEY, OBSERVATIONS_KEY, TRAJECTORY_KEY
from nemo_gym.rollouts.outputs import aggregate_metrics_path as aggregate_metrics_path  # re-exported
from nemo_gym.transport import http_client

logger = logging.getLogger(__name__)
T = TypeVar("T")

HEAVY_FIELDS = frozenset({"response", "responses_create_params", OBSERVATIONS_KEY, CAPTURE_KEY, TRAJECTORY_KEY})
"""Left out of the rows ``/aggregate_metrics`` gets, as NeMo Gym leaves them out: the trajectory and the create params,
and what observability recorded with a rollout (its model calls, the agent's observations, the trajectory file)."""
_JSON_BODY = {"Content-Type": "application/json"}


def strip_row(row: dict[str, Any]) -> dict[str, Any]:
    """A rollout row without its :data:`HEAVY_FIELDS`, keeping ``response.usage`` for token statistics."""
    stripped = {k: v for k, v in row.items() if k not in HEAVY_FIELDS}
    response = row.get("response")
    if isinstance(response, dict) and response.get("usage"):
        stripped["response"] = {"usage": response["usage"]}
    return stripped


class EncodedRows:
    """One agent's stripped rows for ``/aggregate_metrics``, each kept as its JSON bytes, in (task, rollout) order.

    The collector holds every scored row of a run at its end: parsed, a stripped row took ~1.4 KB (65,536 rollouts:
    ~90 MB, and as much again for the request body made from them); its bytes take ~0.4 KB, and the body is those
    bytes joined, the exact bytes ``json={"verify_responses": rows}`` sends. Rows are parsed again only where the
    metrics are computed here (:meth:`decoded`).
    """

    __slots__ = ("_rows",)

    def __init__(self) -> None:
        self._rows: list[tuple[tuple[Any, Any], bytes]] = []

    def __len__(self) -> int:
        return len(self._rows)

    def append(self, row: dict[str, Any]) -> None:
        self._rows.append((_order(row), http_client.dumps(row)))

    def keys(self) -> list[tuple[Any, Any]]:
        """The (task, rollout) of each row."""
        return [key for key, _ in self._rows]

    def sort(self) -> None:
        self._rows.sort(key=_first)

    def decoded(self) -> list[dict[str, Any]]:
        return [orjson.loads(raw) for _, raw in self._rows]

    def request_body(self) -> bytes:
        return b'{"verify_responses":[' + b",".join(raw for _, raw in self._rows) + b"]}"

    def take_request_body(self) -> bytes:
        """:meth:`request_body`, leaving this empty: while the servers compute the metrics (the peak of a run's
        memory) the rows are held once, as the body; :func:`rows_of_body` reads them back from it if need be."""
        body = self.request_body()
        self._rows = []
        return body


def rows_of_body(body: bytes) -> list[dict[str, Any]]:
    """The rows of a ``/aggregate_metrics`` body."""
    rows: list[dict[str, Any]] = orjson.loads(body)["verify_responses"]
    return rows


def _order(row: dict[str, Any]) -> tuple[Any, Any]:
    return row.get("_ng_task_index", 0), row.get("_ng_rollout_index", 0)


def _first(item: tuple[tuple[Any, Any], bytes]) -> tuple[Any, Any]:
    return item[0]


def encoded_rows_by_agent(paths: Iterable[Path]) -> dict[str, EncodedRows]:
    """:func:`rows_by_agent` with each agent's rows as :class:`EncodedRows`, for :func:`compute_metrics`."""
    grouped: dict[str, EncodedRows] = {}
    for path in paths:
        for _, row in iter_jsonl(path):
            grouped.setdefault(_group_name(row), EncodedRows()).append(strip_row(row))
    for rows in grouped.values():
        rows.sort()
    return grouped


def rows_by_agent(paths: Iterable[Path]) -> dict[str, list[dict[str, Any]]]:
    grouped: dict[str, list[dict[str, Any]]] = {}
    for path in paths:
        for _, row in iter_jsonl(path):
            grouped.setdefault(_group_name(row), []).append(strip_row(row))
    for rows in grouped.values():
        rows.sort(key=_order)
    return grouped


def _group_name(row: dict[str, Any]) -> Any:
    ref = row.get(AGENT_REF_KEY) or {}
    return ref.get("name", "unknown") if isinstance(ref, dict) else str(ref)


async def compute_metrics(
    grouped: Mapping[str, list[dict[str, Any]] | EncodedRows], agent_urls: dict[str, str] | None = None
) -> list[dict[str, Any]]:
    """One entry per agent: ``{agent_ref, agent_metrics, key_metrics, group_level_metrics}``."""
    results = []
    for agent, rows in sorted(grouped.items()):
        url = (agent_urls or {}).get(agent)
        metrics = None
        if url:
            if isinstance(rows, EncodedRows):  # they become the body (and are emptied): held once while servers work
                body = rows.take_request_body()
                metrics = await _metrics_from_server(agent, url, body)
                if metrics is None:
                    rows = rows_of_body(body)
            else:
                metrics = await _metrics_from_server(agent, url, http_client.dumps({"verify_responses": rows}))
        if metrics is None:
            metrics = aggregate_verify_responses(rows.decoded() if isinstance(rows, EncodedRows) else rows)
        results.append({AGENT_REF_KEY: {"type": "responses_api_agents", "name": agent}, **metrics.model_dump()})
    return results


async def _metrics_from_server(agent: str, url: str, body: bytes) -> AggregateMetrics | None:
    """The environment's own metrics for the rows in ``body``; None (with a warning) if its server cannot answer,
    so a finished run still gets the default metrics rather than none."""
    try:
        answer = await http_client.request(
            "POST", f"{url}/aggregate_metrics", data=body, headers=_JSON_BODY, server_name=agent,
            url_path="/aggregate_metrics",
        )  # fmt: skip
        http_client.raise_for_status(answer, agent, "/aggregate_metrics")
        return AggregateMetrics.model_validate(await http_client.response_json(answer))
    except (http_client.TransportError, ValueError) as e:
        logger.warning("aggregate metrics of %s computed locally: its server could not answer (%s)", agent, e)
        return None


def write_metrics(path: Path, metrics: list[dict[str, Any]]) -> None:
    write_json_atomic(path, metrics)


def print_key_metrics(metrics: list[dict[str, Any]], console: Console) -> None:
    table = Table(title="Key metrics", title_justify="left")
    table.add_column("Agent")
    table.add_column("Metric")
    table.add_column("Value", justify="right")
    for entry in metrics:
        agent = entry[AGENT_REF_KEY]["name"]
        key_metrics = entry.get("key_metrics") or {}
        if "num_rollouts" in entry.get("agent_metrics", {}):
            key_metrics = {"num_rollouts": entry["agent_metrics"]["num_rollouts"], **key_metrics}
        for name, value in key_metrics.items():
            table.add_row(escape(agent), escape(name), f"{value:.4f}" if isinstance(value, float) else str(value))
    console.print(table)


def agent_name_of(row: dict[str, Any]) -> str:
    """The agent that produced a rollout row (``unknown`` when the row does not say)."""
    ref = row.get(AGENT_REF_KEY) or {}
    return str(ref.get("name", "unknown")) if isinstance(ref, dict) else str(ref)


def sort_grouped(grouped: dict[str, list[dict[str, Any]]]) -> dict[str, list[dict[str, Any]]]:
    """Order each agent's rows by (task, rollout), so metrics do not depend on file or completion order."""
    for rows in grouped.values():
        rows.sort(key=lambda r: (r.get("_ng_task_index", 0), r.get("_ng_rollout_index", 0)))
    return grouped


def compute_metrics_now(
    grouped: dict[str, list[dict[str, Any]]], agent_urls: dict[str, str] | None = None
) -> list[dict[str, Any]]:
    """:func:`compute_metrics` from synchronous code (the CLI tools)."""
    return run_now(compute_metrics(grouped, agent_urls))


def run_now(work: Coroutine[Any, Any, T]) -> T:
    """Run ``work`` from synchronous code (the CLI tools), closing the HTTP session afterwards."""

    async def run() -> T:
        try:
            return await work
        finally:
            await http_client.close_session()

    return asyncio.run(run())
