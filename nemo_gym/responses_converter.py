"""Translate between the Responses API (what every NeMo Gym server speaks) and Chat Completions (what open-model
engines such as vLLM speak), so any Chat Completions endpoint can back a Responses model server.

Two conventions make the round trip lossless enough for RL:
* reasoning travels inside assistant text as `<think>...</think>` spans (one span per reasoning summary), which is how
  reasoning models' chat templates expect past turns and how their raw output looks;
* consecutive model-generated items (reasoning, assistant text, tool calls) collapse into one Chat assistant message,
  and the token ids of a generation ride on that message (`return_token_id_information`) so trainers see exactly what
  was sampled.
"""

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal
from uuid import uuid4

from pydantic import BaseModel

from nemo_gym.chat_to_responses import chat_messages_to_responses_items, chat_params_to_responses_params
from nemo_gym.openai_responses import (
    TOKEN_ID_FIELDS,
    NeMoGymChatCompletion,
    NeMoGymChatCompletionCreateParamsNonStreaming,
    NeMoGymChatCompletionMessage,
    NeMoGymChatCompletionMessageForTraining,
    NeMoGymCompletionUsage,
    NeMoGymIncompleteDetails,
    NeMoGymResponse,
    NeMoGymResponseCreateParamsNonStreaming,
    NeMoGymResponseFunctionToolCall,
    NeMoGymResponseFunctionToolCallForTraining,
    NeMoGymResponseInputTokensDetails,
    NeMoGymResponseOutputMessage,
    NeMoGymResponseOutputMessageForTraining,
    NeMoGymResponseOutputRefusal,
    NeMoGymResponseOutputText,
    NeMoGymResponseOutputTokensDetails,
    NeMoGymResponseReasoningItem,
    NeMoGymResponseReasoningItemForTraining,
    NeMoGymResponseUsage,
    NeMoGymSummary,
    NeMoGymToolChoiceFunction,
    get_field,
    has_token_id_information,
)

THINK_PATTERN = re.compile(r"<think>(.*?)</think>", re.DOTALL)
"""One reasoning span in model text; non-greedy so several spans stay separate."""

MODEL_GENERATED_ITEM_TYPES: frozenset[str] = frozenset(
    {
        "reasoning",
        "function_call",
        "custom_tool_call",
        "mcp_call",
        "mcp_list_tools",
        "mcp_approval_request",
        "web_search_call",
        "file_search_call",
        "computer_call",
        "code_interpreter_call",
        "image_generation_call",
        "local_shell_call",
        "shell_call",
        "apply_patch_call",
        "tool_search_call",
    }
)
"""Item types only a model produces: the first one marks where a replayed prompt ends and sampling began."""

INCOMPLETE_FINISH_REASONS: Mapping[str, Literal["max_output_tokens", "content_filter"]] = MappingProxyType(
    {"length": "max_output_tokens", "content_filter": "content_filter"}
)
"""Chat finish reasons that mean the generation was cut off (so the agent loop must stop), each with the Responses
`incomplete_details.reason` it becomes."""

RESPONSE_ECHO_FIELDS: tuple[str, ...] = (
    "background",
    "instructions",
    "max_output_tokens",
    "max_tool_calls",
    "metadata",
    "parallel_tool_calls",
    "previous_response_id",
    "prompt",
    "reasoning",
    "service_tier",
    "temperature",
    "text",
    "tool_choice",
    "tools",
    "top_logprobs",
    "top_p",
    "truncation",
    "user",
)
"""Request parameters a Response repeats back, as the OpenAI API does."""

ChatMessage = dict[str, Any]
OutputItem = NeMoGymResponseOutputMessage | NeMoGymResponseFunctionToolCall | NeMoGymResponseReasoningItem

_TRAINING_VARIANTS: dict[type, type[OutputItem]] = {
    NeMoGymResponseOutputMessage: NeMoGymResponseOutputMessageForTraining,
    NeMoGymResponseFunctionToolCall: NeMoGymResponseFunctionToolCallForTraining,
    NeMoGymResponseReasoningItem: NeMoGymResponseReasoningItemForTraining,
}


