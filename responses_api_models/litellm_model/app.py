"""litellm_model: any provider LiteLLM reaches (OpenAI, Azure, Bedrock, Vertex, Anthropic, a LiteLLM proxy, ...) as
the policy model, through ``litellm.acompletion``.

LiteLLM speaks Chat Completions to every provider, so ``/v1/responses`` is converted to a Chat request and back
(``ResponsesConverter``, as ``vllm_model`` does) and ``/v1/chat/completions`` goes through as it is. ``model`` is
always the configured LiteLLM model string (``<provider>/<model>``), so a dataset row cannot pick another model.
Reasoning a provider returns apart (LiteLLM's ``reasoning_content``) becomes a reasoning item. A failed call
(LiteLLM raises the ``openai`` SDK's exception classes for every provider) is a transport error naming the provider
and status, which the base server turns into a 502.

LiteLLM fetches its model cost map from the internet when imported unless told otherwise; this server sets
``LITELLM_LOCAL_MODEL_COST_MAP`` first, so it starts the same with or without a network.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # read by LiteLLM when imported, just below

import litellm
import openai
from pydantic import Field, PrivateAttr

from nemo_gym.base_responses_api_model import BaseResponsesAPIModelConfig, SimpleResponsesAPIModel
from nemo_gym.openai_utils import (
    NeMoGymChatCompletion,
    NeMoGymChatCompletionCreateParamsNonStreaming,
    NeMoGymResponse,
    NeMoGymResponseCreateParamsNonStreaming,
)
from nemo_gym.responses_converter import ResponsesConverter
from nemo_gym.transport.types import ServerRequestError, ServerTimeoutError

litellm.suppress_debug_info = True  # no "Give Feedback / Get Help" banner on every failed call

_NOT_SENT = ("model", "metadata", "stream", "stream_options")
"""Chat fields never passed to LiteLLM: the model is the configured one, ``metadata`` carries our per-request extras
(LiteLLM would hand it to its logging callbacks), and streaming is ``StreamingMiddleware``'s job."""


class LiteLLMModelConfig(BaseResponsesAPIModelConfig):
    model: str
    """LiteLLM's model string, ``<provider>/<model>``: ``openai/gpt-4o-mini``, ``anthropic/claude-haiku-4-5``,
    ``azure/<deployment>``, ``hosted_vllm/<name>``, ``litellm_proxy/<name>`` ..."""

    api_base: str | None = None
    """The provider's endpoint, when not its default (an OpenAI-compatible server, a proxy, an Azure resource)."""

    api_key: str | None = None
    """The provider's key; empty or unset lets LiteLLM read the provider's usual environment variable."""

    litellm_kwargs: dict[str, Any] = Field(default_factory=dict)
    """More keyword arguments of ``litellm.acompletion`` on every call (``api_version``, ``drop_params``,
    ``aws_region_name``, ``extra_headers`` ...); request fields win."""

    timeout_s: float = Field(default=600.0, gt=0)
    """Deadline of one call."""

    num_retries: int = Field(default=2, ge=0)
    """LiteLLM's retries of a failed call."""

    max_concurrent_requests: int | None = Field(default=None, ge=1)
    """Cap on calls in flight from this server, to stay under a provider's rate limits; unset = no cap."""

    uses_reasoning_parser: bool = True
    """Split ``<think>`` spans of the answer's text into reasoning items (models that reason inline)."""


class LiteLLMModel(SimpleResponsesAPIModel):
    config: LiteLLMModelConfig

    _semaphore: asyncio.Semaphore | None = PrivateAttr(default=None)
    _converter: ResponsesConverter = PrivateAttr()

    def model_post_init(self, context: Any, /) -> None:
        super().model_post_init(context)
        self._converter = ResponsesConverter(uses_reasoning_parser=self.config.uses_reasoning_parser)
        if self.config.max_concurrent_requests is not None:
            self._semaphore = asyncio.Semaphore(self.config.max_concurrent_requests)

    def model_ids(self) -> list[str]:
        return [self.config.model]

    async def responses(self, body: NeMoGymResponseCreateParamsNonStreaming) -> NeMoGymResponse:
        chat_params = self._converter.responses_to_chat_completion_create_params(body)
        completion = await self.chat_completions(chat_params)
        return self._converter.chat_completion_to_response(body, completion)

    async def chat_completions(self, body: NeMoGymChatCompletionCreateParamsNonStreaming) -> NeMoGymChatCompletion:
        params = {k: v for k, v in body.model_dump(mode="json", exclude_unset=True).items() if k not in _NOT_SENT}
        completion = await self._acompletion(params)
        for choice in completion.get("choices") or []:
            _inline_reasoning(choice.get("message") or {})
        return NeMoGymChatCompletion.model_validate(completion)

    async def _acompletion(self, params: dict[str, Any]) -> dict[str, Any]:
        """One ``litellm.acompletion`` call; the completion as a plain dict."""
        config = self.config
        settings: dict[str, Any] = {"timeout": config.timeout_s, "num_retries": config.num_retries}
        settings |= {key: value for key, value in (("api_base", config.api_base), ("api_key", config.api_key)) if value}
        limit = self._semaphore if self._semaphore is not None else contextlib.nullcontext()
        where = config.api_base or config.model
        try:
            async with limit:
                answer = await litellm.acompletion(model=config.model, **(settings | config.litellm_kwargs | params))
        except openai.APITimeoutError as error:
            raise ServerTimeoutError(f"{where} timed out", server="litellm", url_path=where) from error
        except openai.APIError as error:
            status = getattr(error, "status_code", None)
            raise ServerRequestError(
                f"{where} answered {status}: {error.message}", server="litellm", url_path=where, status=status
            ) from error
        return answer.model_dump(mode="json")


def _inline_reasoning(message: dict[str, Any]) -> None:
    """Put reasoning a provider returned apart into the text as a ``<think>`` span, where the converter finds it."""
    reasoning = message.pop("reasoning_content", None)
    if reasoning:
        message["content"] = f"<think>{reasoning}</think>{message.get('content') or ''}"


if __name__ == "__main__":
    LiteLLMModel.run_webserver()
