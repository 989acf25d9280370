"""The Responses API's input and output items, their content parts, and the unions that route a raw item to its class.

Apart from `openai_responses.py` (the face that re-exports them with the request and response models) because an item
is its own concept: each hop of a rollout, the request's `input` and the response's `output` alike, is a list of these,
and their routing is the subtle part of the wire format.

How unions pick a class: items are routed by their `type` (a missing `type` means a message). An item that carries
any token field (`prompt_token_ids`, `generation_token_ids`, `generation_log_probs`) is routed to its `ForTraining`
variant, which then insists on all three. Message-shaped items try easy message -> input message -> output message,
left to right (in a Response's `output`, output message first); each forbids unknown keys, so the first class that
fits is the right one. Item types we do not model
(hosted tools such as `mcp_call`, `web_search_call`, ...) fall through to the SDK's own models so they stay valid.
The SDK is imported the first time such an item arrives, not before: `import openai` loads its HTTP clients too,
~20 MB in every server process that never sees a hosted-tool item.
"""

import functools
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    Discriminator,
    Field,
    PlainValidator,
    Tag,
    TypeAdapter,
    field_validator,
    model_validator,
)

from nemo_gym.openai_base import (
    TOKEN_ID_FIELDS,
    NeMoGymRequestPart,
    NeMoGymStrictModel,
    TokenIDLogProbMixin,
    get_field,
    has_token_id_information,
    is_none,
)

ItemStatus = Literal["in_progress", "completed", "incomplete"]


# ----------------------------------------------------------------------------------------------------------------------
# Content parts
# ----------------------------------------------------------------------------------------------------------------------


class NeMoGymResponseInputText(NeMoGymRequestPart):
    type: Literal["input_text"] = "input_text"
    text: str


class NeMoGymResponseInputImage(NeMoGymRequestPart):
    type: Literal["input_image"] = "input_image"
    image_url: str | None = None
    file_id: str | None = None
    detail: Literal["low", "high", "auto", "original"] = "auto"


class NeMoGymResponseInputVideo(NeMoGymRequestPart):
    """Not an OpenAI part: video for vision-language models, forwarded to Chat backends as `video_url`."""

    type: Literal["input_video"] = "input_video"
    video_url: str


class NeMoGymTopLogprob(NeMoGymStrictModel):
    token: str
    bytes: list[int] = Field(default_factory=list)
    logprob: float


class NeMoGymLogprob(NeMoGymStrictModel):
    token: str
    bytes: list[int] = Field(default_factory=list)
    logprob: float
    top_logprobs: list[NeMoGymTopLogprob] = Field(default_factory=list)


class NeMoGymResponseOutputText(NeMoGymStrictModel):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[dict[str, Any]] = Field(default_factory=list)
    logprobs: list[NeMoGymLogprob] | None = None


class NeMoGymResponseOutputRefusal(NeMoGymStrictModel):
    type: Literal["refusal"] = "refusal"
    refusal: str


NeMoGymResponseInputContent = Annotated[
    NeMoGymResponseInputText | NeMoGymResponseInputImage | NeMoGymResponseInputVideo, Field(discriminator="type")
]
NeMoGymEasyInputContent = Annotated[
    NeMoGymResponseInputText | NeMoGymResponseInputImage | NeMoGymResponseInputVideo | NeMoGymResponseOutputText,
    Field(discriminator="type"),
]
NeMoGymResponseOutputContent = Annotated[
    NeMoGymResponseOutputText | NeMoGymResponseOutputRefusal, Field(discriminator="type")
]
NeMoGymFunctionCallOutputContent = Annotated[
    NeMoGymResponseInputText | NeMoGymResponseInputImage, Field(discriminator="type")
]


# ----------------------------------------------------------------------------------------------------------------------
# Items
# ----------------------------------------------------------------------------------------------------------------------


def _without(data: Any, *keys: str) -> Any:
    """`data` less the named keys, when it is a raw dict that has any of them (a model or other value as it is)."""
    if isinstance(data, dict) and any(key in data for key in keys):
        return {key: value for key, value in data.items() if key not in keys}
    return data


class NeMoGymEasyInputMessage(NeMoGymStrictModel):
    """The shorthand message most datasets use: a role plus a string or a list of parts."""

    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[NeMoGymEasyInputContent]
    type: Literal["message"] = "message"
    phase: Literal["commentary", "final_answer"] | None = Field(default=None, exclude_if=is_none)  # see is_none

    @model_validator(mode="before")
    @classmethod
    def _drop_status(cls, data: Any) -> Any:
        """A status is accepted and dropped, as NeMo Gym's easy message ignores it (its environments build easy
        messages with one). In the item unions a status still routes a message to the full form that keeps it."""
        return _without(data, "status")


