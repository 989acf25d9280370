"""The policy being trained, as a chat engine: a transformers causal LM that answers like the embedded model.

Prompts are rendered and replies parsed with the embedded model's own protocol (``nemo_gym/chat_protocol.py``), so a
checkpoint trained here is scored by the same rules as ``llamacpp_model``. Every answer carries the token ids and
log-probs a trainer needs, and the ids form a chain across the turns of a rollout: when the conversation holds an
earlier assistant turn that came with its ids, the new prompt is that turn's prompt + generated ids + the ids of the
messages after it (:func:`splice_history`). What the model said is never re-tokenized, so a trainer scores exactly the
tokens that were sampled (``nemo_gym/training/drift.py`` checks it).

One object serves both sides of training: the trainer optimizes ``policy.model`` in place while the policy server
(``nemo_gym/training/policy_server.py``) generates from the same object, so each step's rollouts use the newest
weights. torch and transformers are imported lazily: they come with the ``train`` extra.
"""

from __future__ import annotations

import json
import math
import pathlib
import threading
import time
import uuid
from collections.abc import Sequence
from typing import Any

from nemo_gym.chat_protocol import (
    MESSAGE_HEADER,
    ChatTemplate,
    Tool,
    allowed_headers,
    follows_tool_results,
    normalize_tools,
    parse_reply,
    protocol_messages,
)
from nemo_gym.embedded_model import find_default_gguf
from nemo_gym.errors import ConfigError

__all__ = ["HFPolicy", "load_policy_model", "splice_history"]


def load_policy_model(path: str | None = None) -> tuple[Any, Any]:
    """``(model, tokenizer)`` in fp32 from a checkpoint directory, a GGUF file, or (``None``) the embedded GGUF.

    A GGUF is de-quantized by transformers on load; the result is plain fp32 weights, so it is marked as such and
    can be trained (transformers otherwise refuses to train a model it loaded from a quantized file).
    """
    try:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as e:
        raise ConfigError(
            f"training needs the 'train' extra (torch, transformers, trl): pip install -e '.[train]' ({e})"
        ) from e
    source = pathlib.Path(path) if path else find_default_gguf()
    if not source.exists():
        raise ConfigError(f"model path {str(source)!r} does not exist: give a checkpoint directory or a .gguf file")
    if source.is_file():
        options: dict[str, Any] = {"gguf_file": source.name}
        tokenizer = AutoTokenizer.from_pretrained(source.parent, **options)
        model: Any = AutoModelForCausalLM.from_pretrained(source.parent, dtype=torch.float32, **options)
        model.hf_quantizer = None
        model.is_quantized = False
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
    else:
        tokenizer = AutoTokenizer.from_pretrained(source)
        model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    model.generation_config.pad_token_id = tokenizer.pad_token_id or tokenizer.eos_token_id
    return model, tokenizer


def splice_history(
    full_ids: list[int], history_ids: list[int], turn_end_count: int, end_id: int
) -> tuple[list[int], int]:
    """``history_ids`` followed by what ``full_ids`` renders after the ``turn_end_count``-th end-of-turn token.

    ``full_ids`` is the whole conversation re-rendered; its first ``turn_end_count`` turns are the ones an earlier
    generation already saw and wrote, whose exact ids are ``history_ids`` (that turn's prompt + generated ids). Returns
    the spliced ids and where the new part starts. A history that stopped without its end-of-turn token (cut by the
    length limit) gets one, as the template closes every turn.
    """
    seen = 0
    for position, token in enumerate(full_ids):
        if token == end_id:
            seen += 1
            if seen == turn_end_count:
                history = list(history_ids) if history_ids[-1:] == [end_id] else [*history_ids, end_id]
                return history + full_ids[position + 1 :], len(history)
    raise ValueError(f"the re-rendered conversation has {seen} end-of-turn tokens, fewer than {turn_end_count}")


