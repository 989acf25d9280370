"""pass@k, majority@k and run-to-run spread over rollouts grouped by task, under NeMo Gym's public name.

Environments call these from their ``compute_metrics(tasks)`` override (``tasks[i]`` is the list of verify responses
of task ``i``) and from ``get_key_metrics``. The key names and the numbers are the ones NeMo Gym reports, so a
benchmark scored here compares with the same benchmark scored there:

* ``pass@{k}/{score}``: the unbiased pass@k estimator for a 0/1 score (over all of a task's rollouts), the best of
  the first k rollouts for any other score;
* ``pass@1[avg-of-{k}]/{score}``: the mean score of the first k rollouts;
* ``majority@{k}/{score}`` (with ``answer_key``): the score of the most frequent (answer, score) pair among the first
  k rollouts that have an answer, averaged over the pairs tied for most frequent; 0 for a task with no answer at all;
* ``pass@1[avg-of-{k}]/{score}/std_dev_across_runs`` and ``.../std_err_across_runs``: the sample standard deviation
  (and its standard error) of the per-run scores ``per_sample_aggregate[score][i]`` (run ``i`` = every task's i-th
  rollout) over the first k runs.

Every value is averaged over tasks and is a percentage (0-100). With ``answer_key`` a 0/1 ``no_answer`` score (the
answer is ``None``) is added to every rollout and gets the same treatment as the other scores.

The default ``/aggregate_metrics`` statistics (``mean/reward``, ...) are in :mod:`nemo_gym.metrics`; the pass@k
estimator is shared with it. NeMo Gym 0.7's hooks and entry points live there too and are offered here under their
0.7 names: ``AggregateMetricsMixin`` (``compute_metrics`` / ``compute_repeat_metrics`` / ``get_key_metrics``),
``compute_aggregate_metrics`` (a server's ``/aggregate_metrics`` computed from outside it) and ``RewardProfiler``.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any

from nemo_gym.metrics import AggregateMetricsMixin, RewardProfiler, compute_aggregate_metrics
from nemo_gym.metrics import pass_at_k as _pass_at_k

__all__ = [
    "AggregateMetricsMixin",
    "RewardProfiler",
    "add_avg_sample_std_dev",
    "compute_aggregate_metrics",
    "compute_pass_majority_metrics",
    "compute_subset_metrics",
    "highest_k_metrics",
]

_ScoreFn = Callable[[dict[str, Any]], Mapping[str, Any]]
"""Maps one verify response to named scores (booleans count as 0/1), e.g. ``{"accuracy": r["reward"]}``."""

_NO_ANSWER = "no_answer"
_PER_SAMPLE_AGGREGATE = "per_sample_aggregate"
_STAT_SUFFIXES = ("std_dev_across_runs", "std_err_across_runs", "avg_sample_std_dev")
"""Suffixes of the spread statistics, which :func:`highest_k_metrics` never selects."""

_TaskScores = list[dict[str, float]]


def _accuracy(rollout: dict[str, Any]) -> dict[str, Any]:
    return {"accuracy": rollout["reward"]}


def _vote(answer: Any) -> Hashable:
    """An answer as a vote: itself when hashable, else its repr (a list answer must not crash the count)."""
    try:
        hash(answer)
    except TypeError:
        return repr(answer)
    return answer


def _sample_std(values: Sequence[float]) -> float:
    """Sample (n - 1) standard deviation, computed in the same order of operations as NeMo Gym so the reported
    numbers agree to the last digit."""
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def _score_tasks(
    tasks: Sequence[Sequence[dict[str, Any]]], score_fn: _ScoreFn, answer_key: str | None
) -> tuple[list[_TaskScores], list[list[Any]]]:
    """Each rollout's named scores (booleans as ints, ``no_answer`` added with an answer key), and its answers."""
    scores: list[_TaskScores] = []
    answers: list[list[Any]] = []
    for rollouts in tasks:
        task_scores: _TaskScores = []
        task_answers: list[Any] = []
        for rollout in rollouts:
            named = {
                name: int(value) if isinstance(value, bool) else value for name, value in score_fn(rollout).items()
            }
            if answer_key is not None:
                answer = rollout.get(answer_key)
                named[_NO_ANSWER] = int(answer is None)
                task_answers.append(answer)
            task_scores.append(named)
        scores.append(task_scores)
        answers.append(task_answers)
    return scores, answers