def _new_id(prefix: str) -> str:
    # `uuid4` is looked up on this module at call time, so a test that patches
    # `nemo_gym.responses_converter.uuid4` gets predictable ids.
    return f"{prefix}_{uuid4().hex}"


def _item_type(item: Any) -> str:
    """An item's type; easy messages may omit it."""
    return get_field(item, "type") or "message"


def _is_assistant_side(item: Any) -> bool:
    item_type = _item_type(item)
    return item_type in ("reasoning", "function_call") or (
        item_type == "message" and get_field(item, "role") == "assistant"
    )


def split_responses_input_output_items(items: Sequence[Any]) -> tuple[list[Any], list[Any]]:
    """Split a trajectory into (prompt items, generated items) at the first assistant message or model-generated item.

    Trainers need this boundary: everything before it was given to the model, everything from it on was sampled (or
    is a tool result interleaved with sampled turns).
    """
    for index, item in enumerate(items):
        item_type = _item_type(item)
        if item_type in MODEL_GENERATED_ITEM_TYPES or (
            item_type == "message" and get_field(item, "role") == "assistant"
        ):
            return list(items[:index]), list(items[index:])
    return list(items), []


@dataclass
class _AssistantTurn:
    """Model-generated items waiting to become one Chat assistant message."""

    thinking: list[str] = field(default_factory=list)
    text: list[str] = field(default_factory=list)
    refusals: list[str] = field(default_factory=list)
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    token_information: dict[str, Any] | None = None
    has_items: bool = False


