"""vllm_model: serve the Responses API on top of an engine that only speaks Chat Completions (vLLM, SGLang, llama.cpp).

``/v1/responses`` converts the request to a Chat request (``ResponsesConverter``), runs it through the same code path
as ``/v1/chat/completions`` (no HTTP hop to itself) and converts the completion back. That shared path is where the
engine-specific work happens:

* outbound: force ``model``; merge ``extra_body`` and ``chat_template_kwargs`` (config, then per-request JSON in
  ``metadata.extra_body`` / ``metadata.chat_template_kwargs``, e.g. a rollout's ``seed``); in training mode ask for
  token ids and log-probs; move ``<think>`` spans of past assistant turns into ``reasoning_content`` for the chat
  template; apply ``sampling_overrides`` last so on-policy sampling settings cannot be changed by a request;
* replica choice: sticky per session (sha256 of the session id), so a rollout's turns hit the same engine and reuse
  its prefix cache;
* inbound: engine-parsed reasoning goes back into the text as a ``<think>`` prefix (the converter turns it into a
  reasoning item); token ids and log-probs land on the message so the converter emits ForTraining items; a prompt
  that no longer fits the context window becomes an empty, ``length``-finished completion, so the Response is
  ``incomplete`` and the agent stops cleanly instead of failing the rollout.

Training-token capture (``token_id_capture``): a call under ``/ng-rollout/<id>/training-token-capture/`` asks the
engine for token ids as in training mode, so the capture middleware can record them; with ``external_staging`` the
engine's worker stages them instead and this server only forwards the admission and commits the acknowledgement.
"""

from __future__ import annotations

import hashlib
import logging
import re
import time
import uuid
from collections.abc import Mapping
from typing import Any

import orjson
from fastapi import HTTPException, Request
from pydantic import Field, PrivateAttr, field_validator

from nemo_gym.base_responses_api_model import BaseResponsesAPIModelConfig, SimpleResponsesAPIModel
from nemo_gym.openai_utils import (
    TOKEN_ID_FIELDS,
    NeMoGymChatCompletion,
    NeMoGymChatCompletionCreateParamsNonStreaming,
    NeMoGymChatCompletionMessage,
    NeMoGymChoice,
    NeMoGymCompletionUsage,
    NeMoGymResponse,
    NeMoGymResponseCreateParamsNonStreaming,
)
from nemo_gym.responses_converter import THINK_PATTERN, ResponsesConverter
from nemo_gym.server_utils import SESSION_ID_KEY
from nemo_gym.token_id_capture.config import token_id_capture_config
from nemo_gym.token_id_capture.external_capture import ExternalCaptureHandler, make_external_capture_handler
from nemo_gym.token_id_capture.sink import current_capture_context
from nemo_gym.transport.http_client import raise_for_status, request, response_json

logger = logging.getLogger(__name__)

CONTEXT_LENGTH_ERROR = re.compile(
    r"context[ _-]?(length|size|window)|max_tokens|max_completion_tokens|maximum model length", re.IGNORECASE
)
"""What engines say in a 400 when prompt + max_tokens do not fit (vLLM, SGLang and llama.cpp wordings)."""

TOKEN_ID_PREFIX = "token_id:"
"""How vLLM spells a log-prob token when asked for ``return_tokens_as_token_ids``."""

REASONING_FIELDS: tuple[str, str] = ("reasoning_content", "reasoning")
"""Message fields engines use for parsed reasoning (older and newer vLLM names); both are read and written."""


