"""Anthropic as the policy: our Responses requests as Messages API requests, and Messages answers as Responses / Chat
Completions. The other direction (serving Messages on top of our Responses) is ``nemo_gym/anthropic_messages.py``;
``anthropic_model`` (the model server) and ``AnthropicConverter`` (``nemo_gym/anthropic_converter.py``) both use this.

Pure functions over dicts, so the mapping can be read and tested without a server:

* request: ``instructions`` and every system / developer message become ``system``; user and assistant text become
  text blocks, images image blocks; a ``function_call`` becomes a ``tool_use`` block of the assistant turn and a ``function_call_output``
  a ``tool_result`` block of the next user turn; consecutive blocks of one role share one message, as Anthropic
  wants a tool's result in the user turn right after the call. A ``reasoning`` item that came from Anthropic (it
  carries the block's signature in ``encrypted_content``) is sent back as its ``thinking`` block, which Anthropic
  requires in a tool loop with thinking on; reasoning from elsewhere has no valid signature and is left out.
* answer: ``thinking`` -> a reasoning item (text in ``summary``, signature in ``encrypted_content``),
  ``redacted_thinking`` -> a reasoning item with no summary and the opaque data in ``encrypted_content``, text ->
  one assistant message, ``tool_use`` -> ``function_call``; ``max_tokens`` -> an ``incomplete`` Response; usage with
  cache reads counted as cached input tokens. The Chat Completions answer carries reasoning as ``<think>`` spans,
  the convention of ``nemo_gym/responses_converter.py``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from typing import Any

from nemo_gym.responses_converter import RESPONSE_ECHO_FIELDS

__all__ = [
    "SYSTEM_ROLES",
    "Block",
    "UnsupportedInputError",
    "chat_completion_from_message",
    "messages_request",
    "output_items",
    "response_from_message",
]

Block = dict[str, Any]
SYSTEM_ROLES = ("system", "developer")


class UnsupportedInputError(ValueError):
    """A Responses input this adapter cannot express in the Messages API (the message says which item)."""


# ----------------------------------------------------------------------------------------------------------------------
# Request: Responses -> Messages


def _text(content: Any) -> str:
    """The text of a message's content: a string, or the text of its text parts."""
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content or [] if part.get("type") in ("input_text", "output_text"))


def _content_blocks(content: Any, where: str) -> list[Block]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    blocks: list[Block] = []
    for part in content or []:
        kind = part.get("type")
        if kind in ("input_text", "output_text"):
            blocks.append({"type": "text", "text": part.get("text", "")})
        elif kind == "refusal":
            blocks.append({"type": "text", "text": part.get("refusal", "")})
        elif kind == "input_image" and part.get("image_url"):
            blocks.append({"type": "image", "source": _image_source(part["image_url"])})
        else:
            raise UnsupportedInputError(f"{where}: content part {kind!r} has no Messages API form in this adapter")
    return blocks


def _image_source(url: str) -> Block:
    """A data URL becomes Anthropic's base64 source, anything else its URL source."""
    if url.startswith("data:") and ";base64," in url:
        media_type, data = url[len("data:") :].split(";base64,", 1)
        return {"type": "base64", "media_type": media_type, "data": data}
    return {"type": "url", "url": url}


def _tool_result(item: dict[str, Any]) -> Block:
    output = item.get("output")
    text = output if isinstance(output, str) else _text(output)
    return {"type": "tool_result", "tool_use_id": item["call_id"], "content": text}


def _reasoning_blocks(item: dict[str, Any]) -> list[Block]:
    signature = item.get("encrypted_content")
    if not signature:
        return []  # not Anthropic's own thinking: no signature it would accept
    summary = item.get("summary") or []
    if not summary:
        return [{"type": "redacted_thinking", "data": signature}]
    return [{"type": "thinking", "thinking": "".join(s.get("text", "") for s in summary), "signature": signature}]