class ResponsesConverter:
    """Converts Responses requests to Chat Completions requests, and Chat Completions results back to Responses.

    `return_token_id_information`: carry token ids found on input items onto the Chat assistant messages (training).
    `uses_reasoning_parser`: the model emits `<think>` spans, which are split out into reasoning items.
    """

    def __init__(self, return_token_id_information: bool = False, uses_reasoning_parser: bool = True) -> None:
        self.return_token_id_information = return_token_id_information
        self.uses_reasoning_parser = uses_reasoning_parser

    # ------------------------------------------------------------------------------------------------------------------
    # Responses -> Chat Completions
    # ------------------------------------------------------------------------------------------------------------------

    def responses_to_chat_completion_create_params(
        self, responses_create_params: NeMoGymResponseCreateParamsNonStreaming | Mapping[str, Any]
    ) -> NeMoGymChatCompletionCreateParamsNonStreaming:
        """Build the Chat request; only fields that carry meaning are set, so `model_dump(exclude_unset=True)` is
        the exact body to send."""
        params = responses_create_params
        if not isinstance(params, NeMoGymResponseCreateParamsNonStreaming):
            params = NeMoGymResponseCreateParamsNonStreaming.model_validate(params)

        body: dict[str, Any] = {"messages": self.responses_input_to_chat_messages(params.input, params.instructions)}
        if params.model is not None:
            body["model"] = params.model
        if params.max_output_tokens is not None:
            body["max_tokens"] = params.max_output_tokens
        if params.temperature is not None:
            body["temperature"] = params.temperature
        if params.top_p is not None:
            body["top_p"] = params.top_p
        if params.reasoning is not None and params.reasoning.get("effort") is not None:
            body["reasoning_effort"] = params.reasoning["effort"]
        if params.metadata is not None:
            body["metadata"] = params.metadata  # model servers read per-request extras (e.g. extra_body) from here
        if params.text is not None and params.text.format is not None:
            response_format = _chat_response_format(params.text.format)
            if response_format is not None:
                body["response_format"] = response_format

        if params.tools:
            body["tools"] = [
                {
                    "type": "function",
                    "function": {
                        key: value
                        for key, value in (
                            ("name", tool.name),
                            ("description", tool.description),
                            ("parameters", tool.parameters),
                            ("strict", tool.strict),  # a hosted-API flag; engines that render it drop it themselves
                        )
                        if value is not None
                    },
                }
                for tool in params.tools
            ]
            body["tool_choice"] = _chat_tool_choice(params.tool_choice)
            body["parallel_tool_calls"] = params.parallel_tool_calls
        elif params.tool_choice == "required" or isinstance(params.tool_choice, NeMoGymToolChoiceFunction):
            raise ValueError(f"tool_choice={params.tool_choice!r} requires at least one tool, but `tools` is empty")
        # Without tools, tool_choice and parallel_tool_calls are dropped: several engines reject them then.

        return NeMoGymChatCompletionCreateParamsNonStreaming.model_validate(body)

    def responses_input_to_chat_messages(
        self, input_: str | Sequence[Any], instructions: str | None = None
    ) -> list[ChatMessage]:
        """Walk Responses input items in order and emit Chat messages (plain dicts, validated by the caller)."""
        # A bare string is one user turn with one text part, as NeMo Gym sends it (its tests compare the messages).
        text_turn = {"role": "user", "content": [{"type": "input_text", "text": input_}]}
        items: list[Any] = [text_turn] if isinstance(input_, str) else list(input_)
        messages: list[ChatMessage] = []

        if instructions is not None:
            # One leading system message: instructions first, then any system/developer messages that open the input.
            system_texts = [instructions]
            while (
                items and _item_type(items[0]) == "message" and get_field(items[0], "role") in ("system", "developer")
            ):
                system_texts.append(_plain_text(get_field(items.pop(0), "content")))
            messages.append({"role": "system", "content": "\n\n".join(system_texts)})

        turn = _AssistantTurn()
        for item in items:
            item_type = _item_type(item)
            if _is_assistant_side(item):
                if turn.token_information is not None:
                    # A training item ends its generation; what follows came from a later model call.
                    turn = self._flush(turn, messages)
                self._add_to_turn(turn, item, item_type)
            elif item_type == "message":
                turn = self._flush(turn, messages)
                role = get_field(item, "role")
                messages.append({"role": role, "content": _chat_content(get_field(item, "content"), role)})
            elif item_type == "function_call_output":
                turn = self._flush(turn, messages)
                messages.append(
                    {
                        "role": "tool",
                        "tool_call_id": get_field(item, "call_id"),
                        "content": _tool_content(get_field(item, "output")),
                    }
                )
            else:
                raise NotImplementedError(
                    f"Responses input item type {item_type!r} has no Chat Completions equivalent. Remove it from the "
                    "input, or use a model server that speaks the Responses API natively."
                )
        self._flush(turn, messages)
        return messages

    def _add_to_turn(self, turn: _AssistantTurn, item: Any, item_type: str) -> None:
        turn.has_items = True
        if item_type == "reasoning":
            # Summaries are where `<think>` text lands; raw reasoning `content` is the fallback some servers use.
            parts = get_field(item, "summary") or get_field(item, "content") or []
            turn.thinking.extend(f"<think>{get_field(part, 'text')}</think>" for part in parts)
        elif item_type == "function_call":
            turn.tool_calls.append(
                {
                    "id": get_field(item, "call_id"),
                    "type": "function",
                    "function": {"name": get_field(item, "name"), "arguments": get_field(item, "arguments")},
                }
            )
        else:
            content = get_field(item, "content")
            if isinstance(content, str):
                turn.text.append(content)
            else:
                for part in content:
                    part_type = get_field(part, "type")
                    if part_type in ("output_text", "input_text"):
                        turn.text.append(get_field(part, "text"))
                    elif part_type == "refusal":
                        turn.refusals.append(get_field(part, "refusal"))
                    else:
                        raise NotImplementedError(f"Assistant content part {part_type!r} cannot be sent as Chat text")
        if has_token_id_information(item):
            turn.token_information = {key: get_field(item, key) for key in TOKEN_ID_FIELDS}

    def _flush(self, turn: _AssistantTurn, messages: list[ChatMessage]) -> _AssistantTurn:
        """Emit the buffered assistant message (if any) and return a fresh buffer."""
        if not turn.has_items:
            return turn
        content = "".join(turn.thinking) + "".join(turn.text)
        message: ChatMessage = {"role": "assistant", "content": content}
        if turn.tool_calls:
            message["tool_calls"] = turn.tool_calls
            message["content"] = content or None
        if turn.refusals:
            message["refusal"] = "".join(turn.refusals)
        if self.return_token_id_information and turn.token_information is not None:
            message.update(turn.token_information)
        messages.append(message)
        return _AssistantTurn()

    # ------------------------------------------------------------------------------------------------------------------
    # Chat Completions -> Responses
    # ------------------------------------------------------------------------------------------------------------------

    def chat_completion_message_to_output_items(
        self,
        message: NeMoGymChatCompletionMessage | Mapping[str, Any],
        status: Literal["completed", "incomplete"] = "completed",
    ) -> list[OutputItem]:
        """Reasoning item (from `<think>` spans), then a message (if text or a refusal remains, or nothing else was
        produced), then one function call per tool call. A refusal is kept as the message's refusal part, so the
        provider's safety signal reaches the agent. With token fields on `message`, the last item becomes its
        ForTraining variant: it closes the generation those tokens describe."""
        if isinstance(message, Mapping):
            message_cls = (
                NeMoGymChatCompletionMessageForTraining
                if has_token_id_information(message)
                else NeMoGymChatCompletionMessage
            )
            message = message_cls.model_validate(message)

        text = message.content or ""
        items: list[OutputItem] = []
        if self.uses_reasoning_parser:
            spans, text = self._extract_reasoning_from_content(text)
            if spans:
                items.append(
                    # No status: a reasoning item never sends one (see NeMoGymResponseReasoningItem.status).
                    NeMoGymResponseReasoningItem(
                        id=_new_id("rs"), summary=[NeMoGymSummary(text=span) for span in spans]
                    )
                )

        tool_calls = message.tool_calls or []
        refusal = message.refusal or ""
        content: list[NeMoGymResponseOutputText | NeMoGymResponseOutputRefusal] = []
        if text.strip() or (not items and not tool_calls and not refusal):
            content.append(NeMoGymResponseOutputText(text=text))
        if refusal:
            content.append(NeMoGymResponseOutputRefusal(refusal=refusal))
        if content:
            items.append(NeMoGymResponseOutputMessage(id=_new_id("msg"), content=[*content], status=status))
        for tool_call in tool_calls:
            items.append(
                NeMoGymResponseFunctionToolCall(
                    call_id=tool_call.id,
                    id=tool_call.id,
                    name=tool_call.function.name,
                    arguments=tool_call.function.arguments,
                    status=status,
                )
            )

        if has_token_id_information(message):
            last = items[-1]
            token_information = {key: get_field(message, key) for key in TOKEN_ID_FIELDS}
            items[-1] = _TRAINING_VARIANTS[type(last)].model_validate({**last.model_dump(), **token_information})
        return items

    def chat_completion_to_response(
        self,
        responses_create_params: NeMoGymResponseCreateParamsNonStreaming | Mapping[str, Any],
        chat_completion: NeMoGymChatCompletion | Mapping[str, Any],
        *,
        preserve_envelope_id: bool = False,
    ) -> NeMoGymResponse:
        """Wrap the first choice of a Chat completion as a Response that echoes the request parameters.

        The Response gets a fresh `resp_` id, so ids stay unique whatever the backend sends; with
        `preserve_envelope_id` it keeps the completion's own id instead (when it has one), so a call captured under
        that id can be joined back to the response the client scores. A provider's own finish reason
        (`native_finish_reason`, e.g. OpenRouter's "refusal") is kept on the Response under the same name.
        """
        params = responses_create_params
        if not isinstance(params, NeMoGymResponseCreateParamsNonStreaming):
            params = NeMoGymResponseCreateParamsNonStreaming.model_validate(params)
        if not isinstance(chat_completion, NeMoGymChatCompletion):
            chat_completion = NeMoGymChatCompletion.model_validate(chat_completion)
        if not chat_completion.choices:
            raise ValueError(f"Chat completion {chat_completion.id!r} has no choices to convert")

        choice = chat_completion.choices[0]
        incomplete_reason = INCOMPLETE_FINISH_REASONS.get(choice.finish_reason)
        native_finish_reason = get_field(choice, "native_finish_reason")
        provider_fields: dict[str, Any] = {}
        if native_finish_reason is not None:
            provider_fields["native_finish_reason"] = str(native_finish_reason)
        return NeMoGymResponse(
            id=chat_completion.id if preserve_envelope_id and chat_completion.id else _new_id("resp"),
            created_at=chat_completion.created,
            model=chat_completion.model,
            output=[*self.postprocess_chat_response(choice)],  # a new list: the type checker wants the wider type
            status="incomplete" if incomplete_reason else "completed",
            incomplete_details=NeMoGymIncompleteDetails(reason=incomplete_reason) if incomplete_reason else None,
            usage=_responses_usage(chat_completion.usage),
            **{name: getattr(params, name) for name in RESPONSE_ECHO_FIELDS},
            **provider_fields,
        )

    # ------------------------------------------------------------------------------------------------------------------
    # The converter API NeMo Gym's environments call directly (its method names)
    # ------------------------------------------------------------------------------------------------------------------

    @staticmethod
    def _wrap_reasoning_in_think_tags(texts: Sequence[str]) -> str:
        """Reasoning texts as the `<think>` spans an assistant turn carries in Chat form; empty texts add nothing."""
        return "".join(f"<think>{text}</think>" for text in texts if text)

    @staticmethod
    def _parse_think_tags(content: str) -> tuple[list[str], str]:
        """(the text of every `<think>` span, the content with those spans removed)."""
        return THINK_PATTERN.findall(content), THINK_PATTERN.sub("", content)

    def _extract_reasoning_from_content(self, content: str) -> tuple[list[str], str]:
        """Where this converter finds reasoning in model text; a subclass for another reasoning format overrides it."""
        return self._parse_think_tags(content)

    def postprocess_chat_response(self, choice: Any) -> list[OutputItem]:
        """Output items for one Chat choice (ours, or an `openai` SDK one); a cut-off choice gives incomplete items."""
        message = get_field(choice, "message")
        if isinstance(message, BaseModel) and not isinstance(message, NeMoGymChatCompletionMessage):
            message = message.model_dump(exclude_none=True)  # an SDK message: read as the dict it dumps to
        cut_off = get_field(choice, "finish_reason") in INCOMPLETE_FINISH_REASONS
        return self.chat_completion_message_to_output_items(message, status="incomplete" if cut_off else "completed")

    def postprocess_assistant_message_dict(self, message_dict: Mapping[str, Any]) -> list[OutputItem]:
        """Output items for one Chat assistant message given as a plain dict (e.g. read from an agent's log)."""
        return self.chat_completion_message_to_output_items(message_dict)

    def chat_completions_messages_to_responses_items(self, messages: Sequence[Any]) -> list[Any]:
        """A whole Chat conversation as Responses items (see `chat_to_responses.chat_messages_to_responses_items`)."""
        return chat_messages_to_responses_items(messages, self.postprocess_assistant_message_dict)

    def chat_completion_to_responses_create_params(
        self, chat_completion_create_params: NeMoGymChatCompletionCreateParamsNonStreaming | Mapping[str, Any]
    ) -> NeMoGymResponseCreateParamsNonStreaming:
        """A Chat request as the Responses request that asks for the same thing."""
        return chat_params_to_responses_params(
            chat_completion_create_params, self.chat_completions_messages_to_responses_items
        )