class VLLMModelConfig(BaseResponsesAPIModelConfig):
    base_url: str | list[str]
    """Engine API root(s) including ``/v1``; several replicas are chosen per session."""

    api_key: str = ""
    """Sent as ``Authorization: Bearer <key>`` when not empty."""

    model: str
    """Model name sent on every request (the engine's served model name)."""

    return_token_id_information: bool = False
    """Training mode: return prompt/generation token ids and log-probs on the last output item of every call."""

    request_prompt_and_generation_token_ids: bool = True
    """In training mode also send ``return_token_ids`` (vLLM >= 0.10.2), so prompt ids come back with the completion
    instead of needing a ``/tokenize`` call."""

    uses_reasoning_parser: bool = True
    """The model emits ``<think>`` reasoning (inline, or parsed by the engine): split it into reasoning items."""

    uses_interleaved_reasoning: bool = True
    """Replay past reasoning to the chat template (as ``reasoning_content``); false drops it from past turns."""

    preserve_reasoning_in_assistant_content: bool = False
    """Leave past ``<think>`` spans inline in the assistant text instead of moving them to ``reasoning_content``."""

    replace_developer_role_with_system: bool = False
    """Send ``developer`` messages as ``system`` for chat templates that do not know the developer role."""

    chat_template_kwargs: dict[str, Any] = Field(default_factory=dict)
    """Defaults for the engine's ``chat_template_kwargs`` (e.g. ``enable_thinking``); per-request JSON in
    ``metadata.chat_template_kwargs`` overrides them key by key."""

    extra_body: dict[str, Any] = Field(default_factory=dict)
    """Defaults merged into every engine request (e.g. ``top_k``); per-request JSON in ``metadata.extra_body``
    overrides them, and request fields override both."""

    sampling_overrides: dict[str, Any] = Field(default_factory=dict)
    """Forced onto every outbound request after everything else (e.g. ``temperature: 1.0`` for on-policy RL)."""

    default_headers: dict[str, str] = Field(default_factory=dict)
    """Extra headers on every engine call."""

    @field_validator("base_url")
    @classmethod
    def at_least_one_url(cls, value: str | list[str]) -> str | list[str]:
        if isinstance(value, list) and not value:
            raise ValueError("base_url needs at least one URL")
        return value


