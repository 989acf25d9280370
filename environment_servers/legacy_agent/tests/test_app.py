"""legacy_agent over real HTTP (servers in threads on loopback): a row through the relay is the agent's own answer."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from environment_servers.legacy_agent.app import LegacyAgentConfig, LegacyAgentEnvironmentServer
from nemo_gym import INSTALL_DIR
from nemo_gym.testing import local_server_client, serve_servers
from resources_servers.example_single_tool_call.app import (
    ExampleSingleToolCallResourcesServer,
    ExampleSingleToolCallResourcesServerConfig,
)
from responses_api_agents.simple_agent.app import SimpleAgent, SimpleAgentConfig
from responses_api_models.scripted_model.app import ScriptedModel, ScriptedModelConfig

pytestmark = pytest.mark.timeout(300)  # servers in threads: slow to start on a loaded machine

ROWS = (INSTALL_DIR / "resources_servers/example_single_tool_call/data/example.jsonl").read_text().splitlines()


def _address(name: str) -> dict[str, Any]:
    return {"host": "127.0.0.1", "port": 0, "entrypoint": "app.py", "name": name}


@pytest.fixture(scope="module")
def servers() -> Any:
    client = local_server_client()
    agent_refs = {"resources_server": {"type": "resources_servers", "name": "weather"},
                  "model_server": {"type": "responses_api_models", "name": "model"}}  # fmt: skip
    relay = LegacyAgentConfig(**_address("relay"), agent_server={"type": "responses_api_agents", "name": "agent"})
    servers = {
        "weather": ExampleSingleToolCallResourcesServer(
            config=ExampleSingleToolCallResourcesServerConfig(**_address("weather")), server_client=client
        ),
        "model": ScriptedModel(config=ScriptedModelConfig(**_address("model")), server_client=client),
        "agent": SimpleAgent(config=SimpleAgentConfig(**_address("agent"), **agent_refs), server_client=client),
        "relay": LegacyAgentEnvironmentServer(config=relay, server_client=client),
    }
    with serve_servers(servers, client) as urls:
        yield urls


def test_a_row_through_the_relay_is_the_agents_answer(servers: dict[str, str]) -> None:
    row = json.loads(ROWS[0])
    relayed = httpx.post(f"{servers['relay']}/run", json=row, timeout=30)
    direct = httpx.post(f"{servers['agent']}/run", json=row, timeout=30)
    assert relayed.status_code == direct.status_code == 200
    assert relayed.json()["reward"] == direct.json()["reward"] == 1.0
    assert relayed.json()["responses_create_params"] == direct.json()["responses_create_params"]


def test_the_agents_refusal_comes_back_as_it_was(servers: dict[str, str]) -> None:
    relayed = httpx.post(f"{servers['relay']}/run", json={"responses_create_params": 3}, timeout=30)
    direct = httpx.post(f"{servers['agent']}/run", json={"responses_create_params": 3}, timeout=30)
    assert relayed.status_code == direct.status_code == 422
    assert relayed.json() == direct.json()


def test_metrics_are_the_agents(servers: dict[str, str]) -> None:
    row = json.loads(ROWS[0])
    scored = httpx.post(f"{servers['agent']}/run", json=row, timeout=30).json()
    body = {"verify_responses": [scored | {"_ng_task_index": 0, "_ng_rollout_index": 0}]}
    relayed = httpx.post(f"{servers['relay']}/aggregate_metrics", json=body, timeout=30)
    assert (
        relayed.status_code == 200
        and relayed.json() == httpx.post(f"{servers['agent']}/aggregate_metrics", json=body, timeout=30).json()
    )


def test_limits_a_relay_does_not_apply_warn() -> None:
    with pytest.warns(UserWarning, match="does not apply max_concurrent_episodes"):
        LegacyAgentConfig(**_address("r"), agent_server={"type": "responses_api_agents", "name": "a"},
                          max_concurrent_episodes=2, queue_timeout_seconds=1)  # fmt: skip
