"""Responses <-> Chat Completions conversion, as model servers in front of Chat engines (vLLM, ...) rely on it."""

from typing import Any

import pytest
from openai.types.chat.completion_create_params import CompletionCreateParamsNonStreaming
from openai.types.responses import Response
from pydantic import TypeAdapter

from nemo_gym.openai_utils import (
    NeMoGymChatCompletionAssistantMessageForTrainingParam,
    NeMoGymChatCompletionAssistantMessageParam,
    NeMoGymChatCompletionMessage,
    NeMoGymChatCompletionMessageForTraining,
    NeMoGymFunctionCallOutput,
    NeMoGymResponse,
    NeMoGymResponseCreateParamsNonStreaming,
    NeMoGymResponseFunctionToolCall,
    NeMoGymResponseFunctionToolCallForTraining,
    NeMoGymResponseOutputMessage,
    NeMoGymResponseOutputMessageForTraining,
    NeMoGymResponseReasoningItem,
    NeMoGymResponseReasoningItemForTraining,
)
from nemo_gym.responses_converter import ResponsesConverter, VLLMConverter, split_responses_input_output_items

TOKENS = {"prompt_token_ids": [1, 2], "generation_token_ids": [3, 4], "generation_log_probs": [-0.5, -0.25]}
LATER_TOKENS = {"prompt_token_ids": [1, 2, 3, 4, 9], "generation_token_ids": [7], "generation_log_probs": [-1.0]}
WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather by city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    "strict": True,
}


def reasoning(text: str, **extra: Any) -> dict[str, Any]:
    return {"type": "reasoning", "id": "rs_x", "summary": [{"type": "summary_text", "text": text}], **extra}


def function_call(call_id: str, **extra: Any) -> dict[str, Any]:
    return {"type": "function_call", "call_id": call_id, "name": "get_weather", "arguments": '{"city":"SF"}', **extra}


def output_message(text: str, **extra: Any) -> dict[str, Any]:
    return {
        "id": "msg_x",
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
        **extra,
    }


def to_chat(body: dict[str, Any], **converter_kwargs: Any) -> dict[str, Any]:
    converter = ResponsesConverter(**converter_kwargs)
    return converter.responses_to_chat_completion_create_params(body).model_dump(exclude_unset=True)


def chat_completion(message: dict[str, Any], finish_reason: str = "stop", **extra: Any) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1700000000,
        "model": "policy-model",
        "choices": [{"index": 0, "finish_reason": finish_reason, "message": {"role": "assistant", **message}}],
        "usage": {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18},
        **extra,
    }


# ----------------------------------------------------------------------------------------------------------------------
# Responses -> Chat Completions
# ----------------------------------------------------------------------------------------------------------------------


def test_string_input_becomes_one_user_message_with_one_text_part() -> None:
    """NeMo Gym's converter sends a bare string as one text part; environments written for it compare the messages."""
    assert to_chat({"input": "hello"}) == {
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hello"}]}]
    }


def test_request_parameters_are_mapped() -> None:
    chat = to_chat(
        {
            "input": "hi",
            "model": "m",
            "max_output_tokens": 128,
            "temperature": 0.3,
            "top_p": 0.8,
            "reasoning": {"effort": "high", "summary": "auto"},
            "metadata": {"extra_body": '{"seed": 5}'},
            "text": {"format": {"type": "json_schema", "name": "answer", "schema": {"type": "object"}}},
            "store": False,
        }
    )
    assert chat == {
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
        "model": "m",
        "max_tokens": 128,
        "temperature": 0.3,
        "top_p": 0.8,
        "reasoning_effort": "high",
        "metadata": {"extra_body": '{"seed": 5}'},
        "response_format": {"type": "json_schema", "json_schema": {"name": "answer", "schema": {"type": "object"}}},
    }


def test_tools_are_reshaped_and_strict_is_kept_for_hosted_providers() -> None:
    # As in NeMo Gym 0.7: a hosted provider enforces `strict`; the vLLM model server drops it at its engine boundary.
    chat = to_chat({"input": "hi", "tools": [WEATHER_TOOL], "tool_choice": "required", "parallel_tool_calls": False})
    assert chat["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Weather by city",
                "parameters": WEATHER_TOOL["parameters"],
                "strict": True,
            },
        }
    ]
    assert chat["tool_choice"] == "required"
    assert chat["parallel_tool_calls"] is False


