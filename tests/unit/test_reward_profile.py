"""nemo_gym.reward_profile: NeMo Gym's pass@k / majority@k helpers, checked against numbers worked out by hand."""

from __future__ import annotations

import math
from typing import Any

import pytest

from nemo_gym.reward_profile import (
    add_avg_sample_std_dev,
    compute_pass_majority_metrics,
    compute_subset_metrics,
    highest_k_metrics,
)


def rollouts(*rewards: float, **fields: list[Any]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = [{"reward": r} for r in rewards]
    for name, values in fields.items():
        for row, value in zip(rows, values, strict=True):
            row[name] = value
    return rows


# Two tasks of four rollouts: A = 1 0 0 1 (2 of 4 right), B = 0 0 0 1 (1 of 4 right).
TWO_TASKS = [rollouts(1, 0, 0, 1), rollouts(0, 0, 0, 1)]


def test_pass_at_k_is_the_unbiased_estimator_averaged_over_tasks_in_percent() -> None:
    metrics, _, names, max_k = compute_pass_majority_metrics(TWO_TASKS)
    assert (names, max_k) == (["accuracy"], 4)
    # pass@1: A 1 - C(2,1)/C(4,1) = 1/2, B 1 - C(3,1)/C(4,1) = 1/4
    assert metrics["pass@1/accuracy"] == pytest.approx(100 * (1 / 2 + 1 / 4) / 2)
    # pass@2: A 1 - C(2,2)/C(4,2) = 5/6, B 1 - C(3,2)/C(4,2) = 1/2
    assert metrics["pass@2/accuracy"] == pytest.approx(100 * (5 / 6 + 1 / 2) / 2)
    # pass@3: A has fewer than 3 wrong so 1, B 1 - C(3,3)/C(4,3) = 3/4
    assert metrics["pass@3/accuracy"] == pytest.approx(87.5)
    assert metrics["pass@4/accuracy"] == 100.0


def test_avg_of_k_uses_the_first_k_rollouts() -> None:
    metrics = compute_pass_majority_metrics(TWO_TASKS)[0]
    assert metrics["pass@1[avg-of-1]/accuracy"] == 50.0  # first rollouts: A 1, B 0
    assert metrics["pass@1[avg-of-2]/accuracy"] == 25.0  # A 1/2, B 0
    assert metrics["pass@1[avg-of-3]/accuracy"] == pytest.approx(100 / 6)  # A 1/3, B 0
    assert metrics["pass@1[avg-of-4]/accuracy"] == 37.5  # A 1/2, B 1/4


def test_spread_across_runs_is_the_sample_std_of_per_run_scores() -> None:
    metrics = compute_pass_majority_metrics(TWO_TASKS)[0]
    # run i = every task's i-th rollout: (1+0)/2, (0+0)/2, (0+0)/2, (1+1)/2
    assert metrics["per_sample_aggregate"] == {"accuracy": [50.0, 0.0, 0.0, 100.0]}
    # first two runs 50, 0: mean 25, variance (25² + 25²) / 1 = 1250
    assert metrics["pass@1[avg-of-2]/accuracy/std_dev_across_runs"] == pytest.approx(math.sqrt(1250))
    assert metrics["pass@1[avg-of-2]/accuracy/std_err_across_runs"] == pytest.approx(25.0)
    # all four runs: mean 37.5, squared deviations 156.25 + 1406.25 + 1406.25 + 3906.25 = 6875, over n - 1 = 3
    assert metrics["pass@1[avg-of-4]/accuracy/std_dev_across_runs"] == pytest.approx(math.sqrt(6875 / 3))
    assert metrics["pass@1[avg-of-4]/accuracy/std_err_across_runs"] == pytest.approx(math.sqrt(6875 / 3) / 2)
    assert not any(key.startswith("pass@1[avg-of-1]/accuracy/") for key in metrics)  # one run has no spread


def test_key_order_follows_k_then_score_then_statistic() -> None:
    metrics = compute_pass_majority_metrics([rollouts(1, 0, answer=["a", "b"])], answer_key="answer")[0]
    assert list(metrics) == [
        "pass@1/accuracy", "pass@1[avg-of-1]/accuracy", "majority@1/accuracy",
        "pass@1/no_answer", "pass@1[avg-of-1]/no_answer", "majority@1/no_answer",
        "pass@2/accuracy", "pass@1[avg-of-2]/accuracy", "majority@2/accuracy",
        "pass@2/no_answer", "pass@1[avg-of-2]/no_answer", "majority@2/no_answer",
        "per_sample_aggregate",
        "pass@1[avg-of-2]/accuracy/std_dev_across_runs", "pass@1[avg-of-2]/accuracy/std_err_across_runs",
        "pass@1[avg-of-2]/no_answer/std_dev_across_runs", "pass@1[avg-of-2]/no_answer/std_err_across_runs",
    ]  # fmt: skip


def test_majority_votes_on_answer_and_score_pairs_and_averages_ties() -> None:
    tasks = [
        rollouts(1, 1, 0, 0, answer=["4", "4", "5", None]),  # "4" (right) wins from k = 2 on
        rollouts(0, 1, 0, 0, answer=["x", "y", "y", "z"]),  # k=2: tie x/y -> 1/2; k=3: ("y",1) and ("y",0) differ
        rollouts(0, 0, 0, 0, answer=[None, None, None, None]),  # no answer at all: 0
    ]
    metrics = compute_pass_majority_metrics(tasks, answer_key="answer")[0]
    assert metrics["majority@1/accuracy"] == pytest.approx(100 * (1 + 0 + 0) / 3)
    assert metrics["majority@2/accuracy"] == pytest.approx(100 * (1 + 0.5 + 0) / 3)
    # k=3, task 2: pairs (x,0) (y,1) (y,0) are all seen once, so the tie averages 0, 1, 0
    assert metrics["majority@3/accuracy"] == pytest.approx(100 * (1 + 1 / 3 + 0) / 3)
    # no_answer is a 0/1 score like any other: 1 of 4, 0 of 4, 4 of 4 rollouts unanswered
    assert metrics["pass@1[avg-of-4]/no_answer"] == pytest.approx(100 * (1 / 4 + 0 + 1) / 3)
    assert metrics["per_sample_aggregate"]["no_answer"] == pytest.approx([100 / 3, 100 / 3, 100 / 3, 200 / 3])


def test_an_empty_answer_is_an_answer_only_none_is_not() -> None:
    metrics = compute_pass_majority_metrics([rollouts(1, answer=[""])], answer_key="answer")[0]
    assert metrics["pass@1/no_answer"] == 0.0 and metrics["majority@1/accuracy"] == 100.0


def test_continuous_scores_take_the_best_of_the_first_k_and_custom_score_functions() -> None:
    tasks = [rollouts(0.2, 0.9, 0.5, ok=[True, False, True])]
    metrics, scores, names, _ = compute_pass_majority_metrics(
        tasks, score_fn=lambda r: {"partial": r["reward"], "ok": r["ok"]}
    )
    assert names == ["ok", "partial"] and scores == [[{"partial": 0.2, "ok": 1}, {"partial": 0.9, "ok": 0},
                                                      {"partial": 0.5, "ok": 1}]]  # fmt: skip
    assert [metrics[f"pass@{k}/partial"] for k in (1, 2, 3)] == pytest.approx([20.0, 90.0, 90.0])
    assert metrics["pass@1/ok"] == pytest.approx(100 * 2 / 3)  # booleans are a 0/1 score: the estimator applies


def test_tasks_with_fewer_rollouts_drop_out_of_larger_k_only() -> None:
    metrics = compute_pass_majority_metrics([rollouts(1, 1), rollouts(0)])[0]
    assert metrics["pass@1/accuracy"] == 50.0
    assert metrics["pass@2/accuracy"] == 100.0  # only the task with two rollouts counts
    assert metrics["pass@1[avg-of-2]/accuracy"] == 50.0  # the short task still counts with what it has


def test_no_tasks() -> None:
    assert compute_pass_majority_metrics([]) == ({}, [], [], 0)


def test_avg_sample_std_dev_is_the_mean_spread_within_tasks() -> None:
    metrics, scores, names, max_k = compute_pass_majority_metrics(TWO_TASKS)
    add_avg_sample_std_dev(metrics, scores, names, max_k)
    # k=2: A [1, 0] has sample std sqrt(1/2), B [0, 0] has 0. Not a percentage.
    assert metrics["pass@1[avg-of-2]/accuracy/avg_sample_std_dev"] == pytest.approx(math.sqrt(0.5) / 2)
    # k=4: A [1,0,0,1] variance 1/3; B [0,0,0,1] variance (3 * 1/16 + 9/16) / 3 = 1/4
    assert metrics["pass@1[avg-of-4]/accuracy/avg_sample_std_dev"] == pytest.approx((math.sqrt(1 / 3) + 0.5) / 2)
    untouched: dict[str, Any] = {}
    add_avg_sample_std_dev(untouched, scores, names, 1)
    assert untouched == {}


def test_subset_metrics_group_by_the_first_rollouts_field() -> None:
    tasks = [
        rollouts(1, 1, difficulty=["easy", "easy"]),
        rollouts(0, 1, difficulty=["hard", "hard"]),
        rollouts(1, 1, difficulty=["", ""]),  # no subset: left out
        rollouts(0, 0),
    ]
    metrics = compute_subset_metrics(tasks, "difficulty")
    assert metrics["easy/pass@1/accuracy"] == 100.0
    assert metrics["hard/pass@1/accuracy"] == 50.0 and metrics["hard/pass@2/accuracy"] == 100.0
    assert not any(key.endswith("per_sample_aggregate") for key in metrics)
    assert {key.split("/")[0] for key in metrics} == {"easy", "hard"}


def test_highest_k_picks_the_largest_k_and_skips_spread_statistics() -> None:
    metrics = compute_pass_majority_metrics(TWO_TASKS, answer_key="reward")[0]
    assert highest_k_metrics(metrics, "pass@{k}") == {"pass@4/accuracy": 100.0, "pass@4/no_answer": 0.0}
    assert highest_k_metrics(metrics, "pass@{k}", exclude_names=["no_answer"]) == {"pass@4/accuracy": 100.0}
    assert highest_k_metrics(metrics, "pass@1[avg-of-{k}]", score_names=["accuracy"]) == {
        "pass@1[avg-of-4]/accuracy": 37.5
    }
    assert set(highest_k_metrics(metrics, "majority@{k}")) == {"majority@4/accuracy", "majority@4/no_answer"}
    # the largest k over all scores, not per score
    assert highest_k_metrics({"pass@2/a": 1.0, "pass@8/b": 2.0, "mean/reward": 3.0}, "pass@{k}") == {"pass@8/b": 2.0}
    assert highest_k_metrics({"mean/reward": 1.0}, "pass@{k}") == {}
    with pytest.raises(ValueError, match="placeholder"):
        highest_k_metrics(metrics, "pass@1")
