"""One real rollout: tool_call_match, a non-executing simple_agent and the scripted model as separate processes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nemo_gym.testing import scripted_rollout

HERE = Path(__file__).parents[1]


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_scripted_parallel_calls_are_judged_without_being_run(tmp_path):
    row = json.loads((HERE / "data" / "example.jsonl").read_text().splitlines()[1])  # two forecasts, any order
    calls = [
        {"type": "function_call", "name": c["name"], "arguments": json.dumps(c["arguments"])}
        for c in reversed(row["expected_calls"])
    ]
    rollout = scripted_rollout(
        tmp_path, HERE / "configs" / "tool_call_match.yaml", "tool_call_match_simple_agent", [calls], row
    )
    assert (rollout["reward"], rollout["name_match"], rollout["args_match"]) == (1.0, 1.0, 1.0)
    assert [item["type"] for item in rollout["response"]["output"]] == ["function_call", "function_call"]  # never run
