"""Metrics over verified rollouts: summary statistics, per-task groups, and pass@k / majority@k helpers.

Environments call these from their ``/aggregate_metrics`` (or override it); the keys are flat strings such as
``mean/reward`` so they can be logged to W&B or MLflow as they are. The route's request and answer models
(``AggregateMetricsRequest``, ``AggregateMetrics``) are defined here, beside the code that fills them.
"""

from __future__ import annotations

import functools
import math
import statistics
from collections import Counter, defaultdict
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import Any

from pydantic import BaseModel, Field

TASK_INDEX_KEY_NAME = "_ng_task_index"
ROLLOUT_INDEX_KEY_NAME = "_ng_rollout_index"
_SKIPPED_FIELDS = {TASK_INDEX_KEY_NAME, ROLLOUT_INDEX_KEY_NAME, "_ng_attempt_index"}

__all__ = [
    "ROLLOUT_INDEX_KEY_NAME",
    "TASK_INDEX_KEY_NAME",
    "AggregateMetrics",
    "AggregateMetricsRequest",
    "AggregateMetricsMixin",
    "RewardProfiler",
    "WANDBConfig",
    "aggregate_verify_responses",
    "aggregate_with_hooks",
    "category_metrics",
    "compute_aggregate_metrics",
    "default_key_metrics",
    "every_mean",
    "group_by_task",
    "key_picker",
    "majority_at_k",
    "majority_metrics",
    "numeric_fields",
    "pass_at_k",
    "pass_metrics",
    "repeat_level_metrics",
    "summarize",
    "summarize_rows",
]


# ---------------------------------------------------------------------------------------------------------------------
# Wire types of /aggregate_metrics (NeMo Gym also exports them from nemo_gym.config_types)


class AggregateMetricsRequest(BaseModel):
    """POST body for /aggregate_metrics.

    Each item is a stripped verify response dict containing at minimum the task index (``_ng_task_index``) and
    ``reward``.
    """

    verify_responses: list[dict[str, Any]]


def _empty(value: Any) -> bool:
    return not value


class AggregateMetrics(BaseModel):
    """What ``/aggregate_metrics`` answers: the run's metrics under flat string keys, ready to log as they are. Each
    part may be left out (NeMo Gym 0.7's agents answer ``agent_metrics`` alone) and reads as empty."""

    agent_metrics: dict[str, Any] = Field(default_factory=dict)
    key_metrics: dict[str, Any] = Field(default_factory=dict)
    group_level_metrics: list[dict[str, Any]] = Field(default_factory=list)
    repeat_level_metrics: list[dict[str, Any]] = Field(default_factory=list, exclude_if=_empty)
    """One summary per repeat (rollout index) when a run has several: its sample and missing counts and the usual
    statistics of every numeric field over that repeat's rollouts (NeMo Gym 0.7). Left out of the JSON when empty."""
    perf_summary: dict[str, Any] | None = Field(default=None, exclude_if=_empty)
    """Efficiency statistics of the rollouts' ``ng_perf`` records, where a run keeps them (NeMo Gym 0.7's field)."""


class WANDBConfig(BaseModel):
    is_available: bool
    wandb_api_key: str | None = None
    wandb_project: str | None = None
    wandb_name: str | None = None


# ---------------------------------------------------------------------------------------------------------------------
# Statistics


_USAGE_FIELDS = {key: f"usage/{key}" for key in ("input_tokens", "output_tokens", "total_tokens")}


def _number(value: Any) -> bool:
    return isinstance(value, bool) or isinstance(value, (int, float)) and math.isfinite(value)


