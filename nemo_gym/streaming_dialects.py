"""What streaming clients send and get back, beyond the event encoding in ``streaming.py``.

Harnesses that speak the Responses API over server-sent events (the Codex CLI, say) send bodies our strict params model
refuses: ``stream`` flags, bookkeeping keys, ``namespace`` tools (functions grouped under a name, called back with a
separate ``namespace`` on the ``function_call``), tools carried in an ``additional_tools`` input item, and input items
of kinds we cannot represent. :func:`sanitize_streaming_responses_body` turns such a body into one the params model
takes, and returns what :func:`restore_namespace_tool_calls` needs to give the client its own tool names back.

:func:`reconstruct_streamed_response` goes the other way for a reader of a stream (a capture, a test): the final object
a streamed answer amounts to, for each of the three dialects.
"""

from __future__ import annotations

import copy
import functools
import logging
from collections import defaultdict
from typing import Any

import orjson
from pydantic import TypeAdapter, ValidationError

from nemo_gym.openai_responses import (
    NeMoGymFunctionTool,
    NeMoGymResponseCreateParamsNonStreaming,
    NeMoGymResponseInputItem,
)

__all__ = [
    "NAMESPACE_TOOL_DELIMITER",
    "NamespaceMap",
    "flatten_namespace_tools",
    "reconstruct_streamed_response",
    "restore_namespace_tool_calls",
    "sanitize_streaming_responses_body",
]

logger = logging.getLogger(__name__)

NAMESPACE_TOOL_DELIMITER = "__"
"""Joins a namespace and a tool name into the one function name a backend sees: ``<namespace>__<name>``."""

NamespaceMap = dict[str, tuple[str, str]]
"""Flattened function name -> ``(namespace, name)`` as the client declared it."""

_SYSTEM_ROLES = ("system", "developer")


@functools.cache
def _input_item_adapter() -> TypeAdapter[Any]:
    return TypeAdapter(NeMoGymResponseInputItem)


def flatten_namespace_tools(tools: Any) -> tuple[list[Any], NamespaceMap]:
    """Every ``namespace`` tool replaced by its functions under joined names; other tools kept as they are."""
    flat: list[Any] = []
    names: NamespaceMap = {}
    for tool in tools or []:
        grouped = isinstance(tool, dict) and tool.get("type") == "namespace"
        if not grouped:
            flat.append(tool)
            continue
        namespace = str(tool.get("name") or "")
        named = [m for m in tool.get("tools") or [] if isinstance(m, dict) and m.get("name")]
        names |= {f"{namespace}{NAMESPACE_TOOL_DELIMITER}{m['name']}": (namespace, str(m["name"])) for m in named}
        flat += [m | {"type": "function", "name": f"{namespace}{NAMESPACE_TOOL_DELIMITER}{m['name']}"} for m in named]
    return flat, names


def restore_namespace_tool_calls(items: list[dict[str, Any]], names: NamespaceMap) -> list[dict[str, Any]]:
    """``items`` with each ``function_call`` to a flattened tool named as the client declared it."""

    def restored(item: dict[str, Any]) -> dict[str, Any]:
        declared = (
            names.get(str(item.get("name"))) if isinstance(item, dict) and item.get("type") == "function_call" else None
        )
        return item if declared is None else {**item, "namespace": declared[0], "name": declared[1]}

    return [restored(item) for item in items]


def _usable_tool(tool: Any) -> bool:
    """A tool our params model takes (a function); anything else is dropped with a warning, not a 422."""
    try:
        NeMoGymFunctionTool.model_validate(tool)
    except ValidationError:
        kind = tool.get("type") if isinstance(tool, dict) else type(tool).__name__
        logger.warning("dropping a tool of type %r from a streaming /v1/responses request", kind)
        return False
    return True


def _usable_item(item: Any) -> bool:
    try:
        _input_item_adapter().validate_python(item)
    except ValidationError:
        kind = item.get("type") if isinstance(item, dict) else type(item).__name__
        logger.warning("dropping an input item of type %r from a streaming /v1/responses request", kind)
        return False
    return True


def _is_system_message(item: Any) -> bool:
    return isinstance(item, dict) and item.get("type", "message") == "message" and item.get("role") in _SYSTEM_ROLES


def _message_text(item: dict[str, Any]) -> str:
    content = item.get("content")
    if isinstance(content, str):
        return content
    kinds = ("input_text", "output_text", "text")
    return "".join(p.get("text") or "" for p in content or [] if isinstance(p, dict) and p.get("type") in kinds)


def _kind(item: Any) -> Any:
    """An item's ``type``, or None for anything that is not a dict."""
    return item.get("type") if isinstance(item, dict) else None


