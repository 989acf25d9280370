"""Strict pydantic models of the OpenAI Chat Completions wire format (import them from `nemo_gym.openai_utils`).

Chat Completions is the dialect most open-model engines (vLLM, SGLang, ...) speak, so model servers translate Responses
requests into these models and back. Request-side models reject unknown keys; response-side models keep extra keys
(engines add fields such as `reasoning_content`) the way the SDK does. An assistant message that carries any token field
is routed to its `ForTraining` variant, which requires all three. NeMo Gym declares the request side as TypedDicts, so
those models also answer dict reads (`message["role"]`, `message.get("tool_calls")`; see `KeyAccessMixin`).
"""

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag

from nemo_gym.openai_base import (
    NeMoGymLenientModel,
    NeMoGymRequestPart,
    ReasoningEffort,
    TokenIDLogProbMixin,
    get_field,
    has_token_id_information,
    is_none,
)

# ----------------------------------------------------------------------------------------------------------------------
# Request: content parts
# ----------------------------------------------------------------------------------------------------------------------


class NeMoGymChatCompletionContentPartTextParam(NeMoGymRequestPart):
    type: Literal["text"] = "text"
    text: str


class NeMoGymImageURL(NeMoGymRequestPart):
    url: str
    detail: Literal["auto", "low", "high"] | None = None


class NeMoGymChatCompletionContentPartImageParam(NeMoGymRequestPart):
    type: Literal["image_url"] = "image_url"
    image_url: NeMoGymImageURL


class NeMoGymInputAudio(NeMoGymRequestPart):
    data: str
    format: str


class NeMoGymChatCompletionContentPartInputAudioParam(NeMoGymRequestPart):
    type: Literal["input_audio"] = "input_audio"
    input_audio: NeMoGymInputAudio


class NeMoGymVideoURL(NeMoGymRequestPart):
    url: str


class NeMoGymChatCompletionContentPartVideoParam(NeMoGymRequestPart):
    """Not an OpenAI part: the `video_url` part vLLM accepts for vision-language models."""

    type: Literal["video_url"] = "video_url"
    video_url: NeMoGymVideoURL


class NeMoGymChatCompletionContentPartRefusalParam(NeMoGymRequestPart):
    type: Literal["refusal"] = "refusal"
    refusal: str


NeMoGymChatCompletionUserContentPart = Annotated[
    NeMoGymChatCompletionContentPartTextParam
    | NeMoGymChatCompletionContentPartImageParam
    | NeMoGymChatCompletionContentPartInputAudioParam
    | NeMoGymChatCompletionContentPartVideoParam,
    Field(discriminator="type"),
]
NeMoGymChatCompletionAssistantContentPart = Annotated[
    NeMoGymChatCompletionContentPartTextParam | NeMoGymChatCompletionContentPartRefusalParam,
    Field(discriminator="type"),
]


# ----------------------------------------------------------------------------------------------------------------------
# Request: messages and tools
# ----------------------------------------------------------------------------------------------------------------------


class NeMoGymChatCompletionSystemMessageParam(NeMoGymRequestPart):
    role: Literal["system"] = "system"
    content: str | list[NeMoGymChatCompletionContentPartTextParam]
    name: str | None = None


class NeMoGymChatCompletionDeveloperMessageParam(NeMoGymRequestPart):
    role: Literal["developer"] = "developer"
    content: str | list[NeMoGymChatCompletionContentPartTextParam]
    name: str | None = None


class NeMoGymChatCompletionUserMessageParam(NeMoGymRequestPart):
    role: Literal["user"] = "user"
    content: str | list[NeMoGymChatCompletionUserContentPart]
    name: str | None = None


class NeMoGymChatCompletionMessageToolCallFunctionParam(NeMoGymRequestPart):
    name: str
    arguments: str


class NeMoGymChatCompletionMessageToolCallParam(NeMoGymRequestPart):
    id: str
    type: Literal["function"] = "function"
    function: NeMoGymChatCompletionMessageToolCallFunctionParam


