"""Two tiny environments (configs + datasets) written into a temporary working directory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import write

ENV_A_TRAIN = [
    {
        "responses_create_params": {
            "input": "hi there",
            "temperature": 0.5,
            "tools": [{"type": "function", "name": "f"}],
        },
        "difficulty": 1,
        "category": "x",
    },
    {
        "responses_create_params": {
            "input": [
                {"role": "system", "content": "s"},
                {"role": "user", "content": "q1"},
                {"role": "assistant", "content": "a"},
                {"role": "user", "content": "q2"},
            ],
            "temperature": 1.0,
        },
        "difficulty": 3,
        "category": "y",
    },
    {"responses_create_params": {"input": "hi there"}, "difficulty": 2, "category": "x"},
]
ENV_A_VALIDATION = [{"responses_create_params": {"input": "validate me"}}]
ENV_A_EXAMPLE = [{"responses_create_params": {"input": "example a"}}]
ENV_B_TRAIN = [
    {"responses_create_params": {"input": "hello"}, "difficulty": 5},
    {"responses_create_params": {"input": "hi there", "top_p": 0.9}},
]
ENV_B_EXAMPLE = [{"responses_create_params": {"input": "example b"}}]


def env_config(name: str, datasets: str) -> str:
    return f"""
{name}:
  resources_servers:
    {name}_impl:
      entrypoint: app.py
      domain: math
{name}_agent:
  responses_api_agents:
    simple_agent:
      entrypoint: app.py
      resources_server: {{type: resources_servers, name: {name}}}
      model_server: {{type: responses_api_models, name: policy_model}}
      datasets:
{datasets}
"""


ENV_A_DATASETS = """\
      - {name: train, type: train, jsonl_fpath: data/env_a/train.jsonl, license: MIT, num_repeats: 2}
      - {name: validation, type: validation, jsonl_fpath: data/env_a/validation.jsonl, license: MIT}
      - {name: example, type: example, jsonl_fpath: data/env_a/example.jsonl}
"""
ENV_B_DATASETS = """\
      - {name: train, type: train, jsonl_fpath: data/env_b/train.jsonl, license: Apache 2.0}
      - {name: example, type: example, jsonl_fpath: data/env_b/example.jsonl}
"""


def write_rows(path: Path, rows: list[dict | str]) -> Path:
    return write(path, "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))


def read_rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture
def two_envs(workdir: Path) -> Path:
    """env_a (train x2 repeats, validation, example) and env_b (train, example); dataset paths relative to cwd."""
    write(workdir / "configs" / "env_a.yaml", env_config("env_a", ENV_A_DATASETS))
    write(workdir / "configs" / "env_b.yaml", env_config("env_b", ENV_B_DATASETS))
    write_rows(workdir / "data" / "env_a" / "train.jsonl", ENV_A_TRAIN)
    write_rows(workdir / "data" / "env_a" / "validation.jsonl", ENV_A_VALIDATION)
    write_rows(workdir / "data" / "env_a" / "example.jsonl", ENV_A_EXAMPLE)
    write_rows(workdir / "data" / "env_b" / "train.jsonl", ENV_B_TRAIN)
    write_rows(workdir / "data" / "env_b" / "example.jsonl", ENV_B_EXAMPLE)
    return workdir