def _namespace_folded(item: Any) -> Any:
    """A replayed namespaced ``function_call`` under the flattened name the model saw; any other item as it is."""
    if _kind(item) != "function_call" or not item.get("namespace"):
        return item
    folded = {key: value for key, value in item.items() if key != "namespace"}
    folded["name"] = f"{item['namespace']}{NAMESPACE_TOOL_DELIMITER}{item.get('name')}"
    return folded


def flatten_request_namespaces(body: dict[str, Any]) -> tuple[dict[str, Any], NamespaceMap]:
    """``body`` with namespace tools flattened and replayed namespaced calls folded to match, nothing else changed
    (``sanitize_streaming_responses_body`` also reshapes the rest); restore the answer's calls with the map."""
    if not any(_kind(tool) == "namespace" for tool in body.get("tools") or []):
        return body, {}
    tools, names = flatten_namespace_tools(body["tools"])
    flattened = {**body, "tools": tools}
    if isinstance(body.get("input"), list):
        flattened["input"] = [_namespace_folded(item) for item in body["input"]]
    return flattened, names


def _adopt_carried_tools(body: dict[str, Any], carried: list[Any]) -> NamespaceMap:
    """Append the usable function tools of ``additional_tools`` items to ``tools``; return their namespace map."""
    flat, carried_names = flatten_namespace_tools(carried)
    functions = [tool for tool in flat if _kind(tool) == "function"]
    if len(functions) != len(flat):
        logger.warning("dropping non-function tools of an additional_tools item: a backend calls functions only")
    body["tools"] = [*(body.get("tools") or []), *filter(_usable_tool, functions)]
    return carried_names


def _hoist_leading_system(body: dict[str, Any], kept: list[Any]) -> None:
    """Move the leading system / developer messages of ``kept`` into ``instructions``, after any already given."""
    leading = [body["instructions"]] if body.get("instructions") else []
    while kept and _is_system_message(kept[0]):
        leading.append(_message_text(kept.pop(0)))
    if any(leading):
        body["instructions"] = "\n\n".join(text for text in leading if text)


def sanitize_streaming_responses_body(body: dict[str, Any]) -> tuple[dict[str, Any], NamespaceMap]:
    """A streaming client's ``/v1/responses`` body as our non-streaming params model takes it, and the namespace map.

    The stream flag and its options go (the caller streams the answer itself); namespace tools are flattened, in
    ``tools`` and in replayed ``function_call`` items alike; the function tools of ``additional_tools`` input items
    join ``tools``; a tool or an input item that still does not validate is dropped with a warning, since a harness's
    exotic extra is better lost than its rollout; the leading system / developer messages become ``instructions``
    (after any given), which backends render as the one system message; keys the params model lacks are dropped.
    """
    # The caller streams the answer itself, so the stream flag and its options are not forwarded.
    body = {key: copy.deepcopy(value) for key, value in body.items() if key not in ("stream", "stream_options")}
    names: NamespaceMap = {}
    if "tools" in body:
        flat_tools, names = flatten_namespace_tools(body.get("tools"))
        body["tools"] = list(filter(_usable_tool, flat_tools))
    if isinstance(body.get("input"), list):
        items: list[Any] = body["input"]
        carried = [tool for item in items if _kind(item) == "additional_tools" for tool in item.get("tools") or []]
        renamed = (_namespace_folded(item) for item in items if _kind(item) != "additional_tools")
        kept = [item for item in renamed if _usable_item(item)]
        if carried:
            names.update(_adopt_carried_tools(body, carried))
        _hoist_leading_system(body, kept)
        body["input"] = kept
    known = NeMoGymResponseCreateParamsNonStreaming.model_fields
    dropped = sorted(key for key in body if key not in known)
    if dropped:
        logger.debug("dropping keys a streaming /v1/responses request has and the params model lacks: %s", dropped)
    return {key: value for key, value in body.items() if key in known}, names


# ----------------------------------------------------------------------------------------------------------------------
# Reading a stream back


def _events(raw: bytes) -> list[dict[str, Any]]:
    """The JSON objects of a stream's ``data:`` fields (an event's lines joined), ``[DONE]`` and non-JSON skipped."""
    events = []
    for block in raw.replace(b"\r\n", b"\n").split(b"\n\n"):
        data = b"\n".join(line[5:].lstrip() for line in block.split(b"\n") if line.startswith(b"data:"))
        if not data or data == b"[DONE]":
            continue
        try:
            event = orjson.loads(data)
        except orjson.JSONDecodeError:
            continue
        if isinstance(event, dict):
            events.append(event)
    return events


def _responses_final(events: list[dict[str, Any]]) -> dict[str, Any] | None:
    closing = ("response.completed", "response.incomplete", "response.failed")
    for wanted in (lambda e: e.get("type") in closing, lambda e: True):
        for event in reversed(events):
            if wanted(event) and isinstance(event.get("response"), dict):
                return event["response"]
    return None