class NeMoGymChatCompletionAssistantMessageParam(NeMoGymRequestPart):
    """A past assistant turn; `content` may be null when the turn only called tools."""

    role: Literal["assistant"] = "assistant"
    content: str | list[NeMoGymChatCompletionAssistantContentPart] | None = None
    name: str | None = None
    refusal: str | None = None
    tool_calls: list[NeMoGymChatCompletionMessageToolCallParam] | None = None
    reasoning_content: str | None = None
    """The turn's reasoning, replayed by harnesses (OpenCode's interleaved field) for templates that render it."""


class NeMoGymChatCompletionAssistantMessageForTrainingParam(  # type: ignore[misc]  # __iter__: the dict's
    TokenIDLogProbMixin, NeMoGymChatCompletionAssistantMessageParam
):
    """A past assistant turn that keeps the exact tokens it was sampled as, so multi-turn training stays on-policy."""


class NeMoGymChatCompletionToolMessageParam(NeMoGymRequestPart):
    role: Literal["tool"] = "tool"
    content: str | list[NeMoGymChatCompletionContentPartTextParam]
    tool_call_id: str


def _message_param_tag(value: Any) -> str | None:
    """Route by `role`; an assistant turn with token fields is the training variant. Unknown roles are errors."""
    role = get_field(value, "role")
    if role == "assistant" and has_token_id_information(value):
        return "assistant_for_training"
    return role if role in ("system", "developer", "user", "assistant", "tool") else None


NeMoGymChatCompletionMessageParam = Annotated[
    Annotated[NeMoGymChatCompletionSystemMessageParam, Tag("system")]
    | Annotated[NeMoGymChatCompletionDeveloperMessageParam, Tag("developer")]
    | Annotated[NeMoGymChatCompletionUserMessageParam, Tag("user")]
    | Annotated[NeMoGymChatCompletionAssistantMessageParam, Tag("assistant")]
    | Annotated[NeMoGymChatCompletionAssistantMessageForTrainingParam, Tag("assistant_for_training")]
    | Annotated[NeMoGymChatCompletionToolMessageParam, Tag("tool")],
    Discriminator(_message_param_tag),
]


class NeMoGymFunctionDefinition(NeMoGymRequestPart):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class NeMoGymChatCompletionToolParam(NeMoGymRequestPart):
    type: Literal["function"] = "function"
    function: NeMoGymFunctionDefinition


class NeMoGymChatCompletionNamedToolChoiceFunction(NeMoGymRequestPart):
    name: str


class NeMoGymChatCompletionNamedToolChoiceParam(NeMoGymRequestPart):
    type: Literal["function"] = "function"
    function: NeMoGymChatCompletionNamedToolChoiceFunction


CHAT_REQUEST_PROVIDER_EXTENSION_FIELDS: frozenset[str] = frozenset(
    {"chat_template_kwargs", "thinking", "output_config"}
)
"""Request keys some providers add to the Chat Completions body (vLLM's template variables, Anthropic-style reasoning
settings), named for code that leaves them out when comparing a request with the SDK's field set; all three are
fields here, as in NeMo Gym 0.7."""


class NeMoGymChatCompletionModeration(NeMoGymRequestPart):
    """Chat Completions' ``moderation`` setting: which moderation model checks the request and the answer."""

    model: str


