"""The schemas must be strict (typos fail), keep token fields all-or-nothing, and round-trip through the `openai` SDK."""

from collections.abc import Iterable, Mapping
from typing import Any

import pytest
from openai.types.chat import ChatCompletion
from openai.types.chat.completion_create_params import CompletionCreateParamsNonStreaming
from openai.types.responses import (
    Response,
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
    ResponseReasoningItem,
)
from openai.types.responses.response_create_params import ResponseCreateParamsNonStreaming
from openai.types.responses.response_input_item import McpCall
from openai.types.responses.response_usage import InputTokensDetails, OutputTokensDetails, ResponseUsage
from pydantic import TypeAdapter, ValidationError

from nemo_gym.openai_utils import (
    NeMoGymChatCompletion,
    NeMoGymChatCompletionAssistantMessageForTrainingParam,
    NeMoGymChatCompletionAssistantMessageParam,
    NeMoGymChatCompletionCreateParamsNonStreaming,
    NeMoGymChatCompletionMessage,
    NeMoGymChatCompletionMessageForTraining,
    NeMoGymChatCompletionToolMessageParam,
    NeMoGymChatCompletionUserMessageParam,
    NeMoGymChoice,
    NeMoGymEasyInputMessage,
    NeMoGymFunctionCallOutput,
    NeMoGymMessage,
    NeMoGymResponse,
    NeMoGymResponseCreateParamsNonStreaming,
    NeMoGymResponseFunctionToolCall,
    NeMoGymResponseFunctionToolCallForTraining,
    NeMoGymResponseInputTokensDetails,
    NeMoGymResponseOutputMessage,
    NeMoGymResponseOutputMessageForTraining,
    NeMoGymResponseOutputRefusal,
    NeMoGymResponseOutputText,
    NeMoGymResponseReasoningItem,
    NeMoGymResponseReasoningItemForTraining,
    NeMoGymResponseUsage,
    NeMoGymSummary,
)

TOKENS = {"prompt_token_ids": [1, 2, 3], "generation_token_ids": [4, 5], "generation_log_probs": [-0.1, -0.2]}


def materialize(value: Any) -> Any:
    """Turn the SDK's lazily validated `Iterable` fields into lists; iterating is what runs their validation."""
    if isinstance(value, Mapping):
        return {key: materialize(item) for key, item in value.items()}
    if isinstance(value, str | bytes):
        return value
    if isinstance(value, Iterable):
        return [materialize(item) for item in value]
    return value


def through_sdk_typeddict(typeddict: Any, body: dict[str, Any]) -> dict[str, Any]:
    """Validate `body` as an SDK request TypedDict; TypedDicts drop unknown keys, so equality means all keys known."""
    adapter = TypeAdapter(typeddict)  # must outlive the lazy iterators it returns
    return materialize(adapter.validate_python(body))


def full_responses_params() -> dict[str, Any]:
    return {
        "model": "policy",
        "instructions": "Be brief.",
        "input": [
            {"role": "system", "content": "sys", "type": "message"},
            {"role": "user", "content": [{"type": "input_text", "text": "look"}], "type": "message"},
            {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "think"}]},
            {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "SF"}'},
            {"type": "function_call_output", "call_id": "call_1", "output": "cold"},
            {
                "id": "msg_1",
                "type": "message",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": "It is cold.", "annotations": []}],
            },
        ],
        "tools": [
            {
                "type": "function",
                "name": "get_weather",
                "description": "Weather by city",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
                "strict": True,
            }
        ],
        "tool_choice": "auto",
        "parallel_tool_calls": False,
        "max_output_tokens": 256,
        "temperature": 0.7,
        "top_p": 0.9,
        "reasoning": {"effort": "low"},
        "metadata": {"extra_body": '{"seed": 3}'},
        "store": False,
        "stream": False,
    }


def sample_response() -> NeMoGymResponse:
    return NeMoGymResponse(
        id="resp_1",
        created_at=1700000000,
        model="policy",
        output=[
            NeMoGymResponseReasoningItem(id="rs_1", summary=[NeMoGymSummary(text="hmm")]),
            NeMoGymResponseFunctionToolCallForTraining(
                call_id="call_1", id="call_1", name="f", arguments="{}", status="completed", **TOKENS
            ),
            NeMoGymFunctionCallOutput(call_id="call_1", output="42", id="fco_1", status="completed"),
            NeMoGymResponseOutputMessageForTraining(
                id="msg_1",
                content=[NeMoGymResponseOutputText(text="The answer "), NeMoGymResponseOutputText(text="is 42.")],
                **TOKENS,
            ),
        ],
        status="completed",
        usage=NeMoGymResponseUsage(input_tokens=10, output_tokens=5, total_tokens=15),
        tools=[{"type": "function", "name": "f", "parameters": {"type": "object"}}],
    )


