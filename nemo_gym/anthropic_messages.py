"""Anthropic's Messages API (``POST /v1/messages``) on every model server, as a translation of ``/v1/responses``.

Why a translation and not a second engine path: a model server already answers ``/v1/responses``, so a client or
harness that speaks Messages (the ``anthropic`` SDK, Claude-style agents) gets exactly the policy an agent gets.
``MessagesMiddleware`` rewrites a ``/v1/messages`` request into a Responses request for the server's own route and
turns the JSON answer back into a Message, or, with ``stream: true``, into Anthropic's event stream. The converters are
pure functions over dicts; errors of the route pass through untouched.

``stop_sequences`` has no Responses counterpart: the answer's text is cut at the first one found, as the model would
have stopped there, and ``stop_reason`` says ``stop_sequence``. Fields with no Responses counterpart (``metadata``,
``thinking``, ``top_k``, ``service_tier``, cache control, ...) are ignored, as each SDK release adds some.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any
from uuid import uuid4

import orjson

from nemo_gym.streaming import SSE_MEDIA_TYPE, sse_event

MESSAGES_PATH = "/v1/messages"
RESPONSES_PATH = "/v1/responses"
MESSAGES_STATE_KEY = "nemo_gym_messages"
"""``request.state`` key under which a translated request keeps what its client asked (``stream``,
``stop_sequences``, ``model``), for a ``/v1/responses`` route that serves the Message itself."""
SERVED_AS_MESSAGES_HEADER = b"x-nemo-gym-served-as-messages"
"""Set by such a route on its answer: already the Message (or its stream), so it passes through untranslated."""

_SAMPLING_KEYS = ("temperature", "top_p")


class MessagesRequestError(ValueError):
    """A ``/v1/messages`` body this server cannot read; answered as Anthropic's ``invalid_request_error`` (400)."""


# ----------------------------------------------------------------------------------------------------------------------
# Request: Messages -> Responses


