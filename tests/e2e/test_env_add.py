"""A NeMo Gym 0.7.0 environment we do not ship, brought in as a user would and scored on our core.

``gym env add abstention --from-nemo-gym 0.7.0`` fetches the release's wheel from the package index (pip), copies
its ``environments/abstention`` entry, its ``resources_servers/abstention`` folder and the ``simpleqa`` folder that
one imports into an empty workspace; then ``gym eval run --environment abstention`` scores a question with the
release's own LLM-judged server (three-tier reward: right, abstained, wrong), our simple agent and environment-server
relay, and the embedded SmolLM2 model as both the policy and the judge; real processes throughout. (Wordle, the
release's multi-step game, cannot run offline: its server needs word lists its data script downloads.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.model,
    pytest.mark.slow,
    pytest.mark.timeout(2400),
]

RELEASE = "0.7.0"
ENVIRONMENT = "abstention"


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
    assert "copied   resources_servers/abstention" in added.stdout
    assert "copied   resources_servers/simpleqa" in added.stdout  # imported by abstention's app
    assert "ours     responses_api_agents/simple_agent" in added.stdout
    assert (workspace / "environments" / ENVIRONMENT / "NEMO_GYM_LICENSE").is_file()
    assert "Licence: " in added.stdout

    output = workspace / "results" / "abstention.jsonl"
    run = _gym(
        [
            "eval",
            "run",
            "--environment",
            ENVIRONMENT,
            "--input",
            "environments/abstention/data/example.jsonl",
            "--output",
            str(output),
            "--limit",
            "1",
            "--temperature",
            "0",
            "--max-output-tokens",
            "32",
            # the release names a judge model server of its own (genrm_model): here the embedded model judges too
            "++abstention.resources_servers.abstention.judge_model_server.name=policy_model",
            # the whole rollout is one call from the environment server to the agent: on a busy 2-core machine it can
            # outlast the default 600 s deadline of a call between servers
            "+server_call_timeout_seconds=1500",
            "+shared_venv=true",
            "+head_server={port: 0}",
            f"+cache_dir={tmp_path / 'cache'}",
        ],  # fmt: skip
        workspace,
        timeout=1700,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    rows = [json.loads(line) for line in output.read_text().splitlines()]
    assert len(rows) == 1
    row = rows[0]
    assert row["reward"] in (0.0, 0.5, 1.0), row  # the release's three tiers
    assert row["verdict"] in ("correct", "abstain", "incorrect"), row
    assert row["judge_output"] or row["verdict"] == "abstain", row  # an answer is graded by the judge
    assert row["_ng_environment_server"] == "abstention_environment_server"  # through the 0.7 relay
    assert row["response"]["model"].startswith("SmolLM2")
    failures = output.parent / "abstention_failures.jsonl"
    assert not failures.exists() or not failures.read_text().strip()
