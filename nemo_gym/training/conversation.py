"""One scored rollout as a chat conversation in TRL's conversational format.

A rollout row holds the request (``responses_create_params``: ``input``, ``instructions``, ``tools``) and the agent's
``response`` in the Responses API's items. Trainers read Chat messages instead, the shape a chat template renders:

* ``system`` / ``user`` messages with string content (``developer`` becomes ``system``: few templates know it);
* one ``assistant`` message per model turn: its reasoning as ``<think>...</think>`` before the text (the convention of
  :mod:`nemo_gym.responses_converter`, which does the item walk), and its ``tool_calls`` with the arguments as an
  object, as chat templates expect them;
* one ``tool`` message per tool result, with the ``tool_call_id`` and the tool's ``name``;
* the request's function tools as the JSON schemas a template renders (``{"type": "function", "function": ...}``).

The prompt is what the model was given (the request), the completion what the rollout added (the response), so a
preference pair shares the prompt. A row this cannot represent raises :class:`UnusableRollout` with a reason key
(counted by the export) and a sentence for the user.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import orjson

from nemo_gym.responses_converter import ResponsesConverter

Message = dict[str, Any]

CREATE_PARAMS_KEY = "responses_create_params"
RESPONSE_KEY = "response"
REWARD_KEY = "reward"


class UnusableRollout(Exception):
    """A row that cannot become a conversation: ``reason`` is the statistics key, the message says why."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class Conversation:
    """A rollout in chat form: ``prompt + completion`` is the whole conversation."""

    prompt: list[Message]
    completion: list[Message]
    tools: list[dict[str, Any]] | None
    reward: float
    incomplete: bool
    """The response was cut off (``status: incomplete``, e.g. at ``max_output_tokens``)."""

    @property
    def messages(self) -> list[Message]:
        return self.prompt + self.completion

    def prompt_key(self) -> str:
        """A digest of what the model was given (prompt and tools): rollouts of one task share it."""
        data = orjson.dumps([self.prompt, self.tools], option=orjson.OPT_SORT_KEYS)
        return hashlib.sha256(data).hexdigest()


def rollout_reward(row: dict[str, Any]) -> float:
    """The row's numeric ``reward``; a failure record or a row without one is unusable."""
    if "_ng_failure_class" in row:
        raise UnusableRollout(
            "failure_row", f"a failed rollout ({row['_ng_failure_class']}), not a scored one: export the rollouts file, "
            "not its _failures.jsonl",
        )  # fmt: skip
    reward = row.get(REWARD_KEY)
    if reward is None:
        raise UnusableRollout("missing_reward", "no 'reward': export scored rollouts written by `gym eval run`")
    if isinstance(reward, bool) or not isinstance(reward, int | float):
        raise UnusableRollout("missing_reward", f"'reward' must be a number, got {reward!r}")
    return float(reward)


def rollout_conversation(row: dict[str, Any]) -> Conversation:
    """The conversation of one scored rollout row (see the module docstring for the shape)."""
    reward = rollout_reward(row)
    params = row.get(CREATE_PARAMS_KEY)
    if not isinstance(params, dict) or params.get("input") in (None, "", []):
        raise UnusableRollout("missing_input", f"no '{CREATE_PARAMS_KEY}.input': the row does not say what was asked")
    response = row.get(RESPONSE_KEY)
    output = response.get("output") if isinstance(response, dict) else None
    if not isinstance(response, dict) or not isinstance(output, list):
        raise UnusableRollout("missing_response", f"no '{RESPONSE_KEY}.output' list: the row holds no rollout")
    instructions = params.get("instructions")
    try:
        converter = ResponsesConverter()
        prompt = _normalise(converter.responses_input_to_chat_messages(params["input"], instructions))
        completion = _normalise(converter.responses_input_to_chat_messages(output))
        tools = _tools(params.get("tools"))
    except (NotImplementedError, TypeError, AttributeError, KeyError) as e:
        raise UnusableRollout("unsupported_content", f"cannot be written as chat messages: {e}") from None
    if not any(message["role"] == "assistant" for message in completion):
        raise UnusableRollout("no_model_output", f"'{RESPONSE_KEY}.output' has no assistant message or tool call")
    return Conversation(prompt, completion, tools, reward, incomplete=response.get("status") == "incomplete")


def _normalise(messages: list[Message]) -> list[Message]:
    """Chat Completions messages -> the shape chat templates render (see the module docstring)."""
    names: dict[str, str] = {}
    result = []
    for message in messages:
        role = "system" if message["role"] == "developer" else message["role"]
        out: Message = {"role": role, "content": _text(message.get("content"))}
        if message.get("tool_calls"):
            out["tool_calls"] = [_tool_call(call) for call in message["tool_calls"]]
            names.update((call["id"], call["function"]["name"]) for call in out["tool_calls"])
        if role == "tool":
            out["tool_call_id"] = message["tool_call_id"]
            out["name"] = names.get(message["tool_call_id"], "")
        result.append(out)
    return result


def _text(content: Any) -> str:
    """String content; a list of parts must be all text (a chat dataset holds no images here)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    texts = []
    for part in content:
        if part.get("type") != "text":
            raise NotImplementedError(f"a {part.get('type')!r} content part (only text can be exported)")
        texts.append(part["text"])
    return "".join(texts)


def _tool_call(call: dict[str, Any]) -> dict[str, Any]:
    function = call["function"]
    try:
        arguments = orjson.loads(function["arguments"] or "{}")
    except orjson.JSONDecodeError:
        arguments = None
    if not isinstance(arguments, dict):
        raise UnusableRollout(
            "bad_tool_arguments", f"the arguments of tool call {function['name']!r} are not a JSON object: "
            f"{str(function['arguments'])[:80]!r}",
        )  # fmt: skip
    return {"id": call["id"], "type": "function", "function": {"name": function["name"], "arguments": arguments}}


def _tools(tools: Any) -> list[dict[str, Any]] | None:
    """The request's function tools as chat-template tool schemas; None when there are none."""
    if not tools:
        return None
    schemas = []
    for tool in tools:
        if tool.get("type") != "function":
            raise NotImplementedError(f"a {tool.get('type')!r} tool (only function tools have a chat schema)")
        function = {key: tool[key] for key in ("name", "description", "parameters") if tool.get(key) is not None}
        schemas.append({"type": "function", "function": function})
    return schemas