# ----------------------------------------------------------------------------------------------------------------------
# Responses create params: strictness
# ----------------------------------------------------------------------------------------------------------------------


def test_create_params_defaults() -> None:
    params = NeMoGymResponseCreateParamsNonStreaming(input="hi")
    assert params.parallel_tool_calls is True
    assert params.tool_choice == "auto"
    assert params.tools == []
    assert params.stream is None


@pytest.mark.parametrize("extra", [{"seed": 1}, {"max_tokens": 10}, {"messages": []}, {"stream": None, "n": 2}])
def test_create_params_reject_unknown_fields(extra: dict[str, Any]) -> None:
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        NeMoGymResponseCreateParamsNonStreaming.model_validate({"input": "hi", **extra})


def test_create_params_reject_unknown_field_even_when_null() -> None:
    with pytest.raises(ValidationError):
        NeMoGymResponseCreateParamsNonStreaming.model_validate({"input": "hi", "seed": None})


def test_create_params_reject_stream_true() -> None:
    with pytest.raises(ValidationError):
        NeMoGymResponseCreateParamsNonStreaming.model_validate({"input": "hi", "stream": True})
    assert NeMoGymResponseCreateParamsNonStreaming.model_validate({"input": "hi", "stream": False}).stream is False


@pytest.mark.parametrize(
    "item",
    [
        {"role": "user", "content": "x", "typo": 1},
        {"role": "robot", "content": "x"},
        {"type": "function_call", "call_id": "c", "name": "f"},
        {"type": "function_call_output", "call_id": "c", "output": "x", "result": "x"},
        {"type": "reasoning", "id": "r", "summary": [{"type": "summary", "text": "x"}]},
        {"type": "not_a_real_item"},
    ],
)
def test_create_params_reject_bad_items(item: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        NeMoGymResponseCreateParamsNonStreaming.model_validate({"input": [item]})


def test_create_params_reject_non_function_tools() -> None:
    with pytest.raises(ValidationError):
        NeMoGymResponseCreateParamsNonStreaming.model_validate({"input": "hi", "tools": [{"type": "web_search"}]})


@pytest.mark.parametrize(
    ("item", "expected"),
    [
        ({"role": "user", "content": "x"}, NeMoGymEasyInputMessage),
        ({"role": "assistant", "content": "x", "type": "message"}, NeMoGymEasyInputMessage),
        ({"role": "user", "content": [{"type": "input_text", "text": "x"}], "status": "completed"}, NeMoGymMessage),
        (
            {"id": "m", "role": "assistant", "status": "completed", "content": [{"type": "output_text", "text": "x"}]},
            NeMoGymResponseOutputMessage,
        ),
        (
            {"id": "m", "role": "assistant", "content": [{"type": "output_text", "text": "x"}], **TOKENS},
            NeMoGymResponseOutputMessageForTraining,
        ),
        ({"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}, NeMoGymResponseFunctionToolCall),
        (
            {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}", **TOKENS},
            NeMoGymResponseFunctionToolCallForTraining,
        ),
        ({"type": "reasoning", "id": "r", "summary": []}, NeMoGymResponseReasoningItem),
        ({"type": "reasoning", "id": "r", "summary": [], **TOKENS}, NeMoGymResponseReasoningItemForTraining),
        (
            {"type": "function_call_output", "call_id": "c", "output": [{"type": "input_text", "text": "x"}]},
            NeMoGymFunctionCallOutput,
        ),
        ({"type": "mcp_call", "id": "m", "arguments": "{}", "name": "n", "server_label": "s"}, McpCall),
    ],
)
def test_input_items_route_to_the_right_class(item: dict[str, Any], expected: type) -> None:
    params = NeMoGymResponseCreateParamsNonStreaming.model_validate({"input": [item]})
    assert type(params.input[0]) is expected


def test_unknown_null_keys_on_items_are_tolerated_but_values_are_not() -> None:
    """Newer SDKs dump fields we do not model as null; those must not break validation, real values must."""
    call = {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}
    parsed = NeMoGymResponseCreateParamsNonStreaming.model_validate({"input": [{**call, "future_field": None}]})
    assert "future_field" not in parsed.input[0].model_dump()
    with pytest.raises(ValidationError):
        NeMoGymResponseCreateParamsNonStreaming.model_validate({"input": [{**call, "future_field": "x"}]})


def test_function_call_namespace_is_kept_when_given_and_left_out_when_not() -> None:
    """openai 2.44 gives function calls a ``namespace``; an older SDK's dump has none, a newer one's has null."""
    call = {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}
    for given in (call, {**call, "namespace": None}):
        assert "namespace" not in NeMoGymResponseFunctionToolCall.model_validate(given).model_dump()
    named = NeMoGymResponseCreateParamsNonStreaming.model_validate({"input": [{**call, "namespace": "weather"}]})
    item = named.input[0]
    assert isinstance(item, NeMoGymResponseFunctionToolCall) and item.namespace == "weather"
    assert item.model_dump()["namespace"] == "weather"


# ----------------------------------------------------------------------------------------------------------------------
# Responses create params: SDK round-trip
# ----------------------------------------------------------------------------------------------------------------------


def test_create_params_round_trip_through_sdk_typeddict() -> None:
    params = NeMoGymResponseCreateParamsNonStreaming.model_validate(full_responses_params())
    body = params.model_dump(exclude_none=True)
    assert through_sdk_typeddict(ResponseCreateParamsNonStreaming, body) == body
    assert NeMoGymResponseCreateParamsNonStreaming.model_validate(body) == params


def test_sdk_typed_params_validate_unchanged() -> None:
    sdk_params: ResponseCreateParamsNonStreaming = full_responses_params()  # type: ignore[assignment]
    parsed = NeMoGymResponseCreateParamsNonStreaming.model_validate(sdk_params)
    assert parsed.model_dump(exclude_unset=True) == sdk_params


# ----------------------------------------------------------------------------------------------------------------------
# Token fields
# ----------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "present",
    [("prompt_token_ids",), ("generation_token_ids",), ("prompt_token_ids", "generation_log_probs")],
)
def test_token_fields_are_all_or_nothing(present: tuple[str, ...]) -> None:
    partial = {key: TOKENS[key] for key in present}
    call = {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}
    with pytest.raises(ValidationError, match="all or none"):
        NeMoGymResponseFunctionToolCallForTraining.model_validate({**call, **partial})
    with pytest.raises(ValidationError, match="all or none"):
        NeMoGymResponseCreateParamsNonStreaming.model_validate({"input": [{**call, **partial}]})
    with pytest.raises(ValidationError, match="all or none"):
        NeMoGymChoice.model_validate({"finish_reason": "stop", "message": {"role": "assistant", **partial}})
    with pytest.raises(ValidationError, match="all or none"):
        NeMoGymChatCompletionCreateParamsNonStreaming.model_validate(
            {"messages": [{"role": "assistant", "content": "x", **partial}]}
        )


def test_for_training_variant_requires_token_fields() -> None:
    with pytest.raises(ValidationError):
        NeMoGymResponseReasoningItemForTraining(id="r", summary=[])


def test_generation_ids_and_logprobs_must_have_same_length() -> None:
    with pytest.raises(ValidationError, match="same length"):
        NeMoGymResponseReasoningItemForTraining(id="r", summary=[], **{**TOKENS, "generation_log_probs": [-0.1]})


def test_plain_items_reject_token_fields() -> None:
    with pytest.raises(ValidationError):
        NeMoGymResponseFunctionToolCall(call_id="c", name="f", arguments="{}", **TOKENS)


def test_training_variants_are_subclasses_with_token_fields_last() -> None:
    item = NeMoGymResponseFunctionToolCallForTraining(call_id="c", name="f", arguments="{}", **TOKENS)
    assert isinstance(item, NeMoGymResponseFunctionToolCall)
    assert list(item.model_dump())[-3:] == ["prompt_token_ids", "generation_token_ids", "generation_log_probs"]


# ----------------------------------------------------------------------------------------------------------------------
# Response
# ----------------------------------------------------------------------------------------------------------------------


def test_response_round_trips_through_sdk_response() -> None:
    ours = sample_response()
    sdk = Response.model_validate(ours.model_dump())
    assert [type(item) for item in sdk.output[:2]] == [ResponseReasoningItem, ResponseFunctionToolCall]
    assert sdk.output[1].model_extra == TOKENS  # token fields survive as SDK extras
    assert sdk.usage is not None and sdk.usage.input_tokens_details.cached_tokens == 0

    back = NeMoGymResponse.model_validate(sdk.model_dump())
    assert [type(item) for item in back.output] == [type(item) for item in ours.output]
    assert back.model_dump() == ours.model_dump()


def test_sdk_built_response_validates_and_round_trips() -> None:
    sdk = Response(
        id="resp_2",
        created_at=1.0,
        model="gpt",
        object="response",
        output=[
            ResponseOutputMessage(
                id="msg",
                role="assistant",
                status="completed",
                type="message",
                content=[ResponseOutputText(type="output_text", text="hello", annotations=[])],
            ),
            ResponseFunctionToolCall(type="function_call", call_id="c", name="f", arguments="{}"),
        ],
        parallel_tool_calls=True,
        tool_choice="auto",
        tools=[],
        usage=ResponseUsage(
            input_tokens=1,
            input_tokens_details=InputTokensDetails(cached_tokens=1, cache_write_tokens=0),
            output_tokens=2,
            output_tokens_details=OutputTokensDetails(reasoning_tokens=1),
            total_tokens=3,
        ),
    )
    ours = NeMoGymResponse.model_validate(sdk.model_dump())
    assert [type(item) for item in ours.output] == [NeMoGymResponseOutputMessage, NeMoGymResponseFunctionToolCall]
    assert ours.output_text == sdk.output_text == "hello"
    assert ours.usage is not None and ours.usage.output_tokens_details.reasoning_tokens == 1
    assert Response.model_validate(ours.model_dump()).model_dump() == sdk.model_dump()


def test_output_text_concatenates_assistant_text_only() -> None:
    response = sample_response()
    assert response.output_text == "The answer is 42."
    response.output.append(NeMoGymResponseOutputMessage(id="m2", content=[NeMoGymResponseOutputRefusal(refusal="no")]))
    assert response.output_text == "The answer is 42."
    assert Response.model_validate(response.model_dump()).output_text == response.output_text


@pytest.mark.parametrize(
    "item",
    [
        {"type": "message", "role": "tool", "content": "no message has this role"},
        {"type": "message", "role": "user", "content": 42},
        {"type": "message", "role": "assistant", "content": "x", "id": "m", "colour": "unknown key"},
    ],
)
def test_response_output_rejects_unknown_item_shapes(item: dict[str, Any]) -> None:
    body = sample_response().model_dump()
    body["output"].append(item)
    with pytest.raises(ValidationError):
        NeMoGymResponse.model_validate(body)


def test_null_token_counts_stay_unknown_and_absent_ones_are_zero() -> None:
    details = NeMoGymResponseInputTokensDetails.model_validate({"cached_tokens": None, "cache_write_tokens": None})
    assert details.cached_tokens is None and details.cache_write_tokens == 0
    assert NeMoGymResponseInputTokensDetails.model_validate({}).cached_tokens == 0


# ----------------------------------------------------------------------------------------------------------------------
# Chat Completions
# ----------------------------------------------------------------------------------------------------------------------


def full_chat_params() -> dict[str, Any]:
    return {
        "model": "policy",
        "messages": [
            {"role": "system", "content": "sys"},
            {"role": "developer", "content": [{"type": "text", "text": "dev"}]},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "what is this?"},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA", "detail": "low"}},
                ],
            },
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "result"},
        ],
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
        "tool_choice": {"type": "function", "function": {"name": "f"}},
        "max_tokens": 64,
        "temperature": 0.5,
        "seed": 7,
        "reasoning_effort": "high",
    }


