"""langgraph_agent against real HTTP servers on loopback (in threads): the scripted model, the weather tools.

The graph calls the model through LangChain's ChatOpenAI, so these tests also pin that our Chat Completions endpoint
speaks what that client sends and reads. Rollouts through `gym eval run` in separate processes are in
tests/e2e/test_agent_frameworks.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx

from nemo_gym.testing import local_server_client, serve_servers
from resources_servers.example_single_tool_call.app import (
    ExampleSingleToolCallResourcesServer,
    ExampleSingleToolCallResourcesServerConfig,
)
from responses_api_agents.langgraph_agent.app import LangGraphAgent, LangGraphAgentConfig
from responses_api_models.scripted_model.app import ScriptedModel, ScriptedModelConfig

WEATHER_TOOL = {
    "type": "function", "name": "get_weather", "description": "weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}  # fmt: skip
PARAMS = {"input": [{"role": "user", "content": "What is the weather in Paris?"}], "tools": [WEATHER_TOOL]}
COMMON = {"host": "127.0.0.1", "port": 0, "entrypoint": "app.py"}


def _message(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}


def _call(name: str, arguments: str) -> dict[str, Any]:
    return {"type": "function_call", "name": name, "arguments": arguments}


@contextmanager
def serve(script: list[list[dict[str, Any]]], max_steps: int = 10) -> Iterator[str]:
    """The scripted model, the weather server and the agent; yields the agent's URL."""
    client = local_server_client()
    servers = {
        "policy_model": ScriptedModel(
            config=ScriptedModelConfig(**COMMON, name="policy_model", script=script), server_client=client
        ),
        "weather": ExampleSingleToolCallResourcesServer(
            config=ExampleSingleToolCallResourcesServerConfig(**COMMON, name="weather"), server_client=client
        ),
        "agent": LangGraphAgent(
            config=LangGraphAgentConfig(
                **COMMON, name="agent", max_steps=max_steps,
                resources_server={"type": "resources_servers", "name": "weather"},
                model_server={"type": "responses_api_models", "name": "policy_model"},
            ),
            server_client=client,
        ),
    }  # fmt: skip
    with serve_servers(servers, client) as urls:
        yield urls["agent"]


def run(agent_url: str) -> dict[str, Any]:
    answer = httpx.post(f"{agent_url}/run", json={"responses_create_params": PARAMS}, timeout=60)
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_run_returns_the_trajectory_and_the_reward():
    with serve([[_call("get_weather", '{"city": "Paris"}')], [_message("Cold.")]]) as agent:
        row = run(agent)
    output = row["response"]["output"]
    assert [item["type"] for item in output] == ["function_call", "function_call_output", "message"]
    assert json.loads(output[0]["arguments"]) == {"city": "Paris"}
    assert output[1]["call_id"] == output[0]["call_id"] and "cold" in output[1]["output"]
    assert output[2]["content"][0]["text"] == "Cold."
    assert row["reward"] == 1.0
    assert row["response"]["id"].startswith("chatcmpl_")  # the model was reached through /v1/chat/completions
    assert row["response"]["usage"]["total_tokens"] > 0


def test_bad_tool_calls_become_tool_outputs_the_model_can_read():
    script = [[_call("get_weather", "{not json"), _call("launch_rockets", "{}"), _call("verify", "{}")],
              [_message("sorry")]]  # fmt: skip
    with serve(script) as agent:
        output = run(agent)["response"]["output"]
    tool_outputs = [item["output"] for item in output if item["type"] == "function_call_output"]
    assert len(tool_outputs) == 3
    assert any("Unknown tool 'launch_rockets'" in text for text in tool_outputs)
    assert any("Unknown tool 'verify'" in text for text in tool_outputs)
    assert any("Invalid tool call arguments for 'get_weather'" in text for text in tool_outputs)
    assert output[-1]["type"] == "message"


def test_max_steps_bounds_a_model_that_never_stops_calling_tools():
    with serve([[_call("get_weather", '{"city": "Paris"}')]], max_steps=3) as agent:
        output = run(agent)["response"]["output"]
    assert sum(item["type"] == "function_call" for item in output) == 3
    assert sum(item["type"] == "function_call_output" for item in output) == 2  # the third call is never run


def test_responses_endpoint_runs_the_graph():
    with serve([[_call("get_weather", '{"city": "Paris"}')], [_message("Cold.")]]) as agent:
        answer = httpx.post(f"{agent}/v1/responses", json=PARAMS, timeout=60)
    assert answer.status_code == 200, answer.text
    assert [item["type"] for item in answer.json()["output"]] == ["function_call", "function_call_output", "message"]
