"""azure_openai_model against a fake Azure OpenAI resource on loopback that answers only Azure's URL shape
(``/openai/deployments/<deployment>/chat/completions?api-version=...``) with the ``api-key`` header, as Azure does:
404 for another path, 400 without ``api-version``, 401 for a wrong key."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any
from unittest.mock import MagicMock

import httpx
import openai
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import ValidationError

from nemo_gym.server_utils import ServerClient
from nemo_gym.testing import asgi_clients, serve_in_thread
from responses_api_models.azure_openai_model.app import AzureOpenAIModel, AzureOpenAIModelConfig

pytestmark = pytest.mark.timeout(60)

KEY = "azure-key-1"  # pragma: allowlist secret
VERSION = "2024-10-21"
DEPLOYMENT = "gpt-4o-mini-prod"
WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


def fake_azure(calls: list[dict[str, Any]]) -> FastAPI:
    app = FastAPI()

    def error(status: int, code: str, message: str) -> JSONResponse:
        return JSONResponse({"error": {"code": code, "message": message}}, status_code=status)

    @app.post("/openai/deployments/{deployment}/chat/completions")
    async def chat(deployment: str, request: Request) -> Any:
        if request.headers.get("api-key") != KEY:
            return error(401, "401", "Access denied due to invalid subscription key or wrong API endpoint.")
        if request.query_params.get("api-version") != VERSION:
            return error(400, "BadRequest", "API version not supported")
        if deployment != DEPLOYMENT:
            return error(404, "DeploymentNotFound", "The API deployment for this resource does not exist.")
        body = await request.json()
        calls.append({"deployment": deployment, "query": dict(request.query_params), "body": body})
        if any(message["role"] == "tool" for message in body["messages"]):
            message: dict[str, Any] = {"role": "assistant", "content": "It is cold in Oslo."}
        else:
            call = {"id": "call_az1", "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}  # fmt: skip
            message = {"role": "assistant", "content": None, "tool_calls": [call]}
        finish = "tool_calls" if "tool_calls" in message else "stop"
        return {
            "id": "chatcmpl-az", "object": "chat.completion", "created": 1_700_000_000, "model": "gpt-4o-mini-2024-07-18",
            "choices": [{"index": 0, "finish_reason": finish, "message": message, "content_filter_results": {}}],
            "prompt_filter_results": [], "usage": {"prompt_tokens": 30, "completion_tokens": 9, "total_tokens": 39},
        }  # fmt: skip

    return app


@pytest.fixture
def azure() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    calls: list[dict[str, Any]] = []
    with serve_in_thread(fake_azure(calls)) as url:
        yield url, calls


def make_server(endpoint: str, **config: Any) -> AzureOpenAIModel:
    settings = {"host": "127.0.0.1", "port": 0, "entrypoint": "app.py", "name": "policy_model",
                "openai_base_url": endpoint, "openai_api_key": KEY, "openai_model": DEPLOYMENT,
                "default_query": {"api-version": VERSION}}  # fmt: skip
    return AzureOpenAIModel(
        config=AzureOpenAIModelConfig(**settings | config), server_client=MagicMock(spec=ServerClient)
    )


@pytest.fixture
async def connect() -> AsyncIterator[Callable[[AzureOpenAIModel], httpx.AsyncClient]]:
    async with asgi_clients(timeout_s=30) as factory:
        yield factory


async def test_responses_tool_loop_through_the_deployment(azure: tuple[str, list], connect: Callable) -> None:
    url, calls = azure
    client = connect(make_server(url))
    question = {"input": "Weather in Oslo?", "tools": [WEATHER_TOOL], "model": "ignored"}
    first = await client.post("/v1/responses", json=question)
    assert first.status_code == 200, first.text
    [call] = first.json()["output"]
    assert call["type"] == "function_call" and json.loads(call["arguments"]) == {"city": "Oslo"}
    result = {"type": "function_call_output", "call_id": call["call_id"], "output": "cold"}
    second = await client.post("/v1/responses", json=question | {"input": [{"role": "user", "content": "Weather in Oslo?"}, call, result]})  # fmt: skip
    assert second.json()["output"][0]["content"][0]["text"] == "It is cold in Oslo."
    assert second.json()["usage"]["input_tokens"] == 30
    assert calls[0]["query"] == {"api-version": VERSION} and calls[0]["body"]["model"] == DEPLOYMENT
    assert calls[0]["body"]["tools"][0]["function"]["name"] == "get_weather"


async def test_chat_completions_and_a_separate_deployment_name(azure: tuple[str, list], connect: Callable) -> None:
    url, calls = azure
    server = make_server(url, openai_model="gpt-4o-mini", azure_deployment=DEPLOYMENT)
    answer = await connect(server).post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["message"]["tool_calls"][0]["id"] == "call_az1"
    assert calls[0]["deployment"] == DEPLOYMENT and calls[0]["body"]["model"] == "gpt-4o-mini"


@pytest.mark.parametrize(
    ("config", "status"),
    [({"openai_api_key": "wrong"}, 401), ({"default_query": {"api-version": "1999-01-01"}}, 400),
     ({"openai_model": "other"}, 404)],
)  # fmt: skip
async def test_azure_refusals_are_502s_naming_the_url(azure: tuple[str, list], connect: Callable, config: dict, status: int) -> None:  # fmt: skip
    url, _ = azure
    answer = await connect(make_server(url, **config)).post("/v1/responses", json={"input": "hi"})
    assert answer.status_code == 502
    error = answer.json()["error"]
    assert f"{url}/openai/deployments/" in error and f"HTTP {status}" in error and KEY not in answer.text


def test_api_version_is_required() -> None:
    with pytest.raises(ValidationError, match="api-version"):
        make_server("http://127.0.0.1:1", default_query={})


def test_the_openai_sdk_streams_from_the_azure_model(azure: tuple[str, list]) -> None:
    url, _ = azure
    with serve_in_thread(make_server(url).setup_webserver()) as model_url:
        client = openai.OpenAI(base_url=f"{model_url}/v1", api_key="unused", max_retries=0, timeout=30)
        with client.responses.create(input="Weather in Oslo?", model="x", tools=[WEATHER_TOOL], stream=True) as stream:  # type: ignore[list-item]
            events = list(stream)
    final = events[-1].response
    assert final.output[0].type == "function_call" and final.output[0].name == "get_weather"
