"""The health-check benchmark's rollouts are what it claims: rows ``gym eval run`` would write with capture on, clean
but for the problems it plants (one rollout in 50 with a hollow last turn, one in 50 whose last call failed)."""

from __future__ import annotations

from pathlib import Path

from benchmarks.performance.health_check.rollouts import write_rollouts
from nemo_gym.rollout_health import run_health_checks


def test_the_benchmark_rows_are_checked_and_only_the_planted_problems_found(tmp_path: Path) -> None:
    path = tmp_path / "rollouts.jsonl"
    write_rollouts(path, 100)
    run = run_health_checks(path, workers=1).summary["run"]
    assert run["verdicts"] == {"healthy": 96, "unhealthy": 4, "unobserved": 0}
    assert {check: n for check, n in run["issues"].items() if n} == {
        "agent_turn_hollow": 2,
        "model_call_failed": 2,
        "rollout_ended_on_failed_model_call": 2,
    }
    assert run["artifacts"]["captures"] == 100
