"""A rollout row as chat messages: the Responses shapes other than the weather runs' (a string input, instructions,
reasoning, developer messages, several tool calls in one turn), and what cannot be exported."""

from __future__ import annotations

from typing import Any

import pytest

from nemo_gym.training.conversation import UnusableRollout, rollout_conversation


def row(output: list[dict[str, Any]], **params: Any) -> dict[str, Any]:
    return {
        "responses_create_params": {"input": "What is 2 + 2?", **params},
        "response": {"id": "resp_1", "object": "response", "output": output, "status": "completed"},
        "reward": 1.0, "_ng_task_index": 0, "_ng_rollout_index": 0,
    }  # fmt: skip


def message(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": []}]}  # fmt: skip


def call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"type": "function_call", "call_id": call_id, "name": name, "arguments": arguments, "id": f"fc_{call_id}"}


def test_a_string_input_with_instructions_and_reasoning() -> None:
    reasoning = {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "2 and 2 make 4."}]}
    conversation = rollout_conversation(row([reasoning, message("4")], instructions="Answer briefly."))
    assert conversation.prompt == [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "What is 2 + 2?"},
    ]
    assert conversation.completion == [{"role": "assistant", "content": "<think>2 and 2 make 4.</think>4"}]
    assert conversation.tools is None and conversation.reward == 1.0 and not conversation.incomplete


def test_parallel_tool_calls_of_one_turn_are_one_assistant_message() -> None:
    output = [
        call("c1", "add", '{"a": 2, "b": 2}'), call("c2", "mul", '{"a": 2, "b": 2}'),
        {"type": "function_call_output", "call_id": "c2", "output": "4"},
        {"type": "function_call_output", "call_id": "c1", "output": [{"type": "input_text", "text": "4"}]},
        message("Both give 4."),
    ]  # fmt: skip
    developer = [{"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Use tools."}]},
                 {"type": "message", "role": "user", "content": "What is 2 + 2 and 2 * 2?"}]  # fmt: skip
    tools = [
        {"type": "function", "name": name, "parameters": {"type": "object"}, "strict": True} for name in ("add", "mul")
    ]
    conversation = rollout_conversation(row(output, input=developer, tools=tools))
    assert conversation.prompt[0] == {"role": "system", "content": "Use tools."}
    first, *results, last = conversation.completion
    assert [c["function"] for c in first["tool_calls"]] == [
        {"name": "add", "arguments": {"a": 2, "b": 2}}, {"name": "mul", "arguments": {"a": 2, "b": 2}},
    ]  # fmt: skip
    assert results == [
        {"role": "tool", "content": "4", "tool_call_id": "c2", "name": "mul"},
        {"role": "tool", "content": "4", "tool_call_id": "c1", "name": "add"},
    ]
    assert last == {"role": "assistant", "content": "Both give 4."}
    assert conversation.tools == [
        {"type": "function", "function": {"name": name, "parameters": {"type": "object"}}} for name in ("add", "mul")
    ]


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"reward": "1"}, "missing_reward"),
        ({"reward": True}, "missing_reward"),
        ({"responses_create_params": {}}, "missing_input"),
        ({"response": {"output": "text"}}, "missing_response"),
        ({"response": {"output": []}}, "no_model_output"),
        ({"_ng_failure_class": "model_failed"}, "failure_row"),
        (
            {
                "responses_create_params": {
                    "input": [
                        {"type": "message", "role": "user", "content": [{"type": "input_image", "image_url": "data:,"}]}
                    ]
                }
            },
            "unsupported_content",
        ),  # fmt: skip
        ({"responses_create_params": {"input": "hi", "tools": [{"type": "web_search"}]}}, "unsupported_content"),
        ({"response": {"output": [call("c1", "add", "[1, 2]")]}}, "bad_tool_arguments"),
    ],
)
def test_rows_that_cannot_be_a_conversation_say_why(change: dict[str, Any], reason: str) -> None:
    with pytest.raises(UnusableRollout) as raised:
        rollout_conversation({**row([message("4")]), **change})
    assert raised.value.reason == reason and str(raised.value)