def numeric_fields(row: dict[str, Any]) -> dict[str, float]:
    """Top-level numbers of a verify response (booleans count as 0/1), plus token usage of its response.

    The usage's own top-level numbers come under their own names (``output_tokens``, replacing a row field of that
    name), as NeMo Gym 0.7 reports them and its servers' metric hooks read them; the token counts also under
    ``usage/<name>``, our earlier name for them.
    """
    values: dict[str, float] = {}
    for key, value in row.items():
        if key in _SKIPPED_FIELDS or key.startswith("_ng_"):
            continue
        if _number(value):
            values[key] = float(value)
    usage = (row.get("response") or {}).get("usage") if isinstance(row.get("response"), dict) else None
    if isinstance(usage, dict):
        for key, value in usage.items():
            if _number(value) and not key.startswith("_ng_"):
                values[key] = float(value)
        for key, name in _USAGE_FIELDS.items():
            if isinstance(usage.get(key), (int, float)):
                values[name] = float(usage[key])
    return values


@functools.lru_cache(maxsize=4096)
def _statistic_keys(name: str) -> tuple[str, str, str, str, str]:
    """The keys of one field's statistics, made once: a run's per-task metrics repeat them for every task, and
    12,288 tasks held ~20 MB of identical key strings in the server answering ``/aggregate_metrics``."""
    return (f"mean/{name}", f"max/{name}", f"min/{name}", f"median/{name}", f"std/{name}")


def summarize(values: Sequence[float], name: str) -> dict[str, float]:
    """mean, max, min, median and (population) std of one field."""
    if not values:
        return {}
    mean, largest, smallest, median, std = _statistic_keys(name)
    return {
        mean: statistics.fmean(values),
        largest: max(values),
        smallest: min(values),
        median: statistics.median(values),
        std: statistics.pstdev(values) if len(values) > 1 else 0.0,
    }


def summarize_rows(rows: Iterable[dict[str, Any]]) -> dict[str, float]:
    columns: dict[str, list[float]] = defaultdict(list)
    for row in rows:
        for key, value in numeric_fields(row).items():
            columns[key].append(value)
    result: dict[str, float] = {}
    for name in sorted(columns):
        result |= summarize(columns[name], name)
    return result


def pass_at_k(num_samples: int, num_correct: int, k: int) -> float:
    """Unbiased pass@k estimator: 1 - C(n-c, k) / C(n, k) (the probability that k draws include a success)."""
    if not 0 < k <= num_samples:
        raise ValueError(f"pass@k needs 0 < k <= n, got k={k}, n={num_samples}")
    if num_samples - num_correct < k:
        return 1.0
    return 1.0 - math.comb(num_samples - num_correct, k) / math.comb(num_samples, k)


def majority_at_k(answers: Sequence[Hashable], rewards: Sequence[float], k: int) -> float:
    """Reward of the most common answer among the first k (ties broken by first occurrence); None answers ignored."""
    pairs = [(a, r) for a, r in list(zip(answers, rewards, strict=True))[:k] if a is not None]
    if not pairs:
        return 0.0
    counts = Counter(a for a, _ in pairs)
    best = max(counts.values())
    winner = next(a for a, _ in pairs if counts[a] == best)
    return next(r for a, r in pairs if a == winner)


def group_by_task(rows: Iterable[dict[str, Any]]) -> dict[int, list[dict[str, Any]]]:
    groups: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        groups[int(row.get(TASK_INDEX_KEY_NAME, 0))].append(row)
    return dict(sorted(groups.items()))


def _repeats_of(groups: dict[int, list[dict[str, Any]]]) -> int:
    """The run's repeats per task (``--num-repeats``): 1 + the largest ``_ng_rollout_index`` of a scored row, or the
    largest group where rows carry no index. Failed rollouts never reach the metrics, so a task's group may be
    smaller; the repeats are read from the indices so that a few failures do not change the metric names."""
    indices = [
        int(row[ROLLOUT_INDEX_KEY_NAME]) for rows in groups.values() for row in rows if ROLLOUT_INDEX_KEY_NAME in row
    ]
    return max([len(rows) for rows in groups.values()] + [index + 1 for index in indices])


