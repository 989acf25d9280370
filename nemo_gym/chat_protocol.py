"""How a chat request becomes the embedded model's prompt: its own chat template, our tool protocol, safe tokens.

The conversation is rendered with the chat template stored in the GGUF file (``tokenizer.chat_template``; ChatML when
the file has none), so a model sees the exact turn markup it was trained on, SmolLM2's default system prompt
included. Templates written for tool-less models know nothing of tools, so the tool protocol travels inside the
messages themselves: the functions and the reply protocol are appended to the system message, a past tool call is
re-rendered in the protocol the model writes (so history stays on-policy), and a tool result is a ``tool`` turn whose
content is wrapped in ``<tool_response>`` tags (measured on SmolLM2-135M: wrapped results make it answer rather than
repeat the call).

Message text is never parsed for control tokens: each message's content is swapped for a placeholder before the
template runs, and the text around the placeholders (the template's own markup) is the only part tokenized with
special tokens enabled. A user cannot forge ``<|im_end|>``. Jinja runs sandboxed and never HTML-escapes.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from jinja2 import StrictUndefined
from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

MESSAGE_HEADER = "message:\n"
CALL_PREFIX = "functions."
CALL_SUFFIX = ":\n"
_TOOL_NAME_RE = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")
_PLACEHOLDER = "\x00{}\x00"
_PLACEHOLDER_RE = re.compile("\x00(\\d+)\x00")

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


@dataclass(frozen=True)
class Tool:
    """A function tool normalized from either the Chat Completions or the Responses API shape."""

    name: str
    description: str
    parameters: dict[str, Any]

    @property
    def header(self) -> str:
        """The text that opens a call of this tool in the reply protocol."""
        return f"{CALL_PREFIX}{self.name}{CALL_SUFFIX}"


def normalize_tools(tools: Sequence[dict[str, Any]] | None) -> list[Tool]:
    """Accept ``{"type": "function", "function": {...}}`` and the flat Responses API tool shape."""
    normalized: list[Tool] = []
    for tool in tools or []:
        if tool.get("type", "function") != "function":
            continue
        function = tool.get("function")
        spec = function if isinstance(function, dict) else tool
        name = spec.get("name")
        if not isinstance(name, str) or not _TOOL_NAME_RE.match(name):
            raise ValueError(f"Invalid tool name: {name!r}")
        parameters = spec.get("parameters") or {"type": "object", "properties": {}}
        normalized.append(Tool(name=name, description=spec.get("description") or "", parameters=parameters))
    if len({t.name for t in normalized}) != len(normalized):
        raise ValueError("Tool names must be unique")
    return normalized


def text_of(content: Any) -> str:
    """Flatten OpenAI message content (a string or a list of text parts) into plain text."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts: list[str] = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
        return "".join(parts)
    return str(content)


def tool_instructions(tools: list[Tool]) -> str:
    """System-prompt text teaching the reply protocol; terse wording measurably helps a 135M model decide."""
    lines = ["Functions you can call when the user asks for something they do:"]
    for tool in tools:
        lines.append(f"{CALL_PREFIX}{tool.name}: {tool.description}".rstrip())
        lines.append(json.dumps(tool.parameters, ensure_ascii=False))
    lines += [
        "",
        f"Call: '{CALL_PREFIX}<name>:' then JSON arguments.",
        f"Otherwise: '{MESSAGE_HEADER.strip()}' then the answer.",
    ]
    return "\n".join(lines)


def assistant_body(message: dict[str, Any], tools_active: bool) -> str:
    """Re-render a past assistant turn in the same protocol the model produces, so history stays on-policy."""
    content = text_of(message.get("content"))
    calls = message.get("tool_calls") or []
    pieces: list[str] = []
    if content and (tools_active or calls):
        pieces.append(MESSAGE_HEADER + content)
    elif content:
        pieces.append(content)
    for call in calls:
        function = call.get("function") if isinstance(call.get("function"), dict) else call
        arguments = function.get("arguments") or "{}"
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments)
        pieces.append(f"{CALL_PREFIX}{function.get('name')}{CALL_SUFFIX}{arguments}")
    return "\n".join(pieces)


def tool_result_body(message: dict[str, Any]) -> str:
    return f"<tool_response>\n{text_of(message.get('content'))}\n</tool_response>"


