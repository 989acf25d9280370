"""In-process llama.cpp chat engine for the embedded default policy model.

Why this exists: the gym needs a policy model that runs anywhere (CPU only, no network) and still supports
tool calling, reproducible sampling, and the token ids / log-probs RL training needs. llama-cpp-python's
built-in chat handlers spread one reply over several completions, drop tool results from the prompt and do not expose
token ids, so this module renders the prompt itself (with the model's own chat template, see ``nemo_gym/chat_protocol.py``) and drives
the sampler token by token. Every generated token, the tool protocol's headers included, is drawn from the model's own
distribution within one continuous sequence, so ``prompt_token_ids + generation_token_ids`` is exactly what the model
saw and ``generation_log_probs`` are its real log-probs.

Tool protocol: a tool call is ``functions.<name>:\\n`` followed by a JSON object whose shape a grammar derived from
the tool's parameter schema enforces; further calls may follow, each on a new line. A reply either makes calls or
answers in free text, and which one is decided by scoring complete alternatives under the model and sampling among
them at the request's temperature (a 135M model decides far better over whole headers than token by token):

* replying to the user, the alternatives are the call headers and ``message:\\n`` (an announced answer);
* replying right after tool results, they are the call headers and a free-text answer, whose probability is what the
  call headers leave. Offering ``message:`` there makes a small model copy its previous call instead of reading the
  result (measured on SmolLM2-135M: it repeats the call on every turn), while free text after a rendered result is
  what it naturally writes.

``tool_choice`` is honoured: ``none`` hides the tools, ``required`` offers only call headers, a named function only
its header.

The engine is not thread-safe underneath (llama.cpp contexts are not), so every call is serialized by a lock;
servers should invoke :meth:`LlamaCppEngine.chat` from a worker thread.
"""

from __future__ import annotations

import json
import math
import os
import pathlib
import random
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np  # turns raw logits into log-probs

from nemo_gym.chat_protocol import (
    CALL_PREFIX,
    CALL_SUFFIX,
    MESSAGE_HEADER,
    ChatTemplate,
    Tool,
    allowed_headers,
    follows_tool_results,
    normalize_tools,
    protocol_messages,
)
from nemo_gym.embedded_model import find_default_gguf

from .json_grammar import json_schema_to_gbnf
from .native import LlamaModel

_MAX_SEED = 2**31 - 1

# Fallback grammar for tools whose parameter schema the schema converter cannot handle: any JSON object.
_ANY_JSON_OBJECT_GBNF = r"""
root ::= object
value ::= object | array | string | number | ("true" | "false" | "null")
object ::= "{" ws ( string ":" ws value ( "," ws string ":" ws value )* )? "}"
array ::= "[" ws ( value ( "," ws value )* )? "]"
string ::= "\"" ( [^"\\\x7F\x00-\x1F] | "\\" ( ["\\/bfnrt] | "u" [0-9a-fA-F]{4} ) )* "\"" ws
number ::= "-"? ( [0-9] | [1-9] [0-9]{0,15} ) ( "." [0-9]+ )? ( [eE] [-+]? [0-9]+ )? ws
ws ::= " "?
"""


@dataclass
class _Generation:
    """Tokens generated so far for one request, with their log-probs and why generation ended."""

    token_ids: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    truncated: bool = False


def _arguments_grammar(parameters: dict[str, Any]) -> str:
    """GBNF for a tool's argument object; falls back to any JSON object when the schema is unsupported."""
    schema = dict(parameters)
    schema.setdefault("type", "object")
    try:
        return json_schema_to_gbnf(json.dumps(schema))
    except Exception:  # the converter raises assorted errors on exotic schemas
        return _ANY_JSON_OBJECT_GBNF


def _complete_json_object(text: str) -> str | None:
    """Return ``text`` unchanged (so it re-tokenizes as generated) once it is a complete JSON object."""
    if not text.rstrip().endswith("}"):
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return text if isinstance(value, dict) else None


