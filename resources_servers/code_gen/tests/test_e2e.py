"""One real rollout: code_gen, a simple_agent and the scripted model as separate processes (shared venv)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nemo_gym.testing import scripted_rollout

HERE = Path(__file__).parents[1]
SOLUTION = "n = int(input())\na = list(map(int, input().split()))\nprint(sum(a))\nprint(max(a))"


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_scripted_solution_passes_the_sandboxed_unit_tests(tmp_path):
    row = json.loads((HERE / "data" / "example.jsonl").read_text().splitlines()[0])
    text = f"Sum the sizes, then take the largest.\n```python\n{SOLUTION}\n```"
    reply = [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}]
    rollout = scripted_rollout(tmp_path, HERE / "configs" / "code_gen.yaml", "code_gen_simple_agent", [reply], row)
    assert (rollout["reward"], rollout["result"]) == (1.0, "passed")
    assert rollout["num_passed"] == rollout["num_tests"] == 4
