"""Content hashes that let the next request find the call it continues, whatever dialect the harness speaks.

``assistant_fingerprint`` covers only what the model wrote (assistant text and tool calls, not reasoning, which
harnesses may drop when they echo history), so it is the lookup key: the request after a call repeats that call's
output. ``conversation_digest`` covers every turn, tool results included, and confirms that the context before the
call was not rewritten in between. Chat messages, Responses items and Anthropic blocks reduce to the same tagged,
length-prefixed fields, so ``{"role": "assistant", "content": "hi"}`` and an ``output_text`` item hash alike.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from typing import Any

import orjson

FINGERPRINT_VERSION = 1
"""Bumped when the normalisation changes: a record hashed another way must never match."""

_ASSISTANT_DOMAIN = b"nemo-gym/assistant-turns/v1"
_CONTEXT_DOMAIN = b"nemo-gym/conversation/v1"
_TEXT_PARTS = {"", "text", "input_text", "output_text"}
_TOOL_BLOCKS = {"tool_use", "tool_result"}
_THINKING_BLOCKS = {"thinking", "redacted_thinking"}
"""Anthropic reasoning replayed inside an assistant turn: left out like Responses reasoning items, since a client may
replay it or not and a served answer's reasoning is never part of its fingerprint."""


class _Hasher:
    """SHA-256 over (tag, length, utf-8 bytes) fields, so no two field sequences share an encoding."""

    def __init__(self, domain: bytes) -> None:
        self._hash = hashlib.sha256(domain)

    def add(self, tag: int, value: str) -> None:
        data = value.encode("utf-8")
        self._hash.update(bytes([tag]) + len(data).to_bytes(8, "big") + data)

    def hexdigest(self) -> str:
        return self._hash.hexdigest()


def _canonical(value: Any) -> str:
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode("utf-8")
    except (TypeError, orjson.JSONEncodeError) as error:
        raise ValueError(f"content of type {type(value).__name__} cannot be fingerprinted") from error


def canonicalize_tool_arguments(value: Any) -> str:
    """Tool arguments for comparison only: harnesses re-serialise JSON between turns (key order, spacing)."""
    if value is None:
        return ""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return value.strip()
    return _canonical(value)


def _is_model_authored(item: dict[str, Any]) -> bool:
    """Assistant turns and Responses ``function_call`` items; reasoning is left out on purpose."""
    return item.get("role") == "assistant" or item.get("type") == "function_call"


def _content_parts(content: Any) -> Iterator[tuple[str, str]]:
    """``(kind, payload)`` per content part; tool blocks are read separately, other typed blocks as JSON."""
    if content is None or content == "":
        return
    if isinstance(content, str):
        yield "text", content
        return
    if not isinstance(content, list):
        raise ValueError(f"message content of type {type(content).__name__} cannot be fingerprinted")
    for part in content:
        if isinstance(part, str):
            if part:
                yield "text", part
            continue
        if not isinstance(part, dict):
            raise ValueError(f"content part of type {type(part).__name__} cannot be fingerprinted")
        kind = str(part.get("type") or "")
        if kind in _TOOL_BLOCKS or kind in _THINKING_BLOCKS:
            continue
        if kind in _TEXT_PARTS and isinstance(part.get("text"), str):
            if part["text"]:
                yield "text", part["text"]
        elif kind:
            yield kind, _canonical(part)
        else:
            raise ValueError("a content part has neither a type nor text")


def _tool_calls(item: dict[str, Any]) -> Iterator[tuple[str, str, str]]:
    """``(call id, name, canonical arguments)`` from a Responses item, Anthropic blocks or Chat ``tool_calls``."""
    if item.get("type") == "function_call":
        name = str(item.get("name") or "")
        if item.get("namespace"):
            name = f"{item['namespace']}__{name}"
        call_id = str(item.get("call_id") or item.get("id") or "")
        yield call_id, name, canonicalize_tool_arguments(item.get("arguments"))
    content = item.get("content")
    for block in content if isinstance(content, list) else []:
        if isinstance(block, dict) and block.get("type") == "tool_use":
            yield (
                str(block.get("id") or ""),
                str(block.get("name") or ""),
                canonicalize_tool_arguments(block.get("input")),
            )
    for call in item.get("tool_calls") or []:
        function = (call or {}).get("function") or {}
        yield (
            str((call or {}).get("id") or ""),
            str(function.get("name") or ""),
            canonicalize_tool_arguments(function.get("arguments")),
        )


def _tool_results(item: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """``(call id, output)`` from ``function_call_output`` items, Chat ``tool`` messages and ``tool_result`` blocks."""

    def text(value: Any) -> str:
        return value if isinstance(value, str) else _canonical(value)

    if item.get("type") == "function_call_output":
        yield str(item.get("call_id") or item.get("id") or ""), text(item.get("output"))
    elif item.get("role") == "tool":
        yield str(item.get("tool_call_id") or ""), text(item.get("content"))
    content = item.get("content")
    for block in content if isinstance(content, list) else []:
        if isinstance(block, dict) and block.get("type") == "tool_result":
            yield str(block.get("tool_use_id") or block.get("id") or ""), text(block.get("content"))


def _checked(items: list[Any] | None) -> list[dict[str, Any]]:
    checked = []
    for item in items or []:
        if not isinstance(item, dict):
            raise ValueError(f"request item of type {type(item).__name__} cannot be fingerprinted")
        checked.append(item)
    return checked


def assistant_fingerprint(messages: list[Any] | None) -> str:
    """Hash of the model-authored turns, in order; "" when there are none (a request that continues nothing)."""
    hasher = _Hasher(_ASSISTANT_DOMAIN)
    authored = 0
    for item in _checked(messages):
        if not _is_model_authored(item):
            continue
        authored += 1
        hasher.add(1, "turn")
        for kind, payload in _content_parts(item.get("content")):
            hasher.add(2, kind)
            hasher.add(3, payload)
        for call_id, name, arguments in _tool_calls(item):
            hasher.add(4, call_id)
            hasher.add(5, name)
            hasher.add(6, arguments)
    return hasher.hexdigest() if authored else ""


def conversation_digest(messages: list[Any] | None) -> str:
    """Hash of every turn (role or type, content, tool calls, tool results): the context a recorded call saw."""
    hasher = _Hasher(_CONTEXT_DOMAIN)
    for item in _checked(messages):
        hasher.add(1, str(item.get("role") or item.get("type") or ""))
        for kind, payload in _content_parts(item.get("content") if item.get("role") != "tool" else None):
            hasher.add(2, kind)
            hasher.add(3, payload)
        for call_id, name, arguments in _tool_calls(item):
            hasher.add(4, call_id)
            hasher.add(5, name)
            hasher.add(6, arguments)
        for call_id, output in _tool_results(item):
            hasher.add(7, call_id)
            hasher.add(8, output)
    return hasher.hexdigest()
