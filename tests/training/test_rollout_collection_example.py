"""docs/examples/rollout_collection_helper.py runs as docs/training.md tells a user to run it: the servers of
``gym env start --resources-server example_single_tool_call --model-type scripted_model`` (its launcher, in this
process), and the example in a process of its own, finding the servers through the head server and the run's token
through the token file the launcher wrote.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from nemo_gym import INSTALL_DIR
from nemo_gym.launcher import running_servers
from nemo_gym.transport import access

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

EXAMPLE = INSTALL_DIR / "docs" / "examples" / "rollout_collection_helper.py"
WEATHER = INSTALL_DIR / "resources_servers" / "example_single_tool_call"
SCRIPTED = INSTALL_DIR / "responses_api_models" / "scripted_model" / "configs" / "scripted_model.yaml"
HANG_GUARD_S = 120


def test_the_nemo_rl_example_collects_a_scored_batch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(access.TOKEN_DIR_ENV_VAR, str(tmp_path / "tokens"))  # the launcher's and the example's
    monkeypatch.delenv(access.TOKEN_ENV_VAR, raising=False)
    overrides = [
        f"+config_paths=[{WEATHER / 'configs' / 'example_single_tool_call.yaml'},{SCRIPTED}]", "+shared_venv=true",
        "+head_server={port: 0}", f"+results_dir={tmp_path / 'results'}", f"+cache_dir={tmp_path / 'cache'}",
    ]  # fmt: skip
    with running_servers(overrides) as launcher:
        example = subprocess.run(
            [sys.executable, str(EXAMPLE), "--input", str(WEATHER / "data" / "example.jsonl"),
             "--agent", "example_single_tool_call_simple_agent", "--head-server",
             launcher.head_url.removeprefix("http://"), "--group-size", "2", "--limit", "3"],
            cwd=INSTALL_DIR, env=dict(os.environ), capture_output=True, text=True, timeout=HANG_GUARD_S,
        )  # fmt: skip

    assert example.returncode == 0, example.stdout + example.stderr
    *entries, summary = example.stdout.strip().splitlines()
    scored = [json.loads(entry) for entry in entries]
    assert summary == "6 rollouts, 0 failed [], mean reward 1.000"
    assert sorted(entry["group"] for entry in scored) == [0, 0, 1, 1, 2, 2]
    # the scripted model calls get_weather, then answers: reward 1, so each group's advantage is 0
    assert all(e == {**e, "reward": 1.0, "advantage": 0.0, "tool_calls": 1, "generated_items": 2} for e in scored)
    assert "Traceback" not in example.stderr and "Unclosed" not in example.stderr, example.stderr
