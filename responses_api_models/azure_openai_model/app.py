"""azure_openai_model: an Azure OpenAI deployment as the policy model, with NeMo Gym's config keys for it.

Azure serves a model as a *deployment* of a resource: ``POST <endpoint>/openai/deployments/<deployment>/chat/completions
?api-version=<version>`` with the key in an ``api-key`` header (not ``Authorization``). ``/v1/chat/completions`` goes
there as it is (``model`` forced to the configured one); ``/v1/responses`` is converted to a Chat request and back
(``ResponsesConverter``), as Azure's deployments API speaks Chat Completions. Calls go through the framework's pooled
transport; ``num_concurrent_requests`` caps how many are in flight, to stay under the deployment's rate limit. An
upstream failure is a transport error naming the URL (without the key) and status, which the base server turns into
a 502. For Azure's newer ``/openai/v1`` API, which speaks the Responses API itself, ``openai_model`` is enough.
"""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import quote, urlencode

from pydantic import Field, PrivateAttr, field_validator

from nemo_gym.base_responses_api_model import BaseResponsesAPIModelConfig, SimpleResponsesAPIModel
from nemo_gym.openai_utils import (
    NeMoGymChatCompletion,
    NeMoGymChatCompletionCreateParamsNonStreaming,
    NeMoGymResponse,
    NeMoGymResponseCreateParamsNonStreaming,
)
from nemo_gym.responses_converter import ResponsesConverter
from nemo_gym.transport.http_client import raise_for_status, request, response_json

API_VERSION = "api-version"


class AzureOpenAIModelConfig(BaseResponsesAPIModelConfig):
    openai_base_url: str
    """The resource's endpoint, e.g. ``https://my-resource.openai.azure.com`` (``/openai/deployments/...`` is added)."""

    openai_api_key: str
    """Sent as the ``api-key`` header."""

    openai_model: str
    """Model name sent in every body; also the deployment name unless ``azure_deployment`` is set."""

    default_query: dict[str, str]
    """Query parameters of every call; ``api-version`` is required (e.g. ``2024-10-21``)."""

    azure_deployment: str | None = None
    """The deployment to call, when its name is not ``openai_model``."""

    num_concurrent_requests: int = Field(default=8, ge=1)
    """Calls in flight from this server at most."""

    @field_validator("default_query")
    @classmethod
    def needs_api_version(cls, value: dict[str, str]) -> dict[str, str]:
        if not value.get(API_VERSION):
            raise ValueError(f"default_query needs {API_VERSION!r} (Azure's API version, e.g. 2024-10-21)")
        return value


class AzureOpenAIModel(SimpleResponsesAPIModel):
    config: AzureOpenAIModelConfig

    _semaphore: asyncio.Semaphore = PrivateAttr()
    _converter: ResponsesConverter = PrivateAttr()

    def model_post_init(self, context: Any, /) -> None:
        super().model_post_init(context)
        self._semaphore = asyncio.Semaphore(self.config.num_concurrent_requests)
        self._converter = ResponsesConverter(uses_reasoning_parser=False)

    def model_ids(self) -> list[str]:
        return [self.config.openai_model]

    def chat_url(self) -> str:
        deployment = quote(self.config.azure_deployment or self.config.openai_model, safe="")
        base = self.config.openai_base_url.rstrip("/")
        return f"{base}/openai/deployments/{deployment}/chat/completions?{urlencode(self.config.default_query)}"

    async def responses(self, body: NeMoGymResponseCreateParamsNonStreaming) -> NeMoGymResponse:
        chat_params = self._converter.responses_to_chat_completion_create_params(body)
        return self._converter.chat_completion_to_response(body, await self.chat_completions(chat_params))

    async def chat_completions(self, body: NeMoGymChatCompletionCreateParamsNonStreaming) -> NeMoGymChatCompletion:
        payload = body.model_dump(mode="json", exclude_unset=True)
        payload.pop("metadata", None)  # our per-request extras, not Azure's (it stores metadata only with `store`)
        payload["model"] = self.config.openai_model
        url = self.chat_url()
        async with self._semaphore:
            answer = await request(
                "POST", url, json=payload, headers={"api-key": self.config.openai_api_key}, url_path=url
            )
        raise_for_status(answer, url_path=url)
        return NeMoGymChatCompletion.model_validate(await response_json(answer))


if __name__ == "__main__":
    AzureOpenAIModel.run_webserver()
