"""One real rollout: blackjack, gymnasium_agent and the scripted model as separate processes (shared venv)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nemo_gym.testing import scripted_rollout
from resources_servers.blackjack.app import ACTION_TOOL

HERE = Path(__file__).parents[1]


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_a_scripted_player_hits_then_stands_and_wins(tmp_path):
    row = json.loads((HERE / "data" / "example.jsonl").read_text().splitlines()[0])  # seed 3: 4, 9 against a 10
    script = [
        [{"type": "function_call", "name": ACTION_TOOL, "arguments": json.dumps({"action": action})}]
        for action in ("hit", "stand")
    ]
    rollout = scripted_rollout(tmp_path, HERE / "configs" / "blackjack.yaml", "blackjack_gymnasium_agent", script, row)
    assert (rollout["reward"], rollout["terminated"], rollout["info"]["result"]) == (1.0, True, "win")
    assert [item["type"] for item in rollout["response"]["output"]] == ["function_call", "function_call_output"] * 2
