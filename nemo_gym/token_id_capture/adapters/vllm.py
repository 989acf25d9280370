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
    pairs = _generated_pairs(choice)
    # Logprob entries name their token as "token_id:<n>" when vLLM is asked for ids; plain ids pass through.
    ids = [int(str(token).removeprefix("token_id:")) for token, _ in pairs]
    return ids, [float(log_prob) for _, log_prob in pairs]


def _generated_pairs(choice: dict[str, Any]) -> list[tuple[Any, Any]]:
    """(token, log-prob) per generated token: the message's two generation fields, else ``logprobs.content``."""
    message = _message_of(choice)
    if {"generation_token_ids", "generation_log_probs"} <= message.keys():
        tokens, log_probs = list(message["generation_token_ids"]), list(message["generation_log_probs"])
        if len(tokens) != len(log_probs):
            raise ValueError(f"{len(tokens)} generated ids but {len(log_probs)} log-probs")
        return list(zip(tokens, log_probs, strict=True))
    content = (choice.get("logprobs") or {}).get("content")
    if content is None:
        raise ValueError("the choice has neither generation token fields nor logprobs.content")
    return [(entry["token"], entry["logprob"]) for entry in content]


_ABSENT = object()


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
        experts = _message_of(_only_choice(response_payload)).get(ROUTED_EXPERTS_FIELD)
        spans = response_payload.get(MEDIA_SPANS_FIELD, _ABSENT)
        if experts is not None and not isinstance(experts, (str, dict, list)):
            raise ValueError("routed_experts must be JSON data")
        if spans is not _ABSENT and not (isinstance(spans, list) and all(isinstance(span, dict) for span in spans)):
            raise ValueError("media_spans must be a list of objects")
        found = {ROUTED_EXPERTS_FIELD: experts, MEDIA_SPANS_FIELD: None if spans is _ABSENT else spans}
        return {name: value for name, value in found.items() if value is not None} or None
