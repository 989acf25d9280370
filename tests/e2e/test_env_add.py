"""A NeMo Gym 0.7.0 environment we do not ship, brought in as a user would and scored on our core.

``gym env add wordle --from-nemo-gym 0.7.0`` fetches the release's wheel from the package index (pip), copies its
``environments/wordle`` entry and its ``resources_servers/wordle`` folder into an empty workspace, then
``gym eval run --environment wordle`` plays it: the release's own multi-step Wordle server, our gymnasium agent and
the embedded SmolLM2 model as the policy, real processes throughout.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.model, pytest.mark.slow, pytest.mark.timeout(1500)]

RELEASE = "0.7.0"
ENVIRONMENT = "wordle"


def _gym(args: list[str], cwd: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    env = os.environ | {"NEMO_GYM_ENV_YAML": "", "OPENAI_API_KEY": ""}
    argv = [sys.executable, "-m", "nemo_gym.cli.main", *args]
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def test_a_nemo_gym_07_environment_is_added_from_the_registry_and_scored_with_the_embedded_model(
    tmp_path: Path,
) -> None:
    pytest.importorskip("xllamacpp")
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    added = _gym(["env", "add", ENVIRONMENT, "--from-nemo-gym", RELEASE], workspace, timeout=600)
    assert added.returncode == 0, added.stdout[-3000:] + added.stderr[-3000:]
    assert "copied   resources_servers/wordle" in added.stdout
    assert "ours     responses_api_agents/gymnasium_agent" in added.stdout
    assert (workspace / "environments" / ENVIRONMENT / "NEMO_GYM_LICENSE").is_file()
    assert "Licence: " in added.stdout

    output = workspace / "results" / "wordle.jsonl"
    agent = "wordle_gymnasium_agent"
    run = _gym(
        [
            "eval", "run", "--environment", ENVIRONMENT, "--input", "environments/wordle/data/example.jsonl",
            "--output", str(output), "--limit", "1", "--temperature", "0", "--max-output-tokens", "24",
            f"++{agent}.responses_api_agents.gymnasium_agent.max_steps=2",
            "+shared_venv=true", "+head_server={port: 0}", f"+cache_dir={tmp_path / 'cache'}",
        ],  # fmt: skip
        workspace,
        timeout=840,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    rows = [json.loads(line) for line in output.read_text().splitlines()]
    assert len(rows) == 1
    row = rows[0]
    assert isinstance(row["reward"], (int, float)), row  # scored by the release's own wordle server
    assert row["response"]["model"].startswith("SmolLM2")
    failures = output.parent / "wordle_failures.jsonl"
    assert not failures.exists() or not failures.read_text().strip()
