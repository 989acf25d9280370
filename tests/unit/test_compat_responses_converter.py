"""The converter and wire-model behaviour environments written for NeMo Gym rely on: its converter method names, ids
a test can pin by patching ``nemo_gym.responses_converter.uuid4``, Chat request models read like dicts, and
trajectories (user turns included) in a Response's ``output``."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from openai.types.chat.chat_completion import Choice
from openai.types.chat.chat_completion_message import ChatCompletionMessage

from nemo_gym import responses_converter
from nemo_gym.openai_utils import (
    NeMoGymChatCompletionCreateParamsNonStreaming,
    NeMoGymEasyInputMessage,
    NeMoGymFunctionCallOutput,
    NeMoGymResponse,
    NeMoGymResponseFunctionToolCall,
    NeMoGymResponseFunctionToolCallForTraining,
    NeMoGymResponseInputTokensDetails,
    NeMoGymResponseOutputMessage,
    NeMoGymResponseOutputTokensDetails,
    NeMoGymResponseReasoningItem,
    NeMoGymResponseUsage,
)
from nemo_gym.responses_converter import ResponsesConverter

TOKENS = {"prompt_token_ids": [1], "generation_token_ids": [2, 3], "generation_log_probs": [-0.1, -0.2]}


def completion(content: str | None, finish_reason: str = "stop") -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "created": 5,
        "model": "m",
        "choices": [{"index": 0, "finish_reason": finish_reason, "message": {"role": "assistant", "content": content}}],
    }


def test_patching_the_modules_uuid4_pins_every_id(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("nemo_gym.responses_converter.uuid4", lambda: SimpleNamespace(hex="fixed"))
    response = ResponsesConverter().chat_completion_to_response(
        responses_create_params={"input": "q"}, chat_completion=completion("<think>r</think>answer")
    )
    assert response.id == "resp_fixed"
    assert [item.id for item in response.output] == ["rs_fixed", "msg_fixed"]
    assert responses_converter.uuid4 is not None


def test_content_filter_is_its_own_incomplete_reason() -> None:
    response = ResponsesConverter().chat_completion_to_response({"input": "q"}, completion("", "content_filter"))
    assert response.status == "incomplete"
    assert response.model_dump()["incomplete_details"] == {"reason": "content_filter"}


def test_reasoning_items_carry_no_status_so_they_equal_ones_built_by_hand() -> None:
    [reasoning, _] = ResponsesConverter().postprocess_assistant_message_dict({"content": "<think>r</think>a"})
    assert reasoning == NeMoGymResponseReasoningItem(id=reasoning.id, summary=[{"text": "r"}])


def test_think_tag_helpers() -> None:
    converter = ResponsesConverter()
    assert converter._wrap_reasoning_in_think_tags(["a", "", "b"]) == "<think>a</think><think>b</think>"
    assert converter._extract_reasoning_from_content("<think>a</think>x<think>b</think>y") == (["a", "b"], "xy")
    assert ResponsesConverter._parse_think_tags("plain") == ([], "plain")


def test_a_subclass_can_change_where_reasoning_is_found() -> None:
    class BracketConverter(ResponsesConverter):
        def _extract_reasoning_from_content(self, content: str) -> tuple[list[str], str]:
            reasoning, _, answer = content.partition("]")
            return [reasoning.lstrip("[")], answer

    items = BracketConverter().postprocess_assistant_message_dict({"role": "assistant", "content": "[why]what"})
    assert [type(item) for item in items] == [NeMoGymResponseReasoningItem, NeMoGymResponseOutputMessage]
    assert items[0].summary[0].text == "why"


def test_postprocess_chat_response_takes_sdk_choices() -> None:
    choice = Choice(
        index=0, finish_reason="length", message=ChatCompletionMessage(role="assistant", content="cut", refusal=None)
    )
    [message] = ResponsesConverter().postprocess_chat_response(choice)
    assert isinstance(message, NeMoGymResponseOutputMessage)
    assert (message.content[0].text, message.status) == ("cut", "incomplete")


def test_postprocess_assistant_message_dict_with_tool_calls_and_tokens() -> None:
    message = {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
        **TOKENS,
    }
    [call] = ResponsesConverter(return_token_id_information=True).postprocess_assistant_message_dict(message)
    assert isinstance(call, NeMoGymResponseFunctionToolCallForTraining)
    assert (call.call_id, call.name, call.generation_token_ids) == ("c1", "f", [2, 3])


def test_chat_messages_become_responses_items() -> None:
    messages = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": [{"type": "text", "text": "hi"}]},
        {
            "role": "assistant",
            "content": "<think>plan</think>",
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "42"},
        {"role": "user", "content": None},
    ]
    items = ResponsesConverter().chat_completions_messages_to_responses_items(messages)
    assert [type(item) for item in items] == [
        NeMoGymEasyInputMessage,
        NeMoGymEasyInputMessage,
        NeMoGymResponseReasoningItem,
        NeMoGymResponseFunctionToolCall,
        NeMoGymFunctionCallOutput,
        NeMoGymEasyInputMessage,
    ]
    assert items[1].model_dump()["content"] == [{"type": "input_text", "text": "hi"}]
    assert (items[4].call_id, items[4].output, items[5].content) == ("c1", "42", "")
    with pytest.raises(NotImplementedError, match="'function'"):
        ResponsesConverter().chat_completions_messages_to_responses_items([{"role": "function", "content": "x"}])


def test_a_chat_request_becomes_the_responses_request_for_the_same_thing() -> None:
    chat = {
        "messages": [{"role": "user", "content": "q"}],
        "model": "m",
        "max_completion_tokens": 7,
        "temperature": 0.5,
        "reasoning_effort": "low",
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
        "tool_choice": {"type": "function", "function": {"name": "f"}},
    }
    params = ResponsesConverter().chat_completion_to_responses_create_params(chat)
    assert params.model_dump(exclude_unset=True, mode="json") == {
        "input": [{"role": "user", "content": "q"}],
        "model": "m",
        "max_output_tokens": 7,
        "temperature": 0.5,
        "reasoning": {"effort": "low"},
        "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
        "tool_choice": {"type": "function", "name": "f"},
    }
    plain = ResponsesConverter().chat_completion_to_responses_create_params(
        {"messages": [{"role": "user", "content": "q"}]}
    )
    assert (plain.tool_choice, plain.tools, plain.model_fields_set) == ("auto", [], {"input", "tool_choice", "tools"})


def test_chat_request_messages_read_like_dicts() -> None:
    params = ResponsesConverter().responses_to_chat_completion_create_params(
        {
            "input": [
                {"role": "user", "content": [{"type": "input_text", "text": "hi"}]},
                {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c1", "output": "42"},
            ],
            "instructions": "be brief",
        }
    )
    system, user, assistant, tool = params.messages
    assert (system["role"], system["content"]) == ("system", "be brief")
    assert user["content"][0]["text"] == "hi"
    assert assistant["tool_calls"][0]["function"]["name"] == "f"
    assert assistant.get("refusal") is None and "refusal" not in assistant and "tool_calls" in assistant
    assert (tool["tool_call_id"], tool["content"]) == ("c1", "42")
    assert {**user} == {"role": "user", "content": user["content"]}
    with pytest.raises(KeyError):
        user["name"]
    user["content"] = "replaced"
    assert params.model_dump(exclude_unset=True)["messages"][1] == {"role": "user", "content": "replaced"}

    built = NeMoGymChatCompletionCreateParamsNonStreaming(messages=[{"role": "user", "content": "judge this"}])
    assert "judge this" in built.messages[0]["content"]


def test_response_output_holds_a_whole_trajectory() -> None:
    response = NeMoGymResponse(
        id="r",
        created_at=0,
        model="m",
        output=[
            {"id": "m1", "type": "message", "role": "assistant", "content": "((3))"},
            NeMoGymEasyInputMessage(role="user", content="Thanks, carry on."),
            {"type": "message", "role": "user", "content": "and a dict turn"},
        ],
    )
    first, second, third = response.output
    assert isinstance(first, NeMoGymResponseOutputMessage) and first.content[0].text == "((3))"
    assert response.output_text == "((3))"
    assert isinstance(second, NeMoGymEasyInputMessage) and isinstance(third, NeMoGymEasyInputMessage)
    assert NeMoGymResponse.model_validate(response.model_dump()).output == response.output


def test_usage_sum_from_list() -> None:
    def usage(tokens: int) -> NeMoGymResponseUsage:
        return NeMoGymResponseUsage(
            input_tokens=tokens,
            input_tokens_details=NeMoGymResponseInputTokensDetails(cached_tokens=1),
            output_tokens=tokens,
            output_tokens_details=NeMoGymResponseOutputTokensDetails(reasoning_tokens=2),
            total_tokens=2 * tokens,
        )

    total = NeMoGymResponseUsage.sum_from_list([usage(3), usage(4)])
    assert (total.input_tokens, total.output_tokens, total.total_tokens) == (7, 7, 14)
    assert (total.input_tokens_details.cached_tokens, total.output_tokens_details.reasoning_tokens) == (2, 4)
    assert NeMoGymResponseUsage.sum_from_list([]).total_tokens == 0


def test_the_converter_takes_nemo_gyms_keyword_names() -> None:
    converter = ResponsesConverter()
    chat = converter.responses_to_chat_completion_create_params(responses_create_params={"input": "hi"})
    assert chat.messages == [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    back = converter.chat_completion_to_responses_create_params(chat_completion_create_params=chat)
    assert back.input[0].model_dump()["content"] == [{"type": "input_text", "text": "hi"}]
