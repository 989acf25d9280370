"""Server-sent events for ``stream: true``: the Responses event sequence and Chat Completions chunks.

Why one module: every model server answers a streaming request the same way, so the wire encoding lives here and a
model server only says what it has, either a finished result (``ResponseEvents.finish`` alone,
``chat_completion_chunks``) or text as its engine makes it (``ResponseEvents.text_delta`` / ``chat_text_chunk``, then
the finished result, which closes the stream and carries everything the deltas did not). Pure functions over dicts:
nothing here knows about HTTP servers.

The assembled stream always equals the finished result: deltas already sent must be a prefix of the final text, and
``response.completed`` carries the final response itself.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import orjson

CHAT_DONE = b"data: [DONE]\n\n"
"""The last line of a Chat Completions stream."""

SSE_MEDIA_TYPE = "text/event-stream"

_CLOSING_EVENT = {"completed": "response.completed", "incomplete": "response.incomplete", "failed": "response.failed"}


def sse_event(event: dict[str, Any]) -> bytes:
    """One Responses event: ``event: <type>`` and its JSON ``data`` line."""
    return b"event: " + event["type"].encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n"


def sse_data(chunk: dict[str, Any]) -> bytes:
    """One Chat Completions chunk: a bare ``data`` line, spaced as Python's ``json`` writes it (as NeMo Gym 0.7 does:
    its folders' tests match substrings such as ``"finish_reason": "length"``)."""
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"


