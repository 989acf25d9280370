"""Per-category shares and rewards (result codes, subsets) for /aggregate_metrics."""

from __future__ import annotations

import pytest

from nemo_gym.metrics import category_metrics


def test_category_metrics_share_and_mean_reward():
    rows = [
        {"result": "passed", "reward": 1.0},
        {"result": "passed", "reward": 1.0},
        {"result": "timeout", "reward": 0.0},
        {"reward": 0.5},
    ]
    metrics = category_metrics(rows, "result")
    assert metrics["result/passed/share"] == pytest.approx(0.5)
    assert metrics["result/passed/mean_reward"] == 1.0
    assert metrics["result/timeout/mean_reward"] == 0.0
    assert metrics["result/none/share"] == pytest.approx(0.25)
    assert category_metrics([], "result") == {}