VLLMConverter = ResponsesConverter
"""Older name, kept so code written against it keeps working."""
VLLMConverterResponsesToChatCompletionsState = _AssistantTurn
"""NeMo Gym's name for the converter's state while it turns Responses items into Chat messages (an assistant turn
being assembled); importable for compatibility, its fields are this module's own."""


# ----------------------------------------------------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------------------------------------------------


def _plain_text(content: Any) -> str:
    """Text of a system/developer message; such messages cannot carry media in Chat Completions."""
    if isinstance(content, str):
        return content
    texts = []
    for part in content:
        part_type = get_field(part, "type")
        if part_type not in ("input_text", "output_text"):
            raise NotImplementedError(f"Content part {part_type!r} is not allowed in a system or developer message")
        texts.append(get_field(part, "text"))
    return "".join(texts)


def _chat_content(content: Any, role: str) -> str | list[dict[str, Any]]:
    """Responses message content -> Chat content (string, or list of text / image_url / video_url parts)."""
    if isinstance(content, str):
        return content
    if role in ("system", "developer"):
        return [{"type": "text", "text": _plain_text([part])} for part in content]
    parts: list[dict[str, Any]] = []
    for part in content:
        part_type = get_field(part, "type")
        if part_type in ("input_text", "output_text"):
            parts.append({"type": "text", "text": get_field(part, "text")})
        elif part_type == "input_image":
            url = get_field(part, "image_url")
            if url is None:
                raise NotImplementedError("input_image by file_id cannot be sent to Chat Completions; pass image_url")
            parts.append({"type": "image_url", "image_url": {"url": url, "detail": get_field(part, "detail")}})
        elif part_type == "input_video":
            parts.append({"type": "video_url", "video_url": {"url": get_field(part, "video_url")}})
        else:
            raise NotImplementedError(f"Content part {part_type!r} has no Chat Completions equivalent")
    return parts