class NeMoGymMessage(NeMoGymStrictModel):
    """A non-assistant input message in its full form (parts list, optional status)."""

    role: Literal["user", "system", "developer"]
    content: list[NeMoGymResponseInputContent]
    type: Literal["message"] = "message"
    status: ItemStatus | None = None


class NeMoGymResponseOutputMessage(NeMoGymStrictModel):
    """An assistant message as a model server emits it."""

    id: str
    role: Literal["assistant"] = "assistant"
    content: list[NeMoGymResponseOutputContent]
    status: ItemStatus = "completed"
    type: Literal["message"] = "message"
    phase: Literal["commentary", "final_answer"] | None = Field(default=None, exclude_if=is_none)  # see is_none

    @field_validator("content", mode="before")
    @classmethod
    def bare_text_is_one_part(cls, value: Any) -> Any:
        """Some backends send an assistant message's content as a bare string; it is that text as one part."""
        return [{"type": "output_text", "text": value}] if isinstance(value, str) else value


class NeMoGymResponseFunctionToolCall(NeMoGymStrictModel):
    """A tool call; `arguments` is the raw JSON string the model produced (it may be invalid JSON)."""

    type: Literal["function_call"] = "function_call"
    call_id: str
    name: str
    arguments: str
    id: str | None = None
    status: ItemStatus | None = None
    namespace: str | None = Field(default=None, exclude_if=is_none)  # which tool set `name` is in, when names repeat


class NeMoGymFunctionCallOutput(NeMoGymStrictModel):
    """The result of a tool call, fed back to the model."""

    type: Literal["function_call_output"] = "function_call_output"
    call_id: str
    output: str | list[NeMoGymFunctionCallOutputContent]
    id: str | None = None
    status: ItemStatus | None = None


class NeMoGymSummary(NeMoGymStrictModel):
    type: Literal["summary_text"] = "summary_text"
    text: str


class NeMoGymReasoningContent(NeMoGymStrictModel):
    type: Literal["reasoning_text"] = "reasoning_text"
    text: str

    @model_validator(mode="before")
    @classmethod
    def _drop_output_text_fields(cls, data: Any) -> Any:
        """Proxies (LiteLLM) send reasoning text as `output_text` parts; once retyped, that part's own `annotations`
        and `logprobs` are dropped rather than refused, as the API takes neither on reasoning text."""
        return _without(data, "annotations", "logprobs")


class NeMoGymResponseReasoningItem(NeMoGymStrictModel):
    """Model reasoning; open models put their `<think>` text in `summary` so it can be replayed verbatim."""

    id: str
    type: Literal["reasoning"] = "reasoning"
    summary: list[NeMoGymSummary]
    content: list[NeMoGymReasoningContent] | None = None
    encrypted_content: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _drop_status(cls, data: Any) -> Any:
        """A status is accepted and dropped: OpenAI's API refuses a reasoning item's status when it is replayed in a
        later request, and NeMo Gym's reasoning item has none (its environments compare items built with one). A
        `role` (LiteLLM adds one) is dropped too: a reasoning item has no role to keep, and the API refuses one."""
        return _without(data, "status", "role")


class NeMoGymResponseOutputMessageForTraining(TokenIDLogProbMixin, NeMoGymResponseOutputMessage):
    """Assistant message closing a generation, with the tokens behind it."""


class NeMoGymResponseFunctionToolCallForTraining(TokenIDLogProbMixin, NeMoGymResponseFunctionToolCall):
    """Tool call closing a generation, with the tokens behind it."""


class NeMoGymResponseReasoningItemForTraining(TokenIDLogProbMixin, NeMoGymResponseReasoningItem):
    """Reasoning closing a generation (reasoning-only turn), with the tokens behind it."""


RESPONSES_TO_TRAIN: dict[type[BaseModel], type[BaseModel]] = {
    NeMoGymResponseOutputMessage: NeMoGymResponseOutputMessageForTraining,
    NeMoGymResponseFunctionToolCall: NeMoGymResponseFunctionToolCallForTraining,
    NeMoGymResponseReasoningItem: NeMoGymResponseReasoningItemForTraining,
}
"""Item class -> the variant that carries a generation's tokens: what an adapter builds the last item of a sampled
turn as (hosted-tool items have none: the policy did not sample them)."""


@functools.cache
def _token_fields_in_dict(cls: type[BaseModel]) -> bool:
    """Whether no token field of ``cls`` is a class attribute (a property, say): then :func:`get_field` reads each
    from the instance's ``__dict__`` or its extra keys alone, and so can :func:`_item_tag`."""
    return not any(hasattr(cls, key) for key in TOKEN_ID_FIELDS)


