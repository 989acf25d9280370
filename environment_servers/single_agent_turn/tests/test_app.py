"""single_agent_turn over real HTTP (each server in a thread on loopback): the weather environment, simple_agent and
the scripted model. An episode's result equals what the agent's own /run gives; its failures are typed and staged; its
sessions are closed on every outcome."""

from __future__ import annotations

import copy
import json
import socket
from typing import Any

import httpx
import pytest

from environment_servers.single_agent_turn.app import SingleAgentTurnConfig, SingleAgentTurnEnvironmentServer
from nemo_gym import INSTALL_DIR
from nemo_gym.resources_sessions import ResourcesCloseSessionRequest, ResourcesCloseSessionResponse
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


class CountingWeather(ExampleSingleToolCallResourcesServer):
    """The weather server, counting its closed sessions."""

    closed: list[str] = []

    async def close_resources_session(self, body: ResourcesCloseSessionRequest) -> ResourcesCloseSessionResponse:
        type(self).closed.append(body.resources_session_id)
        return await super().close_resources_session(body)


def _servers(client: Any, **env: Any) -> dict[str, Any]:
    refs = {"resources_server": {"type": "resources_servers", "name": "weather"},
            "agent_server": {"type": "responses_api_agents", "name": "agent"}}  # fmt: skip
    agent_refs = {"resources_server": refs["resources_server"],
                  "model_server": {"type": "responses_api_models", "name": "model"}}  # fmt: skip
    weather = ExampleSingleToolCallResourcesServerConfig(**_address("weather"))
    return {
        "weather": CountingWeather(config=weather, server_client=client),
        "model": ScriptedModel(config=ScriptedModelConfig(**_address("model")), server_client=client),
        "agent": SimpleAgent(
            config=SimpleAgentConfig(**_address("agent"), max_steps=4, **agent_refs), server_client=client
        ),  # fmt: skip
        "env": SingleAgentTurnEnvironmentServer(
            config=SingleAgentTurnConfig(**_address("env"), cleanup_timeout_seconds=60, **refs, **env),
            server_client=client,
        ),
        "env_ghost": SingleAgentTurnEnvironmentServer(  # its agent is an address nobody listens on
            config=SingleAgentTurnConfig(
                **_address("env_ghost"),
                cleanup_timeout_seconds=60,
                **(refs | {"agent_server": {"type": "responses_api_agents", "name": "ghost"}}),
            ),
            server_client=client,
        ),  # fmt: skip
    }


def _episode(rollout_id: str = "0-0") -> dict[str, Any]:
    params = copy.deepcopy(ROW["responses_create_params"])  # a test may change it; the next one gets it whole
    return {
        "episode_id": {"rollout_id": rollout_id, "attempt": 0},
        "task": {"task_id": {"taskset": "weather", "task_id": "0"},
                 "task_input": {"responses_create_params": params, "task_data": {}}},
    }  # fmt: skip


@pytest.fixture
def servers() -> Any:
    client = local_server_client()
    CountingWeather.closed = []
    with socket.socket() as ghost:  # bound, never listening: connections are refused, and its port stays taken
        ghost.bind(("127.0.0.1", 0))
        port = ghost.getsockname()[1]
        client.global_config_dict["ghost"] = {"responses_api_agents": {"x": {"host": "127.0.0.1", "port": port}}}
        with serve_servers(_servers(client), client) as urls:
            yield urls


def test_episode_result_is_the_agents_run(servers: dict[str, str]) -> None:
    answer = httpx.post(f"{servers['env']}/run", json=_episode(), timeout=30).json()
    direct = httpx.post(f"{servers['agent']}/run", json=ROW, timeout=30).json()
    assert answer["failure"] is None and answer["episode_id"]["rollout_id"] == "0-0"
    result = answer["result"]
    assert result["reward"] == direct["reward"] == 1.0
    assert (
        [item["type"] for item in result["response"]["output"]]
        == [item["type"] for item in direct["response"]["output"]]
        == ["function_call", "function_call_output", "message"]
    )
    assert len(CountingWeather.closed) == 1  # the resources session was closed after verification


def test_agent_session_is_refused_after_close(servers: dict[str, str]) -> None:
    episode = {"episode_id": {"rollout_id": "x"}, "task_id": {"taskset": "t", "task_id": "1"}}
    opened = httpx.post(f"{servers['agent']}/v1/agent_sessions", json={"agent_session_id": "a1", **episode})
    assert opened.status_code == 200, opened.text
    close = {"agent_session_id": "a1", "episode_id": episode["episode_id"]}
    first = httpx.post(f"{servers['agent']}/v1/agent_sessions/close", json=close, cookies=opened.cookies)
    again = httpx.post(f"{servers['agent']}/v1/agent_sessions/close", json=close, cookies=opened.cookies)
    assert first.status_code == again.status_code == 200 and first.json() == again.json()
    reopened = httpx.post(f"{servers['agent']}/v1/agent_sessions", json={"agent_session_id": "a1", **episode})
    assert reopened.status_code == 409
    late = httpx.post(f"{servers['agent']}/v1/responses", json=ROW["responses_create_params"], cookies=opened.cookies)
    assert late.status_code == 409  # a closed session's cookie never runs unbound


def test_an_invalid_episode_request_is_refused_before_any_session_opens(servers: dict[str, str]) -> None:
    episode = _episode()
    episode["task"]["task_input"]["responses_create_params"]["tools"] = [{"type": "function", "name": 7}]
    answer = httpx.post(f"{servers['env']}/run", json=episode, timeout=30)
    assert answer.status_code == 422  # the request itself is invalid: refused before any session opens
    assert CountingWeather.closed == []


def test_an_agent_that_cannot_be_reached_is_a_retryable_failure_and_the_seed_is_closed(servers: dict[str, str]) -> None:
    reply = httpx.post(f"{servers['env_ghost']}/run", json=_episode(), timeout=60)
    answer = reply.json()
    assert reply.status_code == 200, reply.text
    assert answer["result"] is None
    failure = answer["failure"]
    assert failure["stage"] == "agent" and failure["failure_kind"] == "transport_unreachable"
    assert failure["terminal"] is False
    assert len(CountingWeather.closed) == 1  # the seeded resources session was released by the cleanup
