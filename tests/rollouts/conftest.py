"""Fixtures for rollout collection: a dataset with known rewards, and the test environment's servers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).parent / "root"
CONFIG = ROOT / "resources_servers" / "rollout_test_env" / "configs" / "rollout_test_env.yaml"


def reward_of(task: int) -> float:
    """The known reward of task ``task``: a third of the tasks score 1, the rest 0.25."""
    return 1.0 if task % 3 == 0 else 0.25


def write_dataset(path: Path, rows: int) -> Path:
    with path.open("w") as f:
        for task in range(rows):
            row = {"responses_create_params": {"input": f"question {task}"}, "expected_reward": reward_of(task)}
            f.write(json.dumps(row) + "\n")
    return path


def stack_overrides(workdir: Path, *extra: str) -> list[str]:
    return [
        f"+config_paths=[{CONFIG}]",
        "+shared_venv=true",
        "+head_server={port: 0}",
        f"+results_dir={workdir / 'results'}",
        f"+cache_dir={workdir / 'cache'}",
        *extra,
    ]


@pytest.fixture
def extra_root(monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("NEMO_GYM_EXTRA_ROOTS", str(ROOT))
    return ROOT