class VLLMModel(SimpleResponsesAPIModel):
    config: VLLMModelConfig

    _base_urls: list[str] = PrivateAttr(default_factory=list)
    _converter: ResponsesConverter = PrivateAttr()
    _token_converter: ResponsesConverter = PrivateAttr()
    _external_capture: ExternalCaptureHandler | None = PrivateAttr(default=None)

    def model_post_init(self, context: Any, /) -> None:
        super().model_post_init(context)
        urls = [self.config.base_url] if isinstance(self.config.base_url, str) else self.config.base_url
        self._base_urls = [url.rstrip("/") for url in urls]
        self._converter = ResponsesConverter(
            return_token_id_information=self.config.return_token_id_information,
            uses_reasoning_parser=self.config.uses_reasoning_parser,
        )
        self._token_converter = ResponsesConverter(
            return_token_id_information=True, uses_reasoning_parser=self.config.uses_reasoning_parser
        )
        capture = token_id_capture_config(getattr(self.server_client, "global_config_dict", None)).token_id_capture
        if capture.enabled and capture.external_staging:
            if self.config.return_token_id_information:
                raise ValueError("token_id_capture.external_staging needs return_token_id_information: false")
            self._external_capture = make_external_capture_handler(capture.external_staging_backend)

    def _with_token_ids(self) -> bool:
        """Training mode, or a training-token-captured call that this server captures itself."""
        context = current_capture_context()
        return self.config.return_token_id_information or (context is not None and not context.external_staging)

    # ------------------------------------------------------------------------------------------------------------------
    # Routes
    # ------------------------------------------------------------------------------------------------------------------

    def model_ids(self) -> list[str]:
        return [self.config.model]

    async def responses(self, request: Request, body: NeMoGymResponseCreateParamsNonStreaming) -> NeMoGymResponse:
        converter = self._token_converter if self._with_token_ids() else self._converter
        chat_params = converter.responses_to_chat_completion_create_params(body)
        completion = await self.complete(chat_params, _session_id(request))
        response = converter.chat_completion_to_response(body, completion)
        if self._external_capture is not None:
            await self._external_capture.finalize_response(response.model_dump(mode="json"))
        return response

    async def chat_completions(
        self, request: Request, body: NeMoGymChatCompletionCreateParamsNonStreaming
    ) -> NeMoGymChatCompletion:
        completion = await self.complete(body, _session_id(request))
        if self._external_capture is not None:
            await self._external_capture.finalize_response(completion.model_dump(mode="json"))
        return completion

    # ------------------------------------------------------------------------------------------------------------------
    # The shared chat path
    # ------------------------------------------------------------------------------------------------------------------

    async def complete(
        self, body: NeMoGymChatCompletionCreateParamsNonStreaming, session_id: str | None = None
    ) -> NeMoGymChatCompletion:
        """One engine call: build the outbound body, send it to the session's replica, normalise the answer."""
        payload = self.build_engine_request(body)
        base_url = self.base_url_for_session(session_id)
        data = await self._post_chat(base_url, payload)
        if data is None:
            return self._context_length_completion()
        if self._external_capture is not None:
            self._external_capture.prepare_response(data)
        with_token_ids = self._with_token_ids()
        choices = data.get("choices") or []
        prompt_token_ids = data.pop("prompt_token_ids", None)
        for choice in choices:
            message = choice["message"] = choice.get("message") or {"role": "assistant"}
            self._reasoning_into_content(message)
            if not with_token_ids:
                for key in TOKEN_ID_FIELDS:
                    message.pop(key, None)
                continue
            if prompt_token_ids is None and not message.get("prompt_token_ids"):
                prompt_token_ids = await self._tokenize_prompt(base_url, payload)
            message.update(_token_information(message, choice, prompt_token_ids))
            choice.pop("token_ids", None)  # now on the message, where the converter and trainers read them
            if body.logprobs is not True:  # asked for by us, not by the caller: do not ship them twice
                choice["logprobs"] = None
        return NeMoGymChatCompletion.model_validate(data)

    def build_engine_request(self, body: NeMoGymChatCompletionCreateParamsNonStreaming) -> dict[str, Any]:
        """The exact JSON sent to the engine for ``body``; see the module docstring for the precedence rules."""
        fields = body.model_dump(mode="json", exclude_unset=True)
        metadata = fields.pop("metadata", None) or {}  # our side channel, not an engine parameter
        payload: dict[str, Any] = {
            **self.config.extra_body,
            **_json_object_from_metadata(metadata, "extra_body"),
            **fields,
        }
        template_kwargs = {
            **self.config.chat_template_kwargs,
            **(payload.get("chat_template_kwargs") or {}),
            **_json_object_from_metadata(metadata, "chat_template_kwargs"),
        }
        if template_kwargs:
            payload["chat_template_kwargs"] = template_kwargs
        payload["messages"] = [self._outbound_message(message) for message in payload["messages"]]
        for tool in payload.get("tools") or []:
            # OpenAI's schema-enforcement flag: vLLM does not enforce it, and chat templates that render every
            # function key would put it in the prompt, so it never reaches the engine.
            (tool.get("function") or {}).pop("strict", None)
        if self._with_token_ids():
            payload.update(logprobs=True, top_logprobs=0, return_tokens_as_token_ids=True)
            if self.config.request_prompt_and_generation_token_ids:
                payload["return_token_ids"] = True
        payload.update(self.config.sampling_overrides)
        payload["model"] = self.config.model
        if self._external_capture is not None:
            payload = self._external_capture.prepare_request(payload)
        return payload

    def base_url_for_session(self, session_id: str | None) -> str:
        """Sticky replica choice: a hash rather than a table, so every worker process picks the same replica."""
        if session_id is None or len(self._base_urls) == 1:
            return self._base_urls[0]
        digest = hashlib.sha256(session_id.encode("utf-8")).hexdigest()
        return self._base_urls[int(digest, 16) % len(self._base_urls)]

    # ------------------------------------------------------------------------------------------------------------------
    # Engine I/O
    # ------------------------------------------------------------------------------------------------------------------

    @property
    def _headers(self) -> dict[str, str]:
        headers = dict(self.config.default_headers)
        if self.config.api_key:
            headers["Authorization"] = f"Bearer {self.config.api_key}"
        return headers

    async def _post_chat(self, base_url: str, payload: dict[str, Any]) -> dict[str, Any] | None:
        """The engine's JSON answer, or None when it refused the request for not fitting the context window."""
        url = f"{base_url}/chat/completions"
        response = await request("POST", url, json=payload, headers=self._headers, url_path=url)
        if response.status == 400:
            text = (await response.read()).decode("utf-8", errors="replace")
            if CONTEXT_LENGTH_ERROR.search(text):
                logger.warning("%s: context window exceeded, ending the turn as 'length': %s", url, text[:300])
                return None
        raise_for_status(response, url_path=url)
        return await response_json(response)

    async def _tokenize_prompt(self, base_url: str, payload: Mapping[str, Any]) -> list[int]:
        """Prompt token ids from vLLM's ``/tokenize`` (served at the root, not under ``/v1``), for engines that do not
        return them with the completion. Same messages, tools and template arguments, so the ids match the prompt."""
        root = base_url.removesuffix("/v1")
        url = f"{root}/tokenize"
        body = {"model": payload["model"], "messages": payload["messages"], "add_generation_prompt": True}
        for key in ("tools", "chat_template_kwargs"):
            if key in payload:
                body[key] = payload[key]
        response = await request("POST", url, json=body, headers=self._headers, url_path=url)
        raise_for_status(response, url_path=url)
        tokens = (await response_json(response)).get("tokens")
        if not isinstance(tokens, list):
            raise RuntimeError(f"{url} returned no 'tokens' list; cannot recover the prompt token ids")
        return tokens

    def _context_length_completion(self) -> NeMoGymChatCompletion:
        return NeMoGymChatCompletion(
            id=f"chatcmpl-{uuid.uuid4().hex}",
            created=int(time.time()),
            model=self.config.model,
            choices=[NeMoGymChoice(finish_reason="length", message=NeMoGymChatCompletionMessage(content=""))],
            usage=NeMoGymCompletionUsage(prompt_tokens=0, completion_tokens=0, total_tokens=0),
        )

    # ------------------------------------------------------------------------------------------------------------------
    # Message rewriting
    # ------------------------------------------------------------------------------------------------------------------

    def _outbound_message(self, message: dict[str, Any]) -> dict[str, Any]:
        """Token fields stay here (they would only bloat the engine request); past reasoning goes where the chat
        template looks for it."""
        message = {key: value for key, value in message.items() if key not in TOKEN_ID_FIELDS}
        if self.config.replace_developer_role_with_system and message.get("role") == "developer":
            message["role"] = "system"
        content = message.get("content")
        if (
            message.get("role") != "assistant"
            or not self.config.uses_reasoning_parser
            or self.config.preserve_reasoning_in_assistant_content
            or not isinstance(content, str)
            or "<think>" not in content
        ):
            return message
        spans = THINK_PATTERN.findall(content)
        text = THINK_PATTERN.sub("", content)
        message["content"] = text if text or not message.get("tool_calls") else None
        if self.config.uses_interleaved_reasoning and spans:
            reasoning = "\n\n".join(spans)
            message.update(dict.fromkeys(REASONING_FIELDS, reasoning))
        return message

    def _reasoning_into_content(self, message: dict[str, Any]) -> None:
        """Engine-parsed reasoning back into the text as a ``<think>`` prefix, where the converter finds it."""
        reasoning = next((value for value in (message.pop(key, None) for key in REASONING_FIELDS) if value), None)
        if not reasoning:
            return
        if not self.config.uses_reasoning_parser:
            raise ValueError(
                f"the engine returned parsed reasoning but this model server has uses_reasoning_parser=false; set it "
                f"to true (or start the engine without a reasoning parser). Model: {self.config.model!r}"
            )
        message["content"] = f"<think>{reasoning}</think>{message.get('content') or ''}"