def _tool_content(output: Any) -> str | list[dict[str, Any]]:
    """function_call_output.output -> Chat tool content; tool messages only carry text."""
    if isinstance(output, str):
        return output
    parts = []
    for part in output:
        part_type = get_field(part, "type")
        if part_type != "input_text":
            raise NotImplementedError(f"function_call_output part {part_type!r} cannot be sent as a Chat tool message")
        parts.append({"type": "text", "text": get_field(part, "text")})
    return parts


def _chat_tool_choice(tool_choice: Any) -> Any:
    if isinstance(tool_choice, NeMoGymToolChoiceFunction):
        return {"type": "function", "function": {"name": tool_choice.name}}
    return tool_choice


def _chat_response_format(text_format: Mapping[str, Any]) -> dict[str, Any] | None:
    """Responses `text.format` -> Chat `response_format`; plain text needs no format."""
    format_type = text_format.get("type")
    if format_type == "json_schema":
        schema = {key: value for key, value in text_format.items() if key != "type"}
        return {"type": "json_schema", "json_schema": schema}
    if format_type == "json_object":
        return {"type": "json_object"}
    return None


def _token_count(value: Any) -> int | None:
    """A provider's token count, or None when it is missing or not a count (a bool, a negative number)."""
    return value if type(value) is int and value >= 0 else None


