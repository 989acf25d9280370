"""Metric helpers: summary statistics, the unbiased pass@k estimator, majority@k, per-task groups."""

from __future__ import annotations

import itertools
import math

import pytest

from nemo_gym.metrics import aggregate_verify_responses, majority_at_k, pass_at_k, summarize


def test_pass_at_k_matches_the_closed_form():
    assert pass_at_k(5, 2, 2) == pytest.approx(1 - math.comb(3, 2) / math.comb(5, 2))  # 0.7
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7)
    assert pass_at_k(4, 0, 2) == 0.0 and pass_at_k(4, 3, 2) == 1.0 and pass_at_k(4, 1, 1) == 0.25


def test_pass_at_k_equals_the_probability_over_all_draws():
    outcomes = [1, 0, 0, 1, 0, 0]
    for k in range(1, 7):
        draws = list(itertools.combinations(outcomes, k))
        assert pass_at_k(6, 2, k) == pytest.approx(sum(any(d) for d in draws) / len(draws))


def test_pass_at_k_rejects_impossible_k():
    with pytest.raises(ValueError):
        pass_at_k(3, 1, 4)


def test_majority_at_k():
    assert majority_at_k(["a", "b", "a", "c"], [1.0, 0.0, 1.0, 0.0], 4) == 1.0
    assert majority_at_k(["b", "a", "a"], [0.0, 1.0, 1.0], 1) == 0.0
    assert majority_at_k([None, None], [1.0, 1.0], 2) == 0.0


def test_summarize():
    stats = summarize([1.0, 2.0, 3.0, 4.0], "reward")
    assert stats == {"mean/reward": 2.5, "max/reward": 4.0, "min/reward": 1.0, "median/reward": 2.5,
                     "std/reward": pytest.approx(math.sqrt(1.25))}  # fmt: skip


def test_aggregate_by_task_with_usage():
    rows = [
        {"_ng_task_index": 0, "_ng_rollout_index": 0, "reward": 1.0, "response": {"usage": {"output_tokens": 10}}},
        {"_ng_task_index": 0, "_ng_rollout_index": 1, "reward": 0.0, "response": {"usage": {"output_tokens": 20}}},
        {"_ng_task_index": 1, "_ng_rollout_index": 0, "reward": 0.0},
        {"_ng_task_index": 1, "_ng_rollout_index": 1, "reward": 0.0},
    ]
    metrics = aggregate_verify_responses(rows)
    assert metrics.agent_metrics["mean/reward"] == 0.25
    assert metrics.agent_metrics["pass@1"] == 0.25 and metrics.agent_metrics["pass@2"] == 0.5
    assert metrics.agent_metrics["mean/usage/output_tokens"] == 15
    assert [g["mean/reward"] for g in metrics.group_level_metrics] == [0.5, 0.0]
    assert metrics.key_metrics["mean/reward"] == 0.25


def test_per_task_metrics_share_their_key_strings():
    """Thousands of tasks each carry the same ~20 statistic names: one string each, not one per task."""
    rows = [
        {"_ng_task_index": task, "reward": 1.0, "response": {"usage": {"input_tokens": 3, "total_tokens": 4}}}
        for task in range(3)
    ]
    first, *others = aggregate_verify_responses(rows).group_level_metrics
    assert "mean/usage/input_tokens" in first
    for other in others:
        assert other == first | {"_ng_task_index": other["_ng_task_index"]}
        assert all(a is b for a, b in zip(first, other, strict=True))


def test_the_aggregate_is_what_validating_it_gives():
    """Built without validation (it would only copy every per-task dict): the same model as a validated one."""
    from nemo_gym.metrics import AggregateMetrics

    rows = [{"_ng_task_index": task % 2, "reward": float(task % 3 == 0)} for task in range(6)]
    built = aggregate_verify_responses(rows)
    validated = AggregateMetrics.model_validate(built.model_dump())
    assert built == validated and built.model_fields_set == validated.model_fields_set
    assert built.model_dump_json() == validated.model_dump_json()


def test_failed_repeats_keep_pass_at_k_over_the_tasks_that_have_k_and_say_how_many_are_left_out():
    """4 repeats per task; task 1 lost one to a failure, task 2 three (failures are never scored)."""
    scored = {0: {0: 1.0, 1: 0.0, 2: 0.0, 3: 1.0}, 1: {0: 1.0, 1: 1.0, 2: 0.0}, 2: {3: 0.0}}
    rows = [
        {"_ng_task_index": task, "_ng_rollout_index": repeat, "reward": reward, "answer": str(reward)}
        for task, repeats in scored.items()
        for repeat, reward in repeats.items()
    ]
    metrics = aggregate_verify_responses(rows, answer_key="answer").agent_metrics
    assert metrics["pass@1"] == pytest.approx((2 / 4 + 2 / 3 + 0) / 3)
    assert metrics["pass@2"] == pytest.approx((pass_at_k(4, 2, 2) + pass_at_k(3, 2, 2)) / 2)  # tasks 0 and 1
    assert metrics["pass@2/tasks_left_out"] == 1
    assert metrics["pass@4"] == 1.0 and metrics["pass@4/tasks_left_out"] == 2  # task 0 only
    assert "pass@1/tasks_left_out" not in metrics
    assert metrics["pass@1[avg-of-4]"] == pytest.approx((2 / 4 + 2 / 3 + 0) / 3)  # N stays the run's repeats
    assert not [key for key in metrics if key.startswith("pass@1[avg-of-") and key != "pass@1[avg-of-4]"]
    assert set(key for key in metrics if key.startswith("majority@")) == {"majority@1", "majority@2", "majority@4"}
    assert metrics["majority@4"] == 1.0  # task 0: a tie between "1.0" and "0.0", the first seen wins


def test_without_failures_there_is_nothing_left_out():
    rows = [{"_ng_task_index": t, "_ng_rollout_index": r, "reward": float(r == 0)} for t in range(2) for r in range(2)]
    metrics = aggregate_verify_responses(rows).agent_metrics
    assert metrics["pass@2"] == 1.0 and metrics["pass@1[avg-of-2]"] == 0.5
    assert not [key for key in metrics if "left_out" in key]