class ResponseEvents:
    """The Responses event sequence of one response, built as its output becomes known.

    ``start`` announces the response; ``text_delta`` streams assistant text as it is generated (opening a message
    item on the first call); ``finish`` takes the finished response and emits every item (the open message first
    continues with the text not yet sent) and the closing ``response.completed`` (or ``.incomplete`` / ``.failed``).
    Each method returns the events to send, already numbered.
    """

    def __init__(self, response_id: str, model: str, created_at: int | None = None) -> None:
        self.shell: dict[str, Any] = {
            "id": response_id,
            "object": "response",
            "created_at": created_at if created_at is not None else int(time.time()),
            "model": model,
            "status": "in_progress",
            "output": [],
        }
        self._sequence = 0
        self._open_message: dict[str, Any] | None = None  # {"id": ..., "text": what was sent}
        self._message_id = f"msg_{response_id}"

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return event

    def start(self) -> list[dict[str, Any]]:
        return [
            self._event("response.created", response=self.shell),
            self._event("response.in_progress", response=self.shell),
        ]

    def text_delta(self, delta: str) -> list[dict[str, Any]]:
        """Assistant text as it is generated; the first call opens the message at output index 0."""
        events: list[dict[str, Any]] = []
        if self._open_message is None:
            self._open_message = {"id": self._message_id, "text": ""}
            events += self._open_message_item(self._message_id, 0)
        if delta:
            self._open_message["text"] += delta
            events.append(self._text_delta(self._message_id, 0, 0, delta))
        return events

    def finish(self, response: dict[str, Any]) -> list[dict[str, Any]]:
        """Every output item of the finished ``response``, then the closing event carrying ``response`` itself.

        A message opened by ``text_delta`` takes the place of the response's first message (its id too, so the
        closing response names the item the deltas went to) and moves to the front, where it was announced.
        """
        response = dict(response)
        output = [dict(item) for item in response.get("output") or []]
        if self._open_message is not None:
            first = next((i for i, item in enumerate(output) if item.get("type") == "message"), None)
            message = output.pop(first) if first is not None else _empty_message(self._message_id)
            output.insert(0, message | {"id": self._message_id})
        response["output"] = output
        events: list[dict[str, Any]] = []
        for index, item in enumerate(output):
            events += self._item(item, index, continues=index == 0 and self._open_message is not None)
        closing = _CLOSING_EVENT.get(response.get("status") or "completed", "response.completed")
        events.append(self._event(closing, response=response))
        return events

    def fail(self, message: str, code: str) -> list[dict[str, Any]]:
        """The closing event of a response that could not be made."""
        failed = self.shell | {"status": "failed", "error": {"code": code, "message": message}}
        return [self._event("response.failed", response=failed)]

    def _item(self, item: dict[str, Any], index: int, continues: bool) -> list[dict[str, Any]]:
        kind = item.get("type")
        item_id = item.get("id") or f"item_{index}"
        if kind == "message":
            return self._message(item, item_id, index, continues)
        events = [self._event("response.output_item.added", output_index=index, item=_announced(item))]
        if kind == "function_call":
            arguments = item.get("arguments") or ""
            events.append(
                self._event(
                    "response.function_call_arguments.delta", item_id=item_id, output_index=index, delta=arguments
                )
            )
            events.append(
                self._event(
                    "response.function_call_arguments.done",
                    item_id=item_id,
                    output_index=index,
                    arguments=arguments,
                    name=item.get("name", ""),
                )  # fmt: skip
            )
        elif kind == "reasoning":
            events += self._reasoning(item, item_id, index)
        events.append(self._event("response.output_item.done", output_index=index, item=item))
        return events

    def _open_message_item(self, item_id: str, index: int) -> list[dict[str, Any]]:
        announced = _empty_message(item_id)
        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        return [
            self._event("response.output_item.added", output_index=index, item=announced),
            self._event("response.content_part.added", item_id=item_id, output_index=index, content_index=0, part=part),
        ]

    def _text_delta(self, item_id: str, index: int, content_index: int, delta: str) -> dict[str, Any]:
        return self._event(
            "response.output_text.delta", item_id=item_id, output_index=index, content_index=content_index,
            delta=delta, logprobs=[],
        )  # fmt: skip

    def _message(self, item: dict[str, Any], item_id: str, index: int, continues: bool) -> list[dict[str, Any]]:
        parts = item.get("content") or []
        sent = self._open_message["text"] if continues and self._open_message is not None else ""
        events = (
            [] if continues else [self._event("response.output_item.added", output_index=index, item=_announced(item))]
        )
        for content_index, part in enumerate(parts):
            kind = part.get("type", "output_text")
            opened = continues and content_index == 0
            if not opened:
                empty = {"type": kind, ("refusal" if kind == "refusal" else "text"): ""}
                if kind == "output_text":
                    empty |= {"annotations": [], "logprobs": []}
                events.append(
                    self._event(
                        "response.content_part.added",
                        item_id=item_id,
                        output_index=index,
                        content_index=content_index,
                        part=empty,
                    )  # fmt: skip
                )
            if kind == "refusal":
                refusal = part.get("refusal", "")
                where = {"item_id": item_id, "output_index": index, "content_index": content_index}
                events.append(self._event("response.refusal.delta", **where, delta=refusal))
                events.append(self._event("response.refusal.done", **where, refusal=refusal))
            else:
                text = part.get("text", "")
                rest = text[len(sent) :] if opened and text.startswith(sent) else ("" if opened else text)
                if rest:
                    events.append(self._text_delta(item_id, index, content_index, rest))
                events.append(
                    self._event(
                        "response.output_text.done",
                        item_id=item_id,
                        output_index=index,
                        content_index=content_index,
                        text=text,
                        logprobs=[],
                    )  # fmt: skip
                )
            events.append(
                self._event(
                    "response.content_part.done",
                    item_id=item_id,
                    output_index=index,
                    content_index=content_index,
                    part=part,
                )  # fmt: skip
            )
        if continues and not parts:  # the deltas' part was opened, the finished message has none: close it empty
            events.append(
                self._event(
                    "response.content_part.done",
                    item_id=item_id,
                    output_index=index,
                    content_index=0,
                    part={"type": "output_text", "text": "", "annotations": [], "logprobs": []},
                )  # fmt: skip
            )
        events.append(self._event("response.output_item.done", output_index=index, item=item))
        return events

    def _reasoning(self, item: dict[str, Any], item_id: str, index: int) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        where = {"item_id": item_id, "output_index": index}
        for summary_index, part in enumerate(item.get("summary") or []):
            text = part.get("text", "")
            at = where | {"summary_index": summary_index}
            events.append(
                self._event("response.reasoning_summary_part.added", **at, part={"type": "summary_text", "text": ""})
            )
            events.append(self._event("response.reasoning_summary_text.delta", **at, delta=text))
            events.append(self._event("response.reasoning_summary_text.done", **at, text=text))
            events.append(self._event("response.reasoning_summary_part.done", **at, part=part))
        for content_index, part in enumerate(item.get("content") or []):
            text = part.get("text", "")
            at = where | {"content_index": content_index}
            events.append(self._event("response.reasoning_text.delta", **at, delta=text))
            events.append(self._event("response.reasoning_text.done", **at, text=text))
        return events