def protocol_messages(messages: list[dict[str, Any]], tools: list[Tool]) -> list[dict[str, str]]:
    """The conversation as plain ``{role, content}`` turns, with the tool protocol folded into the text.

    System and developer messages merge into one leading system turn (templates expect at most one); without any
    and without tools, no system turn is added, so the template's own default applies.
    """
    system_parts = [text_of(m.get("content")) for m in messages if m.get("role") in ("system", "developer")]
    system = "\n\n".join(p for p in system_parts if p)
    if tools:
        system = (system + "\n\n" if system else "") + tool_instructions(tools)
    turns: list[dict[str, str]] = [{"role": "system", "content": system}] if system else []
    for message in messages:
        role = message.get("role")
        if role in ("system", "developer"):
            continue
        if role == "assistant":
            turns.append({"role": "assistant", "content": assistant_body(message, bool(tools))})
        elif role == "tool":
            turns.append({"role": "tool", "content": tool_result_body(message)})
        else:
            turns.append({"role": "user", "content": text_of(message.get("content"))})
    return turns


def follows_tool_results(messages: list[dict[str, Any]]) -> bool:
    """True when the reply comes right after tool results (the model is reading what its calls returned)."""
    return bool(messages) and messages[-1].get("role") == "tool"


def allowed_headers(tools: list[Tool], tool_choice: Any) -> list[str]:
    """Translate ``tool_choice`` into the reply headers the model may start with (empty: no tool protocol).

    The engines choose among these by scoring each whole header under the model (see ``llamacpp_model/engine.py``).
    """
    if not tools or tool_choice == "none":
        return []
    call_headers = [t.header for t in tools]
    if tool_choice is None or tool_choice == "auto":
        return [MESSAGE_HEADER, *call_headers]
    if tool_choice == "required":
        return call_headers
    if isinstance(tool_choice, dict):
        function = tool_choice.get("function")
        spec = function if isinstance(function, dict) else tool_choice
        name = spec.get("name")
        if name not in {t.name for t in tools}:
            raise ValueError(f"tool_choice names unknown tool {name!r}")
        return [f"{CALL_PREFIX}{name}{CALL_SUFFIX}"]
    raise ValueError(f"Unsupported tool_choice: {tool_choice!r}")


class ChatTemplate:
    """A model's Jinja chat template, rendered into (text, is_markup) segments."""

    def __init__(self, source: str | None, bos_token: str = "", eos_token: str = "") -> None:
        self.source = source or CHATML_TEMPLATE
        self.bos_token = bos_token
        self.eos_token = eos_token
        environment = ImmutableSandboxedEnvironment(autoescape=False, undefined=StrictUndefined)
        environment.globals["raise_exception"] = _raise_template_exception
        try:
            self._template = environment.from_string(self.source)
        except TemplateError as e:
            raise ValueError(f"The model's chat template does not parse: {e}") from e

    def segments(self, turns: list[dict[str, str]]) -> list[tuple[str, bool]]:
        """Render ``turns`` with an open assistant turn; markup segments are ``True``, message text ``False``."""
        masked = [{"role": t["role"], "content": _PLACEHOLDER.format(i)} for i, t in enumerate(turns)]
        try:
            rendered = self._template.render(
                messages=masked, add_generation_prompt=True, bos_token=self.bos_token, eos_token=self.eos_token
            )
        except TemplateError as e:
            raise ValueError(f"The model's chat template failed on this conversation: {e}") from e
        pieces: list[tuple[str, bool]] = []
        position = 0
        for match in _PLACEHOLDER_RE.finditer(rendered):
            pieces.append((rendered[position : match.start()], True))
            pieces.append((turns[int(match.group(1))]["content"], False))
            position = match.end()
        pieces.append((rendered[position:], True))
        return [(text, markup) for text, markup in pieces if text]


def _raise_template_exception(message: str) -> None:
    raise TemplateError(message)


def parse_reply(text: str, tools: list[Tool]) -> tuple[str | None, list[tuple[str, str]]]:
    """Read a freely sampled reply back into ``(content, [(tool name, JSON arguments)])``: the inverse of
    :func:`assistant_body`, for engines that sample without the embedded engine's grammar (``hf_policy_model``).

    Calls are ``functions.<name>:`` headers of declared tools, each followed by one JSON object; text before the first
    header is the message (``message:`` stripped). A header whose arguments are not a JSON object leaves the whole
    reply as text, so a malformed call is what the verifier sees rather than a call the model never made.
    """
    names = "|".join(re.escape(t.name) for t in tools)
    headers = list(re.finditer(rf"{re.escape(CALL_PREFIX)}({names}):[ \t]*\n?", text)) if names else []
    calls: list[tuple[str, str]] = []
    decoder = json.JSONDecoder()
    for header in headers:
        try:
            value, _ = decoder.raw_decode(text[header.end() :].lstrip())
        except ValueError:
            value = None
        if not isinstance(value, dict):
            calls = []
            break
        calls.append((header.group(1), json.dumps(value, ensure_ascii=False)))
    content = text[: headers[0].start()] if calls else text
    content = content.strip()
    content = content.removeprefix(MESSAGE_HEADER.strip()).strip() if tools else content
    return (content or None) if calls else content, calls
