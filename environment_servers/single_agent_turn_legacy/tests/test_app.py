"""single_agent_turn_legacy over real HTTP (servers in threads on loopback): a flat row in, the agent's /run answer
out, through the episode; a failed episode is a failure row the collector files by kind and stage."""

from __future__ import annotations

import json
import socket
from typing import Any

import httpx
import pytest

from environment_servers.single_agent_turn.app import SingleAgentTurnConfig
from environment_servers.single_agent_turn_legacy.app import SingleAgentTurnLegacyEnvironmentServer
from nemo_gym import INSTALL_DIR
from nemo_gym.testing import local_server_client, serve_servers
from resources_servers.example_single_tool_call.app import (
    ExampleSingleToolCallResourcesServer,
    ExampleSingleToolCallResourcesServerConfig,
)
from responses_api_agents.simple_agent.app import SimpleAgent, SimpleAgentConfig
from responses_api_models.scripted_model.app import ScriptedModel, ScriptedModelConfig

pytestmark = pytest.mark.timeout(300)  # servers in threads: slow to start on a loaded machine

ROW = json.loads(
    (INSTALL_DIR / "resources_servers/example_single_tool_call/data/example.jsonl").read_text().split("\n")[0]
)


def _address(name: str) -> dict[str, Any]:
    return {"host": "127.0.0.1", "port": 0, "entrypoint": "app.py", "name": name}


def _env(name: str, agent: str, client: Any) -> SingleAgentTurnLegacyEnvironmentServer:
    refs = {"resources_server": {"type": "resources_servers", "name": "weather"},
            "agent_server": {"type": "responses_api_agents", "name": agent}}  # fmt: skip
    config = SingleAgentTurnConfig(**_address(name), cleanup_timeout_seconds=60, **refs)
    return SingleAgentTurnLegacyEnvironmentServer(config=config, server_client=client)


@pytest.fixture(scope="module")
def servers() -> Any:
    client = local_server_client()
    agent_refs = {"resources_server": {"type": "resources_servers", "name": "weather"},
                  "model_server": {"type": "responses_api_models", "name": "model"}}  # fmt: skip
    with socket.socket() as ghost:  # bound, never listening: its connections are refused
        ghost.bind(("127.0.0.1", 0))
        client.global_config_dict["ghost"] = {"responses_api_agents": {"x": {"host": "127.0.0.1",
                                                                             "port": ghost.getsockname()[1]}}}  # fmt: skip
        servers = {
            "weather": ExampleSingleToolCallResourcesServer(
                config=ExampleSingleToolCallResourcesServerConfig(**_address("weather")), server_client=client
            ),
            "model": ScriptedModel(config=ScriptedModelConfig(**_address("model")), server_client=client),
            "agent": SimpleAgent(config=SimpleAgentConfig(**_address("agent"), **agent_refs), server_client=client),
            "env": _env("env", "agent", client),
            "env_ghost": _env("env_ghost", "ghost", client),
        }
        with serve_servers(servers, client) as urls:
            yield urls


def test_a_flat_row_is_answered_as_the_agents_run_answers_it(servers: dict[str, str]) -> None:
    row = ROW | {"_ng_task_index": 4, "_ng_rollout_index": 1, "agent_ref": {"name": "agent"}}
    answer = httpx.post(f"{servers['env']}/run", json=row, timeout=30).json()
    direct = httpx.post(f"{servers['agent']}/run", json=ROW, timeout=30).json()
    assert answer["reward"] == direct["reward"] == 1.0
    assert answer["agent_ref"]["name"] == "agent"
    assert [i["type"] for i in answer["response"]["output"]] == [i["type"] for i in direct["response"]["output"]]


def test_a_failed_episode_is_a_failure_row_with_kind_and_stage(servers: dict[str, str]) -> None:
    row = ROW | {"_ng_task_index": 0, "_ng_rollout_index": 0, "_ng_attempt_index": 1}
    answer = httpx.post(f"{servers['env_ghost']}/run", json=row, timeout=60).json()
    assert answer["_ng_failure_class"] == "environment_server_failed"
    assert (answer["failure_kind"], answer["_ng_failure_stage"]) == ("transport_unreachable", "agent")
    assert "_ng_failure_terminal" not in answer and "reward" not in answer  # retryable, and no reward of 0


def test_a_row_without_an_id_or_index_is_refused() -> None:
    server = _env("e", "agent", local_server_client())
    with pytest.raises(ValueError, match="task index"):
        server.episode_of(dict(ROW))
    episode = server.episode_of(ROW | {"_ng_task_index": 2, "_ng_rollout_index": 3, "_ng_attempt_index": 2})
    assert (episode.episode_id.rollout_id, episode.episode_id.attempt) == ("2-3", 2)
    assert episode.task.task_id.task_id == "2" and episode.task.task_input.task_data == {}
