"""openai_model: a model server for endpoints that speak the Responses API natively (OpenAI, Azure, proxies).

Requests are forwarded as they are, apart from ``model`` (always the configured one, so a dataset row cannot pick a
different, possibly costlier model) and the configured ``extra_body`` defaults underneath them. There is no
Responses<->Chat conversion here: the upstream understands both APIs, so each route goes to its own upstream route.
An upstream failure surfaces as a transport error naming the upstream URL and status, which the base server turns
into a 502.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from pydantic import Field, PrivateAttr

from nemo_gym.base_responses_api_model import BaseResponsesAPIModelConfig, SimpleResponsesAPIModel
from nemo_gym.openai_utils import (
    NeMoGymChatCompletion,
    NeMoGymChatCompletionCreateParamsNonStreaming,
    NeMoGymResponse,
    NeMoGymResponseCreateParamsNonStreaming,
)
from nemo_gym.transport.http_client import raise_for_status, request, response_json


class OpenAIModelConfig(BaseResponsesAPIModelConfig):
    openai_base_url: str
    """Upstream API root including the version, e.g. ``https://api.openai.com/v1``."""

    openai_api_key: str
    """Sent as ``Authorization: Bearer <key>``; an empty key sends no Authorization header (local proxies)."""

    openai_model: str
    """Model name sent upstream on every request, whatever the caller asked for."""

    extra_body: dict[str, Any] = Field(default_factory=dict)
    """Defaults merged under every request body (request fields win), for provider-specific parameters."""

    openai_default_headers: dict[str, str] = Field(default_factory=dict)
    """Extra headers on every upstream call (organisation, project, proxy routing...)."""

    max_concurrent_requests: int | None = Field(default=None, ge=1)
    """Cap on upstream calls in flight from this server, to stay under a provider's rate limits; unset = no cap."""

    drop_input_reasoning_items: bool = False
    """Remove ``reasoning`` items from Responses input before forwarding: providers reject replayed reasoning they did
    not issue (for example items produced by another model server)."""


class OpenAIModel(SimpleResponsesAPIModel):
    config: OpenAIModelConfig

    _semaphore: asyncio.Semaphore | None = PrivateAttr(default=None)

    def model_post_init(self, context: Any, /) -> None:
        super().model_post_init(context)
        if self.config.max_concurrent_requests is not None:
            self._semaphore = asyncio.Semaphore(self.config.max_concurrent_requests)

    def model_ids(self) -> list[str]:
        return [self.config.openai_model]

    async def responses(self, body: NeMoGymResponseCreateParamsNonStreaming) -> NeMoGymResponse:
        payload = self.config.extra_body | body.model_dump(mode="json", exclude_unset=True)
        if self.config.drop_input_reasoning_items and isinstance(payload.get("input"), list):
            payload["input"] = [item for item in payload["input"] if item.get("type") != "reasoning"]
        return NeMoGymResponse.model_validate(await self._post("/responses", payload))

    async def chat_completions(self, body: NeMoGymChatCompletionCreateParamsNonStreaming) -> NeMoGymChatCompletion:
        payload = self.config.extra_body | body.model_dump(mode="json", exclude_unset=True)
        return NeMoGymChatCompletion.model_validate(await self._post("/chat/completions", payload))

    async def _post(self, path: str, payload: dict[str, Any]) -> Any:
        """POST to the upstream with the model forced; non-2xx raises a TransportError naming the URL and status."""
        payload["model"] = self.config.openai_model
        url = self.config.openai_base_url.rstrip("/") + path
        headers = dict(self.config.openai_default_headers)
        if self.config.openai_api_key:
            headers["Authorization"] = f"Bearer {self.config.openai_api_key}"
        limit = self._semaphore if self._semaphore is not None else contextlib.nullcontext()
        async with limit:
            response = await request("POST", url, json=payload, headers=headers, url_path=url)
        raise_for_status(response, url_path=url)
        return await response_json(response)


if __name__ == "__main__":
    OpenAIModel.run_webserver()
