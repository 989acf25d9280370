"""A rollout row as the trajectory page shows it: every item in order, each with a kind, a title and its texts.

Nothing here builds markup: the template escapes every string (model output is untrusted).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from nemo_gym.viewer.index import mapping

HEAVY_KEYS = ("response", "responses_create_params")


@dataclass
class Item:
    kind: str  # input | reasoning | function_call | function_call_output | message | other
    title: str
    text: str
    extra: dict[str, str] = field(default_factory=dict)


def _text_of(content: Any) -> str:
    """The text of a message's content: a string, or the ``text`` of each part (other parts as JSON)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return "" if content is None else _json(content)
    texts = []
    for part in content:
        if isinstance(part, dict) and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif isinstance(part, dict) and isinstance(part.get("refusal"), str):
            texts.append("[refusal] " + part["refusal"])
        else:
            texts.append(_json(part))
    return "\n".join(texts)


def _json(value: Any, indent: bool = False) -> str:
    option = orjson.OPT_INDENT_2 if indent else 0
    return orjson.dumps(value, option=option | orjson.OPT_NON_STR_KEYS, default=str).decode()


def _arguments(raw: Any) -> str:
    """Function-call arguments pretty-printed when they are JSON, as given otherwise."""
    if not isinstance(raw, str):
        return _json(raw, indent=True)
    try:
        return _json(orjson.loads(raw), indent=True)
    except orjson.JSONDecodeError:
        return raw


def _item(entry: Any, source: str) -> Item:
    if not isinstance(entry, dict):
        return Item("other", source, _json(entry))
    kind = entry.get("type") or ("message" if "role" in entry else "other")
    if kind == "message":
        role = str(entry.get("role") or "assistant")
        status = entry.get("status")
        title = f"{source} {role}" + (f" ({status})" if status and status != "completed" else "")
        return Item("input" if source == "input" else "message", title, _text_of(entry.get("content")))
    if kind == "reasoning":
        parts = [_text_of(entry.get("summary")), _text_of(entry.get("content"))]
        return Item("reasoning", "reasoning", "\n".join(p for p in parts if p))
    if kind == "function_call":
        name = str(entry.get("name") or "?")
        return Item("function_call", f"tool call: {name}", _arguments(entry.get("arguments")),
                    {"call_id": str(entry.get("call_id") or "")})  # fmt: skip
    if kind == "function_call_output":
        output = entry.get("output")
        return Item("function_call_output", "tool output", output if isinstance(output, str) else _json(output),
                    {"call_id": str(entry.get("call_id") or "")})  # fmt: skip
    return Item("other", str(kind), _json(entry, indent=True))


def items(row: dict[str, Any]) -> list[Item]:
    """Input messages (instructions first), then the response's output items, in order."""
    found: list[Item] = []
    params = mapping(row.get("responses_create_params"))
    if params.get("instructions"):
        found.append(Item("input", "input instructions", _text_of(params["instructions"])))
    given = params.get("input")
    if isinstance(given, str):
        found.append(Item("input", "input user", given))
    elif isinstance(given, list):
        found.extend(_item(entry, "input") for entry in given)
    response = mapping(row.get("response"))
    for entry in response.get("output") or []:
        found.append(_item(entry, "output"))
    return found


def fields(row: dict[str, Any]) -> list[tuple[str, str]]:
    """The row's other fields (reward, verifier fields, indices, failure class), as (key, compact JSON or text)."""
    shown = []
    for key, value in row.items():
        if key in HEAVY_KEYS:
            continue
        shown.append((str(key), value if isinstance(value, str) else _json(value)))
    return shown


def usage(row: dict[str, Any]) -> list[tuple[str, str]]:
    response = mapping(row.get("response"))
    found = response.get("usage")
    if not isinstance(found, dict):
        return []
    return [(str(k), v if isinstance(v, str) else _json(v)) for k, v in found.items()]


def pretty(raw: bytes) -> str:
    """The row's raw JSON, indented, for the "raw JSON" toggle."""
    try:
        return _json(orjson.loads(raw), indent=True)
    except orjson.JSONDecodeError:
        return raw.decode(errors="replace")