def _item_tag(value: Any) -> str:
    """Routing key shared by the input and output unions (see the module docstring)."""
    if isinstance(value, dict):  # what get_field and has_token_id_information read, inlined: once per item
        get = value.get
        item_type = get("type")
        training = (
            get("prompt_token_ids") is not None
            or get("generation_token_ids") is not None
            or get("generation_log_probs") is not None
        )
    elif isinstance(value, BaseModel) and not value.__pydantic_extra__ and _token_fields_in_dict(type(value)):
        fields = value.__dict__  # serializing one of our items: what get_field would read, read directly
        get = fields.get
        item_type = fields["type"] if "type" in fields else get_field(value, "type")
        training = (
            get("prompt_token_ids") is not None
            or get("generation_token_ids") is not None
            or get("generation_log_probs") is not None
        )
    else:
        item_type = get_field(value, "type")
        training = has_token_id_information(value)
    if item_type is None or item_type == "message":
        return "message_for_training" if training else "message"
    if item_type in ("function_call", "reasoning"):
        return f"{item_type}_for_training" if training else item_type
    if item_type == "function_call_output":
        return item_type
    return "other"


@functools.cache
def _sdk_item_adapter(union_name: str) -> TypeAdapter[Any]:
    import openai.types.responses as sdk_types

    return TypeAdapter(getattr(sdk_types, union_name))


def _sdk_input_item(value: Any) -> Any:
    return _sdk_item_adapter("ResponseInputItem").validate_python(value)


def _sdk_output_item(value: Any) -> Any:
    return _sdk_item_adapter("ResponseOutputItem").validate_python(value)


_SDKInputItem = Annotated[Any, PlainValidator(_sdk_input_item, json_schema_input_type=dict[str, Any])]
"""A hosted-tool input item, validated by the SDK's ``ResponseInputItem`` union (loaded on first use)."""
_SDKOutputItem = Annotated[Any, PlainValidator(_sdk_output_item, json_schema_input_type=dict[str, Any])]
"""A hosted-tool output item, validated by the SDK's ``ResponseOutputItem`` union (loaded on first use)."""


def _refuse_status(data: Any) -> Any:
    if isinstance(data, dict) and data.get("status") is not None:
        raise ValueError("a message with a status is one of the full forms")
    return data


_EasyInputMessageWithoutStatus = Annotated[NeMoGymEasyInputMessage, BeforeValidator(_refuse_status)]
"""The first choice of a message in the unions; a message with a status goes to the full form that keeps it, and only
when none takes it (a string content, an assistant turn without an id) to the easy form, which drops it."""

_MessageFamily = Annotated[
    _EasyInputMessageWithoutStatus | NeMoGymMessage | NeMoGymResponseOutputMessage | NeMoGymEasyInputMessage,
    Field(union_mode="left_to_right"),
]

NeMoGymResponseInputItem = Annotated[
    Annotated[_MessageFamily, Tag("message")]
    | Annotated[NeMoGymResponseOutputMessageForTraining, Tag("message_for_training")]
    | Annotated[NeMoGymResponseFunctionToolCall, Tag("function_call")]
    | Annotated[NeMoGymResponseFunctionToolCallForTraining, Tag("function_call_for_training")]
    | Annotated[NeMoGymFunctionCallOutput, Tag("function_call_output")]
    | Annotated[NeMoGymResponseReasoningItem, Tag("reasoning")]
    | Annotated[NeMoGymResponseReasoningItemForTraining, Tag("reasoning_for_training")]
    | Annotated[_SDKInputItem, Tag("other")],
    Discriminator(_item_tag),
]
"""Any Responses input item; hosted-tool items are validated by the SDK's models."""

_OutputMessageFamily = Annotated[
    NeMoGymResponseOutputMessage | _EasyInputMessageWithoutStatus | NeMoGymMessage | NeMoGymEasyInputMessage,
    Field(union_mode="left_to_right"),
]

NeMoGymResponseOutputItem = Annotated[
    Annotated[_OutputMessageFamily, Tag("message")]
    | Annotated[NeMoGymResponseOutputMessageForTraining, Tag("message_for_training")]
    | Annotated[NeMoGymResponseFunctionToolCall, Tag("function_call")]
    | Annotated[NeMoGymResponseFunctionToolCallForTraining, Tag("function_call_for_training")]
    | Annotated[NeMoGymFunctionCallOutput, Tag("function_call_output")]
    | Annotated[NeMoGymResponseReasoningItem, Tag("reasoning")]
    | Annotated[NeMoGymResponseReasoningItemForTraining, Tag("reasoning_for_training")]
    | Annotated[_SDKOutputItem, Tag("other")],
    Discriminator(_item_tag),
]
"""Any Responses output item. Input-side items are allowed too, as in NeMo Gym: an agent's `output` is its whole
trajectory, tool results (`function_call_output`) and the user turns of a multi-turn episode included."""

NeMoGymResponseInput = str | list[NeMoGymResponseInputItem]