def _chat_final(events: list[dict[str, Any]]) -> dict[str, Any] | None:
    text: list[str] = []
    reasoning: list[str] = []
    refusal: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    head: dict[str, Any] = {"object": "chat.completion", "model": None}
    role, finish, usage, any_choice = "assistant", None, None, False
    for chunk in events:
        head["model"] = chunk.get("model") or head["model"]
        if isinstance(chunk.get("id"), str):
            head["id"] = chunk["id"]
        usage = chunk.get("usage") or usage
        for choice in chunk.get("choices") or []:
            if not isinstance(choice, dict):
                continue
            any_choice = True
            delta = choice.get("delta") or {}
            role = delta.get("role") or role
            text.append(delta.get("content") or "")
            refusal.append(delta.get("refusal") or "")
            reasoning.append(delta.get("reasoning_content") or delta.get("reasoning") or "")
            for part in delta.get("tool_calls") or []:
                call = calls.setdefault(
                    part.get("index", 0), {"id": None, "type": "function", "function": {"name": "", "arguments": ""}}
                )
                call["id"] = part.get("id") or call["id"]
                function = part.get("function") or {}
                call["function"]["name"] = function.get("name") or call["function"]["name"]
                call["function"]["arguments"] += function.get("arguments") or ""
            finish = choice.get("finish_reason") or finish
    if not any_choice:
        return None
    message: dict[str, Any] = {"role": role, "content": "".join(text) or None}
    for key, parts in (("reasoning_content", reasoning), ("refusal", refusal)):
        if "".join(parts):
            message[key] = "".join(parts)
    if calls:
        message["tool_calls"] = [calls[index] for index in sorted(calls)]
    final = head | {"choices": [{"index": 0, "message": message, "finish_reason": finish}]}
    return final | ({"usage": usage} if usage else {})


_MESSAGE_HEAD = frozenset({"id", "type", "role", "model", "stop_reason"})
"""What a rebuilt Message keeps of ``message_start`` (its content and usage are rebuilt from the later events)."""
_BLOCK_DELTAS = {"text_delta": ("text", "text"), "thinking_delta": ("thinking", "thinking")}
"""Messages delta type -> (the block type it implies, the field it extends)."""


def _messages_final(events: list[dict[str, Any]]) -> dict[str, Any] | None:
    message: dict[str, Any] | None = None
    blocks: dict[int, dict[str, Any]] = {}
    partial_json: defaultdict[int, str] = defaultdict(str)
    usage: dict[str, Any] = {}
    stop_reason: Any = None  # the latest one a message_delta named; applied once the stream is read
    for event in events:
        kind = event.get("type")
        if kind == "message_start":
            start = event.get("message") or {}
            message = {k: v for k, v in start.items() if k in _MESSAGE_HEAD and v is not None}
            usage.update(start.get("usage") or {})
        elif kind == "content_block_start":
            blocks[event.get("index", len(blocks))] = dict(event.get("content_block") or {})
        elif kind == "content_block_delta":
            index, delta = event.get("index", 0), event.get("delta") or {}
            block = blocks.setdefault(index, {})
            if delta.get("type") in _BLOCK_DELTAS:
                block_type, field = _BLOCK_DELTAS[delta["type"]]
                block.setdefault("type", block_type)
                block[field] = (block.get(field) or "") + (delta.get(field) or "")
            elif delta.get("type") == "input_json_delta":
                partial_json[index] += delta.get("partial_json") or ""
        elif kind == "message_delta":
            stop_reason = (event.get("delta") or {}).get("stop_reason") or stop_reason
            usage.update(event.get("usage") or {})
    if message is None and not blocks:
        return None
    if message is not None and stop_reason:
        message["stop_reason"] = stop_reason
    for index, text in partial_json.items():
        block = blocks[index]
        if block.get("type") == "tool_use" and not block.get("input"):
            try:
                block["input"] = orjson.loads(text) if text else {}
            except orjson.JSONDecodeError:
                block["input"] = {"_raw": text}  # kept as sent: a reader sees what was streamed
    final = (message or {}) | {"type": "message", "content": [blocks[index] for index in sorted(blocks)]}
    return final | ({"usage": usage} if usage else {})


def reconstruct_streamed_response(raw: bytes, dialect: str) -> dict[str, Any] | None:
    """The final object a streamed answer amounts to: ``responses`` (the closing event's response), ``messages`` (the
    Message with its blocks and usage), anything else read as Chat Completions chunks (one choice, text, refusal,
    reasoning and tool calls joined). None when the stream holds nothing to build it from."""
    builder = {"responses": _responses_final, "messages": _messages_final}.get(dialect, _chat_final)
    events = _events(raw)
    return builder(events) if events else None
