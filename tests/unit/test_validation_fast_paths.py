"""The shortcuts taken on every validation and dump of Responses items give the answers of the general code they skip.

``_item_tag`` (the item unions' discriminator) reads a dict inline and skips the token-field lookups for model classes
that can never hold one; ``_drop_unknown_null_fields`` returns early when every key is declared; the client parses a
server's origin once. Each is compared here with the general computation on the same inputs.
"""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict

from nemo_gym import openai_responses
from nemo_gym.base_resources_server import BaseVerifyRequest, BaseVerifyResponse
from nemo_gym.openai_base import _drop_unknown_null_fields, get_field, has_token_id_information
from nemo_gym.openai_utils import NeMoGymResponse, NeMoGymResponseCreateParamsNonStreaming
from nemo_gym.transport import lean_client
from nemo_gym.transport.admission import origin_of

pytestmark = pytest.mark.timeout(60)

TOKENS = {"prompt_token_ids": [1, 2], "generation_token_ids": [3], "generation_log_probs": [-0.5]}


def general_tag(value: Any) -> str:
    """The discriminator as written before its shortcuts: every read through get_field / has_token_id_information."""
    item_type = get_field(value, "type")
    training = has_token_id_information(value)
    if item_type is None or item_type == "message":
        return "message_for_training" if training else "message"
    if item_type in ("function_call", "reasoning"):
        return f"{item_type}_for_training" if training else item_type
    if item_type == "function_call_output":
        return item_type
    return "other"


def general_drop(model: type[BaseModel], data: Any) -> Any:
    """``_drop_unknown_null_fields`` without its early return for fully declared dicts."""
    if isinstance(data, BaseModel) and not isinstance(data, model):
        data = data.model_dump(exclude_unset=True)
    if not isinstance(data, dict) or None not in data.values():
        return data
    fields = model.__pydantic_fields__
    if any(value is None and key not in fields for key, value in data.items()):
        return {key: value for key, value in data.items() if value is not None or key in fields}
    return data


class _Dict(dict):
    pass


ITEMS: list[dict[str, Any]] = [
    {"role": "user", "content": "hi"},
    {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "x", "annotations": []}]},
    {"type": "message", "role": "assistant", "id": "m", "status": "completed", "content": []} | TOKENS,
    {"type": "function_call", "name": "f", "arguments": "{}", "call_id": "c"},
    {"type": "function_call", "name": "f", "arguments": "{}", "call_id": "c", "generation_token_ids": [1]},
    {"type": "function_call", "name": "f", "arguments": "{}", "call_id": "c", "prompt_token_ids": None},
    {"type": "function_call_output", "call_id": "c", "output": "ok"},
    {"type": "reasoning", "id": "r", "summary": []},
    {"type": "reasoning", "id": "r", "summary": [], "generation_log_probs": [0.0]},
    {"type": "web_search_call", "id": "w", "status": "completed"},
    {"type": None, "role": "user", "content": "hi"},
]


@pytest.mark.parametrize("item", ITEMS + [_Dict(item) for item in ITEMS[:4]])
def test_item_tag_of_a_dict_is_the_general_one(item: dict[str, Any]) -> None:
    assert openai_responses._item_tag(item) == general_tag(item)


def test_item_tag_of_every_item_model_is_the_general_one() -> None:
    trajectory = [
        ITEMS[0],
        ITEMS[1],
        ITEMS[2],
        ITEMS[3],
        ITEMS[3] | TOKENS,
        ITEMS[5],
        ITEMS[6],
        ITEMS[7],
        ITEMS[7] | TOKENS,
    ]
    response = NeMoGymResponse.model_validate(
        {"id": "r", "created_at": 0, "model": "m", "object": "response", "output": trajectory, "tools": []}
        | {"parallel_tool_calls": True, "tool_choice": "auto"}
    )
    classes = {type(item) for item in response.output}
    assert len(classes) >= 6  # plain and training variants of messages, calls and reasoning, and tool outputs
    for item in response.output:
        assert openai_responses._item_tag(item) == general_tag(item)
    # And what the tags decide: a dump validates back to the same classes, as equal items.
    again = NeMoGymResponse.model_validate(response.model_dump())
    assert [type(item) for item in again.output] == [type(item) for item in response.output]
    assert again == response


