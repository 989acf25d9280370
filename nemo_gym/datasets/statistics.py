"""Per-dataset statistics, computed in one streaming pass and mergeable across datasets.

A row is folded into running accumulators and then forgotten, so memory does not grow with the number of rows. The
one exception is the exact distinct counts (unique create params, unique user messages, unique string values of a
field): they keep one 64-bit hash per *distinct* value, about 60 bytes each.

Numeric statistics use Welford's update (numerically stable, and two accumulators merge exactly, so the metrics of a
collated file are the merge of its datasets' metrics). The standard deviation is the population one, so repeating every
row ``n`` times leaves averages and deviations unchanged and only multiplies the counts.

Input length is measured on the JSON dump of ``responses_create_params`` (``json.dumps`` with its default separators):

* always as a word count (whitespace-separated pieces), a tokenizer-free proxy that is identical on every machine;
* also in ``o200k_base`` tokens when the optional ``tiktoken`` package is installed *and* can load that encoding.
  tiktoken downloads the encoding file on first use, so offline it is only available when the file is already in
  its cache (``TIKTOKEN_CACHE_DIR``). tiktoken is therefore not a dependency; the token key is optional in metrics
  files and is not a conflict when one machine has it and another does not.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import orjson

from nemo_gym.config.datasets import AGENT_REF_KEY
from nemo_gym.datasets.validation import CREATE_PARAMS_KEY

EXAMPLES_KEY = "Number of examples"
INVALID_KEY = "Number of invalid rows"
TOOLS_KEY = "Number of tools"
WORDS_KEY = "Json-dumped number of words (proxy for token count)"
TOKENIZER_NAME = "o200k_base"
TOKENS_KEY = f"Json-dumped number of {TOKENIZER_NAME} tokens"
TURNS_KEY = "Number of turns"
UNIQUE_PARAMS_KEY = "Number of unique create params"
UNIQUE_USER_MESSAGES_KEY = "Number of unique user messages"
SAMPLING_PARAMS: dict[str, str] = {
    "temperature": "Temperature",
    "top_p": "Top p",
    "max_output_tokens": "Max output tokens",
}
"""Sampling params of ``responses_create_params`` that get a statistics block: param -> metrics key."""

OPTIONAL_KEYS = frozenset({TOKENS_KEY})
"""Metrics that depend on what is installed; their absence from a new computation is not a difference."""

SKIPPED_FIELDS = frozenset({CREATE_PARAMS_KEY, "response", AGENT_REF_KEY})
"""Top-level row fields that get no per-field statistics (they have their own, or are injected by collation)."""

COUNT = "Total # non-null values"
AVERAGE = "Average"
MINIMUM = "Min"
MAXIMUM = "Max"
STD = "Standard deviation"
UNIQUE_COUNT = "unique_count"
TOTAL_COUNT = "total_count"


def round_metric(value: float | int | None) -> float | int | None:
    """Two decimals for magnitudes of 1 or more, three below: stable files, differences still visible."""
    if value is None or isinstance(value, int):
        return value
    return round(value, 2) if abs(value) >= 1 else round(value, 3)


@dataclass
class RunningStats:
    """Count, mean, spread and range of a stream of numbers (Welford; weighted adds; exact merges)."""

    count: int = 0
    mean: float = 0.0
    m2: float = 0.0
    minimum: float | int | None = None
    maximum: float | int | None = None

    def add(self, value: float | int, weight: int = 1) -> None:
        """Fold in ``value`` as if it occurred ``weight`` times (a merge with a zero-spread block, inlined)."""
        total = self.count + weight
        delta = value - self.mean
        self.mean += delta * weight / total
        self.m2 += delta * delta * self.count * weight / total
        if self.minimum is None or value < self.minimum:
            self.minimum = value
        if self.maximum is None or value > self.maximum:
            self.maximum = value
        self.count = total

    def merge(self, other: RunningStats) -> None:
        if other.count == 0:
            return
        if self.count == 0:
            self.count, self.mean, self.m2 = other.count, other.mean, other.m2
            self.minimum, self.maximum = other.minimum, other.maximum
            return
        total = self.count + other.count
        delta = other.mean - self.mean
        self.mean += delta * other.count / total
        self.m2 += other.m2 + delta * delta * self.count * other.count / total
        self.count = total
        if other.minimum is not None and (self.minimum is None or other.minimum < self.minimum):
            self.minimum = other.minimum
        if other.maximum is not None and (self.maximum is None or other.maximum > self.maximum):
            self.maximum = other.maximum

    @property
    def std(self) -> float | None:
        return math.sqrt(max(self.m2, 0.0) / self.count) if self.count else None

    def to_metrics(self) -> dict[str, Any]:
        empty = self.count == 0
        return {
            COUNT: self.count,
            AVERAGE: None if empty else round_metric(self.mean),
            MINIMUM: round_metric(self.minimum),
            MAXIMUM: round_metric(self.maximum),
            STD: None if empty else round_metric(self.std),
        }


def _hash64(value: Any) -> int:
    """A stable 64-bit identity of a JSON value (key order does not matter)."""
    canonical = orjson.dumps(value, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS)
    return int.from_bytes(hashlib.blake2b(canonical, digest_size=8).digest(), "little")


@dataclass
class DistinctCounter:
    """Exact number of distinct JSON values seen, keeping a 64-bit hash of each distinct one."""

    hashes: set[int] = field(default_factory=set)

    def add(self, value: Any) -> None:
        self.hashes.add(_hash64(value))

    def merge(self, other: DistinctCounter) -> None:
        self.hashes |= other.hashes

    def __len__(self) -> int:
        return len(self.hashes)


@dataclass
class FieldStats:
    """Statistics of one other top-level field: numbers (and booleans) as a stats block, strings as counts."""

    numbers: RunningStats = field(default_factory=RunningStats)
    strings: DistinctCounter = field(default_factory=DistinctCounter)
    string_total: int = 0

    def add(self, value: Any, weight: int) -> None:
        values = _flatten(value) if isinstance(value, list) else [value]
        for item in values:
            if isinstance(item, bool | int | float) and not (isinstance(item, float) and math.isnan(item)):
                self.numbers.add(int(item) if isinstance(item, bool) else item, weight)
            elif isinstance(item, str):
                self.strings.add(item)
                self.string_total += weight

    def merge(self, other: FieldStats) -> None:
        self.numbers.merge(other.numbers)
        self.strings.merge(other.strings)
        self.string_total += other.string_total

    def to_metrics(self) -> dict[str, Any] | None:
        """The block for the metrics file; None when the field never held a number or a string."""
        block: dict[str, Any] = {}
        if self.numbers.count:
            block.update(self.numbers.to_metrics())
        if self.string_total:
            block.update({UNIQUE_COUNT: len(self.strings), TOTAL_COUNT: self.string_total})
        return block or None


def _flatten(values: list[Any]) -> list[Any]:
    flat: list[Any] = []
    for value in values:
        flat.extend(_flatten(value) if isinstance(value, list) else [value])
    return flat


@lru_cache(maxsize=1)
def _tiktoken_encoding() -> Any | None:
    """The o200k_base encoding if tiktoken is installed and can load it (offline only from its cache), else None."""
    try:
        import tiktoken
    except ImportError:
        return None
    try:
        return tiktoken.get_encoding(TOKENIZER_NAME)
    except Exception:  # no network, no cached file, or a broken install: fall back to the word proxy
        return None


def token_counting_available() -> bool:
    """Whether metrics will carry the real token count next to the word proxy."""
    return _tiktoken_encoding() is not None


def user_messages(params: dict[str, Any]) -> list[Any]:
    """The contents of the user messages in ``input`` (a plain string input is one user message)."""
    items = params.get("input")
    if isinstance(items, str):
        return [items]
    if not isinstance(items, list):
        return []
    return [item.get("content") for item in items if isinstance(item, dict) and item.get("role") == "user"]


@dataclass
class DatasetStatistics:
    """Everything the metrics file reports about a stream of valid rows (and the count of invalid ones)."""

    examples: int = 0
    invalid: int = 0
    tools: RunningStats = field(default_factory=RunningStats)
    words: RunningStats = field(default_factory=RunningStats)
    tokens: RunningStats = field(default_factory=RunningStats)
    turns: RunningStats = field(default_factory=RunningStats)
    sampling: dict[str, RunningStats] = field(default_factory=lambda: {key: RunningStats() for key in SAMPLING_PARAMS})
    unique_params: DistinctCounter = field(default_factory=DistinctCounter)
    unique_user_messages: DistinctCounter = field(default_factory=DistinctCounter)
    fields: dict[str, FieldStats] = field(default_factory=dict)

    def add(self, row: dict[str, Any], repeats: int = 1) -> None:
        """Fold in one valid row that the output will hold ``repeats`` times."""
        params = row.get(CREATE_PARAMS_KEY) or {}
        self.examples += repeats
        self.tools.add(len(params.get("tools") or []), repeats)
        dumped = json.dumps(params, ensure_ascii=False)
        self.words.add(len(dumped.split()), repeats)
        encoding = _tiktoken_encoding()
        if encoding is not None:
            self.tokens.add(len(encoding.encode(dumped, disallowed_special=())), repeats)
        messages = user_messages(params)
        self.turns.add(len(messages), repeats)
        for message in messages:
            self.unique_user_messages.add(message)
        for param, stats in self.sampling.items():
            value = params.get(param)
            if isinstance(value, int | float) and not isinstance(value, bool):
                stats.add(value, repeats)
        self.unique_params.add(params)
        for name, value in row.items():
            if name not in SKIPPED_FIELDS:
                self.fields.setdefault(name, FieldStats()).add(value, repeats)

    def merge(self, other: DatasetStatistics) -> None:
        self.examples += other.examples
        self.invalid += other.invalid
        for mine, theirs in (
            (self.tools, other.tools),
            (self.words, other.words),
            (self.tokens, other.tokens),
            (self.turns, other.turns),
        ):
            mine.merge(theirs)
        for param, stats in other.sampling.items():
            self.sampling.setdefault(param, RunningStats()).merge(stats)
        self.unique_params.merge(other.unique_params)
        self.unique_user_messages.merge(other.unique_user_messages)
        for name, field_stats in other.fields.items():
            self.fields.setdefault(name, FieldStats()).merge(field_stats)

    def to_metrics(self, header: dict[str, Any] | None = None) -> dict[str, Any]:
        """The statistics under their metrics-file keys, after ``header``: fixed keys first, then other fields by name.

        A row field whose name is already taken (``name``, ``type``, ``Number of examples``, ...) is reported as
        ``"<field> (row field)"`` rather than overwriting the header or a statistic.
        """
        metrics: dict[str, Any] = dict(header or {})
        metrics |= {
            EXAMPLES_KEY: self.examples,
            INVALID_KEY: self.invalid,
            TOOLS_KEY: self.tools.to_metrics(),
            WORDS_KEY: self.words.to_metrics(),
        }
        if self.tokens.count:
            metrics[TOKENS_KEY] = self.tokens.to_metrics()
        metrics[TURNS_KEY] = self.turns.to_metrics()
        for param, key in SAMPLING_PARAMS.items():
            metrics[key] = self.sampling[param].to_metrics()
        metrics[UNIQUE_PARAMS_KEY] = len(self.unique_params)
        metrics[UNIQUE_USER_MESSAGES_KEY] = len(self.unique_user_messages)
        for name in sorted(self.fields):
            block = self.fields[name].to_metrics()
            if block is not None:
                metrics[f"{name} (row field)" if name in metrics else name] = block
        return metrics