def _powers_of_two(limit: int) -> list[int]:
    """k = 1, 2, 4, … up to ``limit``."""
    return [2**i for i in range(limit.bit_length())] if limit > 0 else []


def pass_metrics(groups: dict[int, list[dict[str, Any]]], success_threshold: float = 1.0) -> dict[str, float]:
    """pass@k for k = 1, 2, 4, … up to the run's repeats N (:func:`_repeats_of`), and pass@1[avg-of-N].

    The rule with failed rollouts (they are never scored): pass@k is the unbiased estimator over each task's scored
    repeats, averaged over the tasks with at least k of them; ``pass@k/tasks_left_out`` beside it counts the tasks
    with fewer (only when there are any). ``pass@1[avg-of-N]`` keeps the run's N and averages each task's scored
    repeats, then the tasks. Without failures every task has N and these are the plain definitions.
    """
    if not groups:
        return {}
    repeats = _repeats_of(groups)
    counts = [
        (len(rows), sum(float(r.get("reward", 0)) >= success_threshold for r in rows)) for rows in groups.values()
    ]
    result: dict[str, float] = {}
    for k in _powers_of_two(repeats):
        scored = [pass_at_k(samples, correct, k) for samples, correct in counts if samples >= k]
        if scored:
            result[f"pass@{k}"] = statistics.fmean(scored)
        if len(scored) < len(counts):
            result[f"pass@{k}/tasks_left_out"] = len(counts) - len(scored)
    result[f"pass@1[avg-of-{repeats}]"] = statistics.fmean(
        statistics.fmean(float(r.get("reward", 0)) for r in rows) for rows in groups.values()
    )
    return result


def _answer_of(row: dict[str, Any], answer_key: str) -> Hashable | None:
    """The row's extracted answer as a hashable value; missing or blank answers are None (they count as no_answer)."""
    value = row.get(answer_key)
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    return value if isinstance(value, (str, int, float, bool)) else repr(value)


def majority_metrics(groups: dict[int, list[dict[str, Any]]], answer_key: str) -> dict[str, float]:
    """majority@k over ``answer_key`` for k = 1, 2, 4, … up to the run's repeats, averaged over the tasks with at
    least k scored repeats (:func:`pass_metrics`' rule), plus the share of rollouts with no answer at all, which
    tells a format problem apart from a knowledge problem."""
    if not groups:
        return {}
    result: dict[str, float] = {}
    for k in _powers_of_two(_repeats_of(groups)):
        majorities = [
            majority_at_k([_answer_of(r, answer_key) for r in rows], [float(r.get("reward", 0)) for r in rows], k)
            for rows in groups.values()
            if len(rows) >= k
        ]
        if majorities:
            result[f"majority@{k}"] = statistics.fmean(majorities)
    all_rows = [row for rows in groups.values() for row in rows]
    result["no_answer"] = statistics.fmean(_answer_of(row, answer_key) is None for row in all_rows)
    return result


def aggregate_verify_responses(rows: list[dict[str, Any]], answer_key: str | None = None) -> AggregateMetrics:
    """The default ``/aggregate_metrics``: overall statistics, pass@k, and statistics per task.

    With ``answer_key`` (e.g. ``extracted_answer``) it also reports majority@k and no_answer, and the largest
    majority@k becomes a key metric.
    """
    groups = group_by_task(rows)
    agent_metrics = summarize_rows(rows) | pass_metrics(groups) | {"num_rollouts": len(rows), "num_tasks": len(groups)}
    if answer_key is not None:
        agent_metrics |= majority_metrics(groups, answer_key)
    # Each row's numbers are read again per task rather than kept from the first pass: 10,000 rows' number dicts held
    # at once were ~3 MB more at the peak of the server answering a run's /aggregate_metrics.
    group_level = [
        {TASK_INDEX_KEY_NAME: task, "num_rollouts": len(task_rows)} | summarize_rows(task_rows)
        for task, task_rows in groups.items()
    ]
    # Built here from plain dicts of floats, so validating would only copy them: one dict per task, ~85 MB at 65,536.
    return AggregateMetrics.model_construct(
        agent_metrics=agent_metrics, key_metrics=default_key_metrics(agent_metrics), group_level_metrics=group_level
    )


