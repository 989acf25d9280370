"""The pure Responses <-> Messages mapping, for the cases the recordings do not cover."""

from __future__ import annotations

import pytest

from responses_api_models.anthropic_model.convert import (
    UnsupportedInputError,
    chat_completion_from_message,
    messages_request,
    output_items,
)

TOOL = {"type": "function", "name": "f", "description": None, "parameters": {"type": "object", "properties": {}}}


def test_system_and_developer_messages_join_the_instructions_and_a_bare_string_is_one_user_turn() -> None:
    params = {
        "instructions": "Be brief.",
        "input": [{"role": "developer", "content": [{"type": "input_text", "text": "Use tools."}]},
                  {"role": "user", "content": "hi"}],
    }  # fmt: skip
    body = messages_request(params, "m", 100)
    assert body["system"] == "Be brief.\n\nUse tools."
    assert body["messages"] == [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    assert messages_request({"input": "hi"}, "m", 100)["messages"] == body["messages"]


@pytest.mark.parametrize(
    ("choice", "parallel", "expected"),
    [
        ("required", None, {"type": "any"}),
        ("none", False, {"type": "none"}),
        ({"type": "function", "name": "f"}, False, {"type": "tool", "name": "f", "disable_parallel_tool_use": True}),
        (None, False, {"type": "auto", "disable_parallel_tool_use": True}),
    ],
)
def test_tool_choice(choice: object, parallel: bool | None, expected: dict) -> None:
    params = {"input": "x", "tools": [TOOL], "tool_choice": choice, "parallel_tool_calls": parallel}
    body = messages_request(params, "m", 1)
    assert body["tool_choice"] == expected
    assert body["tools"] == [{"name": "f", "description": "", "input_schema": TOOL["parameters"]}]


def test_tool_results_lead_their_user_turn_and_foreign_reasoning_is_left_out() -> None:
    params = {
        "input": [
            {"role": "user", "content": "q"},
            {"type": "reasoning", "id": "rs", "summary": [{"type": "summary_text", "text": "from vLLM"}]},
            {"type": "function_call", "call_id": "t1", "name": "f", "arguments": "{}"},
            {"role": "user", "content": "also this"},
            {"type": "function_call_output", "call_id": "t1", "output": "ok"},
        ]
    }
    messages = messages_request(params, "m", 1)["messages"]
    assert messages[1] == {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {}}]}
    assert [block["type"] for block in messages[2]["content"]] == ["tool_result", "text"]


def test_redacted_thinking_round_trips_through_a_reasoning_item() -> None:
    message = {"content": [{"type": "redacted_thinking", "data": "opaque"}, {"type": "text", "text": "hi"}]}
    items = output_items(message)
    assert items[0] == {"type": "reasoning", "id": "rs_0", "summary": [], "encrypted_content": "opaque"}
    assert messages_request({"input": items}, "m", 1)["messages"][0]["content"][0] == {
        "type": "redacted_thinking", "data": "opaque"
    }  # fmt: skip


def test_images_become_image_blocks() -> None:
    content = [{"type": "input_image", "image_url": "data:image/png;base64,iVBORw0K", "detail": "auto"},
               {"type": "input_image", "image_url": "https://example.com/cat.jpg", "detail": "auto"}]  # fmt: skip
    blocks = messages_request({"input": [{"role": "user", "content": content}]}, "m", 1)["messages"][0]["content"]
    assert blocks == [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0K"}},
        {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.jpg"}},
    ]


def test_unsupported_input_names_the_item() -> None:
    with pytest.raises(UnsupportedInputError, match=r"input\.0: content part 'input_file'"):
        messages_request({"input": [{"role": "user", "content": [{"type": "input_file"}]}]}, "m", 1)


def test_chat_completion_carries_thinking_as_think_spans() -> None:
    message = {"id": "m1", "model": "c", "stop_reason": "end_turn",
               "content": [{"type": "thinking", "thinking": "hmm", "signature": "s"}, {"type": "text", "text": "42"}],
               "usage": {"input_tokens": 3, "output_tokens": 2}}  # fmt: skip
    completion = chat_completion_from_message(message)
    assert completion["choices"][0]["message"] == {"role": "assistant", "content": "<think>hmm</think>42"}
    assert completion["usage"] == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
