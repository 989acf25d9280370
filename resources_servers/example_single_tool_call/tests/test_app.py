"""The weather server, tested the way the seeds' README shows: construct it directly, call its routes in-process."""

from __future__ import annotations

import json
from pathlib import Path
from unittest.mock import MagicMock

import pytest
from fastapi.testclient import TestClient

from nemo_gym.base_resources_server import BaseVerifyRequest
from nemo_gym.openai_utils import NeMoGymResponse, NeMoGymResponseCreateParamsNonStreaming
from nemo_gym.server_utils import ServerClient
from resources_servers.example_single_tool_call.app import (
    ExampleSingleToolCallResourcesServer,
    ExampleSingleToolCallResourcesServerConfig,
    GetWeatherRequest,
)


def make_server() -> ExampleSingleToolCallResourcesServer:
    config = ExampleSingleToolCallResourcesServerConfig(host="0.0.0.0", port=8080, entrypoint="", name="")
    return ExampleSingleToolCallResourcesServer(config=config, server_client=MagicMock(spec=ServerClient))


def _response(*output: dict) -> NeMoGymResponse:
    return NeMoGymResponse.model_validate(
        {"id": "resp_1", "created_at": 0, "model": "m", "object": "response", "output": list(output),
         "parallel_tool_calls": True, "tool_choice": "auto", "tools": []}
    )  # fmt: skip


CALL = {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city": "Oslo"}'}
RESULT = {"type": "function_call_output", "call_id": "c1",
          "output": '{"city":"Oslo","weather_description":"The weather in Oslo is cold."}'}  # fmt: skip
ROLLOUTS = Path(__file__).resolve().parents[1] / "data" / "example_rollouts.jsonl"


def _answer(text: str) -> dict:
    return {"type": "message", "id": "m1", "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": []}]}  # fmt: skip


async def _reward(*output: dict) -> float:
    params = NeMoGymResponseCreateParamsNonStreaming(input="What is the weather in Oslo?")
    verified = await make_server().verify(
        BaseVerifyRequest(responses_create_params=params, response=_response(*output))
    )
    return verified.reward


async def test_get_weather():
    result = await make_server().get_weather(GetWeatherRequest(city="Oslo"))
    assert result.weather_description == "The weather in Oslo is cold."


@pytest.mark.parametrize(
    "answer",
    ["Cold.", "It is cold in Oslo.", "The weather in Oslo is COLD right now.", "Oslo: cold, says `get_weather`."],
)
async def test_an_answer_that_states_the_tools_weather_scores_1(answer: str):
    assert await _reward(CALL, RESULT, _answer(answer)) == 1.0


@pytest.mark.parametrize(
    "answer",
    [
        "Sunny.",  # not what the tool said
        "It is getting colder.",  # another word
        "You can use the `get_weather` function to get the weather in Oslo.",  # talk about the tool, no answer
        "Here you go:\n```python\nprint('The weather in Oslo is cold.')\n```",  # the weather only in code
        "This will print:\n```\nThe weather in Oslo is cold.",  # a code block cut off by the token limit
        "Call `get_weather('cold')`.",  # inline code
        "",
    ],
)
async def test_an_answer_that_does_not_state_it_scores_0(answer: str):
    assert await _reward(CALL, RESULT, _answer(answer)) == 0.0


async def test_the_weather_must_come_from_a_get_weather_result():
    assert await _reward(_answer("Cold.")) == 0.0  # no tool call: a guess, not an answer
    assert await _reward(CALL, _answer("Cold.")) == 0.0  # called, but no result came back
    error = {**RESULT, "output": "Error: the tool failed (it is cold)"}
    assert await _reward(CALL, error, _answer("Cold.")) == 0.0  # a result, but no weather in it
    other = {**RESULT, "call_id": "c2"}
    assert await _reward(CALL, other, _answer("Cold.")) == 0.0  # the output answers another call
    assert await _reward(CALL, RESULT, _answer("Cold."), CALL) == 0.0  # no final answer: it ends with a call


async def test_the_example_rollouts_rewards_are_this_verifiers():
    """The five stored SmolLM2 rollouts: three answers are code or talk about the tool, and score 0."""
    rows = [json.loads(line) for line in ROLLOUTS.read_text().splitlines()]
    server = make_server()
    rewards = [(await server.verify(BaseVerifyRequest.model_validate(row))).reward for row in rows]
    assert rewards == [row["reward"] for row in rows] and sorted(rewards) == [0.0, 0.0, 0.0, 1.0, 1.0]


def test_routes_and_sessions():
    client = TestClient(make_server().setup_webserver())
    answer = client.post("/get_weather", json={"city": "Paris"})
    assert answer.json()["city"] == "Paris"
    assert answer.headers["set-cookie"].startswith("ExampleSingleToolCallResourcesServer___=")
    # The session cookie came back, so it is kept: every response re-sends the same one (as NeMo Gym's servers do).
    assert client.get("/").headers["set-cookie"] == answer.headers["set-cookie"]
    assert client.post("/get_weather", json={}).status_code == 422
    assert client.get("/reverify_mode").json() == "stateless"  # verify reads only the transcript