def test_chat_params_round_trip_through_sdk_typeddict() -> None:
    params = NeMoGymChatCompletionCreateParamsNonStreaming.model_validate(full_chat_params())
    assert [type(message) for message in params.messages][2:] == [
        NeMoGymChatCompletionUserMessageParam,
        NeMoGymChatCompletionAssistantMessageParam,
        NeMoGymChatCompletionToolMessageParam,
    ]
    body = params.model_dump(exclude_unset=True)
    assert body == full_chat_params()
    assert through_sdk_typeddict(CompletionCreateParamsNonStreaming, body) == body


@pytest.mark.parametrize(
    "change",
    [
        {"stream": True},
        {"chat_template_kwargs": []},
        {"messages": [{"role": "function", "content": "x", "name": "f"}]},
        {"messages": [{"role": "user", "content": "x", "extra": 1}]},
    ],
)
def test_chat_params_are_strict(change: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        NeMoGymChatCompletionCreateParamsNonStreaming.model_validate({**full_chat_params(), **change})


def test_chat_params_route_assistant_with_tokens_to_training_variant() -> None:
    params = NeMoGymChatCompletionCreateParamsNonStreaming.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a", **TOKENS}]}
    )
    assert type(params.messages[1]) is NeMoGymChatCompletionAssistantMessageForTrainingParam
    body = params.model_dump(exclude_unset=True)
    assert body["messages"][1] == {"role": "assistant", "content": "a", **TOKENS}
    stripped = {**body, "messages": [body["messages"][0], {"role": "assistant", "content": "a"}]}
    assert through_sdk_typeddict(CompletionCreateParamsNonStreaming, body) == stripped


