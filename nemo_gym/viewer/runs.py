"""One run as the viewer sees it: ``<stem>.jsonl``, its ``<stem>_failures.jsonl`` and ``<stem>_aggregate_metrics.json``.

The list page's filters and sorts run over the index's typed arrays (no row is parsed); only a text search reads
rows, and only those the other filters kept.
"""

from __future__ import annotations

import math
import statistics
import threading
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from nemo_gym.errors import ConfigError
from nemo_gym.viewer.health import RunHealth
from nemo_gym.viewer.index import LineIndex

ROLLOUT = "r"
FAILURE = "f"
SORT_KEYS = ("row", "reward", "task", "agent", "failure", "tools", "length", "turns")


@dataclass(frozen=True)
class Filters:
    """What the list page was asked for; every field optional."""

    reward: float | None = None
    task: int | None = None
    agent: str = ""
    failure: str = ""
    min_tools: int | None = None
    text: str = ""
    sort: str = "row"
    descending: bool = False

    @classmethod
    def from_query(cls, query: Any) -> Filters:
        def number(name: str, kind: type) -> Any:
            try:
                return kind(query[name]) if query.get(name, "") != "" else None
            except ValueError:
                return None

        sort = query.get("sort", "row")
        return cls(
            reward=number("reward", float),
            task=number("task", int),
            agent=query.get("agent", ""),
            failure=query.get("failure", ""),
            min_tools=number("min_tools", int),
            text=query.get("q", ""),
            sort=sort if sort in SORT_KEYS else "row",
            descending=query.get("desc", "") == "1",
        )


class Run:
    """A rollout file with its sidecars, indexed and followed as it grows."""

    def __init__(self, number: int, path: Path) -> None:
        if not path.is_file():
            raise ConfigError(
                f"gym view: {str(path)!r} is not a file; pass a rollouts .jsonl written by `gym eval run`"
            )
        self.number = number
        self.path = path
        self.name = path.stem
        self.rollouts = LineIndex(path)
        self.failures = LineIndex(path.with_name(f"{path.stem}_failures.jsonl"))
        self.metrics_path = path.with_name(f"{path.stem}_aggregate_metrics.json")
        self.health = RunHealth(path)
        self._metrics: tuple[float, list[dict[str, Any]]] | None = None
        self._metrics_lock = threading.Lock()

    def refresh(self) -> int:
        return self.rollouts.refresh() + self.failures.refresh()

    def index_of(self, kind: str) -> LineIndex:
        return self.failures if kind == FAILURE else self.rollouts

    def metrics(self) -> list[dict[str, Any]]:
        """The aggregate metrics file's entries (one per agent), read again when the file changes."""
        try:
            mtime = self.metrics_path.stat().st_mtime
        except FileNotFoundError:
            return []
        with self._metrics_lock:
            if self._metrics is None or self._metrics[0] != mtime:
                try:
                    loaded = orjson.loads(self.metrics_path.read_bytes())
                except orjson.JSONDecodeError:
                    loaded = []
                self._metrics = (mtime, loaded if isinstance(loaded, list) else [])
            return self._metrics[1]

    def overview(self) -> dict[str, Any]:
        """The overview page's figures, from the index alone."""
        index = self.rollouts
        n = len(index)
        rewards = [r for r in index.reward[:n] if not math.isnan(r)]
        failures = self.failures
        by_class = Counter(failures.failure_class(i) or "unclassified" for i in range(len(failures)))
        tokens_in = sum(t for t in index.input_tokens[:n] if t > 0)
        tokens_out = sum(t for t in index.output_tokens[:n] if t > 0)
        return {
            "rollouts": n,
            "failures": len(failures),
            "failures_by_class": sorted(by_class.items(), key=lambda kv: -kv[1]),
            "mean_reward": statistics.fmean(rewards) if rewards else None,
            "tasks": len(set(index.task[:n])),
            "agents": sorted(set(index.agents.names[a] for a in index.agent[:n])),
            "input_tokens": tokens_in,
            "output_tokens": tokens_out,
            "bad_lines": index.bad_lines + failures.bad_lines,
        }

    def select(self, filters: Filters) -> list[tuple[str, int]]:
        """The (kind, row) pairs the filters keep, sorted as asked: rollouts then failures before sorting."""
        chosen: list[tuple[str, int]] = []
        for kind, index in ((ROLLOUT, self.rollouts), (FAILURE, self.failures)):
            n = len(index)
            rows = list(range(n))
            if filters.failure:
                if kind == ROLLOUT:
                    continue
                wanted = filters.failure
                rows = [i for i in rows if (index.failure_class(i) or "unclassified") == wanted]
            if filters.reward is not None:
                if kind == FAILURE:
                    continue
                rows = [i for i in rows if index.reward[i] == filters.reward]
            if filters.task is not None:
                rows = [i for i in rows if index.task[i] == filters.task]
            if filters.agent:
                rows = [i for i in rows if index.agent_name(i) == filters.agent]
            if filters.min_tools is not None:
                rows = [i for i in rows if index.tool_calls[i] >= filters.min_tools]
            if filters.text:
                rows = index.matching(rows, filters.text.lower().encode())
            chosen.extend((kind, i) for i in rows)
        if filters.sort != "row" or filters.descending:
            chosen.sort(key=lambda entry: self._sort_key(entry, filters.sort), reverse=filters.descending)
        return chosen

    def _sort_key(self, entry: tuple[str, int], sort: str) -> tuple[Any, ...]:
        kind, i = entry
        index = self.index_of(kind)
        value: Any = {
            "row": 0,
            "reward": -math.inf if math.isnan(index.reward[i]) else index.reward[i],
            "task": index.task[i],
            "agent": index.agent_name(i),
            "failure": index.failure_class(i),
            "tools": index.tool_calls[i],
            "length": index.output_chars[i],
            "turns": index.turns[i],
        }[sort]
        return (value, kind, i)

    def summary(self, kind: str, i: int) -> dict[str, Any]:
        """One list row's cells, from the index."""
        index = self.index_of(kind)
        reward = index.reward[i]
        return {
            "kind": kind,
            "row": i,
            "reward": None if math.isnan(reward) else reward,
            "task": index.task[i],
            "rollout": index.rollout[i],
            "agent": index.agent_name(i),
            "failure": index.failure_class(i) or ("unclassified" if kind == FAILURE else ""),
            "tools": index.tool_calls[i],
            "length": index.output_chars[i],
            "turns": index.turns[i],
        }

    def task_rewards(self) -> dict[int, list[float]]:
        """Each task's rewards (scored rollouts only), for pass rates and comparisons."""
        index = self.rollouts
        grouped: dict[int, list[float]] = {}
        for i in range(len(index)):
            reward = index.reward[i]
            if not math.isnan(reward):
                grouped.setdefault(index.task[i], []).append(reward)
        return grouped


def open_runs(paths: list[Path]) -> list[Run]:
    if not paths:
        raise ConfigError("gym view: no rollout file given; pass PATH (e.g. results/demo/weather_rollouts.jsonl)")
    return [Run(number, path) for number, path in enumerate(paths)]