def test_named_tool_choice_is_reshaped() -> None:
    chat = to_chat({"input": "hi", "tools": [WEATHER_TOOL], "tool_choice": {"type": "function", "name": "get_weather"}})
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}


def test_no_tools_drops_tool_choice_and_parallel_tool_calls() -> None:
    chat = to_chat({"input": "hi", "tool_choice": "none", "parallel_tool_calls": False})
    assert "tool_choice" not in chat
    assert "parallel_tool_calls" not in chat
    assert "tools" not in chat


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "name": "get_weather"}])
def test_forced_tool_choice_without_tools_is_an_error(tool_choice: Any) -> None:
    with pytest.raises(ValueError, match="requires at least one tool"):
        to_chat({"input": "hi", "tool_choice": tool_choice})


def test_multi_turn_tool_trajectory() -> None:
    chat = to_chat(
        {
            "input": [
                {"role": "user", "content": "weather in SF?"},
                reasoning("I should call the tool."),
                function_call("call_1"),
                function_call("call_2"),
                {"type": "function_call_output", "call_id": "call_1", "output": "cold"},
                {
                    "type": "function_call_output",
                    "call_id": "call_2",
                    "output": [{"type": "input_text", "text": "still "}, {"type": "input_text", "text": "cold"}],
                },
                reasoning("Summarize."),
                output_message("It is cold."),
                {"role": "user", "content": "thanks"},
            ],
            "tools": [WEATHER_TOOL],
        }
    )
    tool_call = {"type": "function", "function": {"name": "get_weather", "arguments": '{"city":"SF"}'}}
    assert chat["messages"] == [
        {"role": "user", "content": "weather in SF?"},
        {
            "role": "assistant",
            "content": "<think>I should call the tool.</think>",
            "tool_calls": [{"id": "call_1", **tool_call}, {"id": "call_2", **tool_call}],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "cold"},
        {
            "role": "tool",
            "tool_call_id": "call_2",
            "content": [{"type": "text", "text": "still "}, {"type": "text", "text": "cold"}],
        },
        {"role": "assistant", "content": "<think>Summarize.</think>It is cold."},
        {"role": "user", "content": "thanks"},
    ]
    adapter = TypeAdapter(CompletionCreateParamsNonStreaming)  # the SDK accepts what we send
    sdk = adapter.validate_python({**chat, "model": "m"})
    assert len(list(sdk["messages"])) == 6


def test_reasoning_is_prepended_to_the_assistant_text_and_tool_only_turn_has_null_content() -> None:
    chat = to_chat({"input": [output_message("answer"), reasoning("a"), reasoning("b"), function_call("c")]})
    (assistant,) = chat["messages"]
    assert assistant["content"] == "<think>a</think><think>b</think>answer"
    assert len(assistant["tool_calls"]) == 1
    tool_only = to_chat({"input": [function_call("c")]})["messages"][0]
    assert tool_only["content"] is None


def test_instructions_become_one_leading_system_message_absorbing_leading_system_messages() -> None:
    chat = to_chat(
        {
            "instructions": "Be brief.",
            "input": [
                {"role": "system", "content": "You are a weather bot."},
                {"role": "developer", "content": [{"type": "input_text", "text": "Use Celsius."}]},
                {"role": "user", "content": "hi"},
                {"role": "system", "content": "late system message stays in place"},
            ],
        }
    )
    assert chat["messages"] == [
        {"role": "system", "content": "Be brief.\n\nYou are a weather bot.\n\nUse Celsius."},
        {"role": "user", "content": "hi"},
        {"role": "system", "content": "late system message stays in place"},
    ]


def test_system_messages_without_instructions_keep_their_roles() -> None:
    chat = to_chat({"input": [{"role": "developer", "content": "dev"}, {"role": "user", "content": "hi"}]})
    assert chat["messages"] == [{"role": "developer", "content": "dev"}, {"role": "user", "content": "hi"}]


def test_user_content_parts_are_converted() -> None:
    chat = to_chat(
        {
            "input": [
                {
                    "role": "user",
                    "content": [
                        {"type": "input_text", "text": "what is in"},
                        {"type": "input_image", "image_url": "https://x/img.png", "detail": "low"},
                        {"type": "input_video", "video_url": "https://x/clip.mp4"},
                    ],
                }
            ]
        }
    )
    assert chat["messages"][0]["content"] == [
        {"type": "text", "text": "what is in"},
        {"type": "image_url", "image_url": {"url": "https://x/img.png", "detail": "low"}},
        {"type": "video_url", "video_url": {"url": "https://x/clip.mp4"}},
    ]


