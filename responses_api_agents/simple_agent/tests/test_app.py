"""simple_agent's loop against real HTTP servers (uvicorn on loopback, in threads): scripted model, weather tools.

The end-to-end tests with separate processes live with the launcher; these pin the agent's logic: the trajectory, the
reward, cookies, and how bad tool calls and failing servers are reported.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest
import uvicorn
from omegaconf import OmegaConf

from nemo_gym.config_types import BaseServerConfig
from nemo_gym.server_utils import ServerClient
from resources_servers.example_single_tool_call.app import (
    ExampleSingleToolCallResourcesServer,
    ExampleSingleToolCallResourcesServerConfig,
)
from responses_api_agents.simple_agent.app import SimpleAgent, SimpleAgentConfig
from responses_api_models.scripted_model.app import ScriptedModel, ScriptedModelConfig

WEATHER_TOOL = {
    "type": "function", "name": "get_weather", "description": "weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}  # fmt: skip
ROW = {"responses_create_params": {"input": "What is the weather in Paris?", "tools": [WEATHER_TOOL]}}


def _message(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}


def _call(name: str, arguments: str) -> dict[str, Any]:
    return {"type": "function_call", "name": name, "arguments": arguments}


@contextmanager
def serve(
    script: list[list[dict[str, Any]]], max_steps: int = 10, start_model: bool = True, execute_tools: bool = True
) -> Iterator[str]:
    """Start model, weather and agent servers on loopback; yield the agent's base URL."""
    sockets = {name: socket.create_server(("127.0.0.1", 0)) for name in ("model", "weather", "agent")}
    port = {name: sock.getsockname()[1] for name, sock in sockets.items()}
    config = OmegaConf.create(
        {
            "policy_model": {"responses_api_models": {"scripted_model": {"host": "127.0.0.1", "port": port["model"]}}},
            "weather": {"resources_servers": {"weather": {"host": "127.0.0.1", "port": port["weather"]}}},
            "agent": {"responses_api_agents": {"simple_agent": {"host": "127.0.0.1", "port": port["agent"]}}},
        }
    )
    client = ServerClient(head_server_config=BaseServerConfig(host="127.0.0.1", port=1), global_config_dict=config)
    common = {"host": "127.0.0.1", "entrypoint": "app.py"}
    apps = {
        "model": ScriptedModel(
            config=ScriptedModelConfig(**common, port=port["model"], name="policy_model", script=script),
            server_client=client,
        ),
        "weather": ExampleSingleToolCallResourcesServer(
            config=ExampleSingleToolCallResourcesServerConfig(**common, port=port["weather"], name="weather"),
            server_client=client,
        ),
        "agent": SimpleAgent(
            config=SimpleAgentConfig(
                **common, port=port["agent"], name="agent", max_steps=max_steps, execute_tools=execute_tools,
                resources_server={"type": "resources_servers", "name": "weather"},
                model_server={"type": "responses_api_models", "name": "policy_model"},
            ),
            server_client=client,
        ),
    }  # fmt: skip
    if not start_model:  # nothing listens there: connections are refused
        del apps["model"]
        sockets.pop("model").close()
    servers, threads = [], []
    for name, app in apps.items():
        server = uvicorn.Server(uvicorn.Config(app.setup_webserver(), log_level="warning", lifespan="on"))
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sockets[name]]}, daemon=True)
        thread.start()
        servers.append(server)
        threads.append(thread)
    deadline = time.monotonic() + 120  # a hang guard: the loop ends as soon as they are up
    while not all(s.started for s in servers):
        assert time.monotonic() < deadline, "servers did not start"
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port['agent']}"
    finally:
        for server in servers:
            server.should_exit = True
        for thread in threads:
            thread.join(timeout=10)
        for sock in sockets.values():
            sock.close()


def run(agent_url: str, row: dict[str, Any] = ROW) -> httpx.Response:
    return httpx.post(f"{agent_url}/run", json=row, timeout=30)


def test_run_returns_the_trajectory_and_the_reward():
    with serve([[_call("get_weather", '{"city": "Paris"}')], [_message("Cold.")]]) as agent:
        answer = run(agent)
    assert answer.status_code == 200, answer.text
    row = answer.json()
    types = [item["type"] for item in row["response"]["output"]]
    assert types == ["function_call", "function_call_output", "message"]
    assert "cold" in row["response"]["output"][1]["output"]
    assert row["reward"] == 1.0
    assert row["response"]["usage"]["total_tokens"] > 0


