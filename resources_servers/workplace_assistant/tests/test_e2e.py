"""One real rollout: workplace_assistant, simple_agent and the scripted model as separate processes (shared venv)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nemo_gym.testing import scripted_rollout

HERE = Path(__file__).parents[1]


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_a_scripted_assistant_looks_up_the_email_then_replies(tmp_path):
    row = json.loads((HERE / "data" / "example.jsonl").read_text().splitlines()[0])  # reply about the server migration
    reply = json.loads(row["ground_truth"][0]["arguments"])
    script = [
        [{"type": "function_call", "name": "email_search", "arguments": json.dumps({"query": "server migration"})}],
        [{"type": "function_call", "name": "email_reply", "arguments": json.dumps(reply)}],
        [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Replied."}]}],
    ]
    config = HERE / "configs" / "workplace_assistant.yaml"
    rollout = scripted_rollout(tmp_path, config, "workplace_assistant_simple_agent", script, row)
    assert (rollout["reward"], rollout["differing_tables"], rollout["num_failed_calls"]) == (1.0, [], 0)
    outputs = [item for item in rollout["response"]["output"] if item["type"] == "function_call_output"]
    assert json.loads(outputs[0]["output"])[0]["email_id"] == reply["email_id"]  # the live tool found the row's email
