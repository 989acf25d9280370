"""End to end, with real processes: ``gym env validate`` over every shipped environment, in one launch.

Besides the shipped ones, a search root holds one more environment, ``mcqa_answer_colon``: the real mcqa server set to
read "Answer: X" lines only, so the fixture case that answers ``\\boxed{B}`` no longer gets its reward. That one
launch then shows both halves of the acceptance: every shipped environment validates with its fixtures run, and a
fixture whose reward the verifier does not give fails the command with one line naming the fixture and both rewards.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from nemo_gym import INSTALL_DIR
from nemo_gym.environment.manifest import dump_manifest, load_manifest
from nemo_gym.environment.validation import CASES_FILE
from nemo_gym.verifier_fixture import load_verifier_fixture
from tests.helpers import write

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

SHIPPED = sorted(path.parent.name for path in (INSTALL_DIR / "environments").glob("*/config.yaml"))
CHANGED = "mcqa_answer_colon"


def changed_scoring_environment(root: Path) -> None:
    """``environments/mcqa_answer_colon``: mcqa's own server, data and fixtures, another grading mode."""
    config = {
        CHANGED: {"resources_servers": {"mcqa": {
            "entrypoint": "app.py", "domain": "knowledge", "description": "mcqa graded by 'Answer: X' lines only",
            "grading_mode": "lenient_answer_colon"}}},
        f"{CHANGED}_simple_agent": {"responses_api_agents": {"simple_agent": {
            "entrypoint": "app.py", "max_steps": 1,
            "resources_server": {"type": "resources_servers", "name": CHANGED},
            "model_server": {"type": "responses_api_models", "name": "policy_model"},
            "datasets": [{"name": "example", "type": "example", "jsonl_fpath": "resources_servers/mcqa/data/example.jsonl",
                          "license": "Apache 2.0"}]}}},
    }  # fmt: skip
    folder = root / "environments" / CHANGED
    write(folder / "config.yaml", yaml.safe_dump(config))
    shipped = load_manifest(INSTALL_DIR / "environments" / "mcqa" / "manifest.yaml")
    update = {"name": CHANGED, "resources_server": CHANGED, "agent_server": f"{CHANGED}_simple_agent"}
    dump_manifest(shipped.model_copy(update=update), folder / "manifest.yaml")


def test_every_shipped_environment_validates_and_a_changed_reward_is_one_line(workdir: Path) -> None:
    assert len(SHIPPED) >= 12 and "string_match" in SHIPPED
    changed_scoring_environment(workdir / "extra")
    command = [
        sys.executable, "-m", "nemo_gym.cli.main", "env", "validate", *SHIPPED, CHANGED,
        "--search-dir", str(workdir / "extra"), "+shared_venv=true", "+head_server={port: 0}",
        f"+results_dir={workdir / 'results'}", f"+cache_dir={workdir / 'cache'}",
    ]  # fmt: skip
    env = os.environ | {"NEMO_GYM_ENV_YAML": "", "COLUMNS": "500"}
    done = subprocess.run(command, cwd=workdir, env=env, capture_output=True, text=True, timeout=280)
    assert done.returncode == 1, done.stdout + done.stderr
    summary = [line for line in done.stdout.splitlines() if not line.startswith(" ")]
    expected = []
    for name in SHIPPED:  # every case of each of its servers' fixture files was played and gave its reward
        servers = load_manifest(INSTALL_DIR / "environments" / name / "manifest.yaml").resources_server
        cases = len(load_verifier_fixture(INSTALL_DIR / "resources_servers" / str(servers) / CASES_FILE))
        expected.append(f"{name}: valid ({cases}/{cases} verifier fixture(s) passed)")
    mcqa_cases = len(load_verifier_fixture(INSTALL_DIR / "resources_servers" / "mcqa" / CASES_FILE))
    expected.append(f"{CHANGED}: INVALID ({mcqa_cases - 1}/{mcqa_cases} verifier fixture(s) passed)")
    assert summary == expected, done.stdout + done.stderr
    failures = [line for line in done.stderr.splitlines() if "fixture" in line]
    assert failures == [
        f"{CHANGED}: fixture 'correct answer to row 0' ({CHANGED}): expected reward 1.0, the verifier gave 0.0"
    ], done.stderr