def default_key_metrics(agent_metrics: dict[str, Any]) -> dict[str, Any]:
    """The headline metrics when a server names none: mean reward, pass@1 (and its variants), the largest
    majority@k."""
    majority = [k for k in agent_metrics if k.startswith("majority@")]
    key_names = ("mean/reward", "pass@1", *(k for k in agent_metrics if k.startswith("pass@1[")), *majority[-1:])
    return {name: agent_metrics[name] for name in key_names if name in agent_metrics}


def every_mean(agent_metrics: dict[str, Any]) -> dict[str, Any]:
    """NeMo Gym's own pick of headline metrics: every ``mean/*`` entry. It is what ``get_key_metrics`` answers on the
    hook classes, so a server written for NeMo Gym that falls back to ``super().get_key_metrics(...)`` gets what it
    got there; a server that does not override the hook gets :func:`default_key_metrics` (see :func:`key_picker`)."""
    return {key: value for key, value in agent_metrics.items() if key.startswith("mean/")}


def key_picker(server: Any, hooks: type) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """The server's ``get_key_metrics`` when its class overrides the one of ``hooks``, else our headline default
    (mean reward, pass@1 and the largest majority@k, rather than every mean of every numeric field)."""
    overridden = getattr(type(server), "get_key_metrics", None) is not getattr(hooks, "get_key_metrics", None)
    return server.get_key_metrics if overridden else default_key_metrics


def aggregate_with_hooks(
    rows: list[dict[str, Any]],
    compute_metrics: Callable[[list[list[dict[str, Any]]]], dict[str, Any]] | None = None,
    get_key_metrics: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
) -> AggregateMetrics:
    """The default statistics, extended by a server's ``compute_metrics(tasks)`` and ``get_key_metrics(metrics)``.

    ``tasks`` is the rows grouped by task index, in task order. What ``compute_metrics`` returns is merged into the
    agent metrics, except ``per_task_metrics`` (a list of dicts with ``_ng_task_index``), which is merged into the
    matching group-level entries. ``get_key_metrics`` then picks the headline metrics from the merged agent metrics.
    """
    result = aggregate_verify_responses(rows)
    if compute_metrics is not None and rows:
        groups = group_by_task(rows)
        custom = dict(compute_metrics([groups[task] for task in sorted(groups)]))
        per_task = {m[TASK_INDEX_KEY_NAME]: m for m in custom.pop("per_task_metrics", None) or []}
        for group in result.group_level_metrics:
            extra = per_task.get(group.get(TASK_INDEX_KEY_NAME))
            group.update({k: v for k, v in (extra or {}).items() if k != TASK_INDEX_KEY_NAME})
        result.agent_metrics.update(custom)
    if get_key_metrics is not None:
        result.key_metrics = get_key_metrics(result.agent_metrics)
    else:
        result.key_metrics = default_key_metrics(result.agent_metrics)
    return result


def category_metrics(rows: Sequence[dict[str, Any]], field: str) -> dict[str, float]:
    """For a categorical field (a result code, a subset name): the share of rollouts with each value and the mean
    reward among them, as ``<field>/<value>/share`` and ``<field>/<value>/mean_reward``. Missing values count as
    ``none``."""
    groups: dict[str, list[float]] = defaultdict(list)
    for row in rows:
        value = row.get(field)
        groups["none" if value is None else str(value)].append(float(row.get("reward", 0)))
    result: dict[str, float] = {}
    for value in sorted(groups):
        rewards = groups[value]
        result[f"{field}/{value}/share"] = len(rewards) / len(rows)
        result[f"{field}/{value}/mean_reward"] = statistics.fmean(rewards)
    return result