def chat_completion_body(message: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1700000000,
        "model": "policy",
        "choices": [{"index": 0, "finish_reason": "stop", "logprobs": None, "message": message}],
        "usage": {
            "prompt_tokens": 3,
            "completion_tokens": 2,
            "total_tokens": 5,
            "prompt_tokens_details": {"cached_tokens": 1},
        },
    }


def test_chat_completion_round_trips_through_sdk() -> None:
    message = {
        "role": "assistant",
        "content": "<think>x</think>hi",
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
        "reasoning_content": "engine extra",
    }
    sdk = ChatCompletion.model_validate(chat_completion_body(message))
    ours = NeMoGymChatCompletion.model_validate(sdk.model_dump())
    assert type(ours.choices[0].message) is NeMoGymChatCompletionMessage
    assert ours.choices[0].message.model_extra == {"reasoning_content": "engine extra"}
    assert ChatCompletion.model_validate(ours.model_dump()).model_dump() == sdk.model_dump()


def test_chat_completion_training_message_round_trips_through_sdk() -> None:
    ours = NeMoGymChatCompletion.model_validate(chat_completion_body({"role": "assistant", "content": "a", **TOKENS}))
    assert type(ours.choices[0].message) is NeMoGymChatCompletionMessageForTraining
    sdk = ChatCompletion.model_validate(ours.model_dump())
    assert sdk.choices[0].message.model_extra == TOKENS
    back = NeMoGymChatCompletion.model_validate(sdk.model_dump())
    assert type(back.choices[0].message) is NeMoGymChatCompletionMessageForTraining
    assert back.model_dump() == ours.model_dump()


