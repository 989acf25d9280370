"""A scored rollout through the adapter: ``gym eval run`` on the weather environment, with the replay of recorded
Anthropic traffic as the policy's endpoint. Two tasks (Paris, Tokyo), two Messages calls each: a tool call, then
the answer after the tool's result. Every call must match a recording, so a reward of 1 on both rows means the
agent, the adapter and the Messages wire format agree end to end.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from nemo_gym.testing import eval_run
from responses_api_models.anthropic_model.tests.conftest import Replay

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).parents[3]
WEATHER = "example_single_tool_call"


def test_gym_eval_run_scores_rollouts_through_the_adapter(replay: Replay, tmp_path: Path) -> None:
    rows = eval_run(
        tmp_path, "--resources-server", WEATHER, "--model-type", "anthropic_model", "--agent", f"{WEATHER}_simple_agent",
        "--input", str(ROOT / "resources_servers" / WEATHER / "data" / "example.jsonl"), "--limit", "2",
        f"+policy_base_url={replay.url}", f"+policy_api_key={replay.api_key}", f"+policy_model_name={replay.model}",
    )  # fmt: skip
    assert len(rows) == 2 and all(row["reward"] == 1.0 for row in rows)
    for row in rows:
        assert [item["type"] for item in row["response"]["output"]] == [
            "message", "function_call", "function_call_output", "message"
        ]  # fmt: skip
    served = replay.report()["served"]
    assert set(served) == {
        f"weather_{city}_{turn}" for city in ("paris", "tokyo") for turn in ("1_tool_use", "2_answer")
    }
    assert replay.report()["mismatches"] == []