# ----------------------------------------------------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------------------------------------------------


def _session_id(request: Request | None) -> str | None:
    if request is None:
        return None
    return (request.scope.get("session") or {}).get(SESSION_ID_KEY)


def _json_object_from_metadata(metadata: Mapping[str, str], key: str) -> dict[str, Any]:
    """Metadata values are strings, so per-request dicts travel as JSON text; bad JSON is the caller's error."""
    raw = metadata.get(key)
    if raw is None:
        return {}
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise HTTPException(status_code=400, detail=f"metadata.{key} is not valid JSON: {e}") from e
    if not isinstance(value, dict):
        raise HTTPException(status_code=400, detail=f"metadata.{key} must be a JSON object, got {type(value).__name__}")
    return value


def _token_ids_from_logprobs(choice: Mapping[str, Any]) -> tuple[list[int] | None, list[float] | None]:
    """(generation ids, log-probs) from choice log-probs; ids only when every token is spelled ``token_id:<int>``."""
    entries = ((choice.get("logprobs") or {}).get("content")) or None
    if entries is None:
        return None, None
    log_probs = [float(entry["logprob"]) for entry in entries]
    tokens = [entry.get("token", "") for entry in entries]
    if not all(isinstance(token, str) and token.startswith(TOKEN_ID_PREFIX) for token in tokens):
        return None, log_probs
    return [int(token.removeprefix(TOKEN_ID_PREFIX)) for token in tokens], log_probs


