"""anthropic_model against a loopback process that replays recorded Messages API exchanges (``fixtures/``).

The replay answers only a request equal to a recorded one, so each passing call proves the adapter sent exactly the
recorded Messages body (with the API key and the ``anthropic-version`` header). The adapter is called in-process
through its ASGI app, and over HTTP by the official ``openai`` client, streaming included.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any
from unittest.mock import MagicMock

import anthropic
import httpx
import openai
import pytest

from nemo_gym.server_utils import ServerClient
from nemo_gym.testing import asgi_clients, serve_in_thread
from responses_api_models.anthropic_model.app import AnthropicModel, AnthropicModelConfig
from responses_api_models.anthropic_model.tests.conftest import Replay

pytestmark = pytest.mark.timeout(120)

HERE = Path(__file__).parent
WEATHER_ROW = json.loads(
    (HERE.parents[2] / "resources_servers/example_single_tool_call/data/example.jsonl").open().readline()
)
PARIS = WEATHER_ROW["responses_create_params"]
CALCULATOR = {
    "type": "function",
    "name": "calculator",
    "description": "Evaluate an arithmetic expression.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
}


def make_server(replay: Replay, **config: Any) -> AnthropicModel:
    settings = {"host": "127.0.0.1", "port": 0, "entrypoint": "app.py", "name": "policy_model"}
    settings |= {"base_url": replay.url, "api_key": replay.api_key, "model": replay.model, "max_retries": 0} | config
    return AnthropicModel(config=AnthropicModelConfig(**settings), server_client=MagicMock(spec=ServerClient))


@pytest.fixture
async def connect() -> AsyncIterator[Callable[[AnthropicModel], httpx.AsyncClient]]:
    async with asgi_clients() as factory:
        yield factory


async def test_weather_tool_use_then_answer(replay: Replay, connect: Callable) -> None:
    client = connect(make_server(replay))
    first = (await client.post("/v1/responses", json=PARIS | {"model": "anything"})).json()
    assert [item["type"] for item in first["output"]] == ["message", "function_call"], first
    call = first["output"][1]
    assert (call["name"], json.loads(call["arguments"]), call["call_id"]) == (
        "get_weather", {"city": "Paris"}, "toolu_01A09q90qw90lq917835lq9"
    )  # fmt: skip
    assert first["model"] == replay.model and first["status"] == "completed"
    assert first["usage"]["input_tokens"] == 412 and first["usage"]["output_tokens"] == 61

    tool_output = {"type": "function_call_output", "call_id": call["call_id"],
                   "output": '{"city":"Paris","weather_description":"The weather in Paris is cold."}'}  # fmt: skip
    second = await client.post(
        "/v1/responses", json=PARIS | {"input": PARIS["input"] + first["output"] + [tool_output]}
    )
    assert second.status_code == 200, second.text
    [answer] = second.json()["output"]
    assert answer["content"][0]["text"].startswith("It is currently cold in Paris")


async def test_thinking_comes_back_as_a_reasoning_item_and_is_replayed_signed(
    replay: Replay, connect: Callable
) -> None:
    thinking = {"thinking": {"type": "enabled", "budget_tokens": 2048}}
    client = connect(make_server(replay, extra_body=thinking))
    question = {"input": [{"role": "user", "content": "What is 17 * 23? Use the calculator."}], "tools": [CALCULATOR]}
    first = (await client.post("/v1/responses", json=question)).json()
    reasoning, call = first["output"]
    assert reasoning["type"] == "reasoning" and reasoning["encrypted_content"].startswith("ErUB")
    assert reasoning["summary"][0]["text"].startswith("The user wants 17 * 23")
    assert first["usage"]["input_tokens_details"]["cached_tokens"] == 128 and first["usage"]["input_tokens"] == 517

    result = {"type": "function_call_output", "call_id": call["call_id"], "output": "391"}
    second = await client.post(
        "/v1/responses", json=question | {"input": question["input"] + first["output"] + [result]}
    )
    assert second.status_code == 200, second.text
    assert second.json()["output"][0]["content"][0]["text"] == "17 * 23 = 391."


async def test_an_upstream_stream_is_assembled(replay: Replay, connect: Callable) -> None:
    weather = {**PARIS["tools"][0], "parameters": {k: v for k, v in PARIS["tools"][0]["parameters"].items() if k != "additionalProperties"}}  # fmt: skip
    body = {"input": "Name a cold city, then check its weather.", "tools": [weather], "max_output_tokens": 256}
    answer = await connect(make_server(replay, stream_upstream=True)).post("/v1/responses", json=body)
    assert answer.status_code == 200, answer.text
    message, call = answer.json()["output"]
    assert message["content"][0]["text"] == "Oslo is usually cold. Let me check."
    assert json.loads(call["arguments"]) == {"city": "Oslo"} and call["call_id"] == "toolu_01StreamOslo9x8y7z6w5v"
    assert answer.json()["usage"]["output_tokens"] == 54


async def test_max_tokens_makes_an_incomplete_response(replay: Replay, connect: Callable) -> None:
    body = {"input": "Tell me a long story.", "instructions": "You tell stories.", "max_output_tokens": 8,
            "temperature": 0.0}  # fmt: skip
    response = (await connect(make_server(replay)).post("/v1/responses", json=body)).json()
    assert response["status"] == "incomplete"
    assert response["incomplete_details"] == {"reason": "max_output_tokens"}
    assert response["output"][0]["status"] == "incomplete"


async def test_chat_completions_go_through_the_same_messages_call(replay: Replay, connect: Callable) -> None:
    tool = PARIS["tools"][0]
    chat_tool = {"type": "function", "function": {k: tool[k] for k in ("name", "description", "parameters", "strict")}}
    body = {"messages": [{"role": message["role"], "content": message["content"]} for message in PARIS["input"]],
            "tools": [chat_tool]}  # fmt: skip
    answer = await connect(make_server(replay)).post("/v1/chat/completions", json=body)
    assert answer.status_code == 200, answer.text
    choice = answer.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] == "I'll look up the current weather in Paris."
    assert json.loads(choice["message"]["tool_calls"][0]["function"]["arguments"]) == {"city": "Paris"}


async def test_a_request_no_recording_matches_fails_loudly(replay: Replay, connect: Callable) -> None:
    unseen = PARIS | {"input": [{"role": "user", "content": "What is the weather on Mars?"}]}
    answer = await connect(make_server(replay)).post("/v1/responses", json=unseen)
    assert answer.status_code == 502
    assert f"{replay.url}/v1/messages answered 400" in answer.json()["error"] and replay.api_key not in answer.text
    assert any("Mars" in line and "differs at body.messages" in line for line in replay.report()["mismatches"])


async def test_a_wrong_api_key_is_refused(replay: Replay, connect: Callable) -> None:
    answer = await connect(make_server(replay, api_key="sk-ant-other")).post("/v1/responses", json=PARIS)
    assert answer.status_code == 502 and "the API key" in answer.json()["error"]


def test_the_openai_sdk_streams_from_the_adapter(replay: Replay) -> None:
    """``stream=True`` through the official client: the assembled stream equals the plain answer."""
    server = make_server(replay)
    with serve_in_thread(server.setup_webserver()) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60)
        plain = client.responses.create(**PARIS).model_dump(exclude={"created_at"})
        with client.responses.create(**PARIS, stream=True) as stream:
            events = list(stream)
        assert events[-1].type == "response.completed"
        assert events[-1].response.model_dump(exclude={"created_at"}) == plain
        assert any(event.type == "response.output_text.delta" for event in events)

        messages: list[Any] = [{"role": message["role"], "content": message["content"]} for message in PARIS["input"]]
        tools: list[Any] = [{"type": "function", "function": {k: PARIS["tools"][0][k] for k in ("name", "description", "parameters", "strict")}}]  # fmt: skip
        chunks = list(client.chat.completions.create(model="x", messages=messages, tools=tools, stream=True))
        text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
        calls = [c for chunk in chunks if chunk.choices for c in chunk.choices[0].delta.tool_calls or []]
        assert text == "I'll look up the current weather in Paris."
        assert calls[0].function.name == "get_weather"
        assert json.loads("".join(c.function.arguments or "" for c in calls)) == {"city": "Paris"}
    assert replay.report()["served"]["weather_paris_1_tool_use"] >= 3


def test_the_anthropic_sdk_talks_messages_to_the_adapter(replay: Replay) -> None:
    """Messages in (``/v1/messages``, served by every model server), Messages upstream: the same recorded call."""
    tool = PARIS["tools"][0]
    with serve_in_thread(make_server(replay).setup_webserver()) as url:
        client = anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0, timeout=60)
        message = client.messages.create(
            model="policy", max_tokens=4096, system=PARIS["input"][0]["content"],
            messages=[{"role": "user", "content": PARIS["input"][1]["content"]}],
            tools=[{"name": tool["name"], "description": tool["description"], "input_schema": tool["parameters"]}],
        )  # fmt: skip
    assert message.stop_reason == "tool_use"
    assert [block.type for block in message.content] == ["text", "tool_use"]
    assert message.content[1].input == {"city": "Paris"}  # type: ignore[union-attr]