def _values(task_scores: _TaskScores, name: str) -> list[float]:
    return [s[name] for s in task_scores if name in s]


def _task_pass_at_k(values: list[float], k: int) -> float | None:
    """One task's pass@k, or None when it has fewer than k scores."""
    if not values or k > len(values):
        return None
    if all(v in (0, 1) for v in values):
        return _pass_at_k(len(values), sum(1 for v in values if v), k)
    return max(values[:k])


def _task_majority_at_k(task_scores: _TaskScores, answers: list[Any], name: str, k: int) -> float:
    votes = Counter(
        (_vote(answer), s[name])
        for answer, s in zip(answers[:k], task_scores[:k], strict=True)
        if answer is not None and name in s
    )
    if not votes:
        return 0.0
    top = max(votes.values())
    tied = [score for (_, score), count in votes.items() if count == top]
    return sum(tied) / len(tied)


def _percent_mean(values: Sequence[float]) -> float:
    return 100.0 * sum(values) / len(values)


def compute_pass_majority_metrics(
    tasks: list[list[dict[str, Any]]],
    score_fn: _ScoreFn | None = None,
    answer_key: str | None = None,
) -> tuple[dict[str, Any], list[list[dict[str, float]]], list[str], int]:
    """pass@k, pass@1[avg-of-k], majority@k (with ``answer_key``) and the spread across runs, for k = 1 .. max_k.

    ``score_fn`` defaults to ``{"accuracy": reward}``. Returns ``(metrics, scores, score_names, max_k)``: the flat
    metrics (with ``per_sample_aggregate``, a mapping of score name to per-run percentages), each rollout's named
    scores per task, the sorted score names and the largest number of rollouts of a task; the last three feed
    :func:`add_avg_sample_std_dev`. No tasks: ``({}, [], [], 0)``.
    """
    if not tasks:
        return {}, [], [], 0
    scores, answers = _score_tasks(tasks, score_fn or _accuracy, answer_key)
    names = sorted({name for task_scores in scores for s in task_scores for name in s})
    max_k = max(len(rollouts) for rollouts in tasks)
    metrics: dict[str, Any] = {}
    for k in range(1, max_k + 1):
        for name in names:
            passes = [p for p in (_task_pass_at_k(_values(t, name), k) for t in scores) if p is not None]
            if passes:
                metrics[f"pass@{k}/{name}"] = _percent_mean(passes)
            firsts = [_values(t[:k], name) for t in scores]
            averages = [sum(v) / len(v) for v in firsts if v]
            if averages:
                metrics[f"pass@1[avg-of-{k}]/{name}"] = _percent_mean(averages)
            if answer_key is not None:
                majorities = [_task_majority_at_k(t, a, name, k) for t, a in zip(scores, answers, strict=True)]
                metrics[f"majority@{k}/{name}"] = _percent_mean(majorities)

    per_run: dict[str, list[float]] = {}
    for run in range(max_k):
        for name in names:
            run_scores = [t[run][name] for t in scores if run < len(t) and name in t[run]]
            if run_scores:
                per_run.setdefault(name, []).append(_percent_mean(run_scores))
    metrics[_PER_SAMPLE_AGGREGATE] = {name: per_run[name] for name in names if name in per_run}

    for k in range(2, max_k + 1):
        for name in names:
            runs = per_run.get(name, [])[:k]
            if len(runs) >= 2:
                std_dev = _sample_std(runs)
                metrics[f"pass@1[avg-of-{k}]/{name}/std_dev_across_runs"] = std_dev
                metrics[f"pass@1[avg-of-{k}]/{name}/std_err_across_runs"] = std_dev / math.sqrt(len(runs))
    return metrics, scores, names, max_k


