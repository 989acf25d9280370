"""One real rollout: instruction_following, a simple_agent and the scripted model as separate processes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nemo_gym.testing import scripted_rollout

HERE = Path(__file__).parents[1]
REPLY = (
    "<<Ladder Request>>\nHi Tomas! Could I borrow your ladder on Saturday morning? I will bring it back by lunch."
    "\n\nP.S. Thank you so much."
)


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_scripted_reply_follows_every_instruction(tmp_path):
    row = json.loads((HERE / "data" / "example.jsonl").read_text().splitlines()[0])
    script = [[{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": REPLY}]}]]
    rollout = scripted_rollout(
        tmp_path, HERE / "configs" / "instruction_following.yaml", "instruction_following_simple_agent", script, row
    )
    assert rollout["reward"] == 1.0
    assert rollout["follow_instruction_list"] == [True, True, True, True]
