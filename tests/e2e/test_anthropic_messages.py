"""``POST /v1/messages`` with the official ``anthropic`` SDK (issue 16, acceptance 2, served side).

Two scripted model servers in their own processes on loopback: one calls a tool and then answers (tool use), one only
talks (no tools). The SDK authenticates with the run token as its ``api_key`` (sent as ``x-api-key``). Each stream,
assembled by the SDK itself, must equal the non-streaming message for the same request; ids aside.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import pytest

from nemo_gym import PARENT_DIR
from nemo_gym.launcher import running_servers
from nemo_gym.transport import access
from tests.helpers import write

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

HANG_GUARD_S = 240
WEATHER_TOOL = {
    "name": "get_weather",
    "description": "The weather in a city.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


def _say(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}


TOOL_SCRIPT = [
    [_say("Let me look."), {"type": "function_call", "name": "get_weather", "arguments": '{"city": "Paris"}'}],
    [_say("It is cold in Paris.")],
]
TALK_SCRIPT = [[_say("Hello from the policy. END and nothing after.")]]


@pytest.fixture(scope="module")
def clients(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, anthropic.Anthropic]]:
    workdir = tmp_path_factory.mktemp("anthropic")
    entry = {"entrypoint": "app.py", "description": "scripted"}
    body = {
        "policy_model": {"responses_api_models": {"scripted_model": {**entry, "script": TOOL_SCRIPT}}},
        "talk_model": {"responses_api_models": {"scripted_model": {**entry, "script": TALK_SCRIPT}}},
    }
    configs = [PARENT_DIR / "responses_api_models/scripted_model/configs/scripted_model.yaml"]
    configs.append(write(workdir / "script.yaml", json.dumps(body)))
    overrides = [
        "+config_paths=[" + ",".join(str(c) for c in configs) + "]", "+shared_venv=true", "+head_server={port: 0}",
        f"+results_dir={workdir / 'results'}", f"+cache_dir={workdir / 'cache'}",
    ]  # fmt: skip
    with running_servers(overrides) as run:

        def client(name: str) -> anthropic.Anthropic:
            url = run.urls[name]
            token = access.registered_token(url)
            return anthropic.Anthropic(base_url=url, api_key=token, max_retries=0, timeout=HANG_GUARD_S)

        yield {"tools": client("policy_model"), "talk": client("talk_model")}


def _without_ids(message: dict[str, Any]) -> dict[str, Any]:
    """``message`` without the ids every answer draws afresh (its own, its tool calls')."""
    content = [{k: v for k, v in block.items() if k != "id"} for block in message["content"]]
    return {k: v for k, v in message.items() if k != "id"} | {"content": content}


def _plain_and_streamed(client: anthropic.Anthropic, **request: Any) -> tuple[dict[str, Any], dict[str, Any], list]:
    plain = client.messages.create(**request).model_dump(exclude_none=True)
    with client.messages.stream(**request) as stream:
        events = [event.type for event in stream]
        streamed = stream.get_final_message().model_dump(exclude_none=True)
    return plain, streamed, events


def test_text_only_message_and_its_stream(clients: dict[str, anthropic.Anthropic]) -> None:
    request = {
        "model": "scripted",
        "max_tokens": 64,
        "system": "Be brief.",
        "extra_body": {"temperature": 0.0},  # the SDK no longer has the argument; servers still take the field
        "messages": [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": [{"type": "text", "text": "Hello."}]},
            {"role": "user", "content": [{"type": "text", "text": "Say it again."}]},
        ],
    }
    plain, streamed, events = _plain_and_streamed(clients["talk"], **request)
    assert plain["content"] == [{"type": "text", "text": "Hello from the policy. END and nothing after."}]
    assert plain["stop_reason"] == "end_turn" and plain["role"] == "assistant"
    assert plain["usage"]["input_tokens"] > 0 and plain["usage"]["output_tokens"] > 0
    assert _without_ids(streamed) == _without_ids(plain)
    assert events[0] == "message_start" and events[-1] == "message_stop"
    assert "message_delta" in events and "content_block_stop" in events


def test_stop_sequences_cut_the_text(clients: dict[str, anthropic.Anthropic]) -> None:
    request = {
        "model": "scripted",
        "max_tokens": 64,
        "stop_sequences": [" END"],
        "messages": [{"role": "user", "content": "Hi"}],
    }
    plain, streamed, _ = _plain_and_streamed(clients["talk"], **request)
    assert plain["content"] == [{"type": "text", "text": "Hello from the policy."}]
    assert (plain["stop_reason"], plain["stop_sequence"]) == ("stop_sequence", " END")
    assert _without_ids(streamed) == _without_ids(plain)


def test_tool_use_round_trip_and_its_stream(clients: dict[str, anthropic.Anthropic]) -> None:
    client = clients["tools"]
    first: dict[str, Any] = {"model": "scripted", "max_tokens": 64, "tools": [WEATHER_TOOL],
             "messages": [{"role": "user", "content": "Weather in Paris?"}]}  # fmt: skip
    plain, streamed, events = _plain_and_streamed(client, **first)
    assert plain["stop_reason"] == "tool_use"
    text, call = plain["content"]
    assert text == {"type": "text", "text": "Let me look."}
    assert (call["type"], call["name"], call["input"]) == ("tool_use", "get_weather", {"city": "Paris"})
    assert _without_ids(streamed) == _without_ids(plain)
    assert "content_block_delta" in events

    follow_up = first | {
        "messages": [
            *first["messages"],
            {"role": "assistant", "content": plain["content"]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call["id"], "content": "3 degrees"}]},
        ]
    }
    answer, streamed_answer, _ = _plain_and_streamed(client, **follow_up)
    assert answer["content"] == [{"type": "text", "text": "It is cold in Paris."}]
    assert answer["stop_reason"] == "end_turn"
    assert _without_ids(streamed_answer) == _without_ids(answer)


def test_an_unsupported_request_is_a_400_naming_the_field(clients: dict[str, anthropic.Anthropic]) -> None:
    image: Any = {"type": "image", "source": {"type": "url", "url": "http://127.0.0.1/cat.png"}}
    with pytest.raises(anthropic.BadRequestError, match=r"messages\.0\.content\.0.*'image'"):
        clients["talk"].messages.create(
            model="scripted",
            max_tokens=8,
            messages=[{"role": "user", "content": [image]}],
        )


def test_a_wrong_api_key_is_refused(clients: dict[str, anthropic.Anthropic]) -> None:
    wrong = clients["talk"].with_options(api_key="sk-not-the-run-token")
    with pytest.raises(anthropic.AuthenticationError):
        wrong.messages.create(model="scripted", max_tokens=8, messages=[{"role": "user", "content": "Hi"}])
