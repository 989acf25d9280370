"""vLLM's Chat Completions payloads in capture terms: where the prefix goes and where ids and log-probs come back.

Dependency-free, so a framework's inference worker can use it next to vLLM. Generation ids are read from the message's
``generation_token_ids`` / ``generation_log_probs`` when the engine puts them there, else from
``choice.logprobs.content`` spelled ``token_id:<id>`` (``return_tokens_as_token_ids``).
"""

from __future__ import annotations

from typing import Any

PREFIX_IDS_FIELD = "required_prefix_token_ids"
PROMPT_IDS_FIELD = "prompt_token_ids"
ROUTED_EXPERTS_FIELD = "routed_experts"
MEDIA_SPANS_FIELD = "media_spans"


def _only_choice(payload: dict[str, Any]) -> dict[str, Any]:
    choices = payload.get("choices") or []
    if len(choices) != 1 or not isinstance(choices[0], dict):
        raise ValueError(f"token capture needs exactly one choice, got {len(choices)}")
    choice: dict[str, Any] = choices[0]
    return choice


def _message_of(choice: dict[str, Any]) -> dict[str, Any]:
    message = choice.get("message") or {}
    if not isinstance(message, dict):
        raise ValueError("choice.message must be an object")
    return message


def extract_generation_token_info(choice: dict[str, Any]) -> tuple[list[int], list[float]]:
    """Generated ids and log-probs of one choice, from whichever supported place holds them."""
    message = _message_of(choice)
    if "generation_token_ids" in message and "generation_log_probs" in message:
        raw_ids, raw_log_probs = message["generation_token_ids"], message["generation_log_probs"]
    else:
        entries = (choice.get("logprobs") or {}).get("content")
        if entries is None:
            raise ValueError("the choice has neither generation token fields nor logprobs.content")
        raw_ids = [entry["token"] for entry in entries]
        raw_log_probs = [entry["logprob"] for entry in entries]
    ids = [int(str(token).removeprefix("token_id:")) for token in raw_ids]
    log_probs = [float(value) for value in raw_log_probs]
    if len(ids) != len(log_probs):
        raise ValueError(f"{len(ids)} generated ids but {len(log_probs)} log-probs")
    return ids, log_probs


class VLLMCaptureAdapter:
    """``CaptureAdapter`` for vLLM Chat Completions (``staging.protocols``)."""

    def enter_prefix(self, request_payload: dict[str, Any], prefix_ids: list[int]) -> dict[str, Any]:
        """vLLM's ``required_prefix_token_ids`` extension (a patched engine; stock vLLM ignores it)."""
        request_payload.update({PREFIX_IDS_FIELD: [*prefix_ids]})
        return request_payload

    def extract_prompt_ids(self, response_payload: dict[str, Any]) -> list[int]:
        """Top-level ``prompt_token_ids`` (``return_token_ids``), else the ones on the message."""
        top = response_payload.get(PROMPT_IDS_FIELD)
        found = top if top is not None else _message_of(_only_choice(response_payload)).get(PROMPT_IDS_FIELD)
        if found is None:
            raise ValueError("the vLLM answer carries no prompt_token_ids")
        return list(map(int, found))

    def extract_generation(self, response_payload: dict[str, Any]) -> tuple[list[int], list[float]]:
        return extract_generation_token_info(_only_choice(response_payload))

    def extract_extras(self, response_payload: dict[str, Any]) -> dict[str, Any] | None:
        """Routed experts (MoE) and media placeholder spans, when present; None when there is nothing."""
        extras: dict[str, Any] = {}
        experts = _message_of(_only_choice(response_payload)).get(ROUTED_EXPERTS_FIELD)
        if experts is not None:
            if not isinstance(experts, (str, dict, list)):
                raise ValueError("routed_experts must be JSON data")
            extras[ROUTED_EXPERTS_FIELD] = experts
        if MEDIA_SPANS_FIELD in response_payload:
            spans = response_payload[MEDIA_SPANS_FIELD]
            if not isinstance(spans, list) or not all(isinstance(span, dict) for span in spans):
                raise ValueError("media_spans must be a list of objects")
            extras[MEDIA_SPANS_FIELD] = spans
        return extras or None