def _default_threads() -> int:
    """Half the usable cores: ggml worker threads spin while waiting, so using every core collapses throughput
    (measured 10x slower on 2 cores) as soon as other gym servers or tests compete for the CPU."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // 2)


class LlamaCppEngine:
    """Loads one GGUF model once and serves serialized, reproducible chat completions from it."""

    def __init__(
        self,
        model_path: str | None = None,
        n_ctx: int = 2048,
        n_threads: int | None = None,
        seed: int = 0,
        verbose: bool = False,
        max_tool_calls: int = 4,
    ) -> None:
        path = pathlib.Path(model_path) if model_path else find_default_gguf()
        if not path.is_file():
            raise FileNotFoundError(f"GGUF model not found: {path}")
        if n_threads is None:
            n_threads = _default_threads()
        self.model_path = str(path)
        self.model_name = path.stem
        self.max_tool_calls = max(1, int(max_tool_calls))
        self._lock = threading.Lock()
        self._seed_source = random.Random(seed)
        self._llm = LlamaModel(self.model_path, n_ctx=n_ctx, n_threads=n_threads, verbose=verbose)
        self.n_ctx = self._llm.n_ctx
        self._n_vocab = self._llm.n_vocab
        self._bos = [self._llm.bos] if self._llm.adds_bos else []
        self.template = ChatTemplate(
            self._llm.metadata("tokenizer.chat_template"),
            bos_token=self._token_text(self._llm.bos),
            eos_token=self._token_text(self._llm.eos),
        )
        self._grammars: dict[str, str] = {}

    def chat(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        tool_choice: str | dict[str, Any] | None = None,
        temperature: float | None = 1.0,
        top_p: float | None = 1.0,
        max_tokens: int | None = None,
        seed: int | None = None,
        stop: str | list[str] | None = None,
        return_token_ids: bool = False,
        parallel_tool_calls: bool = True,
        on_text: Callable[[str], None] | None = None,
    ) -> dict[str, Any]:
        """Run one chat completion and return an OpenAI Chat Completions shaped dict.

        ``on_text`` receives the reply's text as it is generated, in pieces that always add up to a prefix of the
        returned ``content`` (text that may still turn out to be a tool call or a stop string is held back).

        Sampling follows OpenAI semantics (no hidden top-k / min-p / repetition penalty) so the reported
        log-probs describe the distribution the tokens were drawn from, up to temperature and top-p.
        """
        normalized_tools = normalize_tools(tools)
        headers = allowed_headers(normalized_tools, tool_choice)
        stops = [stop] if isinstance(stop, str) else [s for s in (stop or []) if s]
        with self._lock:
            request_seed = (seed if seed is not None else self._seed_source.randrange(_MAX_SEED)) % _MAX_SEED
            prompt_ids = self._render_prompt(messages, normalized_tools if headers else [])
            if len(prompt_ids) >= self.n_ctx:
                return self._response(prompt_ids, _Generation(truncated=True), "", [], "length", return_token_ids)
            sampling = {
                "temp": 1.0 if temperature is None else max(float(temperature), 0.0),
                "top_p": 1.0 if top_p is None else float(top_p),
            }
            budget = self.n_ctx - len(prompt_ids) - 1
            if max_tokens is not None and max_tokens > 0:
                budget = min(budget, int(max_tokens))
            # Always start from an empty KV cache: reusing a cached prefix changes the batch shapes of the
            # prompt evaluation, which perturbs logits slightly and would break same-seed reproducibility.
            self._llm.truncate(0)
            runner = _Runner(self, prompt_ids, budget, sampling, request_seed, on_text)
            if headers:
                calls_cap = self.max_tool_calls if parallel_tool_calls else 1
                free_text = MESSAGE_HEADER in headers and follows_tool_results(messages)
                if free_text:
                    headers = [h for h in headers if h != MESSAGE_HEADER]
                content, calls, finish = runner.run_tool_protocol(
                    headers, normalized_tools, stops, calls_cap, free_text=free_text
                )
            else:
                content, calls, finish = runner.run_text(stops)
            return self._response(prompt_ids, runner.gen, content, calls, finish, return_token_ids)

    def _grammar_for(self, tool: Tool) -> str:
        """Argument grammar for a tool, checked once with llama.cpp's own parser.

        Anything llama.cpp's parser refuses falls back to the any-JSON-object grammar, so sampling never meets a
        grammar it cannot use.
        """
        key = json.dumps(tool.parameters, sort_keys=True)
        if key not in self._grammars:
            grammar = _arguments_grammar(tool.parameters)
            if not self._llm.check_grammar(grammar):
                grammar = _ANY_JSON_OBJECT_GBNF
            self._grammars[key] = grammar
        return self._grammars[key]

    def _tokens(self, text: str, special: bool) -> list[int]:
        """Tokenize without BOS; ``special`` only for our own ChatML scaffolding, never for user text."""
        if not text:
            return []
        return self._llm.tokenize(text.encode("utf-8"), special=special)

    def _token_text(self, token: int) -> str:
        return self._llm.detokenize([token], special=True).decode("utf-8", errors="ignore") if token >= 0 else ""

    def _render_prompt(self, messages: list[dict[str, Any]], tools: list[Tool]) -> list[int]:
        """The conversation through the model's chat template, ending with an open assistant turn.

        Only the template's own markup may produce control tokens; message text is tokenized as plain text.
        """
        segments = self.template.segments(protocol_messages(messages, tools))
        ids: list[int] = []
        for text, markup in segments:
            ids += self._tokens(text, special=markup)
        if self._bos and ids[:1] != self._bos:
            ids = self._bos + ids
        return ids

    def _response(
        self,
        prompt_ids: list[int],
        gen: _Generation,
        content: str | None,
        calls: list[tuple[str, str]],
        finish_reason: str,
        return_token_ids: bool,
    ) -> dict[str, Any]:
        """Assemble the Chat Completions dict; tool call ids are random so they never collide across turns."""
        message: dict[str, Any] = {
            "role": "assistant",
            "content": content,
            "tool_calls": [
                {
                    "id": f"call_{uuid.uuid4().hex[:24]}",
                    "type": "function",
                    "function": {"name": name, "arguments": arguments},
                }
                for name, arguments in calls
            ],
        }
        if return_token_ids:
            message["prompt_token_ids"] = list(prompt_ids)
            message["generation_token_ids"] = list(gen.token_ids)
            message["generation_log_probs"] = list(gen.log_probs)
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.model_name,
            "choices": [{"index": 0, "message": message, "finish_reason": finish_reason, "logprobs": None}],
            "usage": {
                "prompt_tokens": len(prompt_ids),
                "completion_tokens": len(gen.token_ids),
                "total_tokens": len(prompt_ids) + len(gen.token_ids),
            },
        }


class _Runner:
    """Drives one request's generation across stages, always extending a single token sequence."""

    def __init__(
        self,
        engine: LlamaCppEngine,
        prompt_ids: list[int],
        budget: int,
        sampling: dict[str, float],
        seed: int,
        on_text: Callable[[str], None] | None = None,
    ) -> None:
        self.engine = engine
        self.on_text = on_text
        self.sent = ""  # text passed to on_text so far
        self.llm = engine._llm
        self.prompt_ids = prompt_ids
        self.budget = budget
        self.sampling = sampling
        self.seed = seed
        self.stage = 0
        self.gen = _Generation()

    def _next_seed(self) -> int:
        """A distinct, reproducible seed per stage of the request."""
        self.stage += 1
        return (self.seed + 7919 * self.stage) % _MAX_SEED

    def _room(self) -> int:
        return self.budget - len(self.gen.token_ids)

    def _append(self, token: int, log_prob: float) -> None:
        self.gen.token_ids.append(int(token))
        self.gen.log_probs.append(float(log_prob))
        if self._room() <= 0:
            self.gen.truncated = True

    def _log_softmax(self, pointer: Any) -> np.ndarray:
        """Normalize one row of raw llama.cpp logits into log-probs (float64 for stable sums)."""
        logits = np.ctypeslib.as_array(pointer, shape=(self.engine._n_vocab,)).astype(np.float64)
        peak = logits.max()
        return logits - (peak + np.log(np.exp(logits - peak).sum()))

    def _current_log_probs(self) -> np.ndarray:
        """Log-probs of the next token after the last evaluated position."""
        return self._log_softmax(self.llm.logits(-1))

    def _goto(self, sequence: list[int]) -> None:
        """Make the context hold exactly ``sequence`` with fresh logits for its last token.

        Only the part after the longest prefix already in the KV cache is evaluated.
        """
        cached = self.llm.tokens
        common = 0
        limit = min(len(cached), len(sequence) - 1)
        while common < limit and cached[common] == sequence[common]:
            common += 1
        self.llm.truncate(common)
        self.llm.evaluate(sequence[common:])

    def _is_eog(self, token: int) -> bool:
        return self.llm.is_eog(token)

    def _decode(self, tokens: list[int]) -> str:
        return self.llm.detokenize(tokens).decode("utf-8", errors="ignore")

    def _raw_text(self) -> str:
        return self._decode([t for t in self.gen.token_ids if not self._is_eog(t)])

    def _eval_with_all_logits(self, tokens: list[int]) -> list[np.ndarray]:
        """Evaluate ``tokens`` in one decode and return next-token log-probs after each of them.

        Plain evaluation keeps only the last position's logits (no n_ctx x n_vocab buffer), so scoring a
        multi-token header would cost one decode per token; asking llama.cpp for every position's logits in one
        small batch makes it one decode per header.
        """
        self.llm.evaluate(tokens, all_logits=True)
        return [self._log_softmax(self.llm.logits(i)) for i in range(len(tokens))]

    def _choose(self, options: list[list[int]], free_text: bool = False) -> int | None:
        """Pick one of several fixed token sequences, scored by the model, and append it to the output.

        Scoring whole sequences (instead of letting a grammar steer token by token) asks the model which
        continuation it prefers as a whole, so tokenization quirks of the headers cannot bias the choice.
        With ``free_text`` one more alternative is anything else the model might write, with the probability the
        options leave; picking it (index ``len(options)``) appends nothing.
        Returns the option index, or None when the token budget cut the option short.
        """
        base = self.prompt_ids + self.gen.token_ids
        if len(base) + max(len(o) for o in options) > self.engine.n_ctx:
            self.gen.truncated = True  # scoring would run past the context window
            return None
        self._goto(base)
        first = self._current_log_probs()
        scores: list[list[float]] = []
        for option in options:
            rows = [first]
            if len(option) > 1:
                self.llm.truncate(len(base))
                rows += self._eval_with_all_logits(option[:-1])
            scores.append([min(float(row[token]), 0.0) for row, token in zip(rows, option, strict=True)])
        totals = [sum(s) for s in scores]
        if free_text:
            rest = 1.0 - sum(math.exp(t) for t in totals)
            totals.append(math.log(max(rest, 1e-12)))
        pick = self._sample_option(totals, random.Random(self._next_seed()))
        if pick == len(options):
            return pick
        for token, log_prob in zip(options[pick], scores[pick], strict=True):
            if self._room() <= 0:
                self.gen.truncated = True
                return None
            self._append(token, log_prob)
        return pick

    def _sample_option(self, totals: list[float], rng: random.Random) -> int:
        """Sample an option index from the model's sequence scores under temperature and top-p."""
        temp = self.sampling["temp"]
        best = max(range(len(totals)), key=totals.__getitem__)
        if temp <= 0.0 or len(totals) == 1:
            return best
        scaled = [t / temp for t in totals]
        peak = max(scaled)
        weights = [math.exp(s - peak) for s in scaled]
        norm = sum(weights)
        ranked = sorted(range(len(totals)), key=lambda i: -weights[i])
        kept: list[int] = []
        mass = 0.0
        for index in ranked:
            kept.append(index)
            mass += weights[index] / norm
            if mass >= self.sampling["top_p"]:
                break
        return rng.choices(kept, weights=[weights[i] for i in kept])[0]

    def _stream(self, grammar: str | None) -> Any:
        """Sample tokens continuing the sequence, yielding each after recording it, until the budget is spent.

        Each call builds a fresh sampler (fresh grammar state) seeded from the request seed; only the part of the
        sequence the KV cache does not hold yet is evaluated.
        """
        if self._room() <= 0:
            self.gen.truncated = True
            return
        seed = self._next_seed()
        self._goto(self.prompt_ids + self.gen.token_ids)
        generator = self.llm.sample(self.sampling["temp"], self.sampling["top_p"], seed, grammar)
        try:
            for token in generator:
                self._append(token, float(self._current_log_probs()[token]))
                yield int(token)
                if self.gen.truncated:
                    return
        finally:
            generator.close()

    def run_text(self, stops: list[str]) -> tuple[str, list[tuple[str, str]], str]:
        """Free-form generation until end-of-turn, a stop string, or the token budget."""
        content, _, finish = self._text_or_late_call(stops, set())
        return content, [], finish

    def _text_or_late_call(self, stops: list[str], tool_names: set[str]) -> tuple[str, str | None, str]:
        """Free text, unless the model opens it with a declared tool's call header: then that tool's name.

        A small model that chose to answer sometimes writes a call anyway (the protocol is in its prompt); such a
        reply is a call. What it wrote is taken back and replaced by the header exactly as the protocol spells it
        (with the model's log-probs for those tokens), so its arguments follow under the tool's grammar like any
        other call's, whatever tokens the model had split the header into.
        """
        start = len(self.gen.token_ids)
        for token in self._stream(None):
            if self._is_eog(token):
                return self._decode(self.gen.token_ids[start:-1]), None, "stop"
            text = self._decode(self.gen.token_ids[start:])
            opening = text.lstrip()
            if opening.startswith(CALL_PREFIX) and ":" in opening:
                name = opening[len(CALL_PREFIX) : opening.index(":")]
                if name in tool_names:
                    del self.gen.token_ids[start:], self.gen.log_probs[start:]
                    self.gen.truncated = False
                    header = self.engine._tokens(f"{CALL_PREFIX}{name}{CALL_SUFFIX}", special=False)
                    return "", name, "tool_calls" if self._choose([header]) is not None else "length"
            if stops:
                cut = min((i for i in (text.find(s) for s in stops) if i >= 0), default=-1)
                if cut >= 0:
                    return text[:cut], None, "stop"
            self._send_text(text, stops, bool(tool_names))
        return self._decode(self.gen.token_ids[start:]), None, "length"

    def _send_text(self, text: str, stops: list[str], may_be_call: bool) -> None:
        """Pass on the part of ``text`` that can no longer change: not a possible call header, no stop string's start."""
        if self.on_text is None or not text.startswith(self.sent):
            return
        opening = text.lstrip()
        if may_be_call and (CALL_PREFIX.startswith(opening) or opening.startswith(CALL_PREFIX)):
            return
        safe = len(text)
        for stop in stops:
            for size in range(min(len(stop) - 1, len(text)), 0, -1):
                if text.endswith(stop[:size]):
                    safe = min(safe, len(text) - size)
                    break
        if safe > len(self.sent):
            self.on_text(text[len(self.sent) : safe])
            self.sent = text[:safe]

    def _arguments(self, tool: Tool) -> str | None:
        """Generate one grammar-constrained argument object; None when the budget ran out first."""
        start = len(self.gen.token_ids)
        for token in self._stream(self.engine._grammar_for(tool)):
            if self._is_eog(token):
                break
            complete = _complete_json_object(self._decode(self.gen.token_ids[start:]))
            if complete is not None:
                return complete
        return None

    def run_tool_protocol(
        self, headers: list[str], tools: list[Tool], stops: list[str], max_calls: int, free_text: bool = False
    ) -> tuple[str | None, list[tuple[str, str]], str]:
        """Header decision, then either a plain message or one or more grammar-constrained tool calls.

        ``free_text``: a free-text answer is one more alternative to the headers (see the module docstring).

        Small models rarely stop calling tools on their own, so after ``max_calls`` calls, or as soon as a
        call repeats an earlier one, the end-of-turn token is forced. Repeats are still returned so that the
        returned calls always re-render to exactly the generated tokens.
        """
        tokens = self.engine._tokens
        by_name = {t.name: t for t in tools}
        pick = self._choose([tokens(h, special=False) for h in headers], free_text=free_text)
        if pick is None:
            return self._raw_text(), [], "length"
        if pick == len(headers) or headers[pick] == MESSAGE_HEADER:
            content, late_call, finish = self._text_or_late_call(stops, {t.name for t in tools})
            if late_call is None or finish == "length":
                return content if late_call is None else self._raw_text(), [], finish
            name = late_call
        else:
            name = headers[pick][len(CALL_PREFIX) : -len(CALL_SUFFIX)]
        eog = [self.llm.eos]
        follow_ups = [eog] + [tokens(f"\n{t.header}", special=False) for t in tools]
        calls: list[tuple[str, str]] = []
        seen: set[tuple[str, str]] = set()
        while True:
            arguments = self._arguments(by_name[name])
            if arguments is None:
                return self._raw_text(), [], "length"
            key = (name, json.dumps(json.loads(arguments), sort_keys=True))
            repeated = key in seen
            seen.add(key)
            calls.append((name, arguments))
            done = repeated or len(calls) >= max_calls
            pick = self._choose([eog] if done else follow_ups)
            if pick is None or pick == 0 or done:
                # pick None: the calls so far are complete, there was just no room left to end the turn.
                return None, calls, "tool_calls"
            name = tools[pick - 1].name
