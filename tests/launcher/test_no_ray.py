"""Ray only when asked (issue 18): without ``--ray-address`` no run imports Ray, and ``replicas`` asks for it.

Each command runs in a fresh interpreter (``nemo_gym.cli.main.main``), which then reports every ``ray`` module it
holds: a run that imported Ray anywhere along its way (launcher, collector, config) would list it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.rollouts.conftest import CONFIG, ROOT, write_dataset

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

REPORT = """
import json, sys
from nemo_gym.cli.main import main
code = main(sys.argv[1:])
print(json.dumps({"code": code, "ray": sorted(m for m in sys.modules if m == "ray" or m.startswith("ray."))}))
"""


def gym(workdir: Path, *args: str) -> dict:
    common = [f"--config={CONFIG}", "+shared_venv=true", "+head_server={port: 0}",
              f"+results_dir={workdir / 'results'}", f"+cache_dir={workdir / 'cache'}"]  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-c", REPORT, *args, *common], cwd=workdir, capture_output=True, text=True, timeout=240,
        env={**os.environ, "NEMO_GYM_EXTRA_ROOTS": str(ROOT)},
    )  # fmt: skip
    assert done.stdout.strip(), done.stderr[-3000:]
    return {**json.loads(done.stdout.strip().splitlines()[-1]), "stderr": done.stderr}


def test_an_eval_run_without_a_ray_address_never_imports_ray(tmp_path: Path):
    data = write_dataset(tmp_path / "data.jsonl", 3)
    result = gym(tmp_path, "eval", "run", "--input", str(data), "--output", str(tmp_path / "out.jsonl"),
                 "--agent", "rollout_test_agent")  # fmt: skip
    assert result["code"] == 0, result["stderr"][-3000:]
    assert result["ray"] == []
    assert len((tmp_path / "out.jsonl").read_text().splitlines()) == 3


def test_env_start_without_a_ray_address_never_imports_ray(tmp_path: Path):
    result = gym(tmp_path, "env", "start", "+dry_run=true")
    assert result["code"] == 0, result["stderr"][-3000:]
    assert result["ray"] == []


def test_replicas_without_a_ray_cluster_is_one_line_naming_the_key_and_the_flag(tmp_path: Path):
    result = gym(tmp_path, "env", "start", "++rollout_test_agent.responses_api_agents.simple_agent.replicas=2")
    assert result["code"] == 1
    assert result["ray"] == []
    assert "rollout_test_agent.responses_api_agents.simple_agent.replicas" in result["stderr"]
    assert "--ray-address" in result["stderr"] and "Traceback" not in result["stderr"]
