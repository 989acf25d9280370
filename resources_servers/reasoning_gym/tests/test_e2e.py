"""One real rollout: reasoning_gym (with its scorer pool), simple_agent and the scripted model as separate processes
(shared venv)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nemo_gym.testing import scripted_rollout

HERE = Path(__file__).parents[1]


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_a_scripted_tagged_answer_earns_reward_one(tmp_path):
    row = json.loads((HERE / "data" / "example.jsonl").read_text().splitlines()[0])  # leg_counting
    answer = f"Counting legs animal by animal.\n<answer>{row['answer']}</answer>"
    script = [[{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": answer}]}]]
    config = HERE / "configs" / "reasoning_gym.yaml"
    rollout = scripted_rollout(tmp_path, config, "reasoning_gym_simple_agent", script, row)
    assert (rollout["reward"], rollout["task_name"], rollout["extracted_answer"]) == (
        1.0,
        "leg_counting",
        row["answer"],
    )
