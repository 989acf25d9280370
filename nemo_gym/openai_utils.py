"""NeMo Gym's `openai_utils`: the OpenAI wire models and the OpenAI-compatible client, under one import path.

The Responses models are defined in `nemo_gym.openai_responses` (and its parts `openai_response_items`,
`openai_response_params`), the Chat Completions ones in `nemo_gym.openai_chat_utils` (shared bases in
`nemo_gym.openai_base`), and `NeMoGymAsyncOpenAI` in `nemo_gym.transport.openai_client`. Neither the `openai` SDK nor an HTTP client is imported here: the SDK loads only when
a hosted-tool item arrives, and aiohttp on a client's first call. ``NeMoGymResponseMcpCall`` subclasses an SDK class, so
it is loaded (with the SDK) when first asked for.

NeMo Gym 0.7's names for what is here under another: ``NeMoGymResponseFunctionCallOutput`` is
``NeMoGymFunctionCallOutput``, ``MAX_NUM_TRIES`` is ``MAX_SERVER_ERROR_TRIES``.
"""

from typing import TYPE_CHECKING, Any

from nemo_gym.openai_chat_utils import CHAT_REQUEST_PROVIDER_EXTENSION_FIELDS
from nemo_gym.openai_responses import (
    REQUIRED_TOKEN_METADATA_FIELDS,
    RESPONSES_TO_TRAIN,
    TOKEN_ID_FIELDS,
    TOKEN_METADATA_FIELDS,
    ItemStatus,
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
    NeMoGymEasyInputContent,
    NeMoGymEasyInputMessage,
    NeMoGymFunction,
    NeMoGymFunctionCallOutput,
    NeMoGymFunctionCallOutputContent,
    NeMoGymFunctionDefinition,
    NeMoGymFunctionTool,
    NeMoGymFunctionToolParam,
    NeMoGymImageURL,
    NeMoGymIncompleteDetails,
    NeMoGymInputAudio,
    NeMoGymLenientModel,
    NeMoGymLogprob,
    NeMoGymMessage,
    NeMoGymPromptTokensDetails,
    NeMoGymReasoning,
    NeMoGymReasoningContent,
    NeMoGymReasoningParam,
    NeMoGymResponse,
    NeMoGymResponseCreateParamsNonStreaming,
    NeMoGymResponseError,
    NeMoGymResponseFunctionToolCall,
    NeMoGymResponseFunctionToolCallForTraining,
    NeMoGymResponseInput,
    NeMoGymResponseInputContent,
    NeMoGymResponseInputImage,
    NeMoGymResponseInputItem,
    NeMoGymResponseInputText,
    NeMoGymResponseInputTokensDetails,
    NeMoGymResponseInputVideo,
    NeMoGymResponseOutputContent,
    NeMoGymResponseOutputItem,
    NeMoGymResponseOutputMessage,
    NeMoGymResponseOutputMessageForTraining,
    NeMoGymResponseOutputRefusal,
    NeMoGymResponseOutputText,
    NeMoGymResponseOutputTokensDetails,
    NeMoGymResponsePrompt,
    NeMoGymResponseReasoningItem,
    NeMoGymResponseReasoningItemForTraining,
    NeMoGymResponseTextConfig,
    NeMoGymResponseUsage,
    NeMoGymStrictModel,
    NeMoGymSummary,
    NeMoGymToolChoice,
    NeMoGymToolChoiceFunction,
    NeMoGymTopLogprob,
    NeMoGymVideoURL,
    ReasoningEffort,
    TokenIDLogProbMixin,
    accumulate_response_usage,
    get_field,
    has_token_id_information,
)
from nemo_gym.openai_responses import NeMoGymFunctionCallOutput as NeMoGymResponseFunctionCallOutput
from nemo_gym.transport.openai_client import (
    MAX_SERVER_ERROR_TRIES,
    RATE_LIMIT_ERROR_CODES,
    RETRY_ERROR_CODES,
    NeMoGymAsyncOpenAI,
)
from nemo_gym.transport.openai_client import MAX_SERVER_ERROR_TRIES as MAX_NUM_TRIES

if TYPE_CHECKING:
    from nemo_gym.openai_hosted import NeMoGymResponseMcpCall
    from nemo_gym.transport.passthrough import request


def __getattr__(name: str) -> Any:
    """Names loaded on first use: ``NeMoGymResponseMcpCall`` (defining it imports the ``openai`` SDK) and ``request``
    (NeMo Gym 0.7's HTTP send, aiohttp's arguments and the body left unread: the transport's
    :func:`~nemo_gym.transport.passthrough.request`, which imports aiohttp); no other name here needs either."""
    found: Any
    if name == "NeMoGymResponseMcpCall":
        from nemo_gym.openai_hosted import NeMoGymResponseMcpCall

        found = NeMoGymResponseMcpCall
    elif name == "request":
        from nemo_gym.transport.passthrough import request as send

        found = send
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = found
    return found


__all__ = [
    "CHAT_REQUEST_PROVIDER_EXTENSION_FIELDS",
    "ItemStatus",
    "MAX_NUM_TRIES",
    "MAX_SERVER_ERROR_TRIES",
    "NeMoGymAsyncOpenAI",
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
    "NeMoGymFunction",
    "NeMoGymFunctionCallOutput",
    "NeMoGymFunctionCallOutputContent",
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
    "NeMoGymResponseFunctionCallOutput",
    "NeMoGymResponseFunctionToolCall",
    "NeMoGymResponseFunctionToolCallForTraining",
    "NeMoGymResponseInput",
    "NeMoGymResponseInputContent",
    "NeMoGymResponseInputImage",
    "NeMoGymResponseInputItem",
    "NeMoGymResponseInputText",
    "NeMoGymResponseInputTokensDetails",
    "NeMoGymResponseInputVideo",
    "NeMoGymResponseMcpCall",
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
    "RATE_LIMIT_ERROR_CODES",
    "REQUIRED_TOKEN_METADATA_FIELDS",
    "RESPONSES_TO_TRAIN",
    "RETRY_ERROR_CODES",
    "ReasoningEffort",
    "TOKEN_ID_FIELDS",
    "TOKEN_METADATA_FIELDS",
    "TokenIDLogProbMixin",
    "accumulate_response_usage",
    "get_field",
    "has_token_id_information",
    "request",
]
