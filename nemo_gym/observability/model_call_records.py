"""What one captured model call says: :class:`ModelCallRecord`, built from a stored exchange in any of the three
dialects (Responses, Chat Completions, Anthropic Messages), and the sums over a rollout's calls.

Apart from ``capture.py`` (which stores exchanges, reads them back, and re-exports these names) because reading a
record out of an exchange is pure parsing of provider payloads (usage keys, tool calls, reasoning text, finish
reasons) that needs neither the store nor the middleware.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, cast

import orjson
from pydantic import BaseModel, Field

from nemo_gym.config.server_models import ModelServerRef

LENGTH_STOPS = frozenset({"length", "max_output_tokens", "max_tokens"})
"""Finish reasons of a generation cut off at its length limit (Chat, Responses, Messages)."""


class ModelCallRecord(BaseModel):
    """What one captured exchange says: identity, outcome, tokens, cache use, latency and (optionally) payloads.

    ``call_index`` is the append order, not a causal order of concurrent calls. A token field that the provider did
    not report is None ("unknown"), never 0.
    """

    model_call_id: str | None = None
    response_id: str | None = None
    client_session_id: str | None = None  # the client's x-session-id header: evidence of its invocation, not a check
    call_index: int
    model_ref: ModelServerRef | None = None
    model: str | None = None
    dialect: str | None = None
    status_code: int | None = None
    response_status: str | None = None
    finish_reason: str | None = None
    upstream_attempted: bool | None = None
    response_source: Literal["upstream", "local"] | None = None
    upstream_status_code: int | None = None
    local_response_reason: str | None = None
    started_at: float | None = None
    completed_at: float | None = None
    tokens_in: int | None = None
    tokens_out: int | None = None
    tokens_reasoning: int | None = None
    tokens_total: int | None = None
    request: dict[str, Any] | None = None
    response: dict[str, Any] | None = None
    request_raw: str | None = None
    response_raw: str | None = None
    tool_calls: list[dict[str, Any]] = Field(default_factory=list)
    reasoning_content: str | None = None
    cache_hit: bool | None = None
    cached_tokens: int | None = None
    cache_creation_tokens: int | None = None
    error_category: str | None = None
    latency_total_ms: float | None = None
    latency_ttft_ms: float | None = None


def _count(value: Any) -> int | None:
    return value if type(value) is int and value >= 0 else None


def _detail(usage: Mapping[str, Any], groups: tuple[str, ...], names: tuple[str, ...]) -> int | None:
    for group in groups:
        details = usage.get(group)
        if isinstance(details, Mapping):
            for name in names:
                if (value := _count(details.get(name))) is not None:
                    return value
    return None


def token_stats(usage: Any) -> dict[str, int | None]:
    """Token counts of a Responses, Chat Completions or Anthropic Messages ``usage``.

    Anthropic's ``input_tokens`` leaves out cache reads and writes, so they are added back: ``tokens_in`` is the
    prompt's size in every dialect.
    """
    stats: dict[str, int | None] = dict.fromkeys(
        ("tokens_in", "tokens_out", "tokens_reasoning", "tokens_total", "cache_creation_tokens")
    )
    if not isinstance(usage, Mapping):
        return stats
    tokens_in = _count(usage.get("input_tokens"))
    tokens_in = tokens_in if tokens_in is not None else _count(usage.get("prompt_tokens"))
    tokens_out = _count(usage.get("output_tokens"))
    tokens_out = tokens_out if tokens_out is not None else _count(usage.get("completion_tokens"))
    cache_read = _count(usage.get("cache_read_input_tokens"))
    cache_write = _count(usage.get("cache_creation_input_tokens"))
    cached = (cache_read or 0) + (cache_write or 0)
    if (cache_read is not None or cache_write is not None) and (tokens_in is not None or cached > 0):
        tokens_in = (tokens_in or 0) + cached
    total = _count(usage.get("total_tokens"))
    if total is None and tokens_in is not None and tokens_out is not None:
        total = tokens_in + tokens_out
    reasoning = _detail(usage, ("output_tokens_details", "completion_tokens_details"), ("reasoning_tokens",))
    stats.update(
        tokens_in=tokens_in,
        tokens_out=tokens_out,
        tokens_reasoning=reasoning if reasoning is not None else _count(usage.get("reasoning_output_tokens")),
        tokens_total=total,
        cache_creation_tokens=cache_write,
    )
    return stats


def _cached_tokens(usage: Any) -> int | None:
    if not isinstance(usage, Mapping):
        return None
    cached = _detail(usage, ("prompt_tokens_details", "input_tokens_details"), ("cached_tokens", "cached_input_tokens"))
    for key in ("cache_read_input_tokens", "cached_input_tokens"):
        cached = cached if cached is not None else _count(usage.get(key))
    return cached


def _arguments(arguments: Any) -> dict[str, Any]:
    if isinstance(arguments, dict):
        return arguments
    if isinstance(arguments, str):
        try:
            parsed = orjson.loads(arguments)
        except orjson.JSONDecodeError:
            return {"_raw": arguments}
        return parsed if isinstance(parsed, dict) else {"_raw": arguments}
    return {}


def _tool_calls_and_reasoning(response: dict[str, Any]) -> tuple[list[dict[str, Any]], str | None]:
    """Tool calls (name, id, parsed arguments) and reasoning text of a response in any of the three dialects."""
    calls: list[dict[str, Any]] = []
    reasoning: list[str] = []
    for item in response.get("output") or []:  # Responses
        if not isinstance(item, dict):
            continue
        if item.get("type") == "function_call":
            calls.append(
                {"id": item.get("call_id"), "name": item.get("name"), "arguments": _arguments(item.get("arguments"))}
            )
        elif item.get("type") == "reasoning":
            reasoning += [
                part["text"]
                for part in item.get("summary") or []
                if isinstance(part, dict) and isinstance(part.get("text"), str)
            ]
            reasoning += [
                part["text"]
                for part in item.get("content") or []
                if isinstance(part, dict) and isinstance(part.get("text"), str)
            ]
    for choice in response.get("choices") or []:  # Chat Completions
        message = choice.get("message") if isinstance(choice, dict) else None
        if not isinstance(message, dict):
            continue
        for call in message.get("tool_calls") or []:
            function = call.get("function") or {} if isinstance(call, dict) else {}
            calls.append(
                {"id": call.get("id"), "name": function.get("name"), "arguments": _arguments(function.get("arguments"))}
            )
        for key in ("reasoning_content", "reasoning"):
            if isinstance(message.get(key), str):
                reasoning.append(message[key])
                break
    for block in response.get("content") or [] if response.get("type") == "message" else []:  # Anthropic
        if isinstance(block, dict) and block.get("type") == "tool_use":
            calls.append(
                {"id": block.get("id"), "name": block.get("name"), "arguments": _arguments(block.get("input"))}
            )
        elif isinstance(block, dict) and block.get("type") == "thinking" and isinstance(block.get("thinking"), str):
            reasoning.append(block["thinking"])
    return calls, "\n".join(reasoning) or None


def build_model_call_record(exchange: dict[str, Any], *, call_index: int) -> ModelCallRecord:
    """The record of one stored exchange (see ``capture._record`` for the exchange's shape)."""
    response = exchange.get("response") if isinstance(exchange.get("response"), dict) else None
    request = exchange.get("request") if isinstance(exchange.get("request"), dict) else None
    body, sent = response or {}, request or {}
    usage = body.get("usage")
    cached = _cached_tokens(usage)
    tool_calls, reasoning = _tool_calls_and_reasoning(body)
    choices = body.get("choices")
    first_choice = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
    details = body.get("incomplete_details")
    incomplete = details if isinstance(details, dict) else {}
    finish = (body.get("stop_reason"), first_choice.get("finish_reason"), incomplete.get("reason"))
    model = body.get("model") or sent.get("model")
    return ModelCallRecord(
        model_call_id=exchange.get("model_call_id"),
        response_id=body["id"] if isinstance(body.get("id"), str) else None,
        client_session_id=_str_or_none(exchange.get("client_session_id")),
        call_index=call_index,
        model_ref=exchange.get("model_ref"),
        model=model if isinstance(model, str) else None,
        dialect=exchange.get("dialect"),
        status_code=exchange.get("status_code"),
        response_status=body["status"] if isinstance(body.get("status"), str) else None,
        finish_reason=next((value for value in finish if isinstance(value, str)), None),
        started_at=exchange.get("started_at"),
        completed_at=exchange.get("completed_at"),
        request=request,
        response=response,
        request_raw=_str_or_none(exchange.get("request_raw")),
        response_raw=_str_or_none(exchange.get("response_raw")),
        tool_calls=tool_calls,
        reasoning_content=reasoning,
        cache_hit=None if cached is None else cached > 0,
        cached_tokens=cached,
        error_category=exchange.get("error_category"),
        latency_total_ms=exchange.get("latency_ms"),
        latency_ttft_ms=exchange.get("latency_ttft_ms"),
        **cast(dict[str, Any], token_stats(usage)),
    )


def _str_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else None


_SUMMED_FIELDS = ("tokens_in", "tokens_out", "tokens_reasoning", "tokens_total", "cached_tokens", "latency_total_ms")


def aggregate_model_call_records(calls: list[ModelCallRecord]) -> dict[str, Any]:
    """Sums of tokens and latency over calls (None where no call reported the value) and ``num_calls``."""
    sums: dict[str, Any] = dict.fromkeys(_SUMMED_FIELDS)
    for call in calls:
        for name in _SUMMED_FIELDS:
            value = getattr(call, name)
            if value is not None:
                sums[name] = value if sums[name] is None else sums[name] + value
    sums["num_calls"] = len(calls)
    return sums
