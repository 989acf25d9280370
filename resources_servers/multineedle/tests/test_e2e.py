"""One real rollout: multineedle, simple_agent and the scripted model as separate processes (shared venv)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nemo_gym.testing import scripted_rollout

HERE = Path(__file__).parents[1]


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_a_scripted_answer_naming_every_needle_gets_reward_one(tmp_path):
    row = json.loads((HERE / "data" / "example.jsonl").read_text().splitlines()[0])
    answer = json.dumps({needle["key"]: needle["value"] for needle in row["needles"]})
    script = [[{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": answer}]}]]
    rollout = scripted_rollout(tmp_path, HERE / "configs" / "multineedle.yaml", "multineedle_simple_agent", script, row)
    assert (rollout["reward"], rollout["all_found"], rollout["answer_format"]) == (1.0, True, "json")
