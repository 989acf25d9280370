"""One ATIF trajectory -> the Responses object its verifier scores, the reverse of :mod:`nemo_gym.atif.from_rollout`.

The output items are rebuilt from the trajectory's own agent steps (those not marked ``is_copied_context``): its
reasoning, message, tool calls and observations, so what is scored is what the file says the agent did. Item ids and
statuses kept under ``extra.nemo_gym`` make the rebuilt items equal to the exported ones; a trajectory from another
producer gets generated ids. The response's other fields (model, usage, sampling settings) come from the envelope
the export kept, or plain defaults.
"""

from __future__ import annotations

import json
from typing import Any

from nemo_gym.atif.from_rollout import OURS, TOKEN_IDS_MOVED, UnsupportedRollout
from nemo_gym.atif.schema import Content, Step, Trajectory
from nemo_gym.openai_base import TOKEN_ID_FIELDS


def _ours(extra: dict[str, Any] | None, key: str | None = None) -> dict[str, Any]:
    mine = (extra or {}).get(OURS)
    if not isinstance(mine, dict):
        return {}
    if key is None:
        return mine
    value = mine.get(key)
    return value if isinstance(value, dict) else {}


def _text(content: Content | None, where: str) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if any(part.type != "text" for part in content):
        raise UnsupportedRollout(f"{where}: an image cannot be sent to a text verifier")
    return "".join(part.text or "" for part in content)


def _parts(text: str, kept: dict[str, Any], default: dict[str, Any]) -> list[dict[str, Any]]:
    return [(kept.get("part") or default) | {"text": text}]


def _fields(kept: dict[str, Any], *dropped: str) -> dict[str, Any]:
    return {k: v for k, v in kept.items() if k not in dropped}


def _token_ids(step: Step, kept: dict[str, Any]) -> dict[str, Any]:
    """The token record back on the item it came from (see ``TOKEN_IDS_MOVED``)."""
    metrics = step.metrics
    if not kept.get(TOKEN_IDS_MOVED) or metrics is None:
        return {}
    record = (metrics.prompt_token_ids, metrics.completion_token_ids, metrics.logprobs)
    return dict(zip(TOKEN_ID_FIELDS, record, strict=True))


def _step_items(step: Step, where: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    reasoning_kept = _ours(step.extra, "reasoning")
    if step.reasoning_content is not None:
        source = reasoning_kept.get("from", "summary")
        default = {"type": "summary_text" if source == "summary" else "reasoning_text"}
        reasoning = {"type": "reasoning", "summary": []} | _fields(reasoning_kept, "from", "part", TOKEN_IDS_MOVED)
        reasoning |= _token_ids(step, reasoning_kept)
        reasoning[source] = _parts(step.reasoning_content, reasoning_kept, default)
        items.append(reasoning)
    message_kept = _ours(step.extra, "message")
    text = _text(step.message, f"{where}.message")
    if message_kept or (text and step.source == "agent"):
        content: Any = text if message_kept.get("plain") else _parts(text, message_kept, _OUTPUT_TEXT)
        message = _MESSAGE | _fields(message_kept, "part", "plain", TOKEN_IDS_MOVED) | {"content": content}
        items.append(message | _token_ids(step, message_kept))
    for call in step.tool_calls or []:
        kept = _ours(call.extra)
        arguments = kept.get("raw_arguments", json.dumps(call.arguments))
        items.append(
            {"type": "function_call", "call_id": call.tool_call_id, "name": call.function_name}
            | _fields(kept, "raw_arguments", TOKEN_IDS_MOVED)
            | {"arguments": arguments}
            | _token_ids(step, kept)
        )
    for i, result in enumerate(step.observation.results if step.observation else []):
        if result.source_call_id is None:
            raise UnsupportedRollout(f"{where}.observation.results[{i}]: names no tool call (source_call_id)")
        kept = _ours(result.extra)
        output_text = _text(result.content, f"{where}.observation.results[{i}].content")
        output: Any = output_text if kept.get("plain", True) else [{"type": "input_text", "text": output_text}]
        items.append(
            {"type": "function_call_output", "call_id": result.source_call_id}
            | _fields(kept, "plain")
            | {"output": output}
        )
    return items


_OUTPUT_TEXT = {"type": "output_text", "annotations": []}
_MESSAGE = {"type": "message", "role": "assistant", "status": "completed"}


def trajectory_output(trajectory: Trajectory) -> list[dict[str, Any]]:
    """The Responses output items of the trajectory's own agent steps, in order."""
    items: list[dict[str, Any]] = []
    for step in trajectory.steps:
        if step.source == "agent" and not step.is_copied_context:
            items.extend(_step_items(step, f"steps[{step.step_id - 1}]"))
    for n, item in enumerate(items):  # a foreign trajectory has no ids; the Responses schema wants them on these
        if item["type"] in ("message", "reasoning") and not item.get("id"):
            item["id"] = f"{'msg' if item['type'] == 'message' else 'rs'}_atif_{n}"
    return items


def trajectory_response(trajectory: Trajectory) -> dict[str, Any]:
    """The whole Responses object: the export's envelope (or defaults) around the rebuilt output."""
    envelope = _ours(trajectory.extra, "response") or {
        "id": f"resp_{trajectory.trajectory_id or trajectory.session_id or 'atif'}",
        "object": "response",
        "created_at": 0.0,
        "model": trajectory.agent.model_name or trajectory.agent.name,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": trajectory.agent.tool_definitions or [],
    }
    return envelope | {"output": trajectory_output(trajectory)}
