"""One real rollout in tool-call mode: structured_outputs acknowledges the submission tool, then grades the call."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nemo_gym.testing import scripted_rollout

HERE = Path(__file__).parents[1]
CONTACT = {"full_name": "Priya Raman", "email": "priya.raman@halden-instruments.example", "phone": None,
           "company": "Halden Instruments"}  # fmt: skip


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_scripted_tool_call_submission_validates(tmp_path):
    row = json.loads((HERE / "data" / "example.jsonl").read_text().splitlines()[4])
    assert row["response_mode"] == "tool_call"
    script = [
        [{"type": "function_call", "name": "submit_contact", "arguments": json.dumps({"contact": CONTACT})}],
        [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Submitted."}]}],
    ]
    rollout = scripted_rollout(
        tmp_path, HERE / "configs" / "structured_outputs.yaml", "structured_outputs_simple_agent", script, row
    )
    assert (rollout["reward"], rollout["error_type"], rollout["payload_source"]) == (1.0, None, "tool_call")
    types = [item["type"] for item in rollout["response"]["output"]]
    assert types == ["function_call", "function_call_output", "message"]
    assert json.loads(rollout["response"]["output"][1]["output"])["status"] == "recorded"