def add_avg_sample_std_dev(
    metrics: dict[str, Any],
    all_score_dicts: list[list[dict[str, float]]],
    score_names: list[str],
    max_k: int,
) -> None:
    """Add ``pass@1[avg-of-{k}]/{score}/avg_sample_std_dev`` to ``metrics`` in place: the mean over tasks of the
    sample standard deviation of each task's first k scores (the spread within a task, where
    ``std_dev_across_runs`` is the spread between runs). Takes the last three results of
    :func:`compute_pass_majority_metrics`."""
    for k in range(2, max_k + 1):
        for name in score_names:
            spreads = [_sample_std(v) for v in (_values(t[:k], name) for t in all_score_dicts) if len(v) >= 2]
            if spreads:
                metrics[f"pass@1[avg-of-{k}]/{name}/avg_sample_std_dev"] = sum(spreads) / len(spreads)


def compute_subset_metrics(
    tasks: list[list[dict[str, Any]]],
    subset_key: str,
    score_fn: _ScoreFn | None = None,
    answer_key: str | None = None,
) -> dict[str, Any]:
    """:func:`compute_pass_majority_metrics` per subset, keyed ``{subset}/{metric}`` (e.g. ``hard/pass@1/accuracy``).

    A task's subset is ``subset_key`` of its first rollout; tasks where it is missing or empty are left out, and so
    is ``per_sample_aggregate``.
    """
    subsets: dict[Any, list[list[dict[str, Any]]]] = {}
    for rollouts in tasks:
        subset = rollouts[0].get(subset_key) if rollouts else None
        if subset:
            subsets.setdefault(subset, []).append(rollouts)
    metrics: dict[str, Any] = {}
    for subset, subset_tasks in subsets.items():
        subset_metrics = compute_pass_majority_metrics(subset_tasks, score_fn=score_fn, answer_key=answer_key)[0]
        metrics |= {f"{subset}/{key}": value for key, value in subset_metrics.items() if key != _PER_SAMPLE_AGGREGATE}
    return metrics


def highest_k_metrics(
    agent_metrics: dict[str, Any],
    pattern: str,
    score_names: list[str] | None = None,
    exclude_names: list[str] | None = None,
) -> dict[str, Any]:
    """The entries ``{pattern}/{score}`` at the largest k present, for headline (key) metrics.

    ``pattern`` has a ``{k}`` placeholder: ``"pass@{k}"``, ``"majority@{k}"``, ``"pass@1[avg-of-{k}]"``. Spread
    statistics are never selected; ``score_names`` keeps only those scores, ``exclude_names`` drops some (e.g.
    ``["no_answer"]``). Example: ``highest_k_metrics(m, "pass@{k}", score_names=["accuracy"])`` gives
    ``{"pass@8/accuracy": 91.2}`` when 8 is the largest k.
    """
    prefix, placeholder, suffix = pattern.partition("{k}")
    if not placeholder:
        raise ValueError(f"metric pattern {pattern!r} needs a {{k}} placeholder, e.g. 'pass@{{k}}'")
    key_shape = re.compile(f"^{re.escape(prefix)}(\\d+){re.escape(suffix)}/(.+)$")
    found: list[tuple[int, str]] = []
    for key in agent_metrics:
        match = key_shape.match(key)
        if match is None:
            continue
        name = match.group(2)
        if name.endswith(_STAT_SUFFIXES):
            continue
        if score_names is not None and name not in score_names:
            continue
        if exclude_names is not None and name in exclude_names:
            continue
        found.append((int(match.group(1)), key))
    if not found:
        return {}
    top = max(k for k, _ in found)
    return {key: agent_metrics[key] for k, key in found if k == top}