# ---------------------------------------------------------------------------------------------------------------------
# NeMo Gym 0.7's metric hooks and its aggregation entry point (nemo_gym.reward_profile re-exports them)

_MASK_SAMPLE_FIELD = "mask_sample"
"""A verify response that sets this ran, but its reward measures nothing about the policy (an environment fault)."""
_ACROSS_REPEATS = "_across_repeats/"
"""``<stat>_across_repeats/<metric>``: a statistic of one metric over the repeats, each repeat scored on its own."""


class AggregateMetricsMixin:
    """The hooks that shape a server's ``/aggregate_metrics``: override any of them; defaults add nothing.

    ``compute_metrics(tasks)`` gets every measured verify response grouped by task and returns metrics merged into the
    agent metrics; ``compute_repeat_metrics(tasks)`` gets one repeat at a time and its metrics are summarized across
    repeats; ``get_key_metrics(agent_metrics)`` picks the headline ones.
    """

    def compute_metrics(self, tasks: list[list[dict[str, Any]]]) -> dict[str, Any]:
        return {}

    def compute_repeat_metrics(self, tasks: list[list[dict[str, Any]]]) -> dict[str, Any]:
        return {}

    def get_key_metrics(self, agent_metrics: dict[str, Any]) -> dict[str, Any]:
        return every_mean(agent_metrics)

    def _aggregate_with_hooks(self, rows: list[dict[str, Any]]) -> AggregateMetrics:
        picker = key_picker(self, AggregateMetricsMixin)
        return compute_aggregate_metrics(rows, self.compute_metrics, picker, self.compute_repeat_metrics)


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _coverage(rows: list[dict[str, Any]], measured: list[dict[str, Any]]) -> dict[str, int]:
    """How much of the run the quality metrics come from; empty when nothing was masked."""
    if len(measured) == len(rows):
        return {}
    tasks = {row.get(TASK_INDEX_KEY_NAME, 0) for row in rows}
    measured_tasks = {row.get(TASK_INDEX_KEY_NAME, 0) for row in measured}
    return {
        "coverage/measured_rollouts": len(measured),
        "coverage/masked_rollouts": len(rows) - len(measured),
        "coverage/measured_tasks": len(measured_tasks),
        "coverage/fully_masked_tasks": len(tasks - measured_tasks),
    }


