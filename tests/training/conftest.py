"""Rollout files written by the real stack, cheaply: the weather environment's resources server, ``simple_agent`` and
the scripted model, served in threads of this process, collected by ``RolloutCollectionHelper.run_from_config`` (the
collector of ``gym eval run``) into the files a user would export.

Two runs of the same five tasks, two repeats each: a model that calls ``get_weather`` and then answers (reward 1)
and one that answers without the tool (reward 0), so every task has a preference pair across the two files.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from nemo_gym import INSTALL_DIR

WEATHER = INSTALL_DIR / "resources_servers" / "example_single_tool_call"
TASKS = 5
REPEATS = 2
NO_TOOL_SCRIPT = [[{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Sunny."}]}]]


@dataclass(frozen=True)
class WeatherRuns:
    with_tool: Path
    """Every rollout calls get_weather, then answers: reward 1."""
    without_tool: Path
    """Every rollout answers at once: reward 0."""


def _servers(client: Any) -> dict[str, Any]:
    from resources_servers.example_single_tool_call.app import (
        ExampleSingleToolCallResourcesServer,
        ExampleSingleToolCallResourcesServerConfig,
    )
    from responses_api_agents.simple_agent.app import SimpleAgent, SimpleAgentConfig
    from responses_api_models.scripted_model.app import ScriptedModel, ScriptedModelConfig

    def address(name: str) -> dict[str, Any]:
        return {"host": "127.0.0.1", "port": 0, "entrypoint": "app.py", "name": name}

    def agent(name: str, model: str) -> SimpleAgent:
        refs = {"resources_server": {"type": "resources_servers", "name": "weather"},
                "model_server": {"type": "responses_api_models", "name": model}}  # fmt: skip
        return SimpleAgent(config=SimpleAgentConfig(**address(name), max_steps=4, **refs), server_client=client)

    weather = ExampleSingleToolCallResourcesServerConfig(**address("weather"))
    return {
        "weather": ExampleSingleToolCallResourcesServer(config=weather, server_client=client),
        "tool_model": ScriptedModel(config=ScriptedModelConfig(**address("tool_model")), server_client=client),
        "no_tool_model": ScriptedModel(
            config=ScriptedModelConfig(**address("no_tool_model"), script=NO_TOOL_SCRIPT), server_client=client
        ),
        "tool_agent": agent("tool_agent", "tool_model"),
        "no_tool_agent": agent("no_tool_agent", "no_tool_model"),
    }


@pytest.fixture(scope="session")
def weather_runs(tmp_path_factory: pytest.TempPathFactory) -> WeatherRuns:
    import nemo_gym.rollout_collection as face
    from nemo_gym.rollout_collection import RolloutCollectionConfig, RolloutCollectionHelper
    from nemo_gym.testing import local_server_client, serve_servers
    from nemo_gym.transport.http_client import close_session

    out = tmp_path_factory.mktemp("weather_runs")
    client = local_server_client()

    async def collect(agent: str, output: Path) -> None:
        config = RolloutCollectionConfig(
            input_jsonl_fpath=str(WEATHER / "data" / "example.jsonl"), output_jsonl_fpath=str(output),
            agent_name=agent, num_repeats=REPEATS, disable_aggregation=True,
        )  # fmt: skip
        try:
            await RolloutCollectionHelper(client).run_from_config(config)
        finally:
            await close_session()

    runs = WeatherRuns(out / "with_tool.jsonl", out / "without_tool.jsonl")
    with pytest.MonkeyPatch.context() as patch, serve_servers(_servers(client), client):
        patch.setattr(face, "get_global_config_dict", lambda: client.global_config_dict)
        asyncio.run(collect("tool_agent", runs.with_tool))
        asyncio.run(collect("no_tool_agent", runs.without_tool))
    for path, reward in ((runs.with_tool, 1.0), (runs.without_tool, 0.0)):
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        assert len(rows) == TASKS * REPEATS and {row["reward"] for row in rows} == {reward}, path
    return runs