class NeMoGymChatCompletionCreateParamsNonStreaming(BaseModel):
    """Body of `POST /v1/chat/completions`. Unknown keys are errors; streaming is decided before validation.

    Engine-specific knobs (`return_tokens_as_token_ids`, ...) are not fields: model servers add them to the outbound
    JSON from their config or from `metadata`; vLLM's `chat_template_kwargs` is one, as in NeMo Gym 0.7, so a request
    written for it validates here. Anthropic's reasoning settings
    (`thinking`, `output_config`) are: OpenAI-compatible gateways in front of Claude read them from the body, so a
    model server passes them on as given (NeMo Gym 0.7's judges send them).
    """

    model_config = ConfigDict(extra="forbid")

    # Fields newer than NeMo Gym's `openai` pin are left out of a dump while unset (see `is_none`).
    messages: list[NeMoGymChatCompletionMessageParam]
    model: str | None = None
    audio: dict[str, Any] | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, int] | None = None
    logprobs: bool | None = None
    max_completion_tokens: int | None = None
    max_tokens: int | None = None
    metadata: dict[str, str] | None = None
    modalities: list[Literal["text", "audio"]] | None = None
    # `{"model": "omni-moderation-latest"}`: the moderation model run on the request and the answer.
    moderation: NeMoGymChatCompletionModeration | None = Field(default=None, exclude_if=is_none)
    n: int | None = None
    parallel_tool_calls: bool = True  # OpenAI's default; a dump for sending (exclude_unset) leaves it out unless given
    prediction: dict[str, Any] | None = None
    presence_penalty: float | None = None
    prompt_cache_key: str | None = Field(default=None, exclude_if=is_none)
    prompt_cache_retention: Literal["in_memory", "24h"] | None = Field(default=None, exclude_if=is_none)
    reasoning_effort: ReasoningEffort | None = None
    response_format: dict[str, Any] | None = None
    safety_identifier: str | None = Field(default=None, exclude_if=is_none)
    seed: int | None = None
    service_tier: Literal["auto", "default", "flex", "scale", "priority", "fast"] | None = None
    stop: str | list[str] | None = None
    store: bool | None = None
    stream: Literal[False] | None = None
    stream_options: dict[str, Any] | None = None
    temperature: float | None = None
    tool_choice: Literal["none", "auto", "required"] | NeMoGymChatCompletionNamedToolChoiceParam | None = None
    tools: list[NeMoGymChatCompletionToolParam] | None = None
    top_logprobs: int | None = None
    top_p: float | None = None
    user: str | None = None
    verbosity: Literal["low", "medium", "high"] | None = Field(default=None, exclude_if=is_none)
    web_search_options: dict[str, Any] | None = None
    # Open mappings, not the SDK's types: `{"type": "adaptive"}` has no `budget_tokens`. Absent from a dump while unset.
    thinking: dict[str, Any] | None = Field(default=None, exclude_if=is_none)
    # vLLM's per-request template variables (NeMo Gym 0.7 accepts them on the body too); a vLLM server merges them
    # over its configured ones, other servers leave them out.
    chat_template_kwargs: dict[str, Any] | None = Field(default=None, exclude_if=is_none)
    output_config: dict[str, Any] | None = Field(default=None, exclude_if=is_none)


# ----------------------------------------------------------------------------------------------------------------------
# Response
# ----------------------------------------------------------------------------------------------------------------------


class NeMoGymChatCompletionMessageToolCallFunction(NeMoGymLenientModel):
    name: str
    arguments: str


NeMoGymFunction = NeMoGymChatCompletionMessageToolCallFunction
"""NeMo Gym's name for the function of a Chat Completions tool call (``name``, ``arguments``)."""


class NeMoGymChatCompletionMessageToolCall(NeMoGymLenientModel):
    id: str
    type: Literal["function"] = "function"
    function: NeMoGymChatCompletionMessageToolCallFunction


class NeMoGymChatCompletionMessage(NeMoGymLenientModel):
    """The generated assistant message; engine extras (e.g. `reasoning_content`) are kept as extra keys."""

    role: Literal["assistant"] = "assistant"
    content: str | None = None
    refusal: str | None = None
    annotations: list[dict[str, Any]] | None = None
    audio: dict[str, Any] | None = None
    function_call: dict[str, Any] | None = None
    tool_calls: list[NeMoGymChatCompletionMessageToolCall] | None = None


class NeMoGymChatCompletionMessageForTraining(TokenIDLogProbMixin, NeMoGymChatCompletionMessage):
    """The generated message with the prompt and generation tokens a trainer needs."""


class NeMoGymChatCompletionTopLogprob(NeMoGymLenientModel):
    token: str
    bytes: list[int] | None = None
    logprob: float


