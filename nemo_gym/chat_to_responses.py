"""Chat Completions -> Responses: a Chat conversation or request rewritten as Responses items and create params.

The reverse of what `responses_converter` does for model servers. Agents that drive a Chat-speaking harness (and log
its turns as Chat messages) use it to report their trajectory as a Response; `ResponsesConverter` exposes both
functions under NeMo Gym's method names. How an assistant turn becomes items (reasoning split out of `<think>` spans,
token fields kept) is the converter's business, so it is passed in.
"""

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pydantic import BaseModel

from nemo_gym.openai_base import get_field
from nemo_gym.openai_chat_utils import (
    NeMoGymChatCompletionCreateParamsNonStreaming,
    NeMoGymChatCompletionNamedToolChoiceParam,
)
from nemo_gym.openai_responses import (
    NeMoGymEasyInputMessage,
    NeMoGymFunctionCallOutput,
    NeMoGymResponseCreateParamsNonStreaming,
)

AssistantItems = Callable[[dict[str, Any]], Sequence[Any]]
"""Output items for one Chat assistant message, given as a plain dict."""


def chat_messages_to_responses_items(messages: Sequence[Any], assistant_items: AssistantItems) -> list[Any]:
    """User, system and developer turns become easy input messages, assistant turns `assistant_items(message)`, tool
    results `function_call_output` items. Messages may be dicts or our Chat message models."""
    items: list[Any] = []
    for message in messages:
        role = get_field(message, "role")
        content = get_field(message, "content")
        if role in ("user", "system", "developer"):
            items.append(NeMoGymEasyInputMessage.model_validate({"role": role, "content": _responses_content(content)}))
        elif role == "assistant":
            assistant = message.model_dump(exclude_none=True) if isinstance(message, BaseModel) else dict(message)
            if isinstance(content, list):  # text parts: one string, as a generated message has
                assistant["content"] = "".join(get_field(part, "text") or "" for part in content)
            items.extend(assistant_items(assistant))
        elif role == "tool":
            if not isinstance(content, str):
                content = [{"type": "input_text", "text": get_field(part, "text")} for part in content or []]
            items.append(
                NeMoGymFunctionCallOutput(
                    call_id=get_field(message, "tool_call_id"), output=content, status="completed"
                )
            )
        else:
            raise NotImplementedError(f"Chat message role {role!r} has no Responses equivalent")
    return items


def chat_params_to_responses_params(
    chat_params: NeMoGymChatCompletionCreateParamsNonStreaming | Mapping[str, Any],
    messages_to_items: Callable[[Sequence[Any]], list[Any]],
) -> NeMoGymResponseCreateParamsNonStreaming:
    """The Responses request that asks for what `chat_params` asks for; only parameters it sets are set."""
    if not isinstance(chat_params, NeMoGymChatCompletionCreateParamsNonStreaming):
        chat_params = NeMoGymChatCompletionCreateParamsNonStreaming.model_validate(chat_params)
    tool_choice: Any = chat_params.tool_choice
    if isinstance(tool_choice, NeMoGymChatCompletionNamedToolChoiceParam):
        tool_choice = {"type": "function", "name": tool_choice.function.name}
    body: dict[str, Any] = {
        "input": messages_to_items(chat_params.messages),
        "tool_choice": tool_choice or "auto",
        "tools": [
            {"type": "function", **tool.function.model_dump(exclude_none=True)} for tool in chat_params.tools or []
        ],
    }
    copied = {
        "max_output_tokens": chat_params.max_completion_tokens or chat_params.max_tokens,
        "metadata": chat_params.metadata,
        "model": chat_params.model,
        "parallel_tool_calls": (
            chat_params.parallel_tool_calls if "parallel_tool_calls" in chat_params.model_fields_set else None
        ),
        "reasoning": {"effort": chat_params.reasoning_effort} if chat_params.reasoning_effort else None,
        "service_tier": chat_params.service_tier,
        "store": chat_params.store,
        "temperature": chat_params.temperature,
        "top_logprobs": chat_params.top_logprobs,
        "top_p": chat_params.top_p,
        "user": chat_params.user,
    }
    body.update({key: value for key, value in copied.items() if value is not None})
    return NeMoGymResponseCreateParamsNonStreaming.model_validate(body)


def _responses_content(content: Any) -> str | list[dict[str, Any]]:
    """Chat message content -> Responses message content; null content is empty text."""
    if content is None or isinstance(content, str):
        return content or ""
    parts: list[dict[str, Any]] = []
    for part in content:
        part_type = get_field(part, "type")
        if part_type == "text":
            parts.append({"type": "input_text", "text": get_field(part, "text")})
        elif part_type == "image_url":
            image = get_field(part, "image_url")
            url, detail = get_field(image, "url"), get_field(image, "detail") or "auto"
            parts.append({"type": "input_image", "image_url": url, "detail": detail})
        elif part_type == "video_url":
            parts.append({"type": "input_video", "video_url": get_field(get_field(part, "video_url"), "url")})
        else:
            raise NotImplementedError(f"Chat content part {part_type!r} has no Responses equivalent")
    return parts


__all__ = ["AssistantItems", "chat_messages_to_responses_items", "chat_params_to_responses_params"]