def _empty_message(item_id: str) -> dict[str, Any]:
    return {"id": item_id, "type": "message", "role": "assistant", "status": "in_progress", "content": []}


def _announced(item: dict[str, Any]) -> dict[str, Any]:
    """An item as ``output_item.added`` shows it: in progress, its streamed fields still empty."""
    empty: dict[str, Any] = {"status": "in_progress"} if "status" in item or item.get("type") != "reasoning" else {}
    if item.get("type") == "message":
        empty["content"] = []
    elif item.get("type") == "function_call":
        empty["arguments"] = ""
    elif item.get("type") == "reasoning":
        empty["summary"] = []
        if "content" in item:
            empty["content"] = []
    return item | empty


def response_events(response: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The whole event sequence of a finished response."""
    events = ResponseEvents(response.get("id", "resp"), response.get("model", ""), response.get("created_at"))
    events.shell |= {k: v for k, v in response.items() if k not in ("output", "status", "usage")}
    yield from events.start()
    yield from events.finish(response)


def failed_response_events(message: str, code: str = "server_error") -> Iterator[dict[str, Any]]:
    """The stream of a response that could not be made: created, then ``response.failed`` naming why.

    A streaming client has already been promised a Responses stream, so a failure is its closing event, not an HTTP
    error the client would read as a broken connection.
    """
    events = ResponseEvents(f"resp_failed_{time.time_ns()}", "")
    yield from events.start()[:1]
    yield from events.fail(message, code)


# ----------------------------------------------------------------------------------------------------------------------
# Chat Completions


def _chunk(completion: dict[str, Any], delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
    return {
        "id": completion.get("id", "chatcmpl"),
        "object": "chat.completion.chunk",
        "created": completion.get("created", int(time.time())),
        "model": completion.get("model", ""),
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None}],
    }


def chat_text_chunk(head: dict[str, Any], delta: dict[str, Any]) -> dict[str, Any]:
    """A chunk sent while generating, before the result exists; ``head``: its ``id``, ``model`` and ``created``."""
    return _chunk(head, delta)


def chat_completion_chunks(
    completion: dict[str, Any], sent_text: str | None = None, include_usage: bool = False
) -> Iterator[dict[str, Any]]:
    """The chunks of a finished completion (first choice); ``sent_text``: content already streamed (role included).

    Reasoning (``reasoning_content``), the rest of the content, each tool call (id and name, then its arguments),
    the finish reason, and with ``include_usage`` a last chunk holding only the usage, as OpenAI sends it.
    """
    choice = (completion.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    if sent_text is None:
        yield _chunk(completion, {"role": "assistant", "content": ""})
        sent_text = ""
    for key in ("reasoning_content", "reasoning"):
        if message.get(key):
            yield _chunk(completion, {key: message[key]})
    content = message.get("content") or ""
    rest = content[len(sent_text) :] if content.startswith(sent_text) else ""
    if rest:
        yield _chunk(completion, {"content": rest})
    if message.get("refusal"):
        yield _chunk(completion, {"refusal": message["refusal"]})
    for index, call in enumerate(message.get("tool_calls") or []):
        function = call.get("function") or {}
        opening = {
            "index": index,
            "id": call.get("id"),
            "type": "function",
            "function": {"name": function.get("name"), "arguments": ""},
        }
        yield _chunk(completion, {"tool_calls": [opening]})
        yield _chunk(
            completion, {"tool_calls": [{"index": index, "function": {"arguments": function.get("arguments", "")}}]}
        )
    yield _chunk(completion, {}, choice.get("finish_reason") or "stop")
    if include_usage:
        yield _chunk(completion, {}) | {"choices": [], "usage": completion.get("usage")}


# ----------------------------------------------------------------------------------------------------------------------
# Deciding a stream before validation


RESPONSES_PATH = "/v1/responses"
CHAT_PATH = "/v1/chat/completions"
STREAM_STATE_KEY = "nemo_gym_stream"
"""Where a request's streaming wish waits for a handler that streams natively: ``request.state.nemo_gym_stream``."""


def stream_options(request: Any) -> dict[str, Any] | None:
    """The ``stream_options`` of a request that asked to stream (``{}`` if it gave none); None: not streaming."""
    return getattr(request.state, STREAM_STATE_KEY, None)


class StreamingMiddleware:
    """Pure ASGI: ``stream: true`` on ``/v1/responses`` or ``/v1/chat/completions`` works on every model server.

    The flag (and ``stream_options``) is taken out of the body before the route validates it, and left on
    ``request.state`` (see ``stream_options``). The route answers as usual; a JSON 200 is turned into the event
    stream of that finished result, while a route that streams natively (its answer is already ``text/event-stream``)
    and any error pass through untouched.
    """

    def __init__(self, app: Any) -> None:
        self._app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        path = scope.get("path")
        if scope.get("type") != "http" or scope.get("method") != "POST" or path not in (RESPONSES_PATH, CHAT_PATH):
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
        body = b"".join(chunks)
        options = _take_stream_flag(body)
        if options is not None:
            body = orjson.dumps(options.pop("_body"))
            headers = [(k, v) for k, v in scope.get("headers", []) if k.lower() != b"content-length"]
            state = dict(scope.get("state") or {}) | {STREAM_STATE_KEY: options}
            scope = scope | {"headers": [*headers, (b"content-length", str(len(body)).encode())], "state": state}

        replayed = False

        async def replay() -> dict[str, Any]:
            nonlocal replayed
            if replayed:
                return await receive()  # a later receive waits for the disconnect, as it would have
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self._app(scope, replay, send if options is None else _Converter(send, path, options).send)


def _take_stream_flag(body: bytes) -> dict[str, Any] | None:
    """``{"include_usage": ..., "_body": <body without the flag>}`` when the body asks to stream, else None.

    A body without the key spelled out (nor any ``\\u`` escape that could spell it) is not parsed at all: most
    requests do not stream, and parsing each whole conversation twice was 2% of a model server's CPU.
    """
    if b'"stream"' not in body and b"\\u" not in body:
        return None
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(payload, dict) or payload.get("stream") is not True:
        return None
    del payload["stream"]
    options = payload.pop("stream_options", None)
    return (options if isinstance(options, dict) else {}) | {"_body": payload}


class _Converter:
    """Wraps ``send``: a JSON 200 answer becomes the event stream of that result; anything else goes as it is."""

    def __init__(self, send: Any, path: str, options: dict[str, Any]) -> None:
        self._send, self._path, self._options = send, path, options
        self._start: dict[str, Any] | None = None
        self._body = bytearray()

    async def send(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            content_type = dict(message.get("headers") or []).get(b"content-type", b"")
            if message.get("status") == 200 and content_type.startswith(b"application/json"):
                self._start = message
                return
        elif self._start is not None and message["type"] == "http.response.body":
            self._body.extend(message.get("body", b""))
            if not message.get("more_body"):
                await self._send_stream(orjson.loads(bytes(self._body)))
            return
        await self._send(message)

    async def _send_stream(self, result: dict[str, Any]) -> None:
        assert self._start is not None
        headers = [
            (k, v) for k, v in self._start.get("headers", []) if k.lower() not in (b"content-length", b"content-type")
        ]
        headers += [(b"content-type", SSE_MEDIA_TYPE.encode()), (b"cache-control", b"no-cache")]
        await self._send({"type": "http.response.start", "status": 200, "headers": headers})
        if self._path == RESPONSES_PATH:
            data = b"".join(sse_event(event) for event in response_events(result))
        else:
            include_usage = bool(self._options.get("include_usage"))
            data = b"".join(sse_data(chunk) for chunk in chat_completion_chunks(result, include_usage=include_usage))
            data += CHAT_DONE
        await self._send({"type": "http.response.body", "body": data, "more_body": False})
