"""nemo_gym.path_utils: NeMo Gym's name for where the collector writes failed rollouts."""

from __future__ import annotations

from pathlib import Path

from nemo_gym.path_utils import failures_path_for
from nemo_gym.rollouts.collector import failures_path


def test_failures_sit_next_to_the_rollouts_with_the_collectors_name(tmp_path: Path) -> None:
    output = tmp_path / "run" / "rollouts.jsonl"
    assert failures_path_for(output) == tmp_path / "run" / "rollouts_failures.jsonl" == failures_path(output)
    assert failures_path_for("results/math.v2.jsonl") == Path("results/math.v2_failures.jsonl")
