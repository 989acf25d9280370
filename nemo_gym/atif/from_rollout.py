"""One rollout row -> one ATIF trajectory.

The prompt (``instructions`` and the input items) becomes system and user steps, with earlier assistant turns of a
multi-turn prompt as agent steps marked ``is_copied_context``. The response's output becomes agent steps, one per
model turn: its reasoning, its message, the tool calls it made and their outputs as the step's observation. A new
turn starts where an item cannot belong to the current one (a message after tool calls, reasoning after anything).
A turn's token record (prompt and generated token ids with their log-probs, what RL trainers read) is its step's
``metrics``.

What ATIF has no field for (item ids and statuses, arguments that are not a JSON object) goes to the ``extra``
objects under ``nemo_gym``, as does what re-verification needs: the task row, the reward and the response's other
fields. :mod:`nemo_gym.atif.to_response` reads those back. Items ATIF cannot hold (images, files, refusals, hosted
tool calls) are refused with their path in the row rather than dropped.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, TypeGuard

from pydantic import ValidationError

from nemo_gym.atif.schema import (
    ATIF_VERSION,
    Agent,
    FinalMetrics,
    Metrics,
    Observation,
    ObservationResult,
    Step,
    ToolCall,
    Trajectory,
)
from nemo_gym.config.datasets import AGENT_REF_KEY
from nemo_gym.errors import ConfigError
from nemo_gym.openai_base import TOKEN_ID_FIELDS
from nemo_gym.row_fields import ROLLOUT_INDEX_KEY, TASK_INDEX_KEY

OURS = "nemo_gym"
"""Key of our data in every ``extra`` object."""
TOKEN_IDS_MOVED = "token_ids_in_metrics"
"""Marks the item whose token record is the step's ``metrics`` (put back on it by :mod:`nemo_gym.atif.to_response`)."""
TEXT_PARTS = ("input_text", "output_text", "text", "summary_text", "reasoning_text")


class UnsupportedRollout(ConfigError):
    """A rollout holds something ATIF (or this mapping) cannot represent; the message names where."""


def _ours(rest: dict[str, Any]) -> dict[str, Any] | None:
    return {OURS: rest} if rest else None


def given(fields: dict[str, Any]) -> dict[str, Any]:
    """The fields that have a value: ATIF leaves an absent field out, so the export writes only fields it sets."""
    return {k: v for k, v in fields.items() if v is not None}


def _without(item: dict[str, Any], *keys: str) -> dict[str, Any]:
    return {k: v for k, v in item.items() if k not in keys}


def content_text(content: Any, where: str) -> str:
    """The text of a message's content: a string, or text parts joined; any other part is refused."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise UnsupportedRollout(f"{where}: expected a string or a list of parts")
    texts = []
    for i, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in TEXT_PARTS or not isinstance(part.get("text"), str):
            raise UnsupportedRollout(f"{where}[{i}]: a {kind!r} part cannot be exported (text parts only)")
        texts.append(part["text"])
    return "".join(texts)


@dataclass
class _Turn:
    """The agent step being built: one model turn and what its tool calls returned."""

    copied: bool
    reasoning: str | None = None
    message: str | None = None
    calls: list[ToolCall] = field(default_factory=list)
    results: list[ObservationResult] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    metrics: Metrics | None = None

    def take_token_ids(self, rest: dict[str, Any]) -> dict[str, Any]:
        """The first token record of the turn (prompt ids, generated ids, their log-probs: what RL trainers read)
        moves to the step's ``metrics``, where ATIF keeps it; ``rest`` says which item it came from."""
        prompt, generated, logprobs = (rest.get(key) for key in TOKEN_ID_FIELDS)
        if self.metrics is not None or prompt is None or generated is None or logprobs is None:
            return rest
        try:
            self.metrics = Metrics(
                prompt_tokens=len(prompt), completion_tokens=len(generated), prompt_token_ids=prompt,
                completion_token_ids=generated, logprobs=logprobs,
            )  # fmt: skip
        except (TypeError, ValidationError):
            return rest  # not a valid record: kept as it came, under extra
        return _without(rest, *TOKEN_ID_FIELDS) | {TOKEN_IDS_MOVED: True}

    def step(self) -> dict[str, Any]:
        return {
            "source": "agent",
            "message": self.message or "",
            "reasoning_content": self.reasoning,
            "tool_calls": self.calls or None,
            "observation": Observation(results=self.results) if self.results else None,
            "metrics": self.metrics,
            "is_copied_context": True if self.copied else None,
            "extra": _ours(self.extra),
        }