def test_no_tool_call_gets_reward_zero():
    with serve([[_message("I do not know.")]]) as agent:
        row = run(agent).json()
    assert row["reward"] == 0.0 and [i["type"] for i in row["response"]["output"]] == ["message"]


def test_invalid_arguments_become_a_tool_output_the_model_can_read():
    with serve([[_call("get_weather", "{not json")], [_message("sorry")]]) as agent:
        output = run(agent).json()["response"]["output"]
    assert "Invalid tool call arguments" in output[1]["output"]


def test_arguments_failing_validation_and_unknown_tools_are_reported_to_the_model():
    script = [[_call("get_weather", '{"town": "Paris"}'), _call("launch_rockets", "{}"), _call("verify", "{}")],
              [_message("done")]]  # fmt: skip
    with serve(script) as agent:
        output = run(agent).json()["response"]["output"]
    tool_outputs = [item["output"] for item in output if item["type"] == "function_call_output"]
    assert "Invalid arguments for tool 'get_weather'" in tool_outputs[0] and "city" in tool_outputs[0]
    assert "Unknown tool 'launch_rockets'" in tool_outputs[1]
    assert "Unknown tool 'verify'" in tool_outputs[2]


def test_a_model_that_never_answers_stops_at_max_steps():
    reasoning_only = [[{"type": "reasoning", "summary": [{"type": "summary_text", "text": "hmm"}]}]]
    with serve(reasoning_only, max_steps=3) as agent:
        answer = run(agent)
    assert answer.status_code == 200
    assert [i["type"] for i in answer.json()["response"]["output"]] == ["reasoning"] * 3


def test_agent_v1_responses_works_with_the_openai_client():
    openai = pytest.importorskip("openai")
    with serve([[_call("get_weather", '{"city": "Oslo"}')], [_message("Cold in Oslo.")]]) as agent:
        client = openai.OpenAI(base_url=f"{agent}/v1", api_key="unused", max_retries=0)
        response = client.responses.create(input="weather in Oslo?", tools=[WEATHER_TOOL], model="any")
    assert response.output_text == "Cold in Oslo."
    assert [item.type for item in response.output] == ["function_call", "function_call_output", "message"]


def test_a_bad_row_is_a_422_naming_the_field():
    with serve([[_message("x")]]) as agent:
        answer = run(agent, {"responses_create_params": {"input": "x", "temperature": "hot"}})
    assert answer.status_code == 422 and "temperature" in answer.text


def test_a_dead_model_server_fails_the_rollout_with_a_502_naming_it():
    with serve([[_message("x")]], start_model=False) as agent:
        answer = run(agent)
    assert answer.status_code == 502
    assert "policy_model" in answer.text and "/v1/responses" in answer.text


def test_without_tool_execution_one_model_call_is_judged_as_is():
    """execute_tools=false: the call is the answer; it is never run, so no tool output joins the trajectory."""
    script = [[_call("get_weather", '{"city": "Paris"}'), _call("launch_rockets", "{}")], [_message("Cold.")]]
    with serve(script, execute_tools=False) as agent:
        row = run(agent).json()
    assert [item["type"] for item in row["response"]["output"]] == ["function_call", "function_call"]
    assert row["reward"] == 0.0  # the weather verifier wants a final message, which a single call never gives


def test_without_tool_execution_a_text_answer_also_ends_the_rollout():
    with serve([[_message("No tool needed.")], [_message("second")]], execute_tools=False) as agent:
        output = run(agent).json()["response"]["output"]
    assert [item["content"][0]["text"] for item in output] == ["No tool needed."]


def test_aggregate_metrics_are_the_resources_servers_own():
    from nemo_gym.metrics import aggregate_verify_responses

    rows = [
        {"_ng_task_index": task % 2, "reward": task / 4, "response": {"usage": {"total_tokens": task}}}
        for task in range(4)
    ]
    with serve([[_message("Cold.")]]) as agent:
        answer = httpx.post(f"{agent}/aggregate_metrics", json={"verify_responses": rows}, timeout=60)
    assert answer.status_code == 200, answer.text
    assert answer.json() == aggregate_verify_responses(rows).model_dump()
