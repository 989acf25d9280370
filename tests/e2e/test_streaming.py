"""``stream: true`` and ``GET /v1/models`` with the official ``openai`` SDK (issue 16, acceptance 1).

Real model servers in their own processes on loopback: the scripted model (a tool call, then an answer) and the
embedded SmolLM2 model. Each stream is assembled the way a client would (text deltas, argument deltas, chunks) and
must equal the non-streaming answer to the same request, tool calls included; ids and timestamps aside, which every
answer draws afresh.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from nemo_gym import PARENT_DIR
from nemo_gym.launcher import running_servers
from nemo_gym.transport import access
from tests.helpers import write

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

HANG_GUARD_S = 240
WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    "strict": False,
}
SCRIPT = [
    [{"type": "function_call", "name": "get_weather", "arguments": '{"city": "Paris"}'}],
    [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "It is cold in Paris."}]}],
]
VOLATILE = {"id", "call_id", "created_at", "created", "item_id"}


def _client(workdir: Path, model: str, *extra: Path) -> Iterator[openai.OpenAI]:
    configs = [PARENT_DIR / "responses_api_models" / model / "configs" / f"{model}.yaml", *extra]
    overrides = [
        "+config_paths=[" + ",".join(str(c) for c in configs) + "]", "+shared_venv=true", "+head_server={port: 0}",
        f"+results_dir={workdir / 'results'}", f"+cache_dir={workdir / 'cache'}",
    ]  # fmt: skip
    with running_servers(overrides) as run:
        url = run.urls["policy_model"]
        yield openai.OpenAI(
            base_url=f"{url}/v1", api_key=access.registered_token(url), max_retries=0, timeout=HANG_GUARD_S
        )


@pytest.fixture(scope="module")
def scripted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[openai.OpenAI]:
    workdir = tmp_path_factory.mktemp("scripted")
    body = {"policy_model": {"responses_api_models": {"scripted_model": {"script": SCRIPT}}}}
    yield from _client(workdir, "scripted_model", write(workdir / "script.yaml", json.dumps(body)))


def stable(value: Any) -> Any:
    """``value`` without the fields every answer draws afresh (ids, timestamps)."""
    if isinstance(value, dict):
        return {k: stable(v) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list):
        return [stable(v) for v in value]
    return value


def assembled_response(events: list[Any]) -> dict[str, Any]:
    """The response a client builds from the events alone: items as announced done, text and arguments from deltas."""
    types = [event.type for event in events]
    # a turn cut off at max_output_tokens ends with response.incomplete, as OpenAI's API ends it
    ending = {"response.completed": "completed", "response.incomplete": "incomplete"}
    assert types[:2] == ["response.created", "response.in_progress"] and types[-1] in ending, types
    assert [event.sequence_number for event in events] == list(range(len(events)))
    texts: dict[tuple[int, int], str] = {}
    arguments: dict[int, str] = {}
    output: dict[int, dict[str, Any]] = {}
    for event in events:
        if event.type == "response.output_text.delta":
            texts[(event.output_index, event.content_index)] = (
                texts.get((event.output_index, event.content_index), "") + event.delta
            )
        elif event.type == "response.function_call_arguments.delta":
            arguments[event.output_index] = arguments.get(event.output_index, "") + event.delta
        elif event.type == "response.output_item.done":
            output[event.output_index] = event.item.model_dump(mode="json", exclude_none=True)
    for index, item in output.items():
        if item["type"] == "function_call":
            assert arguments[index] == item["arguments"]
        for content_index, part in enumerate(item.get("content") or []):
            if part["type"] == "output_text":
                assert texts.get((index, content_index), "") == part["text"]
    final = events[-1].response.model_dump(mode="json", exclude_none=True)
    assert final["status"] == ending[types[-1]]
    assert final["output"] == [output[i] for i in sorted(output)]
    return final


def assembled_completion(chunks: list[Any]) -> dict[str, Any]:
    """The message, finish reason and usage a client builds from the chunks."""
    content, calls, finish, usage = "", {}, None, None
    for chunk in chunks:
        usage = chunk.usage or usage
        for choice in chunk.choices:
            content += choice.delta.content or ""
            finish = choice.finish_reason or finish
            for call in choice.delta.tool_calls or []:
                entry = calls.setdefault(call.index, {"name": "", "arguments": ""})
                entry["name"] += call.function.name or ""
                entry["arguments"] += call.function.arguments or ""
    return {
        "content": content,
        "tool_calls": [calls[i] for i in sorted(calls)],
        "finish_reason": finish,
        "usage": usage.model_dump(mode="json", exclude_none=True) if usage is not None else None,
    }


def completion_summary(completion: Any) -> dict[str, Any]:
    message = completion.choices[0].message
    calls = [{"name": c.function.name, "arguments": c.function.arguments} for c in message.tool_calls or []]
    usage = completion.usage.model_dump(mode="json", exclude_none=True)
    return {
        "content": message.content or "",
        "tool_calls": calls,
        "finish_reason": completion.choices[0].finish_reason,
        "usage": usage,
    }


def test_models_list_names_the_served_model(scripted: openai.OpenAI) -> None:
    assert [model.id for model in scripted.models.list()] == ["scripted"]


@pytest.mark.parametrize("turn", [0, 1], ids=["tool_call", "answer"])
def test_scripted_responses_stream_equals_the_non_streaming_answer(scripted: openai.OpenAI, turn: int) -> None:
    conversation: list[dict[str, Any]] = [{"role": "user", "content": "Weather in Paris?"}]
    if turn:
        conversation += [
            {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
            {"type": "function_call_output", "call_id": "c1", "output": "cold"},
        ]
    plain = scripted.responses.create(model="scripted", input=conversation, tools=[WEATHER_TOOL])
    events = list(scripted.responses.create(model="scripted", input=conversation, tools=[WEATHER_TOOL], stream=True))
    final = assembled_response(events)
    assert stable(final) == stable(plain.model_dump(mode="json", exclude_none=True))
    expected = {0: "response.function_call_arguments.delta", 1: "response.output_text.delta"}[turn]
    assert expected in {event.type for event in events}


@pytest.mark.parametrize("turn", [0, 1], ids=["tool_call", "answer"])
def test_scripted_chat_stream_equals_the_non_streaming_answer(scripted: openai.OpenAI, turn: int) -> None:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Weather in Paris?"}]
    if turn:
        call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
        messages += [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": "cold"},
        ]
    tools = [{"type": "function", "function": {k: WEATHER_TOOL[k] for k in ("name", "description", "parameters")}}]
    plain = scripted.chat.completions.create(model="scripted", messages=messages, tools=tools)
    chunks = list(
        scripted.chat.completions.create(
            model="scripted", messages=messages, tools=tools, stream=True, stream_options={"include_usage": True}
        )
    )
    assert {chunk.object for chunk in chunks} == {"chat.completion.chunk"}
    assert assembled_completion(chunks) == completion_summary(plain)


def test_a_streaming_request_is_still_validated(scripted: openai.OpenAI) -> None:
    with pytest.raises(openai.UnprocessableEntityError):
        scripted.responses.create(model="scripted", input="hi", stream=True, extra_body={"not_a_field": 1})


@pytest.mark.model
def test_embedded_model_streams_as_it_generates_and_equals_the_non_streaming_answer(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Same seed, same answer: text arrives in several deltas (as the engine makes it); tool calls too."""
    pytest.importorskip("xllamacpp")
    for client in _client(tmp_path_factory.mktemp("embedded"), "llamacpp_model"):
        assert len(list(client.models.list())) == 1
        ask = {
            "model": "smollm2",
            "input": "Say hello to Ada in one sentence.",
            "max_output_tokens": 24,
            "temperature": 0.0,
        }
        plain = client.responses.create(**ask)
        events = list(client.responses.create(**ask, stream=True))
        final = assembled_response(events)
        assert stable(final) == stable(plain.model_dump(mode="json", exclude_none=True))
        assert sum(event.type == "response.output_text.delta" for event in events) > 1

        tools = {"tools": [WEATHER_TOOL], "tool_choice": "required", "max_output_tokens": 48, "temperature": 0.0}
        call = {"model": "smollm2", "input": "What is the weather in Paris?", **tools}
        plain = client.responses.create(**call)
        final = assembled_response(list(client.responses.create(**call, stream=True)))
        assert final["output"][0]["type"] == "function_call"
        assert stable(final) == stable(plain.model_dump(mode="json", exclude_none=True))

        chat = {
            "model": "smollm2",
            "messages": [{"role": "user", "content": "Say hello."}],
            "max_tokens": 16,
            "temperature": 0,
        }
        plain_chat = client.chat.completions.create(**chat)
        chunks = list(client.chat.completions.create(**chat, stream=True, stream_options={"include_usage": True}))
        assert assembled_completion(chunks) == completion_summary(plain_chat)
        assert sum(bool(c.choices and c.choices[0].delta.content) for c in chunks) > 1
