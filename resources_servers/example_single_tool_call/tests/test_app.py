"""The weather server, tested the way the seeds' README shows: construct it directly, call its routes in-process."""

from __future__ import annotations

from unittest.mock import MagicMock

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
ANSWER = {"type": "message", "id": "m1", "role": "assistant", "status": "completed",
          "content": [{"type": "output_text", "text": "Cold.", "annotations": []}]}  # fmt: skip


async def test_get_weather():
    result = await make_server().get_weather(GetWeatherRequest(city="Oslo"))
    assert result.weather_description == "The weather in Oslo is cold."


async def test_verify_rewards_a_tool_call_followed_by_an_answer():
    server = make_server()
    params = NeMoGymResponseCreateParamsNonStreaming(input="weather?")
    good = await server.verify(BaseVerifyRequest(responses_create_params=params, response=_response(CALL, ANSWER)))
    no_tool = await server.verify(BaseVerifyRequest(responses_create_params=params, response=_response(ANSWER)))
    assert (good.reward, no_tool.reward) == (1.0, 0.0)


def test_routes_and_sessions():
    client = TestClient(make_server().setup_webserver())
    answer = client.post("/get_weather", json={"city": "Paris"})
    assert answer.json()["city"] == "Paris"
    assert answer.headers["set-cookie"].startswith("ExampleSingleToolCallResourcesServer___=")
    # The session cookie came back, so it is kept: every response re-sends the same one (as NeMo Gym's servers do).
    assert client.get("/").headers["set-cookie"] == answer.headers["set-cookie"]
    assert client.post("/get_weather", json={}).status_code == 422
    assert client.get("/reverify_mode").json() == "stateless"  # verify reads only the transcript