def _role_and_blocks(index: int, item: dict[str, Any]) -> tuple[str, list[Block]]:
    kind = item.get("type", "message")
    where = f"input.{index}"
    if kind == "message":
        role = item.get("role")
        if role not in ("user", "assistant"):
            raise UnsupportedInputError(f"{where}: role {role!r} cannot appear after the conversation started")
        return role, _content_blocks(item.get("content"), where)
    if kind == "function_call":
        arguments = json.loads(item.get("arguments") or "{}")
        return "assistant", [{"type": "tool_use", "id": item["call_id"], "name": item["name"], "input": arguments}]
    if kind == "function_call_output":
        return "user", [_tool_result(item)]
    if kind == "reasoning":
        return "assistant", _reasoning_blocks(item)
    raise UnsupportedInputError(f"{where}: item type {kind!r} has no Messages API form in this adapter")


def _messages(items: list[dict[str, Any]]) -> tuple[list[str], list[dict[str, Any]]]:
    """(system texts, messages) with consecutive blocks of one role merged into one message."""
    system: list[str] = []
    messages: list[dict[str, Any]] = []
    for index, item in enumerate(items):
        if item.get("type", "message") == "message" and item.get("role") in SYSTEM_ROLES:
            system.append(_text(item.get("content")))
            continue
        role, blocks = _role_and_blocks(index, item)
        if not blocks:
            continue
        if messages and messages[-1]["role"] == role:
            messages[-1]["content"].extend(blocks)
        else:
            messages.append({"role": role, "content": blocks})
    for message in messages:  # a tool's results go first in their user turn, as Anthropic requires
        message["content"].sort(key=lambda block: block["type"] != "tool_result")
    return system, messages


def _tool_choice(choice: Any, parallel_tool_calls: bool | None) -> Block | None:
    if isinstance(choice, dict):
        mapped: Block = {"type": "tool", "name": choice.get("name")}
    else:
        mapped = {"type": {"required": "any", "none": "none"}.get(choice or "auto", "auto")}
    if parallel_tool_calls is False and mapped["type"] != "none":
        mapped["disable_parallel_tool_use"] = True
    return mapped


def messages_request(params: dict[str, Any], model: str, default_max_tokens: int) -> dict[str, Any]:
    """The Messages API body that asks what the Responses ``params`` (a JSON dump of the request) ask."""
    raw_input = params.get("input") or []
    items = [{"role": "user", "content": raw_input}] if isinstance(raw_input, str) else list(raw_input)
    system, messages = _messages(items)
    if params.get("instructions"):
        system.insert(0, params["instructions"])
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": params.get("max_output_tokens") or default_max_tokens,
        "messages": messages,
    }
    if system:
        body["system"] = "\n\n".join(system)
    for key in ("temperature", "top_p"):
        if params.get(key) is not None:
            body[key] = params[key]
    tools = [tool for tool in params.get("tools") or [] if tool.get("type") == "function"]
    if tools:
        body["tools"] = [
            {"name": tool["name"], "description": tool.get("description") or "", "input_schema": tool["parameters"]}
            for tool in tools
        ]
        body["tool_choice"] = _tool_choice(params.get("tool_choice"), params.get("parallel_tool_calls"))
    return body


# ----------------------------------------------------------------------------------------------------------------------
# Answer: Message -> Response / Chat Completion


def _usage(message: dict[str, Any]) -> dict[str, Any]:
    usage = message.get("usage") or {}
    cached = usage.get("cache_read_input_tokens") or 0
    input_tokens = (usage.get("input_tokens") or 0) + cached + (usage.get("cache_creation_input_tokens") or 0)
    output_tokens = usage.get("output_tokens") or 0
    return {
        "input_tokens": input_tokens,
        "input_tokens_details": {"cached_tokens": cached},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},  # Anthropic does not count thinking tokens apart
        "total_tokens": input_tokens + output_tokens,
    }


