"""majority@k and no_answer over an extracted-answer field, and how aggregate_verify_responses reports them."""

from __future__ import annotations

import pytest

from nemo_gym.metrics import aggregate_verify_responses, group_by_task, majority_metrics


def rows(*tasks: list[tuple[str | None, float]]) -> list[dict]:
    return [
        {"_ng_task_index": t, "_ng_rollout_index": r, "extracted_answer": answer, "reward": reward}
        for t, task in enumerate(tasks)
        for r, (answer, reward) in enumerate(task)
    ]


def test_majority_at_k_per_task_then_averaged():
    data = rows([("7", 0.0), ("8", 1.0), ("8", 1.0), ("7", 0.0)], [("x", 1.0), (None, 0.0), ("", 0.0), ("y", 0.0)])
    metrics = majority_metrics(group_by_task(data), "extracted_answer")
    assert metrics["majority@1"] == pytest.approx((0.0 + 1.0) / 2)
    assert metrics["majority@2"] == pytest.approx((0.0 + 1.0) / 2)  # tie 7-8: the first seen wins
    assert metrics["majority@4"] == pytest.approx((0.0 + 1.0) / 2)  # task 0: 2-2 tie again -> 7; task 1: x-y -> x
    assert metrics["no_answer"] == pytest.approx(2 / 8)  # None and blank both count
    assert "majority@3" not in metrics


def test_unhashable_answers_are_compared_by_value():
    data = rows([([1, 2], 1.0), ([1, 2], 1.0), ([3], 0.0)])
    assert majority_metrics(group_by_task(data), "extracted_answer")["majority@2"] == 1.0


def test_aggregate_adds_majority_only_when_asked():
    data = rows([("a", 1.0), ("b", 0.0)])
    plain = aggregate_verify_responses(data)
    assert not any(k.startswith("majority@") for k in plain.agent_metrics) and "no_answer" not in plain.agent_metrics
    voted = aggregate_verify_responses(data, answer_key="extracted_answer")
    assert voted.agent_metrics["majority@2"] == 1.0 and voted.key_metrics["majority@2"] == 1.0
    assert majority_metrics({}, "extracted_answer") == {}