class NeMoGymChatCompletionTokenLogprob(NeMoGymLenientModel):
    token: str
    bytes: list[int] | None = None
    logprob: float
    top_logprobs: list[NeMoGymChatCompletionTopLogprob] = Field(default_factory=list)


class NeMoGymChoiceLogprobs(NeMoGymLenientModel):
    content: list[NeMoGymChatCompletionTokenLogprob] | None = None
    refusal: list[NeMoGymChatCompletionTokenLogprob] | None = None


def _choice_message_tag(value: Any) -> str:
    return "training" if has_token_id_information(value) else "plain"


class NeMoGymChoice(NeMoGymLenientModel):
    """One completion choice. `finish_reason` is a plain string: engines emit values beyond OpenAI's set."""

    finish_reason: str
    index: int = 0
    logprobs: NeMoGymChoiceLogprobs | None = None
    message: Annotated[
        Annotated[NeMoGymChatCompletionMessage, Tag("plain")]
        | Annotated[NeMoGymChatCompletionMessageForTraining, Tag("training")],
        Discriminator(_choice_message_tag),
    ]


class NeMoGymPromptTokensDetails(NeMoGymLenientModel):
    cached_tokens: int | None = None
    audio_tokens: int | None = None


class NeMoGymCompletionTokensDetails(NeMoGymLenientModel):
    reasoning_tokens: int | None = None
    audio_tokens: int | None = None
    accepted_prediction_tokens: int | None = None
    rejected_prediction_tokens: int | None = None


class NeMoGymCompletionUsage(NeMoGymLenientModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: NeMoGymPromptTokensDetails | None = None
    completion_tokens_details: NeMoGymCompletionTokensDetails | None = None


class NeMoGymChatCompletion(NeMoGymLenientModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[NeMoGymChoice]
    service_tier: str | None = None
    system_fingerprint: str | None = None
    usage: NeMoGymCompletionUsage | None = None


__all__ = [
    "CHAT_REQUEST_PROVIDER_EXTENSION_FIELDS",
    "NeMoGymChatCompletion",
    "NeMoGymChatCompletionAssistantContentPart",
    "NeMoGymChatCompletionAssistantMessageForTrainingParam",
    "NeMoGymChatCompletionAssistantMessageParam",
    "NeMoGymChatCompletionContentPartImageParam",
    "NeMoGymChatCompletionContentPartInputAudioParam",
    "NeMoGymChatCompletionContentPartRefusalParam",
    "NeMoGymChatCompletionContentPartTextParam",
    "NeMoGymChatCompletionContentPartVideoParam",
    "NeMoGymChatCompletionCreateParamsNonStreaming",
    "NeMoGymChatCompletionDeveloperMessageParam",
    "NeMoGymChatCompletionMessage",
    "NeMoGymChatCompletionMessageForTraining",
    "NeMoGymChatCompletionMessageParam",
    "NeMoGymChatCompletionMessageToolCall",
    "NeMoGymChatCompletionMessageToolCallFunction",
    "NeMoGymChatCompletionMessageToolCallFunctionParam",
    "NeMoGymChatCompletionMessageToolCallParam",
    "NeMoGymChatCompletionModeration",
    "NeMoGymChatCompletionNamedToolChoiceFunction",
    "NeMoGymChatCompletionNamedToolChoiceParam",
    "NeMoGymChatCompletionSystemMessageParam",
    "NeMoGymChatCompletionTokenLogprob",
    "NeMoGymChatCompletionToolMessageParam",
    "NeMoGymChatCompletionToolParam",
    "NeMoGymChatCompletionTopLogprob",
    "NeMoGymChatCompletionUserContentPart",
    "NeMoGymChatCompletionUserMessageParam",
    "NeMoGymChoice",
    "NeMoGymChoiceLogprobs",
    "NeMoGymCompletionTokensDetails",
    "NeMoGymCompletionUsage",
    "NeMoGymFunction",
    "NeMoGymFunctionDefinition",
    "NeMoGymImageURL",
    "NeMoGymInputAudio",
    "NeMoGymPromptTokensDetails",
    "NeMoGymVideoURL",
]
