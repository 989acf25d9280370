"""Strict pydantic models of the OpenAI Responses API wire format (import them from `nemo_gym.openai_utils`, which
also re-exports the Chat Completions side of `nemo_gym.openai_chat_utils`).

Why our own copies: the SDK's request types are TypedDicts (nothing is validated) and its response models accept any
extra key, so a typo in a task file would silently change a rollout. Servers validate against these models instead,
and training runs use the `*ForTraining` item variants to carry token ids and log-probs through every hop. Every model
dumps to JSON that the official `openai` types accept, and accepts what those types dump.

This module defines the response (:class:`NeMoGymResponse`) and is the import path of the rest, which lives in two
parts: `openai_response_items.py` (content parts, input and output items, and how their unions route a raw item to
its class) and `openai_response_params.py` (tools, tool choice, reasoning and text settings, and the request body).
"""

from typing import Any, Literal

from pydantic import Field

from nemo_gym.openai_base import (
    REQUIRED_TOKEN_METADATA_FIELDS,
    TOKEN_ID_FIELDS,
    TOKEN_METADATA_FIELDS,
    NeMoGymLenientModel,
    NeMoGymStrictModel,
    ReasoningEffort,
    TokenIDLogProbMixin,
    get_field,
    has_token_id_information,
)
from nemo_gym.openai_base import NeMoGymKeyedModel as NeMoGymKeyedModel  # the bases, importable here as before
from nemo_gym.openai_base import NeMoGymRequestPart as NeMoGymRequestPart
from nemo_gym.openai_base import as_attribute_read_dict as as_attribute_read_dict
from nemo_gym.openai_base import is_none as is_none
from nemo_gym.openai_chat_utils import (
    NeMoGymChatCompletion,
    NeMoGymChatCompletionAssistantContentPart,
    NeMoGymChatCompletionAssistantMessageForTrainingParam,
    NeMoGymChatCompletionAssistantMessageParam,
    NeMoGymChatCompletionContentPartImageParam,
    NeMoGymChatCompletionContentPartInputAudioParam,
    NeMoGymChatCompletionContentPartRefusalParam,
    NeMoGymChatCompletionContentPartTextParam,
    NeMoGymChatCompletionContentPartVideoParam,
    NeMoGymChatCompletionCreateParamsNonStreaming,
    NeMoGymChatCompletionDeveloperMessageParam,
    NeMoGymChatCompletionMessage,
    NeMoGymChatCompletionMessageForTraining,
    NeMoGymChatCompletionMessageParam,
    NeMoGymChatCompletionMessageToolCall,
    NeMoGymChatCompletionMessageToolCallFunction,
    NeMoGymChatCompletionMessageToolCallFunctionParam,
    NeMoGymChatCompletionMessageToolCallParam,
    NeMoGymChatCompletionNamedToolChoiceFunction,
    NeMoGymChatCompletionNamedToolChoiceParam,
    NeMoGymChatCompletionSystemMessageParam,
    NeMoGymChatCompletionTokenLogprob,
    NeMoGymChatCompletionToolMessageParam,
    NeMoGymChatCompletionToolParam,
    NeMoGymChatCompletionTopLogprob,
    NeMoGymChatCompletionUserContentPart,
    NeMoGymChatCompletionUserMessageParam,
    NeMoGymChoice,
    NeMoGymChoiceLogprobs,
    NeMoGymCompletionTokensDetails,
    NeMoGymCompletionUsage,
    NeMoGymFunction,
    NeMoGymFunctionDefinition,
    NeMoGymImageURL,
    NeMoGymInputAudio,
    NeMoGymPromptTokensDetails,
    NeMoGymVideoURL,
)
from nemo_gym.openai_response_items import (
    RESPONSES_TO_TRAIN,
    ItemStatus,
    NeMoGymEasyInputContent,
    NeMoGymEasyInputMessage,
    NeMoGymFunctionCallOutput,
    NeMoGymFunctionCallOutputContent,
    NeMoGymLogprob,
    NeMoGymMessage,
    NeMoGymReasoningContent,
    NeMoGymResponseFunctionToolCall,
    NeMoGymResponseFunctionToolCallForTraining,
    NeMoGymResponseInput,
    NeMoGymResponseInputContent,
    NeMoGymResponseInputImage,
    NeMoGymResponseInputItem,
    NeMoGymResponseInputText,
    NeMoGymResponseInputVideo,
    NeMoGymResponseOutputContent,
    NeMoGymResponseOutputItem,
    NeMoGymResponseOutputMessage,
    NeMoGymResponseOutputMessageForTraining,
    NeMoGymResponseOutputRefusal,
    NeMoGymResponseOutputText,
    NeMoGymResponseReasoningItem,
    NeMoGymResponseReasoningItemForTraining,
    NeMoGymSummary,
    NeMoGymTopLogprob,
)
from nemo_gym.openai_response_items import _item_tag as _item_tag  # the item unions' discriminator, read by tests
from nemo_gym.openai_response_params import (
    NeMoGymFunctionTool,
    NeMoGymFunctionToolParam,
    NeMoGymReasoning,
    NeMoGymReasoningParam,
    NeMoGymResponseCreateParamsNonStreaming,
    NeMoGymResponsePrompt,
    NeMoGymResponseTextConfig,
    NeMoGymToolChoice,
    NeMoGymToolChoiceFunction,
)
from nemo_gym.openai_response_params import ReasoningSummary as ReasoningSummary
from nemo_gym.openai_usage import (
    NeMoGymResponseInputTokensDetails,
    NeMoGymResponseOutputTokensDetails,
    NeMoGymResponseUsage,
    accumulate_response_usage,
)