def test_token_fields_ride_on_the_flushed_assistant_message_in_training_mode() -> None:
    body = {
        "input": [
            {"role": "user", "content": "q"},
            reasoning("think"),
            function_call("call_1", **TOKENS),
            {"type": "function_call_output", "call_id": "call_1", "output": "cold"},
            output_message("done", **LATER_TOKENS),
        ]
    }
    converter = ResponsesConverter(return_token_id_information=True)
    params = converter.responses_to_chat_completion_create_params(body)
    assert [type(message) for message in params.messages[1::2]] == [
        NeMoGymChatCompletionAssistantMessageForTrainingParam,
        NeMoGymChatCompletionAssistantMessageForTrainingParam,
    ]
    dumped = params.model_dump(exclude_unset=True)["messages"]
    assert {key: dumped[1][key] for key in TOKENS} == TOKENS
    assert {key: dumped[3][key] for key in LATER_TOKENS} == LATER_TOKENS

    without = ResponsesConverter().responses_to_chat_completion_create_params(body)
    assert type(without.messages[1]) is NeMoGymChatCompletionAssistantMessageParam
    assert "prompt_token_ids" not in without.model_dump(exclude_unset=True)["messages"][1]


def test_a_training_item_closes_its_generation() -> None:
    """Two model calls back to back (e.g. a reasoning-only turn) stay two assistant messages, each with its tokens."""
    body = {
        "input": [
            {"role": "user", "content": "q"},
            reasoning("first", **TOKENS),
            output_message("second", **LATER_TOKENS),
        ]
    }
    messages = to_chat(body, return_token_id_information=True)["messages"]
    assert [message["content"] for message in messages[1:]] == ["<think>first</think>", "second"]
    assert messages[1]["generation_token_ids"] == TOKENS["generation_token_ids"]
    assert messages[2]["generation_token_ids"] == LATER_TOKENS["generation_token_ids"]


@pytest.mark.parametrize(
    ("item", "message"),
    [
        ({"type": "mcp_call", "id": "m", "arguments": "{}", "name": "n", "server_label": "s"}, "'mcp_call'"),
        (
            {"type": "function_call_output", "call_id": "c", "output": [{"type": "input_image", "image_url": "u"}]},
            "'input_image'",
        ),
    ],
)
def test_unconvertible_items_raise_not_implemented(item: dict[str, Any], message: str) -> None:
    with pytest.raises(NotImplementedError, match=message):
        to_chat({"input": [{"role": "user", "content": "q"}, item]})


def test_unknown_item_type_from_raw_items_raises_not_implemented() -> None:
    with pytest.raises(NotImplementedError, match="'compaction_summary'.*Responses API natively"):
        ResponsesConverter().responses_input_to_chat_messages([{"type": "compaction_summary"}])


# ----------------------------------------------------------------------------------------------------------------------
# Chat Completions -> Responses
# ----------------------------------------------------------------------------------------------------------------------


def test_plain_text_completion_becomes_one_output_message() -> None:
    response = ResponsesConverter().chat_completion_to_response({"input": "hi"}, chat_completion({"content": "Hello"}))
    assert [type(item) for item in response.output] == [NeMoGymResponseOutputMessage]
    assert response.output_text == "Hello"
    assert response.id.startswith("resp_") and len(response.id) > len("resp_")
    assert response.status == "completed" and response.incomplete_details is None
    assert response.model == "policy-model"
    assert response.created_at == 1700000000


def test_think_spans_become_one_reasoning_item_with_one_summary_per_span() -> None:
    content = "<think>step 1\nstep 2</think>middle<think>more</think>\n\nFinal answer"
    response = ResponsesConverter().chat_completion_to_response({"input": "q"}, chat_completion({"content": content}))
    reasoning_item, message = response.output
    assert isinstance(reasoning_item, NeMoGymResponseReasoningItem)
    assert [summary.text for summary in reasoning_item.summary] == ["step 1\nstep 2", "more"]
    assert response.output_text == "middle\n\nFinal answer"


