"""litellm_model against OpenAI-compatible endpoints on loopback, reached through LiteLLM's ``openai/<model>`` provider:
a recording fake (what LiteLLM sends) and our scripted model server (tool calls, and a scored ``gym eval run``)."""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any
from unittest.mock import MagicMock

import httpx
import pytest

from nemo_gym.server_utils import ServerClient
from nemo_gym.testing import FakeUpstream, asgi_clients, eval_run, serve_in_thread
from responses_api_models.litellm_model.app import LiteLLMModel, LiteLLMModelConfig
from responses_api_models.scripted_model.app import ScriptedModel, ScriptedModelConfig

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).parents[3]
WEATHER = "example_single_tool_call"
ROW = json.loads((ROOT / "resources_servers" / WEATHER / "data" / "example.jsonl").open().readline())
PARAMS = ROW["responses_create_params"]


def make_server(api_base: str, **config: Any) -> LiteLLMModel:
    settings = {"host": "127.0.0.1", "port": 0, "entrypoint": "app.py", "name": "policy_model"}
    settings |= {"model": "openai/upstream-model", "api_base": api_base, "api_key": "sk-loopback", "num_retries": 0}
    return LiteLLMModel(config=LiteLLMModelConfig(**settings | config), server_client=MagicMock(spec=ServerClient))


@pytest.fixture(scope="module")
def scripted() -> Iterator[str]:
    """Our scripted model server (get_weather, then an answer), as an OpenAI-compatible endpoint: its ``/v1``."""
    config = ScriptedModelConfig(host="127.0.0.1", port=0, entrypoint="app.py", name="upstream")
    with serve_in_thread(
        ScriptedModel(config=config, server_client=MagicMock(spec=ServerClient)).setup_webserver()
    ) as url:
        yield f"{url}/v1"


@pytest.fixture
async def connect() -> AsyncIterator[Callable[[LiteLLMModel], httpx.AsyncClient]]:
    async with asgi_clients(timeout_s=120) as factory:
        yield factory


def chat_reply(body: Any) -> tuple[int, dict[str, Any]]:
    message = {"role": "assistant", "content": "Cold.", "reasoning_content": "The tool said cold."}
    return 200, {
        "id": "chatcmpl-up", "object": "chat.completion", "created": 1_700_000_000, "model": body["model"],
        "choices": [{"index": 0, "finish_reason": "stop", "message": message}],
        "usage": {"prompt_tokens": 20, "completion_tokens": 5, "total_tokens": 25},
    }  # fmt: skip


async def test_what_litellm_sends_and_what_comes_back(connect: Callable) -> None:
    upstream = FakeUpstream(lambda path, body: chat_reply(body)).start()
    try:
        server = make_server(upstream.url, litellm_kwargs={"extra_headers": {"X-Route": "a"}})
        body = PARAMS | {"model": "caller-choice", "temperature": 0.5, "max_output_tokens": 64}
        answer = await connect(server).post("/v1/responses", json=body)
        assert answer.status_code == 200, answer.text
    finally:
        upstream.stop()
    [received] = upstream.received
    assert received.path == "/v1/chat/completions"
    headers = {key.lower(): value for key, value in received.headers.items()}
    assert headers["authorization"] == "Bearer sk-loopback" and headers["x-route"] == "a"
    sent = received.json
    assert sent["model"] == "upstream-model" and sent["temperature"] == 0.5 and sent["max_tokens"] == 64
    assert [m["role"] for m in sent["messages"]] == ["system", "user"]
    assert sent["tools"][0]["function"]["name"] == "get_weather"
    response = answer.json()
    assert [item["type"] for item in response["output"]] == ["reasoning", "message"]
    assert response["output"][0]["summary"][0]["text"] == "The tool said cold."
    assert response["usage"]["input_tokens"] == 20 and response["usage"]["output_tokens"] == 5


async def test_tool_call_loop_against_the_scripted_model(scripted: str, connect: Callable) -> None:
    client = connect(make_server(scripted))
    first = (await client.post("/v1/responses", json=PARAMS)).json()
    [call] = first["output"]
    assert call["type"] == "function_call" and json.loads(call["arguments"]) == {"city": "Paris"}
    result = {"type": "function_call_output", "call_id": call["call_id"], "output": "cold"}
    second = (await client.post("/v1/responses", json=PARAMS | {"input": PARAMS["input"] + [call, result]})).json()
    assert second["output"][0]["content"][0]["text"] == "It is cold there."

    chat = {"messages": [{"role": "user", "content": "Weather in Paris?"}],
            "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]}  # fmt: skip
    completion = (await client.post("/v1/chat/completions", json=chat)).json()
    assert completion["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "get_weather"
    assert completion["choices"][0]["finish_reason"] == "tool_calls"


async def test_a_provider_error_is_a_502_naming_the_endpoint(connect: Callable) -> None:
    upstream = FakeUpstream(lambda path, body: (401, {"error": {"message": "bad key", "type": "auth"}})).start()
    try:
        answer = await connect(make_server(upstream.url)).post("/v1/responses", json={"input": "hi"})
    finally:
        upstream.stop()
    assert answer.status_code == 502
    assert f"{upstream.url} answered 401" in answer.json()["error"] and "sk-loopback" not in answer.text


def test_gym_eval_run_scores_rollouts_through_litellm(scripted: str, tmp_path: Path) -> None:
    rows = eval_run(
        tmp_path, "--resources-server", WEATHER, "--model-type", "litellm_model", "--agent", f"{WEATHER}_simple_agent",
        "--input", str(ROOT / "resources_servers" / WEATHER / "data" / "example.jsonl"), "--limit", "2",
        f"+policy_base_url={scripted}", "+policy_api_key=sk-loopback", "+policy_model_name=openai/scripted",
    )  # fmt: skip
    assert len(rows) == 2 and all(row["reward"] == 1.0 for row in rows)
    for row in rows:
        assert [item["type"] for item in row["response"]["output"]] == [
            "function_call", "function_call_output", "message"
        ]  # fmt: skip


def test_litellm_was_imported_with_its_local_cost_map() -> None:
    """Set before LiteLLM's import, so it never fetches its cost map from the internet (none here)."""
    import litellm

    assert os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] == "True" and litellm.model_cost
