"""anthropic_model: an Anthropic Messages endpoint (Anthropic's API, or a proxy that speaks it) as the policy model.

``/v1/responses`` and ``/v1/chat/completions`` are translated to one ``POST /v1/messages`` each (``convert.py``), sent
with the official ``anthropic`` SDK: one ``AsyncAnthropic`` client per server, so its connection pool is shared by
every request, with the configured timeout and retries (the SDK retries 408/409/429/5xx and overloaded answers).
``model`` is always the configured one, so a dataset row cannot pick a different, possibly costlier model, and
``extra_body`` (say ``thinking``) is merged under every request. ``stream_upstream`` asks Anthropic for its event
stream and assembles it here (Anthropic advises streaming for long generations); our own ``stream: true`` needs
neither, as every model server's ``StreamingMiddleware`` streams the finished answer. An upstream failure is a
transport error naming the upstream URL and status, which the base server turns into a 502.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import anthropic
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
from responses_api_models.anthropic_model.convert import (
    chat_completion_from_message,
    messages_request,
    response_from_message,
)

MESSAGES_PATH = "/v1/messages"


class AnthropicModelConfig(BaseResponsesAPIModelConfig):
    base_url: str = "https://api.anthropic.com"
    """API root without ``/v1`` (the SDK adds ``/v1/messages``)."""

    api_key: str
    """Sent as ``x-api-key``."""

    model: str
    """Model name sent upstream on every request, whatever the caller asked for."""

    max_tokens: int = Field(default=4096, ge=1)
    """``max_tokens`` when a request sets no ``max_output_tokens`` (Anthropic requires one)."""

    extra_body: dict[str, Any] = Field(default_factory=dict)
    """Defaults merged under every Messages body (request fields win), e.g. ``thinking: {type: enabled, ...}``."""

    anthropic_version: str = "2023-06-01"
    """The ``anthropic-version`` header: the Messages API version ``convert.py`` speaks, whatever the SDK's default."""

    default_headers: dict[str, str] = Field(default_factory=dict)
    """Extra headers on every upstream call (``anthropic-beta``, proxy routing...)."""

    stream_upstream: bool = False
    """Ask Anthropic for its event stream and assemble the message here, for generations that take minutes."""

    timeout_s: float = Field(default=600.0, gt=0)
    """Deadline of one upstream call, retries apart."""

    max_retries: int = Field(default=2, ge=0)
    """Retries of a failed upstream call, with the SDK's backoff."""

    max_concurrent_requests: int | None = Field(default=None, ge=1)
    """Cap on upstream calls in flight from this server, to stay under a provider's rate limits; unset = no cap."""


class AnthropicModel(SimpleResponsesAPIModel):
    config: AnthropicModelConfig

    _client: anthropic.AsyncAnthropic | None = PrivateAttr(default=None)
    _semaphore: asyncio.Semaphore | None = PrivateAttr(default=None)
    _converter: ResponsesConverter = PrivateAttr(default_factory=ResponsesConverter)

    def model_post_init(self, context: Any, /) -> None:
        super().model_post_init(context)
        if self.config.max_concurrent_requests is not None:
            self._semaphore = asyncio.Semaphore(self.config.max_concurrent_requests)

    def model_ids(self) -> list[str]:
        return [self.config.model]

    def client(self) -> anthropic.AsyncAnthropic:
        """The one SDK client of this server, made on first use (inside the server's event loop)."""
        if self._client is None:
            self._client = anthropic.AsyncAnthropic(
                base_url=self.config.base_url,
                api_key=self.config.api_key,
                timeout=self.config.timeout_s,
                max_retries=self.config.max_retries,
                default_headers={"anthropic-version": self.config.anthropic_version, **self.config.default_headers},
            )
        return self._client

    async def responses(self, body: NeMoGymResponseCreateParamsNonStreaming) -> NeMoGymResponse:
        params = body.model_dump(mode="json", exclude_unset=True)
        message = await self.create_message(params)
        return NeMoGymResponse.model_validate(response_from_message(message, params))

    async def chat_completions(self, body: NeMoGymChatCompletionCreateParamsNonStreaming) -> NeMoGymChatCompletion:
        responses_params = self._converter.chat_completion_to_responses_create_params(body)
        message = await self.create_message(responses_params.model_dump(mode="json", exclude_unset=True))
        return NeMoGymChatCompletion.model_validate(chat_completion_from_message(message))

    async def create_message(self, params: dict[str, Any]) -> dict[str, Any]:
        """One Messages call for a Responses request (as JSON); the Message as a dict."""
        request = self.config.extra_body | messages_request(params, self.config.model, self.config.max_tokens)
        core = {key: request.pop(key) for key in ("model", "max_tokens", "messages")}
        limit = self._semaphore if self._semaphore is not None else contextlib.nullcontext()
        url = self.config.base_url.rstrip("/") + MESSAGES_PATH
        try:
            async with limit:
                if self.config.stream_upstream:
                    async with self.client().messages.stream(**core, extra_body=request) as stream:
                        message = await stream.get_final_message()
                else:
                    message = await self.client().messages.create(**core, extra_body=request)
        except anthropic.APIStatusError as error:
            raise ServerRequestError(
                f"{url} answered {error.status_code}: {error.message}",
                server="anthropic",
                url_path=url,
                status=error.status_code,
                body_snippet=str(error.body)[:200],
            ) from error
        except anthropic.APITimeoutError as error:
            raise ServerTimeoutError(f"{url} timed out", server="anthropic", url_path=url) from error
        except anthropic.APIConnectionError as error:
            raise ServerRequestError(
                f"{url} could not be reached: {error}", server="anthropic", url_path=url
            ) from error
        return message.model_dump(mode="json")


if __name__ == "__main__":
    AnthropicModel.run_webserver()