def test_without_reasoning_parser_think_text_stays_in_the_message() -> None:
    converter = ResponsesConverter(uses_reasoning_parser=False)
    response = converter.chat_completion_to_response({"input": "q"}, chat_completion({"content": "<think>x</think>y"}))
    assert [type(item) for item in response.output] == [NeMoGymResponseOutputMessage]
    assert response.output_text == "<think>x</think>y"


def test_reasoning_only_completion_has_no_message() -> None:
    response = ResponsesConverter().chat_completion_to_response(
        {"input": "q"}, chat_completion({"content": "<think>only thoughts</think>\n"})
    )
    assert [type(item) for item in response.output] == [NeMoGymResponseReasoningItem]


def test_empty_completion_still_produces_an_empty_message() -> None:
    response = ResponsesConverter().chat_completion_to_response({"input": "q"}, chat_completion({"content": None}))
    assert [type(item) for item in response.output] == [NeMoGymResponseOutputMessage]
    assert response.output_text == ""


def test_tool_calls_become_function_call_items() -> None:
    message = {
        "content": "<think>need weather</think>",
        "tool_calls": [
            {"id": "call_a", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"SF"}'}},
            {"id": "call_b", "type": "function", "function": {"name": "get_weather", "arguments": "not json"}},
        ],
    }
    response = ResponsesConverter().chat_completion_to_response(
        {"input": "q", "tools": [WEATHER_TOOL]}, chat_completion(message, finish_reason="tool_calls")
    )
    assert [type(item) for item in response.output] == [
        NeMoGymResponseReasoningItem,
        NeMoGymResponseFunctionToolCall,
        NeMoGymResponseFunctionToolCall,
    ]
    first, second = response.output[1:]
    assert (first.call_id, first.id, first.name, first.arguments) == (
        "call_a",
        "call_a",
        "get_weather",
        '{"city":"SF"}',
    )
    assert second.arguments == "not json"
    assert response.status == "completed"


@pytest.mark.parametrize(
    ("message", "last_type"),
    [
        ({"content": "answer"}, NeMoGymResponseOutputMessageForTraining),
        ({"content": "<think>only</think>"}, NeMoGymResponseReasoningItemForTraining),
        (
            {
                "content": "x",
                "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": ""}}],
            },
            NeMoGymResponseFunctionToolCallForTraining,
        ),
    ],
)
def test_token_information_goes_on_the_last_output_item(message: dict[str, Any], last_type: type) -> None:
    response = ResponsesConverter(return_token_id_information=True).chat_completion_to_response(
        {"input": "q"}, chat_completion({**message, **TOKENS})
    )
    assert type(response.output[-1]) is last_type
    assert {key: getattr(response.output[-1], key) for key in TOKENS} == TOKENS
    assert all(not hasattr(item, "prompt_token_ids") for item in response.output[:-1])
    # and the whole thing is still a valid SDK Response carrying the token fields
    assert Response.model_validate(response.model_dump()).output[-1].model_extra == TOKENS


def test_chat_message_models_are_accepted_directly() -> None:
    converter = ResponsesConverter()
    items = converter.chat_completion_message_to_output_items(NeMoGymChatCompletionMessage(content="hi"))
    assert [type(item) for item in items] == [NeMoGymResponseOutputMessage]
    trained = converter.chat_completion_message_to_output_items(
        NeMoGymChatCompletionMessageForTraining(content="hi", **TOKENS)
    )
    assert [type(item) for item in trained] == [NeMoGymResponseOutputMessageForTraining]


@pytest.mark.parametrize(
    ("finish_reason", "reason"), [("length", "max_output_tokens"), ("content_filter", "content_filter")]
)
def test_truncated_completion_is_incomplete(finish_reason: str, reason: str) -> None:
    response = ResponsesConverter().chat_completion_to_response(
        {"input": "q"}, chat_completion({"content": "partial"}, finish_reason=finish_reason)
    )
    assert response.status == "incomplete"
    assert response.incomplete_details is not None
    assert response.incomplete_details.reason == reason
    assert response.output[0].status == "incomplete"