class _StepBuilder:
    """Turns Responses items into step fields, in order."""

    def __init__(self) -> None:
        self.steps: list[dict[str, Any]] = []
        self.turn: _Turn | None = None

    def close_turn(self) -> None:
        if self.turn is not None:
            self.steps.append(self.turn.step())
            self.turn = None

    def _open_turn(self, copied: bool, starts_fresh: bool) -> _Turn:
        if self.turn is None or starts_fresh or self.turn.copied != copied:
            self.close_turn()
            self.turn = _Turn(copied)
        return self.turn

    def add(self, item: Any, copied: bool, where: str) -> None:
        if not isinstance(item, dict):
            raise UnsupportedRollout(f"{where}: expected an object")
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            self._message(item, copied, where)
        elif kind == "reasoning":
            turn = self._open_turn(copied, starts_fresh=True)
            source = "summary" if item.get("summary") else "content"
            parts = item.get(source) or []
            turn.reasoning = "\n".join(content_text([part], f"{where}.{source}") for part in parts)
            rest = _without(item, source) | {"from": source}
            if len(parts) == 1:
                rest["part"] = _without(parts[0], "text")
            turn.extra["reasoning"] = turn.take_token_ids(rest)
        elif kind == "function_call":
            self._call(item, copied, where)
        elif kind == "function_call_output":
            self._output(item, copied, where)
        else:
            raise UnsupportedRollout(f"{where}: a {kind!r} item cannot be exported")

    def _message(self, item: dict[str, Any], copied: bool, where: str) -> None:
        role = item.get("role")
        text = content_text(item.get("content"), f"{where}.content")
        rest = _without(item, "content")
        parts = item.get("content")
        if isinstance(parts, list) and len(parts) == 1:
            rest["part"] = _without(parts[0], "text")
        elif isinstance(parts, str):
            rest["plain"] = True
        if role == "assistant":
            turn = self.turn
            if turn is None or turn.copied != copied or turn.message is not None or turn.calls or turn.results:
                turn = self._open_turn(copied, starts_fresh=True)
            turn.message = text
            turn.extra["message"] = turn.take_token_ids(rest)
            return
        if role not in ("system", "developer", "user"):
            raise UnsupportedRollout(f"{where}.role: {role!r} is not system, developer, user or assistant")
        self.close_turn()
        self.steps.append({"source": "user" if role == "user" else "system", "message": text, "extra": _ours(rest)})

    def _call(self, item: dict[str, Any], copied: bool, where: str) -> None:
        turn = self._open_turn(copied, starts_fresh=bool(self.turn and self.turn.results))
        raw = item.get("arguments")
        if (
            not isinstance(item.get("call_id"), str)
            or not isinstance(item.get("name"), str)
            or not isinstance(raw, str)
        ):
            raise UnsupportedRollout(f"{where}: a function_call needs string call_id, name and arguments")
        try:
            arguments = json.loads(raw)
        except ValueError:
            arguments = None
        rest = _without(item, "call_id", "name", "arguments")
        if not isinstance(arguments, dict) or json.dumps(arguments) != raw:
            rest["raw_arguments"] = raw  # the model's exact text, which ATIF's object could not give back
        rest = turn.take_token_ids(rest)
        turn.calls.append(
            ToolCall(
                tool_call_id=item["call_id"],
                function_name=item["name"],
                arguments=arguments if isinstance(arguments, dict) else {},
                **given({"extra": _ours(rest)}),
            )
        )

    def _output(self, item: dict[str, Any], copied: bool, where: str) -> None:
        call_id = item.get("call_id")
        turn = self.turn
        if turn is None or turn.copied != copied or call_id not in {c.tool_call_id for c in turn.calls}:
            raise UnsupportedRollout(f"{where}: output of call {call_id!r} does not follow its function_call")
        output = item.get("output")
        rest = _without(item, "call_id", "output") | {"plain": isinstance(output, str)}
        text = content_text(output, f"{where}.output")
        turn.results.append(ObservationResult(source_call_id=call_id, content=text, **given({"extra": _ours(rest)})))