def repeat_level_metrics(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per repeat (rollout index), when there are several: how many tasks it covers and misses, and the statistics
    of every numeric field over its rollouts."""
    by_repeat: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        by_repeat[int(row.get(ROLLOUT_INDEX_KEY_NAME, 0))].append(row)
    if len(by_repeat) < 2:
        return []
    all_tasks = {row.get(TASK_INDEX_KEY_NAME, 0) for row in rows}
    summaries = []
    for repeat in sorted(by_repeat):
        covered = {row.get(TASK_INDEX_KEY_NAME, 0) for row in by_repeat[repeat]}
        summaries.append(
            {
                ROLLOUT_INDEX_KEY_NAME: repeat,
                "sample_count": len(covered),
                "missing_count": len(all_tasks - covered),
                **summarize_rows(row for row in by_repeat[repeat]),
            }
        )
    return summaries


def _repeat_statistics(
    measured: list[dict[str, Any]],
    compute_repeat_metrics: Callable[[list[list[dict[str, Any]]]], dict[str, Any]],
    full_run: dict[str, Any],
    repeat_rows: list[dict[str, Any]],
) -> dict[str, float]:
    """Each repeat (rollout index) scored alone by the hook, then every metric that is a finite number in all
    repeats (and in the full run, where the full run has it) summarized across them.

    Such a metric also goes into each repeat's entry of ``repeat_rows`` (the per-repeat statistics, in repeat
    order), replacing a generic statistic of the same name; one that is not finite everywhere is taken out of them.
    """
    by_repeat: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for row in measured:
        by_repeat[int(row.get(ROLLOUT_INDEX_KEY_NAME, 0))].append(row)
    if len(by_repeat) < 2:
        return {}
    per_repeat = []
    for repeat in sorted(by_repeat):
        groups = group_by_task(by_repeat[repeat])
        per_repeat.append(compute_repeat_metrics(list(groups.values())))
    result: dict[str, float] = {}
    for name in sorted({name for metrics in per_repeat for name in metrics}):
        values = [metrics.get(name) for metrics in per_repeat]
        for row in repeat_rows:
            row.pop(name, None)
        if not all(_finite(v) for v in values) or (name in full_run and not _finite(full_run[name])):
            continue
        numbers = [float(v) for v in values]  # type: ignore[arg-type]  # all finite numbers, checked above
        if len(repeat_rows) == len(numbers):
            for row, number in zip(repeat_rows, numbers, strict=True):
                row[name] = number
        spread = statistics.stdev(numbers)
        result |= {
            f"mean{_ACROSS_REPEATS}{name}": statistics.fmean(numbers),
            f"median{_ACROSS_REPEATS}{name}": statistics.median(numbers),
            f"std{_ACROSS_REPEATS}{name}": spread,
            f"se{_ACROSS_REPEATS}{name}": spread / math.sqrt(len(numbers)),
            f"min{_ACROSS_REPEATS}{name}": min(numbers),
            f"max{_ACROSS_REPEATS}{name}": max(numbers),
        }
    return result


def compute_aggregate_metrics(
    verify_responses: list[dict[str, Any]],
    compute_metrics_fn: Callable[[list[list[dict[str, Any]]]], dict[str, Any]] | None = None,
    get_key_metrics_fn: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    compute_repeat_metrics_fn: Callable[[list[list[dict[str, Any]]]], dict[str, Any]] | None = None,
) -> AggregateMetrics:
    """``/aggregate_metrics`` with a server's hooks, as NeMo Gym 0.7 computes it from outside a server.

    The default statistics and ``compute_metrics_fn`` (see :func:`aggregate_with_hooks`) over the measured responses:
    those without ``mask_sample``, whose flag is dropped, with ``coverage/*`` counts when any was masked (every one
    masked: only the counts). ``compute_repeat_metrics_fn`` adds ``<stat>_across_repeats/<metric>`` when the run has
    several repeats. ``get_key_metrics_fn`` picks the headline metrics last; coverage counts are always among them.
    """
    if not verify_responses:
        return AggregateMetrics(agent_metrics={}, key_metrics={}, group_level_metrics=[])
    measured = [
        {k: v for k, v in row.items() if k != _MASK_SAMPLE_FIELD}
        for row in verify_responses
        if not row.get(_MASK_SAMPLE_FIELD)
    ]
    coverage = _coverage(verify_responses, measured)
    if not measured:
        return AggregateMetrics(agent_metrics=dict(coverage), key_metrics=dict(coverage), group_level_metrics=[])
    custom: dict[str, Any] = {}

    def compute_metrics(tasks: list[list[dict[str, Any]]]) -> dict[str, Any]:
        custom.update(compute_metrics_fn(tasks) if compute_metrics_fn is not None else {})
        return custom

    result = aggregate_with_hooks(measured, compute_metrics, lambda metrics: {})
    result.repeat_level_metrics = repeat_level_metrics(measured)
    result.agent_metrics.update(coverage)
    if compute_repeat_metrics_fn is not None:
        across = _repeat_statistics(measured, compute_repeat_metrics_fn, custom, result.repeat_level_metrics)
        result.agent_metrics.update(across)
    pick = get_key_metrics_fn if get_key_metrics_fn is not None else default_key_metrics
    result.key_metrics = {**pick(result.agent_metrics), **coverage}
    return result


class RewardProfiler:
    """NeMo Gym 0.7's per-rollout view of results: aligning results with their inputs, and each rollout's numbers."""

    @staticmethod
    def _by_key(rows: list[dict[str, Any]], what: str) -> dict[tuple[Any, Any], dict[str, Any]]:
        indexed: dict[tuple[Any, Any], dict[str, Any]] = {}
        for row in rows:
            key = (row[TASK_INDEX_KEY_NAME], row[ROLLOUT_INDEX_KEY_NAME])
            if key in indexed:
                raise ValueError(f"Duplicate {what} row for rollout key {key}")
            indexed[key] = row
        return indexed

    def align_rows_and_results(
        self, rows: list[dict[str, Any]], results: list[dict[str, Any]], allow_partial_rollouts: bool = False
    ) -> list[tuple[dict[str, Any], dict[str, Any]]]:
        """``(input row, result)`` pairs by rollout key, in key order. A result without an input is an error; an
        input without a result too, unless ``allow_partial_rollouts``."""
        inputs, outputs = self._by_key(rows, "materialized input"), self._by_key(results, "result")
        extra = sorted(outputs.keys() - inputs.keys())
        if extra:
            raise ValueError(f"{len(extra)} rollout results have no materialized input row, e.g. {extra[:10]}")
        missing = sorted(inputs.keys() - outputs.keys())
        if missing and not allow_partial_rollouts:
            raise ValueError(
                f"{len(missing)} materialized input rows have no rollout result, e.g. {missing[:10]}; "
                "++allow_partial_rollouts=True profiles the completed ones"
            )
        return [(inputs[key], outputs[key]) for key in sorted(inputs.keys() & outputs.keys())]

    def profile_completion_summary(self, rows: list[dict[str, Any]], results: list[dict[str, Any]]) -> dict[str, Any]:
        """How complete a collection is, by rollout and by input row (a task of one agent)."""
        inputs, outputs = self._by_key(rows, "materialized input"), self._by_key(results, "result")
        done = inputs.keys() & outputs.keys()

        def group(key: tuple[Any, Any]) -> tuple[Any, Any]:
            ref = inputs[key].get("agent_ref")
            return key[0], ref.get("name") if isinstance(ref, dict) else ref

        expected, completed = Counter(group(k) for k in inputs), Counter(group(k) for k in done)
        complete = sum(1 for g, n in expected.items() if completed[g] == n)
        partial = sum(1 for g, n in expected.items() if 0 < completed[g] < n)
        return {
            "expected_rollout_rows": len(inputs),
            "completed_rollout_rows": len(done),
            "missing_rollout_rows": len(inputs) - len(done),
            "extra_rollout_rows": len(outputs.keys() - inputs.keys()),
            "reward_profile_completion_pct": 100.0 * len(done) / len(inputs) if inputs else 100.0,
            "total_input_rows": len(expected),
            "complete_input_rows": complete,
            "partial_input_rows": partial,
            "missing_input_rows": len(expected) - complete - partial,
        }

    def rollout_info_from_result(self, result: dict[str, Any]) -> dict[str, Any]:
        """One rollout's identity and numbers: its reward, its response's token usage and every other top-level
        number (booleans as 0/1). Fields starting with ``_`` are bookkeeping, not metrics, and are left out."""
        task, rollout = result[TASK_INDEX_KEY_NAME], result[ROLLOUT_INDEX_KEY_NAME]
        info: dict[str, Any] = {
            "rollout_id": f"{task}:{rollout}",
            TASK_INDEX_KEY_NAME: task,
            ROLLOUT_INDEX_KEY_NAME: rollout,
        }
        if "reward" in result:
            info["reward"] = result["reward"]
        response = result.get("response")
        usage = (response.get("usage") if isinstance(response, dict) else None) or {}
        fields = [
            *usage.items(),
            *((k, v) for k, v in result.items() if not k.startswith("_") and k not in ("reward", "response")),
        ]
        for key, value in fields:
            if isinstance(value, bool):
                info[key] = int(value)
            elif isinstance(value, (int, float)):
                info[key] = value
        return info