def _usage_detail(usage: Any, detail_group: str, detail_name: str, *top_level_aliases: str) -> int | None:
    """One token detail of a Chat usage (dict or model): ``usage.<detail_group>.<detail_name>``, else the first of
    the top-level names other providers report it under; None when nobody counted it."""
    found = _token_count(get_field(get_field(usage, detail_group), detail_name))
    for alias in top_level_aliases:
        if found is not None:
            break
        found = _token_count(get_field(usage, alias))
    return found


def _responses_usage(usage: NeMoGymCompletionUsage | None) -> NeMoGymResponseUsage | None:
    """Chat usage -> Responses usage, looking cached / reasoning counts up under the aliases providers use."""
    if usage is None:
        return None
    cached = _usage_detail(
        usage,
        "prompt_tokens_details",
        "cached_tokens",
        "cached_tokens",
        "prompt_cache_hit_tokens",
        "cached_input_tokens",
        "cache_read_input_tokens",
    )
    reasoning = _usage_detail(
        usage, "completion_tokens_details", "reasoning_tokens", "reasoning_tokens", "reasoning_output_tokens"
    )
    return NeMoGymResponseUsage(
        input_tokens=usage.prompt_tokens,
        input_tokens_details=NeMoGymResponseInputTokensDetails(cached_tokens=cached or 0),
        output_tokens=usage.completion_tokens,
        output_tokens_details=NeMoGymResponseOutputTokensDetails(reasoning_tokens=reasoning or 0),
        total_tokens=usage.total_tokens,
    )


__all__ = [
    "INCOMPLETE_FINISH_REASONS",
    "MODEL_GENERATED_ITEM_TYPES",
    "RESPONSE_ECHO_FIELDS",
    "THINK_PATTERN",
    "ResponsesConverter",
    "VLLMConverter",
    "VLLMConverterResponsesToChatCompletionsState",
    "split_responses_input_output_items",
]