def _reasoning_item(block: Block, number: int) -> dict[str, Any]:
    if block["type"] == "redacted_thinking":
        return {"type": "reasoning", "id": f"rs_{number}", "summary": [], "encrypted_content": block["data"]}
    return {
        "type": "reasoning",
        "id": f"rs_{number}",
        "summary": [{"type": "summary_text", "text": block.get("thinking", "")}],
        "encrypted_content": block.get("signature"),
    }


def output_items(message: dict[str, Any]) -> list[dict[str, Any]]:
    """The Responses output items of a Message, in the order its blocks came."""
    status = "incomplete" if message.get("stop_reason") == "max_tokens" else "completed"
    items: list[dict[str, Any]] = []
    for number, block in enumerate(message.get("content") or []):
        kind = block.get("type")
        if kind in ("thinking", "redacted_thinking"):
            items.append(_reasoning_item(block, number))
        elif kind == "text":
            part = {"type": "output_text", "text": block.get("text", ""), "annotations": []}
            if items and items[-1]["type"] == "message":
                items[-1]["content"].append(part)
            else:
                items.append(
                    {"type": "message", "id": f"msg_{number}", "role": "assistant", "status": status, "content": [part]}
                )
        elif kind == "tool_use":
            items.append(
                {
                    "type": "function_call",
                    "id": f"fc_{block['id']}",
                    "call_id": block["id"],
                    "name": block["name"],
                    "arguments": json.dumps(block.get("input") or {}),
                    "status": status,
                }
            )
    if not any(item["type"] in ("message", "function_call") for item in items):
        empty = {"type": "output_text", "text": "", "annotations": []}
        items.append({"type": "message", "id": "msg_empty", "role": "assistant", "status": status, "content": [empty]})
    return items


def response_from_message(message: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    """A Responses object for a Message answering ``params``, echoing the request's parameters as OpenAI does."""
    incomplete = message.get("stop_reason") == "max_tokens"
    echoed = {name: params[name] for name in RESPONSE_ECHO_FIELDS if params.get(name) is not None}
    return echoed | {
        "id": f"resp_{message.get('id', '')}",
        "object": "response",
        "created_at": int(time.time()),
        "model": message.get("model", ""),
        "status": "incomplete" if incomplete else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "output": output_items(message),
        "parallel_tool_calls": params.get("parallel_tool_calls", True),
        "tool_choice": params.get("tool_choice", "auto"),
        "tools": params.get("tools") or [],
        "usage": _usage(message),
    }


def _think_spans(blocks: Iterable[Block]) -> str:
    return "".join(f"<think>{b.get('thinking', '')}</think>" for b in blocks if b.get("type") == "thinking")


def chat_completion_from_message(message: dict[str, Any]) -> dict[str, Any]:
    """A Chat Completions object for a Message: one choice; reasoning as ``<think>`` spans before the text."""
    blocks = message.get("content") or []
    text = _think_spans(blocks) + "".join(b.get("text", "") for b in blocks if b.get("type") == "text")
    tool_calls = [
        {"id": b["id"], "type": "function", "function": {"name": b["name"], "arguments": json.dumps(b.get("input"))}}
        for b in blocks
        if b.get("type") == "tool_use"
    ]
    reply: dict[str, Any] = {"role": "assistant", "content": text or None}
    if tool_calls:
        reply["tool_calls"] = tool_calls
    finish = {"max_tokens": "length", "tool_use": "tool_calls"}.get(message.get("stop_reason") or "", "stop")
    usage = _usage(message)
    return {
        "id": f"chatcmpl_{message.get('id', '')}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": message.get("model", ""),
        "choices": [{"index": 0, "message": reply, "finish_reason": finish, "logprobs": None}],
        "usage": {
            "prompt_tokens": usage["input_tokens"],
            "completion_tokens": usage["output_tokens"],
            "total_tokens": usage["total_tokens"],
        },
    }
