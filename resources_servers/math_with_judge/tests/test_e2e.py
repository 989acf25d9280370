"""One real rollout: math_with_judge (with its worker pool), simple_agent and the scripted model as separate
processes (shared venv)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nemo_gym.testing import scripted_rollout

HERE = Path(__file__).parents[1]


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_a_scripted_equivalent_answer_earns_reward_one(tmp_path):
    row = json.loads((HERE / "data" / "example.jsonl").read_text().splitlines()[1])  # gold \frac{1}{6}
    answer = "There are 6 ways out of 36, so the probability is \\boxed{6/36}."
    script = [[{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": answer}]}]]
    config = HERE / "configs" / "math_with_judge.yaml"
    rollout = scripted_rollout(tmp_path, config, "math_with_judge_simple_agent", script, row)
    assert (rollout["reward"], rollout["library_reward"], rollout["timed_out"]) == (1.0, 1.0, False)
    assert rollout["extracted_answer"] and rollout["expected_answer"] == "\\frac{1}{6}"