# --------------------------------------------------------------------------------------------------------------------
# get_field / has_token_id_information: run for every item of every (de)serialization, so they take fast paths


def test_get_field_reads_dicts_fields_extras_and_properties_like_getattr() -> None:
    from nemo_gym.openai_base import NeMoGymLenientModel, get_field

    class Item(NeMoGymLenientModel):
        type: str
        note: str | None = None

        @property
        def shout(self) -> str:
            return self.type.upper()

    item = Item.model_validate({"type": "message", "vendor_extra": 7})
    assert get_field({"type": "x"}, "type") == "x"
    assert get_field({}, "type") is None
    assert get_field(item, "type") == "message"
    assert get_field(item, "note") is None
    assert get_field(item, "vendor_extra") == 7  # an extra key, like getattr
    assert get_field(item, "shout") == "MESSAGE"  # a property, like getattr
    assert get_field(item, "missing") is None
    assert get_field(object(), "missing") is None


def test_token_fields_route_dicts_and_models_to_training_variants() -> None:
    from nemo_gym.openai_base import has_token_id_information

    assert not has_token_id_information({"type": "message"})
    assert not has_token_id_information({"prompt_token_ids": None})
    assert has_token_id_information({"generation_log_probs": []})
    training = NeMoGymResponseOutputMessageForTraining.model_validate(
        {
            "id": "m",
            "role": "assistant",
            "status": "completed",
            "type": "message",
            "content": [{"type": "output_text", "text": "hi", "annotations": []}],
            "prompt_token_ids": [1],
            "generation_token_ids": [2],
            "generation_log_probs": [-0.5],
        }
    )
    assert has_token_id_information(training)
    plain = NeMoGymResponseOutputMessage.model_validate(
        training.model_dump(exclude={"prompt_token_ids", "generation_token_ids", "generation_log_probs"})
    )
    assert not has_token_id_information(plain)


def test_unknown_null_keys_are_dropped_and_unknown_values_still_rejected() -> None:
    message = {"role": "user", "content": "hi", "type": "message"}
    assert NeMoGymEasyInputMessage.model_validate(message | {"status": None}).model_dump(exclude_unset=True) == message
    with pytest.raises(ValidationError):
        NeMoGymEasyInputMessage.model_validate(message | {"colour": "blue"})
