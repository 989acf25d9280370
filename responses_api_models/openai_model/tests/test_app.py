"""openai_model against a real (scripted) Responses-native upstream on loopback: in-process through the ASGI app, and
over HTTP through the official ``openai`` client."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any
from unittest.mock import MagicMock

import httpx
import openai
import pytest
from omegaconf import OmegaConf

from nemo_gym.openai_utils import NeMoGymChatCompletion, NeMoGymResponse
from nemo_gym.server_utils import ServerClient
from nemo_gym.testing import FakeUpstream, Reply, serve_in_thread
from nemo_gym.transport.http_client import close_session
from responses_api_models.openai_model.app import OpenAIModel, OpenAIModelConfig

pytestmark = pytest.mark.timeout(60)

WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
CHAT_WEATHER_TOOL = {"type": "function", "function": {k: v for k, v in WEATHER_TOOL.items() if k != "type"}}


def responses_reply(body: Any) -> dict[str, Any]:
    """A Responses object as OpenAI sends it: a reasoning item and a tool call, with the request echoed."""
    return {
        "id": "resp_up",
        "object": "response",
        "created_at": 1_700_000_000,
        "model": body["model"],
        "status": "completed",
        "error": None,
        "incomplete_details": None,
        "output": [
            {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": None, "status": None},
            {
                "type": "function_call",
                "id": "fc_1",
                "call_id": "call_1",
                "name": "get_weather",
                "arguments": '{"city": "Oslo"}',
                "status": "completed",
            },
        ],
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": body.get("tools", []),
        "usage": {
            "input_tokens": 12,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": 7,
            "output_tokens_details": {"reasoning_tokens": 3},
            "total_tokens": 19,
        },
    }


def chat_reply(body: Any) -> dict[str, Any]:
    return {
        "id": "chatcmpl-up",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": body["model"],
        "choices": [
            {
                "index": 0,
                "finish_reason": "tool_calls",
                "logprobs": None,
                "message": {
                    "role": "assistant",
                    "content": None,
                    "refusal": None,
                    "tool_calls": [
                        {
                            "id": "call_1",
                            "type": "function",
                            "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
                        }
                    ],
                },
            }
        ],
        "usage": {"prompt_tokens": 12, "completion_tokens": 7, "total_tokens": 19},
    }


def openai_like(path: str, body: Any) -> Reply:
    if path == "/v1/responses":
        return 200, responses_reply(body)
    if path == "/v1/chat/completions":
        return 200, chat_reply(body)
    return 404, {"error": {"message": f"no route {path}"}}


@pytest.fixture
def upstream() -> Iterator[FakeUpstream]:
    fake = FakeUpstream(openai_like).start()
    yield fake
    fake.stop()


def make_server(base_url: str, **config: Any) -> OpenAIModel:
    settings = {"host": "127.0.0.1", "port": 0, "entrypoint": "app.py", "name": "policy_model"}
    settings |= {"openai_base_url": base_url, "openai_api_key": "sk-test", "openai_model": "gpt-test"} | config
    return OpenAIModel(config=OpenAIModelConfig(**settings), server_client=MagicMock(spec=ServerClient))


@pytest.fixture
async def connect() -> AsyncIterator[Callable[[OpenAIModel], httpx.AsyncClient]]:
    clients: list[httpx.AsyncClient] = []

    def factory(server: OpenAIModel) -> httpx.AsyncClient:
        transport = httpx.ASGITransport(app=server.setup_webserver(), raise_app_exceptions=False)
        clients.append(httpx.AsyncClient(transport=transport, base_url="http://model", timeout=30))
        return clients[-1]

    yield factory
    for client in clients:
        await client.aclose()
    await close_session()


async def test_responses_pass_through_with_model_forced_and_extra_body_underneath(upstream, connect):
    server = make_server(
        upstream.url,
        extra_body={"service_tier": "flex", "temperature": 0.9},
        openai_default_headers={"OpenAI-Project": "proj_1"},
    )
    body = {"model": "caller-choice", "input": "Weather in Oslo?", "tools": [WEATHER_TOOL], "temperature": 0.2}
    answer = await connect(server).post("/v1/responses", json=body)
    assert answer.status_code == 200, answer.text
    response = NeMoGymResponse.model_validate(answer.json())
    assert response.model == "gpt-test"
    assert [item.type for item in response.output] == ["reasoning", "function_call"]
    assert response.output[1].name == "get_weather" and response.output[1].call_id == "call_1"
    assert response.usage.output_tokens_details.reasoning_tokens == 3

    [received] = upstream.received
    assert received.path == "/v1/responses"
    assert received.headers["Authorization"] == "Bearer sk-test"
    assert received.headers["OpenAI-Project"] == "proj_1"
    # The caller's fields arrive untouched (no conversion), only what it left unset comes from extra_body.
    assert received.json == {
        "model": "gpt-test",
        "input": "Weather in Oslo?",
        "tools": [WEATHER_TOOL],
        "temperature": 0.2,
        "service_tier": "flex",
    }


async def test_chat_completions_pass_through(upstream, connect):
    server = make_server(upstream.url, openai_api_key="")
    body = {"model": "x", "messages": [{"role": "user", "content": "Weather?"}], "tools": [CHAT_WEATHER_TOOL]}
    answer = await connect(server).post("/v1/chat/completions", json=body)
    assert answer.status_code == 200, answer.text
    completion = NeMoGymChatCompletion.model_validate(answer.json())
    assert completion.choices[0].message.tool_calls[0].function.name == "get_weather"
    [received] = upstream.received
    assert received.path == "/v1/chat/completions"
    assert received.json == body | {"model": "gpt-test"}
    assert "Authorization" not in received.headers  # empty key: nothing to send


async def test_drop_input_reasoning_items(upstream, connect):
    history = [
        {"role": "user", "content": "q"},
        {"type": "reasoning", "id": "rs_other", "summary": [{"type": "summary_text", "text": "from elsewhere"}]},
        {"role": "assistant", "content": "a"},
    ]
    await connect(make_server(upstream.url)).post("/v1/responses", json={"input": history})
    await connect(make_server(upstream.url, drop_input_reasoning_items=True)).post(
        "/v1/responses", json={"input": history}
    )
    kept, dropped = upstream.bodies("/v1/responses")
    assert [item.get("type", "message") for item in kept["input"]] == ["message", "reasoning", "message"]
    assert [item.get("type", "message") for item in dropped["input"]] == ["message", "message"]


async def test_upstream_error_becomes_502_naming_the_upstream(upstream, connect):
    upstream.responder = lambda path, body: (500, {"error": {"message": "upstream is sad"}})
    answer = await connect(make_server(upstream.url)).post("/v1/responses", json={"input": "q"})
    assert answer.status_code == 502
    error = answer.json()["error"]
    assert f"{upstream.url}/responses" in error and "HTTP 500" in error and "upstream is sad" in error
    assert "sk-test" not in error


async def test_invalid_request_is_rejected_before_the_upstream(upstream, connect):
    answer = await connect(make_server(upstream.url)).post("/v1/responses", json={"input": "q", "bogus": 1})
    assert answer.status_code == 422
    assert upstream.received == []


async def test_max_concurrent_requests_bounds_upstream_calls(upstream, connect):
    upstream.delay_s = 0.05
    client = connect(make_server(upstream.url, max_concurrent_requests=2))
    answers = await asyncio.gather(*(client.post("/v1/responses", json={"input": "q"}) for _ in range(6)))
    assert [answer.status_code for answer in answers] == [200] * 6
    assert upstream.max_in_flight == 2

    unbounded = connect(make_server(upstream.url))
    upstream.max_in_flight = 0
    await asyncio.gather(*(unbounded.post("/v1/responses", json={"input": "q"}) for _ in range(6)))
    assert upstream.max_in_flight > 2


def test_official_openai_client_gets_valid_responses_and_chat_completions(upstream):
    with serve_in_thread(make_server(upstream.url).setup_webserver()) as base_url:
        client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", timeout=20, max_retries=0)
        response = client.responses.create(model="m", input="Weather in Oslo?", tools=[WEATHER_TOOL])
        assert response.status == "completed" and response.model == "gpt-test"
        call = response.output[1]
        assert call.type == "function_call" and call.name == "get_weather" and call.arguments == '{"city": "Oslo"}'

        completion = client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "Weather in Oslo?"}], tools=[CHAT_WEATHER_TOOL]
        )
        assert completion.choices[0].message.tool_calls[0].function.name == "get_weather"
        assert completion.choices[0].finish_reason == "tool_calls"
        client.close()
    assert [item.path for item in upstream.received] == ["/v1/responses", "/v1/chat/completions"]
    assert all(item.json["model"] == "gpt-test" for item in upstream.received)


def test_shipped_config_loads():
    config = OmegaConf.merge(
        OmegaConf.load(Path(__file__).parents[1] / "configs" / "openai_model.yaml"),
        {"policy_base_url": "https://api.example/v1", "policy_api_key": "k", "policy_model_name": "m"},
        {"policy_model": {"responses_api_models": {"openai_model": {"host": "127.0.0.1", "port": 1}}}},
    )
    loaded = OpenAIModel.load_config("policy_model", config)
    assert (loaded.openai_base_url, loaded.openai_api_key, loaded.openai_model) == ("https://api.example/v1", "k", "m")