class HFPolicy:
    """Chat Completions from a transformers model, in the embedded model's protocol, with token ids and log-probs.

    ``chat`` holds a lock: one generation at a time, and never while :meth:`updating` holds it for a weight change.
    """

    def __init__(self, model: Any, tokenizer: Any, name: str = "policy") -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.name = name
        self.lock = threading.RLock()
        self.end_id = int(tokenizer.eos_token_id)
        self.template = ChatTemplate(
            getattr(tokenizer, "chat_template", None), tokenizer.bos_token or "", tokenizer.eos_token or ""
        )

    @classmethod
    def load(cls, path: str | None = None) -> HFPolicy:
        model, tokenizer = load_policy_model(path)
        name = pathlib.Path(path).stem if path else find_default_gguf().stem
        return cls(model, tokenizer, name=name)

    def _tokens(self, text: str, markup: bool) -> list[int]:
        """Only the template's markup may become control tokens; message text is always plain text."""
        ids = self.tokenizer.encode(text, add_special_tokens=False, split_special_tokens=not markup)
        return [int(i) for i in ids]

    def render(self, messages: Sequence[dict[str, Any]], tools: list[Tool]) -> list[int]:
        """The conversation's prompt ids, spliced onto the ids of its last generated turn when it carries them."""
        turns = protocol_messages(list(messages), tools)
        full = [i for text, markup in self.template.segments(turns) for i in self._tokens(text, markup)]
        last = _last_generated_turn(messages)
        if last is None:
            return full
        index, message = last
        before = protocol_messages(list(messages[: index + 1]), tools)
        rendered_before = [i for text, markup in self.template.segments(before) for i in self._tokens(text, markup)]
        turn_ends = rendered_before.count(self.end_id)
        history = [*message["prompt_token_ids"], *message["generation_token_ids"]]
        spliced, _ = splice_history(full, history, turn_ends, self.end_id)
        return spliced

    def chat(
        self,
        messages: Sequence[dict[str, Any]],
        tools: Sequence[dict[str, Any]] | None = None,
        tool_choice: Any = None,
        temperature: float | None = 1.0,
        top_p: float | None = 1.0,
        max_tokens: int | None = None,
        seed: int | None = None,
        return_token_ids: bool = True,
    ) -> dict[str, Any]:
        """One Chat Completions dict; ``tool_choice="none"`` hides the tools, any other value offers them all."""
        import torch

        normalized = normalize_tools(list(tools or []))
        headers = allowed_headers(normalized, tool_choice)
        with self.lock, torch.no_grad():
            prompt_ids = self.render(messages, normalized if headers else [])
            forced: list[int] = []
            if headers:
                free_text = MESSAGE_HEADER in headers and follows_tool_results(list(messages))
                options = [h for h in headers if not (free_text and h == MESSAGE_HEADER)]
                pick = self._choose(prompt_ids, [self._tokens(h, False) for h in options], temperature, free_text)
                if pick < len(options):
                    forced = self._tokens(options[pick] + _arguments_opening(options[pick], normalized), False)
            budget = max_tokens or 256
            generated, log_probs, stopped = self._generate(prompt_ids, forced, temperature, top_p, budget, seed)
        text = self.tokenizer.decode(generated, skip_special_tokens=True)
        content, calls = parse_reply(text, normalized)
        finish = "tool_calls" if calls else ("stop" if stopped else "length")
        message: dict[str, Any] = {
            "role": "assistant",
            "content": content,
            "tool_calls": [
                {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function", "function": {"name": n, "arguments": a}}
                for n, a in calls
            ],
        }
        if return_token_ids:
            message |= {"prompt_token_ids": prompt_ids, "generation_token_ids": generated}
            message["generation_log_probs"] = log_probs
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.name,
            "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
            "usage": {
                "prompt_tokens": len(prompt_ids),
                "completion_tokens": len(generated),
                "total_tokens": len(prompt_ids) + len(generated),
            },
        }

    def _log_probs(self, ids: list[int], start: int, temperature: float) -> Any:
        """Log-softmax rows (at ``temperature``) predicting ``ids[start:]``."""
        import torch

        device = next(self.model.parameters()).device
        logits = self.model(torch.tensor([ids], device=device)).logits[0, start - 1 : len(ids) - 1].float()
        return torch.log_softmax(logits / temperature, dim=-1)

    def _choose(
        self, prompt_ids: list[int], options: list[list[int]], temperature: float | None, free_text: bool
    ) -> int:
        """Which reply header to write, by each whole header's probability under the model, sampled at the
        request's temperature (as the embedded engine decides); ``len(options)``: free text, when offered."""
        import torch

        totals = []
        for option in options:
            rows = self._log_probs(prompt_ids + option, len(prompt_ids), 1.0)
            totals.append(float(rows[torch.arange(len(option)), torch.tensor(option)].sum()))
        if free_text:
            totals.append(math.log(max(1.0 - sum(math.exp(t) for t in totals), 1e-12)))
        scores = torch.tensor(totals)
        if not temperature or len(totals) == 1:
            return int(scores.argmax())
        return int(torch.multinomial(torch.softmax(scores / float(temperature), dim=-1), 1))

    def _generate(
        self,
        prompt_ids: list[int],
        forced: list[int],
        temperature: float | None,
        top_p: float | None,
        max_tokens: int,
        seed: int | None,
    ) -> tuple[list[int], list[float], bool]:
        """``forced`` (a chosen header) then sampled ids, their log-probs under the sampling temperature (what a
        trainer recomputes), and whether the model ended its turn."""
        import torch

        temperature = 1.0 if temperature is None else float(temperature)
        sample = temperature > 0
        scale = temperature if sample else 1.0
        if seed is not None:
            torch.manual_seed(seed)
        forced = forced[:max_tokens]
        log_probs: list[float] = []
        if forced:
            rows = self._log_probs(prompt_ids + forced, len(prompt_ids), scale)
            log_probs = [float(rows[i, token]) for i, token in enumerate(forced)]
        device = next(self.model.parameters()).device
        inputs = torch.tensor([prompt_ids + forced], device=device)
        options: dict[str, Any] = {"max_new_tokens": max_tokens - len(forced), "eos_token_id": self.end_id}
        options |= {"do_sample": sample, "top_k": 0, "temperature": scale, "top_p": 1.0 if top_p is None else top_p}
        if not sample:
            options |= {"temperature": None, "top_p": None, "top_k": None}
        if options["max_new_tokens"] <= 0:
            return forced, log_probs, False
        out = self.model.generate(
            inputs, attention_mask=torch.ones_like(inputs), return_dict_in_generate=True, output_logits=True, **options
        )
        sampled = [int(i) for i in out.sequences[0, inputs.shape[1] :]]
        log_probs += [
            float(torch.log_softmax(logits[0].float() / scale, dim=-1)[token])
            for logits, token in zip(out.logits, sampled, strict=False)
        ]
        generated = forced + sampled
        return generated, log_probs, bool(sampled) and sampled[-1] == self.end_id


def _arguments_opening(header: str, tools: list[Tool]) -> str:
    """The start of a call's JSON arguments, up to its first property's value: ``{"city": "``.

    The embedded engine holds a call's arguments to its schema with a grammar; sampling freely, a 135M model writes
    a schema instead of arguments. Opening the object with its first (required) property keeps it on the arguments
    while leaving the value, and the rest of the object, to the model.
    """
    tool = next((t for t in tools if t.header == header), None)
    properties = (tool.parameters.get("properties") or {}) if tool else {}
    if not properties:
        return ""
    required = [name for name in tool.parameters.get("required") or [] if name in properties] if tool else []
    first = (required or list(properties))[0]
    quote = '"' if (properties[first] or {}).get("type") == "string" else ""
    return "{" + json.dumps(first) + ": " + quote


def _last_generated_turn(messages: Sequence[dict[str, Any]]) -> tuple[int, dict[str, Any]] | None:
    """The last assistant message that carries its generation's ids, with its index."""
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if (
            message.get("role") == "assistant"
            and message.get("prompt_token_ids")
            and message.get("generation_token_ids")
        ):
            return index, message
    return None
