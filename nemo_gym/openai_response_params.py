"""The request side of the Responses API: tools, tool choice, reasoning and text settings, and the body of
`POST /v1/responses` (:class:`NeMoGymResponseCreateParamsNonStreaming`).

Apart from `openai_responses.py` (the face that re-exports them) because these are what a caller configures, not what
a model produces; the settings models are shared with the response, which echoes them back.
"""

from typing import Annotated, Any, Literal, NotRequired, Required

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, with_config
from typing_extensions import TypedDict  # pydantic validates only this one on Python < 3.12

from nemo_gym.openai_base import NeMoGymKeyedModel, ReasoningEffort, as_attribute_read_dict
from nemo_gym.openai_response_items import NeMoGymResponseInput


class NeMoGymFunctionTool(NeMoGymKeyedModel):
    """A function tool; NeMo Gym environments expose their tools as HTTP endpoints named `name`."""

    type: Literal["function"] = "function"
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class NeMoGymFunctionToolParam(TypedDict, total=False):
    """A function tool as a plain dict (the SDK's `FunctionToolParam`); request models validate it into
    :class:`NeMoGymFunctionTool`."""

    type: Required[Literal["function"]]
    name: Required[str]
    parameters: Required[dict[str, Any] | None]
    strict: Required[bool | None]
    description: NotRequired[str | None]


class NeMoGymToolChoiceFunction(NeMoGymKeyedModel):
    type: Literal["function"] = "function"
    name: str


NeMoGymToolChoice = Literal["none", "auto", "required"] | NeMoGymToolChoiceFunction


ReasoningSummary = Literal["auto", "concise", "detailed"]


class NeMoGymReasoning(NeMoGymKeyedModel):
    """A response's reasoning settings (the SDK's ``Reasoning`` model); a request's are a
    :class:`NeMoGymReasoningParam` dict."""

    effort: ReasoningEffort | None = None
    summary: ReasoningSummary | None = None
    generate_summary: ReasoningSummary | None = None


@with_config(ConfigDict(extra="forbid"))
class NeMoGymReasoningParam(TypedDict, total=False):
    """A request's ``reasoning``: a plain dict, as the SDK's TypedDict is, so an agent can pass it on (or compare it)
    as the dict it was sent as, with only the keys that were given; unknown keys are refused."""

    effort: ReasoningEffort | None
    summary: ReasoningSummary | None
    generate_summary: ReasoningSummary | None


def _reasoning_param(value: Any) -> Any:
    """A reasoning model (the SDK's, or a response's :class:`NeMoGymReasoning`) given for the request's dict: the keys
    it was given, as with every request model here; unknown null keys (newer SDK fields) are dropped, not refused."""
    if isinstance(value, BaseModel):
        value = value.model_dump(exclude_unset=True)
    if isinstance(value, dict) and None in value.values():
        known = NeMoGymReasoningParam.__annotations__
        value = {key: item for key, item in value.items() if item is not None or key in known}
    return value


class NeMoGymResponseTextConfig(NeMoGymKeyedModel):
    """`format` stays a dict: its JSON-schema variant has a `schema` key that a pydantic field cannot name (it reads as
    attributes too, ``format.schema_`` as on the SDK's model)."""

    format: Annotated[dict[str, Any], AfterValidator(as_attribute_read_dict)] | None = None
    verbosity: Literal["low", "medium", "high"] | None = None


class NeMoGymResponsePrompt(NeMoGymKeyedModel):
    id: str
    variables: dict[str, Any] | None = None
    version: str | None = None


class NeMoGymResponseCreateParamsNonStreaming(BaseModel):
    """Body of `POST /v1/responses`. Unknown keys are errors (422 at the server), never silently dropped.

    There is no `seed`: per-request sampling extras travel in `metadata` (e.g. `metadata.extra_body`), which model
    servers read.
    """

    model_config = ConfigDict(extra="forbid")

    input: NeMoGymResponseInput
    background: bool | None = None
    include: list[str] | None = None
    instructions: str | None = None
    max_output_tokens: int | None = None
    max_tool_calls: int | None = None
    metadata: dict[str, str] | None = None
    model: str | None = None
    parallel_tool_calls: bool = True
    previous_response_id: str | None = None
    prompt: NeMoGymResponsePrompt | None = None
    reasoning: Annotated[NeMoGymReasoningParam | None, BeforeValidator(_reasoning_param)] = None
    service_tier: Literal["auto", "default", "flex", "scale", "priority", "fast", "ultrafast"] | None = None
    store: bool | None = None
    stream: Literal[False] | None = None
    temperature: float | None = None
    text: NeMoGymResponseTextConfig | None = None
    tool_choice: NeMoGymToolChoice = "auto"
    tools: list[NeMoGymFunctionTool] = Field(default_factory=list)
    top_logprobs: int | None = None
    top_p: float | None = None
    truncation: Literal["auto", "disabled"] | None = None
    user: str | None = None
