"""``--split`` with ``--agent``: only that agent's datasets of the split are run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nemo_gym.errors import ConfigError
from nemo_gym.global_config import parse_global_config_dict
from nemo_gym.rollouts.config import RolloutCollectionConfig
from nemo_gym.rollouts.inputs import prepare_inputs
from tests.helpers import write
from tests.rollouts.conftest import write_dataset


def agent(name: str, datasets: str) -> str:
    return f"""
{name}:
  responses_api_agents:
    simple_agent:
      entrypoint: app.py
      resources_server: {{type: resources_servers, name: rollout_test_env}}
      model_server: {{type: responses_api_models, name: policy_model}}
      datasets: {datasets}
"""


@pytest.fixture
def config(workdir: Path, extra_root: Path):
    def dataset(agent_name: str, rows: int, kind: str = "example") -> str:
        path = write_dataset(workdir / f"{agent_name}_{kind}.jsonl", rows)
        return f"[{{name: {kind}, type: {kind}, jsonl_fpath: {path}, license: Apache 2.0}}]"

    env = (extra_root / "resources_servers/rollout_test_env/configs/rollout_test_env.yaml").read_text()
    env = env.split("rollout_test_agent:")[0]  # the resources server; the agents are below
    yaml = env + agent("agent_a", dataset("agent_a", 2)) + agent("agent_b", dataset("agent_b", 3))
    yaml += agent("agent_c", dataset("agent_c", 1, "validation"))
    path = write(workdir / "config.yaml", yaml)
    return parse_global_config_dict([f"+config_paths=[{path}]"], dummy_model=True)


def settings(workdir: Path, agent_name: str | None) -> RolloutCollectionConfig:
    return RolloutCollectionConfig(
        output_jsonl_fpath=str(workdir / "out" / "rollouts.jsonl"), split="example", agent_name=agent_name
    )


def agents_of(path: Path) -> list[str]:
    return [json.loads(line)["agent_ref"]["name"] for line in path.read_text().splitlines()]


def test_split_without_agent_runs_every_agent_of_the_split(workdir: Path, config) -> None:
    materialized = prepare_inputs(settings(workdir, None), config)
    assert agents_of(materialized.path) == ["agent_a"] * 2 + ["agent_b"] * 3


def test_agent_limits_split_to_its_own_datasets(workdir: Path, config) -> None:
    materialized = prepare_inputs(settings(workdir, "agent_b"), config)
    assert agents_of(materialized.path) == ["agent_b"] * 3
    assert materialized.rollouts_per_agent == {"agent_b": 3}


def test_an_agent_without_a_dataset_of_the_split_is_one_line_naming_those_that_have_one(workdir, config) -> None:
    with pytest.raises(ConfigError) as refused:
        prepare_inputs(settings(workdir, "agent_c"), config)
    assert str(refused.value) == (
        "--agent agent_c declares no dataset of type 'example' (agents that do: agent_a, agent_b); pick one of them, "
        "or pass --input PATH"
    )