def _agreed(what: str, candidates: list[tuple[str, Any]]) -> Any:
    """The first available source of a value; every other source that is present must say the same thing."""
    present = [(source, value) for source, value in candidates if value is not None]
    if not present:
        return None
    first_source, first = present[0]
    for source, value in present[1:]:
        if list(value) != list(first):
            raise RuntimeError(
                f"the engine's {what} disagree: {first_source} has {len(first)} values, {source} has {len(value)} "
                "(or different values); refusing to guess which one a trainer should see"
            )
    return first


def _token_information(
    message: Mapping[str, Any], choice: Mapping[str, Any], prompt_token_ids: list[int] | None
) -> dict[str, Any]:
    """The three training fields from whatever the engine returned, checked for consistency."""
    logprob_ids, logprob_values = _token_ids_from_logprobs(choice)
    prompt = _agreed(
        "prompt token ids",
        [("message.prompt_token_ids", message.get("prompt_token_ids")), ("prompt_token_ids", prompt_token_ids)],
    )
    generation = _agreed(
        "generation token ids",
        [
            ("message.generation_token_ids", message.get("generation_token_ids")),
            ("choice.token_ids", choice.get("token_ids")),
            ("logprobs tokens", logprob_ids),
        ],
    )
    log_probs = _agreed(
        "generation log-probs",
        [("message.generation_log_probs", message.get("generation_log_probs")), ("logprobs", logprob_values)],
    )
    if prompt is None or generation is None or log_probs is None:
        raise RuntimeError(
            "return_token_id_information is on but the engine returned no prompt ids, generation ids or log-probs; it must "
            "honour logprobs=true with return_tokens_as_token_ids=true (vLLM) or return_token_ids=true"
        )
    if len(generation) != len(log_probs):
        raise RuntimeError(f"the engine returned {len(generation)} generation token ids but {len(log_probs)} log-probs")
    return {
        "prompt_token_ids": list(prompt),
        "generation_token_ids": list(generation),
        "generation_log_probs": list(log_probs),
    }


if __name__ == "__main__":
    VLLMModel.run_webserver()