def is_index(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _index(row: dict[str, Any], key: str) -> int:
    value = row.get(key)
    if not is_index(value):
        raise UnsupportedRollout(f"{key}: expected a non-negative integer, got {value!r}")
    return value


def _final_metrics(usage: Any, steps: int) -> FinalMetrics:
    usage = usage if isinstance(usage, dict) else {}
    cached = (usage.get("input_tokens_details") or {}).get("cached_tokens")
    totals = {
        "total_prompt_tokens": usage.get("input_tokens"),
        "total_completion_tokens": usage.get("output_tokens"),
        "total_cached_tokens": cached,
    }
    return FinalMetrics(total_steps=steps, **given(totals))


def rollout_to_trajectory(
    row: dict[str, Any], task: dict[str, Any], *, session_id: str, agent_version: str
) -> Trajectory:
    """The trajectory of one rollout; ``task`` is its materialized input row (what ``/verify`` was sent)."""
    task_index, rollout_index = _index(row, TASK_INDEX_KEY), _index(row, ROLLOUT_INDEX_KEY)
    agent = (row.get(AGENT_REF_KEY) or {}).get("name")
    response, params = row.get("response"), row.get("responses_create_params")
    if not isinstance(agent, str) or not agent:
        raise UnsupportedRollout(f"{AGENT_REF_KEY}.name: the rollout names no agent")
    if not isinstance(response, dict) or not isinstance(response.get("output"), list):
        raise UnsupportedRollout("response: the rollout has no stored response (a failure record?)")
    if not isinstance(params, dict):
        raise UnsupportedRollout("responses_create_params: missing")
    reward = row.get("reward")
    if isinstance(reward, bool) or not isinstance(reward, (int, float)):
        raise UnsupportedRollout(f"reward: expected a number, got {reward!r}")

    builder = _StepBuilder()
    instructions = params.get("instructions")
    if isinstance(instructions, str) and instructions:
        builder.steps.append({"source": "system", "message": instructions, "extra": _ours({"instructions": True})})
    prompt = params.get("input")
    if isinstance(prompt, str):
        builder.steps.append({"source": "user", "message": prompt, "extra": _ours({"plain_input": True})})
    else:
        for i, item in enumerate(prompt or []):
            builder.add(item, True, f"responses_create_params.input[{i}]")
    builder.close_turn()
    for i, item in enumerate(response["output"]):
        builder.add(item, False, f"response.output[{i}]")
    builder.close_turn()
    steps = [Step(step_id=n, **given(fields)) for n, fields in enumerate(builder.steps, 1)]
    if not steps:
        raise UnsupportedRollout("the rollout has neither a prompt nor any output")
    tools = params.get("tools")
    return Trajectory(
        schema_version=ATIF_VERSION,
        session_id=session_id,
        trajectory_id=f"{session_id}:{task_index}-{rollout_index}",
        agent=Agent(
            name=agent,
            version=agent_version,
            **given(
                {
                    "model_name": response.get("model") if isinstance(response.get("model"), str) else None,
                    "tool_definitions": tools if isinstance(tools, list) and tools else None,
                }
            ),
        ),
        steps=steps,
        final_metrics=_final_metrics(response.get("usage"), len(steps)),
        extra={
            OURS: {
                TASK_INDEX_KEY: task_index,
                ROLLOUT_INDEX_KEY: rollout_index,
                "reward": reward,
                "task": task,
                "response": _without(response, "output"),
            }
        },
    )