def _text_of(content: Any, where: str) -> str:
    """A string, or the text of a list of ``text`` blocks (other blocks have no text and are skipped)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(b.get("text", "") for b in content if isinstance(b, dict) and b.get("type") == "text")
    raise MessagesRequestError(f"{where} must be a string or a list of content blocks")


def _message_items(index: int, message: Any) -> list[dict[str, Any]]:
    if not isinstance(message, dict) or message.get("role") not in ("user", "assistant"):
        raise MessagesRequestError(f"messages.{index}: needs a role of 'user' or 'assistant'")
    role, content = message["role"], message.get("content")
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if not isinstance(content, list):
        raise MessagesRequestError(f"messages.{index}.content must be a string or a list of content blocks")
    items: list[dict[str, Any]] = []
    text: list[str] = []

    def flush() -> None:
        if text:
            items.append({"role": role, "content": "".join(text)})
            text.clear()

    for position, block in enumerate(content):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            text.append(block.get("text", ""))
        elif kind == "tool_use":
            flush()
            arguments = json.dumps(block.get("input") or {})
            items.append(
                {"type": "function_call", "call_id": block["id"], "name": block["name"], "arguments": arguments}
            )
        elif kind == "tool_result":
            flush()
            output = _text_of(block.get("content") or "", f"messages.{index}.content.{position}.content")
            items.append({"type": "function_call_output", "call_id": block["tool_use_id"], "output": output})
        elif kind in ("thinking", "redacted_thinking"):
            continue  # the policy's earlier reasoning is not replayed, as Responses clients usually do
        else:
            raise MessagesRequestError(f"messages.{index}.content.{position}: unsupported content block type {kind!r}")
    flush()
    return items


def _tool_choice(choice: Any) -> Any:
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind == "tool":
        return {"type": "function", "name": choice.get("name")}
    mapped = {"auto": "auto", "any": "required", "none": "none"}.get(kind or "")
    if mapped is None:
        raise MessagesRequestError(f"tool_choice.type must be auto, any, tool or none, not {kind!r}")
    return mapped


def responses_request(body: Any) -> dict[str, Any]:
    """The ``/v1/responses`` body that asks what the Messages ``body`` asks."""
    if not isinstance(body, dict):
        raise MessagesRequestError("the body must be a JSON object")
    for key in ("model", "max_tokens", "messages"):
        if key not in body:
            raise MessagesRequestError(f"{key}: Field required")
    if not isinstance(body["messages"], list):
        raise MessagesRequestError("messages must be a list")
    request: dict[str, Any] = {
        "model": body["model"],
        "input": [item for i, m in enumerate(body["messages"]) for item in _message_items(i, m)],
        "max_output_tokens": body["max_tokens"],
    }
    if body.get("system"):
        request["instructions"] = _text_of(body["system"], "system")
    for key in _SAMPLING_KEYS:
        if body.get(key) is not None:
            request[key] = body[key]
    if body.get("tools"):
        request["tools"] = [
            {
                "type": "function",
                "name": tool["name"],
                "description": tool.get("description"),
                "parameters": tool.get("input_schema") or {"type": "object", "properties": {}},
                "strict": False,
            }
            for tool in body["tools"]
        ]
    if body.get("tool_choice") is not None:
        request["tool_choice"] = _tool_choice(body["tool_choice"])
    return request


# ----------------------------------------------------------------------------------------------------------------------
# Answer: Response -> Message


def _cut(text: str, stops: list[str]) -> tuple[str, str | None]:
    """``text`` up to the first stop sequence in it, and that sequence (None: none found)."""
    found = [(text.find(s), s) for s in stops if s and s in text]
    if not found:
        return text, None
    at, stop = min(found)
    return text[:at], stop


def message_from_response(response: dict[str, Any], stop_sequences: list[str] | None = None) -> dict[str, Any]:
    """The Messages answer for a finished Response: text and tool_use blocks, stop reason and usage."""
    content: list[dict[str, Any]] = []
    stop_sequence: str | None = None
    for item in response.get("output") or []:
        if stop_sequence is not None:
            break  # the model would have stopped at the stop sequence
        if item.get("type") == "message":
            for part in item.get("content") or []:
                if part.get("type") == "output_text" and stop_sequence is None:
                    text, stop_sequence = _cut(part.get("text", ""), stop_sequences or [])
                    if text:
                        content.append({"type": "text", "text": text})
                elif part.get("type") == "refusal" and part.get("refusal"):
                    content.append({"type": "text", "text": part["refusal"]})  # Messages has no refusal block
        elif item.get("type") == "reasoning":
            # Open models sign nothing; the signature is the item's encrypted content when a backend gives one.
            signature = item.get("encrypted_content") or ""
            content += [
                {"type": "thinking", "thinking": part.get("text", ""), "signature": signature}
                for part in item.get("summary") or []
            ]
        elif item.get("type") == "function_call":
            try:
                arguments = json.loads(item.get("arguments") or "{}")
            except json.JSONDecodeError:
                arguments = {}  # tool_use input must be an object; the raw string would not be
            content.append(
                {
                    "type": "tool_use",
                    "id": item.get("call_id") or item.get("id"),
                    "name": item.get("name"),
                    "input": arguments if isinstance(arguments, dict) else {},
                }
            )
    incomplete = (response.get("incomplete_details") or {}).get("reason")
    if stop_sequence is not None:
        stop_reason = "stop_sequence"
    elif any(block["type"] == "tool_use" for block in content):
        stop_reason = "tool_use"
    elif response.get("status") == "incomplete" and incomplete == "max_output_tokens":
        stop_reason = "max_tokens"
    else:
        stop_reason = "end_turn"
    usage = response.get("usage") or {}
    return {
        "id": response.get("id") or f"msg_{uuid4().hex}",  # the Response's own id: capture keys the call by it
        "type": "message",
        "role": "assistant",
        "model": response.get("model", ""),
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": stop_sequence,
        "usage": {"input_tokens": usage.get("input_tokens") or 0, "output_tokens": usage.get("output_tokens") or 0},
    }


def message_events(message: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Anthropic's event sequence of a finished message; assembling it gives ``message`` back."""
    usage = message["usage"]
    start = message | {"content": [], "stop_reason": None, "stop_sequence": None}
    yield {"type": "message_start", "message": start | {"usage": {**usage, "output_tokens": 0}}}
    for index, block in enumerate(message["content"]):
        if block["type"] == "text":
            yield {"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}}
            delta = {"type": "text_delta", "text": block["text"]}
        elif block["type"] == "thinking":
            shell = {"type": "thinking", "thinking": ""}
            yield {"type": "content_block_start", "index": index, "content_block": shell}
            delta = {"type": "thinking_delta", "thinking": block["thinking"]}
        else:
            yield {"type": "content_block_start", "index": index, "content_block": block | {"input": {}}}
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
        yield {"type": "content_block_delta", "index": index, "delta": delta}
        yield {"type": "content_block_stop", "index": index}
    stop = {"stop_reason": message["stop_reason"], "stop_sequence": message["stop_sequence"]}
    yield {"type": "message_delta", "delta": stop, "usage": {"output_tokens": usage["output_tokens"]}}
    yield {"type": "message_stop"}


def error_body(message: str, kind: str = "invalid_request_error") -> bytes:
    return orjson.dumps({"type": "error", "error": {"type": kind, "message": message}})


# ----------------------------------------------------------------------------------------------------------------------
# ASGI


class MessagesMiddleware:
    """Pure ASGI: ``POST /v1/messages`` answered by the app's own ``/v1/responses`` route (see the module docstring)."""

    def __init__(self, app: Any) -> None:
        self._app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope.get("type") != "http" or scope.get("method") != "POST" or scope.get("path") != MESSAGES_PATH:
            await self._app(scope, receive, send)
            return
        chunks = []
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client left while sending
                return
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        try:
            body = orjson.loads(b"".join(chunks))
            request = responses_request(body)
        except (orjson.JSONDecodeError, MessagesRequestError, KeyError, TypeError, AttributeError) as error:
            shown = f"missing field {error}" if isinstance(error, KeyError) else str(error)
            await _answer(send, 400, error_body(f"/v1/messages: {shown}"), b"application/json")
            return
        payload = orjson.dumps(request)
        headers = [(k, v) for k, v in scope.get("headers", []) if k.lower() != b"content-length"]
        asked = {"stream": body.get("stream") is True, "stop_sequences": body.get("stop_sequences")}
        scope.setdefault("state", {})[MESSAGES_STATE_KEY] = asked | {"model": body.get("model")}
        scope = scope | {
            "path": RESPONSES_PATH,
            "raw_path": RESPONSES_PATH.encode(),
            "headers": [*headers, (b"content-length", str(len(payload)).encode())],
        }
        replayed = False

        async def replay() -> dict[str, Any]:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": payload, "more_body": False}

        converter = _Converter(send, stream=body.get("stream") is True, stop_sequences=body.get("stop_sequences"))
        await self._app(scope, replay, converter.send)


async def _answer(send: Any, status: int, body: bytes, content_type: bytes) -> None:
    headers = [(b"content-type", content_type), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


class _Converter:
    """Wraps ``send``: the route's JSON 200 becomes a Message (or its event stream); anything else goes as it is."""

    def __init__(self, send: Any, stream: bool, stop_sequences: list[str] | None) -> None:
        self._send, self._stream, self._stops = send, stream, stop_sequences
        self._start: dict[str, Any] | None = None
        self._body = bytearray()

    async def send(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            headers = message.get("headers") or []
            if any(key.lower() == SERVED_AS_MESSAGES_HEADER for key, _ in headers):
                kept = [(key, value) for key, value in headers if key.lower() != SERVED_AS_MESSAGES_HEADER]
                await self._send(message | {"headers": kept})
                return
            content_type = dict(headers).get(b"content-type", b"")
            if message.get("status") == 200 and content_type.startswith(b"application/json"):
                self._start = message
                return
        elif self._start is not None and message["type"] == "http.response.body":
            self._body.extend(message.get("body", b""))
            if not message.get("more_body"):
                answer = message_from_response(orjson.loads(bytes(self._body)), self._stops)
                if self._stream:
                    data = b"".join(sse_event(event) for event in message_events(answer))
                    await _answer(self._send, 200, data, SSE_MEDIA_TYPE.encode())
                else:
                    await _answer(self._send, 200, orjson.dumps(answer), b"application/json")
            return
        await self._send(message)
