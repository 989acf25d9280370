"""One real rollout: mcqa, simple_agent and the scripted model as separate processes (shared venv)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nemo_gym.testing import scripted_rollout

HERE = Path(__file__).parents[1]


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_a_scripted_boxed_letter_earns_reward_one(tmp_path):
    row = json.loads((HERE / "data" / "example.jsonl").read_text().splitlines()[0])  # gold B, strict boxed mode
    answer = "Nitrogen is about 78% of the air, oxygen about 21%.\n\\boxed{B}"
    script = [[{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": answer}]}]]
    rollout = scripted_rollout(tmp_path, HERE / "configs" / "mcqa.yaml", "mcqa_simple_agent", script, row)
    assert (rollout["reward"], rollout["extracted_answer"], rollout["expected_answer"]) == (1.0, "B", "B")
    assert rollout["uuid"] == row["uuid"] and rollout["response"]["output"][-1]["type"] == "message"