def test_request_parameters_are_echoed_and_usage_is_mapped() -> None:
    params = {
        "input": "q",
        "instructions": "Be brief.",
        "max_output_tokens": 99,
        "temperature": 0.1,
        "top_p": 0.2,
        "metadata": {"k": "v"},
        "tools": [WEATHER_TOOL],
        "tool_choice": "required",
        "parallel_tool_calls": False,
        "reasoning": {"effort": "low"},
    }
    completion = chat_completion({"content": "a"})
    completion["usage"]["prompt_tokens_details"] = {"cached_tokens": 4}
    completion["usage"]["completion_tokens_details"] = {"reasoning_tokens": 3}
    response = ResponsesConverter().chat_completion_to_response(params, completion)

    assert (response.instructions, response.max_output_tokens, response.temperature, response.top_p) == (
        "Be brief.",
        99,
        0.1,
        0.2,
    )
    assert response.metadata == {"k": "v"}
    assert response.tool_choice == "required" and response.parallel_tool_calls is False
    assert [tool.name for tool in response.tools] == ["get_weather"]
    assert response.reasoning is not None and response.reasoning.effort == "low"
    assert response.usage is not None
    assert (response.usage.input_tokens, response.usage.output_tokens, response.usage.total_tokens) == (11, 7, 18)
    assert response.usage.input_tokens_details.cached_tokens == 4
    assert response.usage.output_tokens_details.reasoning_tokens == 3
    Response.model_validate(response.model_dump())


def test_usage_aliases_and_missing_usage() -> None:
    completion = chat_completion({"content": "a"})
    completion["usage"]["prompt_cache_hit_tokens"] = 6  # DeepSeek's spelling
    response = ResponsesConverter().chat_completion_to_response({"input": "q"}, completion)
    assert response.usage is not None and response.usage.input_tokens_details.cached_tokens == 6
    del completion["usage"]
    assert ResponsesConverter().chat_completion_to_response({"input": "q"}, completion).usage is None


def test_completion_without_choices_is_an_error() -> None:
    completion = chat_completion({"content": "a"})
    completion["choices"] = []
    with pytest.raises(ValueError, match="no choices"):
        ResponsesConverter().chat_completion_to_response({"input": "q"}, completion)


def test_round_trip_output_back_into_the_next_request() -> None:
    """Feeding a converted response back as input reproduces the original assistant text exactly."""
    converter = ResponsesConverter(return_token_id_information=True)
    content = "<think>\nplan\n</think>\n\nanswer"
    response = converter.chat_completion_to_response({"input": "q"}, chat_completion({"content": content, **TOKENS}))
    body = NeMoGymResponseCreateParamsNonStreaming(
        input=[{"role": "user", "content": "q"}, *response.output, {"role": "user", "content": "next"}]
    )
    messages = converter.responses_to_chat_completion_create_params(body).model_dump(exclude_unset=True)["messages"]
    assert messages[1] == {"role": "assistant", "content": content, **TOKENS}


def test_vllm_converter_alias() -> None:
    assert VLLMConverter is ResponsesConverter


# ----------------------------------------------------------------------------------------------------------------------
# split_responses_input_output_items
# ----------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("items", "cut"),
    [
        ([{"role": "system", "content": "s"}, {"role": "user", "content": "u"}, output_message("a")], 2),
        ([{"role": "user", "content": "u"}, reasoning("r"), output_message("a")], 1),
        ([{"role": "user", "content": "u"}, function_call("c")], 1),
        ([{"role": "user", "content": "u"}, {"role": "assistant", "content": "replayed"}], 1),
        ([{"role": "user", "content": "u"}, {"type": "web_search_call", "id": "w", "status": "completed"}], 1),
        ([{"role": "user", "content": "u"}, {"role": "developer", "content": "d"}], 2),
        ([], 0),
    ],
)
def test_split_input_output_items(items: list[dict[str, Any]], cut: int) -> None:
    prompt, generated = split_responses_input_output_items(items)
    assert prompt == items[:cut]
    assert generated == items[cut:]


def test_split_accepts_models() -> None:
    response = NeMoGymResponse.model_validate(
        {
            "id": "r",
            "created_at": 0,
            "model": "m",
            "output": [
                function_call("c", id="c", status="completed"),
                {"type": "function_call_output", "call_id": "c", "output": "x"},
            ],
        }
    )
    items = [{"role": "user", "content": "u"}, *response.output]
    prompt, generated = split_responses_input_output_items(items)
    assert prompt == items[:1]
    assert [type(item) for item in generated] == [NeMoGymResponseFunctionToolCall, NeMoGymFunctionCallOutput]