# ----------------------------------------------------------------------------------------------------------------------
# Response
# ----------------------------------------------------------------------------------------------------------------------


class NeMoGymIncompleteDetails(NeMoGymLenientModel):
    reason: Literal["max_output_tokens", "max_messages", "content_filter", "steered"] | None = None


class NeMoGymResponseError(NeMoGymLenientModel):
    code: str
    message: str


class NeMoGymResponse(NeMoGymLenientModel):
    """A Responses API result; agents return one per rollout with the whole trajectory in `output`."""

    id: str
    created_at: float
    model: str
    object: Literal["response"] = "response"
    output: list[NeMoGymResponseOutputItem]
    status: Literal["completed", "failed", "in_progress", "cancelled", "queued", "incomplete"] | None = None
    error: NeMoGymResponseError | None = None
    incomplete_details: NeMoGymIncompleteDetails | None = None
    usage: NeMoGymResponseUsage | None = None
    instructions: str | None = None
    max_output_tokens: int | None = None
    max_tool_calls: int | None = None
    metadata: dict[str, str] | None = None
    parallel_tool_calls: bool = True
    previous_response_id: str | None = None
    prompt: NeMoGymResponsePrompt | None = None
    reasoning: NeMoGymReasoning | None = None
    service_tier: str | None = None
    temperature: float | None = None
    text: NeMoGymResponseTextConfig | None = None
    tool_choice: NeMoGymToolChoice = "auto"
    tools: list[NeMoGymFunctionTool] = Field(default_factory=list)
    top_logprobs: int | None = None
    top_p: float | None = None
    truncation: Literal["auto", "disabled"] | None = None
    user: str | None = None
    background: bool | None = None
    conversation: dict[str, Any] | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None

    @property
    def output_text(self) -> str:
        """All `output_text` parts of assistant messages, concatenated (what a verifier usually grades)."""
        return "".join(
            part.text
            for item in self.output
            if isinstance(item, NeMoGymResponseOutputMessage)
            for part in item.content
            if isinstance(part, NeMoGymResponseOutputText)
        )


__all__ = [
    "ItemStatus",
    "accumulate_response_usage",
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
    "NeMoGymEasyInputContent",
    "NeMoGymEasyInputMessage",
    "NeMoGymFunctionCallOutput",
    "NeMoGymFunctionCallOutputContent",
    "NeMoGymFunction",
    "NeMoGymFunctionDefinition",
    "NeMoGymFunctionTool",
    "NeMoGymFunctionToolParam",
    "NeMoGymImageURL",
    "NeMoGymIncompleteDetails",
    "NeMoGymInputAudio",
    "NeMoGymLenientModel",
    "NeMoGymLogprob",
    "NeMoGymMessage",
    "NeMoGymPromptTokensDetails",
    "NeMoGymReasoning",
    "NeMoGymReasoningContent",
    "NeMoGymReasoningParam",
    "NeMoGymResponse",
    "NeMoGymResponseCreateParamsNonStreaming",
    "NeMoGymResponseError",
    "NeMoGymResponseFunctionToolCall",
    "NeMoGymResponseFunctionToolCallForTraining",
    "NeMoGymResponseInput",
    "NeMoGymResponseInputContent",
    "NeMoGymResponseInputImage",
    "NeMoGymResponseInputItem",
    "NeMoGymResponseInputText",
    "NeMoGymResponseInputTokensDetails",
    "NeMoGymResponseInputVideo",
    "NeMoGymResponseOutputContent",
    "NeMoGymResponseOutputItem",
    "NeMoGymResponseOutputMessage",
    "NeMoGymResponseOutputMessageForTraining",
    "NeMoGymResponseOutputRefusal",
    "NeMoGymResponseOutputText",
    "NeMoGymResponseOutputTokensDetails",
    "NeMoGymResponsePrompt",
    "NeMoGymResponseReasoningItem",
    "NeMoGymResponseReasoningItemForTraining",
    "NeMoGymResponseTextConfig",
    "NeMoGymResponseUsage",
    "NeMoGymStrictModel",
    "NeMoGymSummary",
    "NeMoGymToolChoice",
    "NeMoGymToolChoiceFunction",
    "NeMoGymTopLogprob",
    "NeMoGymVideoURL",
    "REQUIRED_TOKEN_METADATA_FIELDS",
    "RESPONSES_TO_TRAIN",
    "ReasoningEffort",
    "TOKEN_ID_FIELDS",
    "TOKEN_METADATA_FIELDS",
    "TokenIDLogProbMixin",
    "get_field",
    "has_token_id_information",
]
