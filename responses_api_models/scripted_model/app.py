"""scripted_model: a model server that replays a fixed script of outputs, instantly.

For testing agent logic and for benchmarks of the framework's own overhead: a real HTTP server speaking the same
Responses and Chat Completions API as any model server, but with no model behind it. Turn ``i`` of a rollout (``i`` =
number of tool results already in the input) answers with ``script[i]``; past the end of the script it repeats the
last turn. Replies are stateless, so any number of concurrent rollouts can share one server.

Per-task scripts: ``scripts_file`` names a JSONL file, read once at start, of ``{"match": ..., "script": ...}`` lines;
a request whose input text (its messages' text) contains a line's ``match`` replays that line's script (the first such
line wins), any other request replays ``script``. A line may also give the response ``status`` (``"failed"`` or
``"incomplete"``, with the matching ``error`` or ``incomplete_details``): a model call that fails, for health checks.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import orjson
from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, Field, ValidationError

from nemo_gym.base_responses_api_model import BaseResponsesAPIModelConfig, SimpleResponsesAPIModel
from nemo_gym.errors import ConfigError
from nemo_gym.openai_utils import NeMoGymChatCompletionCreateParamsNonStreaming, NeMoGymResponseCreateParamsNonStreaming
from nemo_gym.server_utils import json_response

Script = list[list[dict[str, Any]]]
"""Output items per turn."""
_STATUSES = ("completed", "failed", "incomplete")
_Scripted = tuple[str, Script, str]
"""A scripts-file line: its match, its script, the status its responses report."""

DEFAULT_SCRIPT: Script = [
    [{"type": "function_call", "name": "get_weather", "arguments": '{"city": "Paris"}'}],
    [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "It is cold there."}]}],
]


class ScriptedModelConfig(BaseResponsesAPIModelConfig):
    script: Script = Field(default_factory=lambda: DEFAULT_SCRIPT)
    """Output items per turn; ids, call ids and statuses are filled in."""
    model_name: str = "scripted"
    reply_delay_s: float = Field(default=0.0, ge=0)
    """Seconds each reply waits before it is sent: a slow model, or (large) a hung one, for fault tests."""
    scripts_file: str | None = None
    """JSONL of ``{"match": str, "script": [[items], ...], "status"?: str}`` lines: per-task scripts, chosen by text in
    the input."""


class ScriptedModel(SimpleResponsesAPIModel):
    config: ScriptedModelConfig

    def model_post_init(self, context: Any) -> None:
        super().model_post_init(context)
        self._ids = itertools.count()
        # Read once here, so a bad file stops the server at start rather than failing requests.
        self._scripts = _load_scripts(self.config.scripts_file) if self.config.scripts_file else []

    def model_ids(self) -> list[str]:
        return [self.config.model_name]

    def _turn(self, finished_tool_calls: int, texts: Iterable[str]) -> tuple[list[dict[str, Any]], str]:
        """The items to answer with and the response's status: the first per-task script whose match is in
        ``texts``, else ``script`` (completed)."""
        script, status = self.config.script, "completed"
        if self._scripts:
            text = "\0".join(texts)  # joined once; NUL keeps a match from spanning two messages
            script, status = next(
                ((found, how) for match, found, how in self._scripts if match in text), (script, status)
            )
        return script[min(finished_tool_calls, len(script) - 1)], status

    async def _delay(self) -> None:
        if self.config.reply_delay_s:
            await asyncio.sleep(self.config.reply_delay_s)

    async def responses(self, request: Request) -> Response:
        """Replies to a Responses request (validated like any model server's input)."""
        raw = await request.body()
        body = _parse_body(NeMoGymResponseCreateParamsNonStreaming, raw)
        await self._delay()
        items = body.input if isinstance(body.input, list) else []
        finished = sum(1 for item in items if getattr(item, "type", None) == "function_call_output")
        number = next(self._ids)
        texts = [body.input] if isinstance(body.input, str) else _message_texts(items)
        turn, status = self._turn(finished, texts)
        output = [_complete_item(item, number, i) for i, item in enumerate(turn)]
        input_tokens = _input_size(raw) // 4
        output_tokens = sum(len(orjson.dumps(item)) for item in output) // 4
        return json_response(
            {
                "id": f"resp_{number}",
                "object": "response",
                "created_at": int(time.time()),
                "model": self.config.model_name,
                "status": status,
                "error": {"code": "server_error", "message": "scripted failure"} if status == "failed" else None,
                "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
                "output": output,
                "parallel_tool_calls": body.parallel_tool_calls,
                "tool_choice": body.tool_choice if isinstance(body.tool_choice, str) else "auto",
                "tools": [tool.model_dump(mode="json") for tool in body.tools],
                "temperature": body.temperature,
                "top_p": body.top_p,
                "usage": {
                    "input_tokens": input_tokens,
                    "input_tokens_details": {"cached_tokens": 0},
                    "output_tokens": output_tokens,
                    "output_tokens_details": {"reasoning_tokens": 0},
                    "total_tokens": input_tokens + output_tokens,
                },
            }
        )

    async def chat_completions(self, request: Request) -> Response:
        body = _parse_body(NeMoGymChatCompletionCreateParamsNonStreaming, await request.body())
        await self._delay()
        finished = sum(1 for message in body.messages if getattr(message, "role", None) == "tool")
        number = next(self._ids)
        text_parts: list[str] = []
        tool_calls: list[dict[str, Any]] = []
        for i, item in enumerate(self._turn(finished, _message_texts(body.messages))[0]):
            if item.get("type") == "function_call":
                call_id = item.get("call_id") or f"call_{number}_{i}"
                tool_calls.append(
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": item["name"], "arguments": item["arguments"]},
                    }
                )
            elif item.get("type") == "message":
                text_parts.extend(part.get("text", "") for part in item.get("content", []))
        message: dict[str, Any] = {"role": "assistant", "content": "".join(text_parts) or None}
        if tool_calls:
            message["tool_calls"] = tool_calls
        return json_response(
            {
                "id": f"chatcmpl_{number}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": self.config.model_name,
                "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if tool_calls else "stop"}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            }
        )


def _message_texts(messages: Iterable[Any]) -> Iterator[str]:
    """The text of each message: its string content, or the ``text`` of its content parts. Lazy, so a server without
    per-task scripts never walks the input."""
    for message in messages:
        if getattr(message, "type", "message") != "message":
            continue  # a tool call, tool output or reasoning item (chat messages have no type)
        content = getattr(message, "content", None)
        if isinstance(content, str):
            yield content
        elif isinstance(content, list):
            yield from (text for part in content if isinstance(text := getattr(part, "text", None), str))


def _load_scripts(path: str) -> list[_Scripted]:
    """The ``(match, script, status)`` of each line of a scripts file, in file order; any bad line is a config error that names it."""
    shape = 'each line must be {"match": "<text>", "script": [[<turn 0 items>], [<turn 1 items>], ...]}'
    try:
        lines = Path(path).read_text(encoding="utf-8").split("\n")  # not splitlines: JSON strings may hold U+2028
    except (OSError, UnicodeDecodeError) as error:
        reason = getattr(error, "strerror", None) or error
        raise ConfigError(
            f"scripts_file {path}: cannot read it ({reason}); give a UTF-8 file's path, relative to {Path.cwd()} or "
            "absolute"
        ) from error
    scripts: list[_Scripted] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            entry = orjson.loads(line)
        except orjson.JSONDecodeError as error:
            raise ConfigError(
                f"scripts_file {path} line {number}: not JSON ({error.msg} at column {error.colno}); {shape}"
            ) from error
        match = entry.get("match") if isinstance(entry, dict) else None
        script = entry.get("script") if isinstance(entry, dict) else None
        if not isinstance(match, str) or not match:
            raise ConfigError(f"scripts_file {path} line {number}: needs a non-empty string 'match'; {shape}")
        if not (
            isinstance(script, list)
            and script
            and all(isinstance(turn, list) and turn and all(isinstance(i, dict) for i in turn) for turn in script)
        ):
            raise ConfigError(
                f"scripts_file {path} line {number}: 'script' must be a non-empty list of non-empty lists of items; "
                f"{shape}"
            )
        status = entry.get("status", "completed")
        if status not in _STATUSES:
            raise ConfigError(f"scripts_file {path} line {number}: 'status' must be one of {', '.join(_STATUSES)}")
        scripts.append((match, script, status))
    return scripts


def _complete_item(item: dict[str, Any], number: int, index: int) -> dict[str, Any]:
    """A script item with the fields a real model server fills in."""
    if item.get("type") == "function_call":
        call_id = item.get("call_id") or f"call_{number}_{index}"
        return {"id": f"fc_{number}_{index}", "call_id": call_id, "status": "completed"} | item
    if item.get("type") == "message":
        content = [{"annotations": [], "logprobs": []} | part for part in item.get("content", [])]
        return {"id": f"msg_{number}_{index}", "role": "assistant", "status": "completed"} | item | {"content": content}
    return {"id": f"item_{number}_{index}"} | item


def _input_size(raw: bytes) -> int:
    """Bytes of the request's ``input`` as the caller sent it, in compact JSON: the token estimate's basis, measured
    without dumping the validated request again."""
    return len(orjson.dumps(orjson.loads(raw).get("input")))


_Body = TypeVar("_Body", bound=BaseModel)


def _parse_body(model: type[_Body], raw: bytes) -> _Body:
    """The request body, parsed by hand (faster than a typed route); a bad one is the client's error, a 422."""
    try:
        return model.model_validate_json(raw)
    except ValidationError as error:
        raise RequestValidationError(error.errors(include_url=False, include_context=False)) from error


if __name__ == "__main__":
    ScriptedModel.run_webserver()