def test_item_tag_of_a_model_that_keeps_extra_keys_reads_them() -> None:
    class Loose(BaseModel):
        model_config = ConfigDict(extra="allow")
        type: str = "function_call"

    class WithProperty(BaseModel):
        type: str = "reasoning"

        @property
        def generation_token_ids(self) -> list[int]:
            return [1]

    loose = Loose.model_validate({"prompt_token_ids": [1]})
    sneaked = openai_responses.NeMoGymResponseFunctionToolCall(name="f", arguments="{}", call_id="c")
    object.__setattr__(sneaked, "generation_token_ids", [1])  # a key in __dict__ that is no field
    for value in (loose, Loose(), WithProperty(), sneaked):
        assert openai_responses._item_tag(value) == general_tag(value)
    assert openai_responses._item_tag(loose) == "function_call_for_training"
    assert openai_responses._item_tag(WithProperty()) == "reasoning_for_training"
    assert openai_responses._item_tag(sneaked) == "function_call_for_training"


@pytest.mark.parametrize(
    "data",
    [
        {"type": "function_call", "name": "f", "arguments": "{}", "call_id": "c", "id": None, "status": None},
        {"type": "function_call", "name": "f", "arguments": "{}", "call_id": "c", "brand_new": None},
        {"type": "function_call", "name": "f", "arguments": "{}", "call_id": "c", "brand_new": 1, "id": None},
        {"type": "function_call", "name": "f", "arguments": "{}", "call_id": "c"},
        [1, None],
    ],
)
def test_dropping_unknown_nulls_gives_the_general_answer(data: Any) -> None:
    model = openai_responses.NeMoGymResponseFunctionToolCall
    assert _drop_unknown_null_fields(model, data) == general_drop(model, data)


def test_a_verify_body_rebuilt_by_the_environment_idiom_is_unchanged() -> None:
    """``BaseVerifyResponse(**body.model_dump(), reward=...)``: the dump and the rebuild go through the shortcuts."""
    row = {
        "responses_create_params": NeMoGymResponseCreateParamsNonStreaming.model_validate(
            {"input": [ITEMS[0], {"role": "system", "content": "s", "type": "message"}], "temperature": 0.5}
        ).model_dump(mode="json", exclude_unset=True),
        "response": {"id": "r", "created_at": 0, "model": "m", "object": "response", "output": ITEMS[1:4] + ITEMS[6:8]}
        | {"parallel_tool_calls": True, "tool_choice": "auto", "tools": []},
    }
    body = BaseVerifyRequest.model_validate(row)
    rebuilt = BaseVerifyResponse(**body.model_dump(), reward=1.0)
    assert rebuilt.response == body.response
    assert rebuilt.responses_create_params == body.responses_create_params
    # what a verify response adds to its request: the reward, and NeMo Gym 0.7's mask and typed-failure fields
    added = {"reward", "mask_sample", "failure_kind", "failure_reason"}
    assert added == set(BaseVerifyResponse.model_fields) - set(BaseVerifyRequest.model_fields)
    assert rebuilt.model_dump_json(exclude=added) == body.model_dump_json()


@pytest.mark.parametrize(
    "url", ["http://127.0.0.1:8000", "http://localhost", "http://example.com:81/", "not a url", "http://[::1]:9"]
)
def test_a_server_origin_is_parsed_as_origin_of_parses_it(url: str) -> None:
    assert lean_client.origin_of_server(url) == origin_of(url)
    assert lean_client.origin_of_server(url) == origin_of(url)  # and again, from the cache
