"""Token usage of a Responses call, shaped as the installed `openai` SDK shapes it, and its sum over a rollout.

Apart from `openai_responses.py` because usage is its own concern: which keys a dump has depends on the installed SDK
(NeMo Gym's environments pin openai 2.7 and compare usage dicts), and counts are added up across a rollout's calls.
"""

from __future__ import annotations

import ast
import importlib.util
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator

from nemo_gym.openai_base import NeMoGymLenientModel

__all__ = [
    "NeMoGymResponseInputTokensDetails",
    "NeMoGymResponseOutputTokensDetails",
    "NeMoGymResponseUsage",
    "accumulate_response_usage",
]


_SDK_COUNTS_CACHE_WRITES: bool | None = None
"""Whether the installed ``openai`` has ``cache_write_tokens`` in its usage details (2.30 on; 2.7, NeMo Gym's pin, has
not). None until the first usage dump asks: importing this module must not import the SDK."""


_SDK_USAGE_MODULE = "openai.types.responses.response_usage"


def _sdk_declared_input_details_fields() -> frozenset[str] | None:
    """The fields the installed SDK's ``InputTokensDetails`` declares, read from its source without importing it.

    Importing that one module imports the whole SDK (``openai/__init__`` loads its HTTP clients and ~900 modules,
    ~20 MB): a server that only dumps usage paid that on its first rollout. None when the class cannot be read that
    way (no source file, the class moved or inherits its fields): the caller imports it then.
    """
    spec = importlib.util.find_spec("openai")  # a top-level name: located, not imported
    if spec is None or not spec.submodule_search_locations:
        return None
    source = Path(spec.submodule_search_locations[0], *_SDK_USAGE_MODULE.split(".")[1:]).with_suffix(".py")
    try:
        tree = ast.parse(source.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return None
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "InputTokensDetails":
            if [ast.unparse(base) for base in node.bases] != ["BaseModel"]:
                return None
            return frozenset(
                item.target.id
                for item in node.body
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)
            )
    return None


def _sdk_counts_cache_writes() -> bool:
    """Whether the installed SDK's usage details have ``cache_write_tokens`` (True without an SDK)."""
    loaded = sys.modules.get(_SDK_USAGE_MODULE)
    if loaded is None and importlib.util.find_spec("openai") is None:
        return True
    if loaded is None and (declared := _sdk_declared_input_details_fields()) is not None:
        return "cache_write_tokens" in declared
    try:
        from openai.types.responses.response_usage import InputTokensDetails
    except ImportError:
        return True
    return "cache_write_tokens" in InputTokensDetails.model_fields


def _unknown_to_the_sdk(_: object) -> bool:
    """A usage dump has the keys the installed SDK's own model has: newer SDKs require ``cache_write_tokens``, and an
    environment written for NeMo Gym on openai 2.7 compares usage dicts that lack it."""
    global _SDK_COUNTS_CACHE_WRITES
    if _SDK_COUNTS_CACHE_WRITES is None:
        _SDK_COUNTS_CACHE_WRITES = _sdk_counts_cache_writes()
    return not _SDK_COUNTS_CACHE_WRITES


class NeMoGymResponseInputTokensDetails(NeMoGymLenientModel):
    cached_tokens: int | None = 0
    """None: the provider did not say (NeMo Gym 0.7 keeps that apart from zero, and a sum with it stays unknown)."""
    cache_write_tokens: int = Field(default=0, exclude_if=_unknown_to_the_sdk)

    @field_validator("cache_write_tokens", mode="before")
    @classmethod
    def null_means_zero(cls, value: Any) -> Any:
        """Some providers send a null count; the SDK requires an integer here, so null means "none counted"."""
        return 0 if value is None else value


class NeMoGymResponseOutputTokensDetails(NeMoGymLenientModel):
    reasoning_tokens: int | None = 0
    """None: unknown, as for ``cached_tokens``."""


class NeMoGymResponseUsage(NeMoGymLenientModel):
    input_tokens: int
    input_tokens_details: NeMoGymResponseInputTokensDetails = Field(default_factory=NeMoGymResponseInputTokensDetails)
    output_tokens: int
    output_tokens_details: NeMoGymResponseOutputTokensDetails = Field(
        default_factory=NeMoGymResponseOutputTokensDetails
    )
    total_tokens: int

    @classmethod
    def sum_from_list(cls, usages: Iterable[NeMoGymResponseUsage]) -> NeMoGymResponseUsage:
        """The usage of several model calls added up (NeMo Gym's name); no calls at all is a usage of zero."""
        total = cls(input_tokens=0, output_tokens=0, total_tokens=0)
        for usage in usages:
            total = accumulate_response_usage(total, usage) or total
        return total


_SUMMED_USAGE_FIELDS: tuple[tuple[str | None, tuple[str, ...]], ...] = (
    (None, ("input_tokens", "output_tokens", "total_tokens")),
    ("input_tokens_details", ("cached_tokens", "cache_write_tokens")),
    ("output_tokens_details", ("reasoning_tokens",)),
)
"""Where the integer counts of a usage live (None: on the usage itself), for :func:`accumulate_response_usage`."""


def accumulate_response_usage(
    total: NeMoGymResponseUsage | None, additional: NeMoGymResponseUsage | None
) -> NeMoGymResponseUsage | None:
    """The usage of several model calls of one rollout added up (top-level counts and their details); ``total`` is
    left untouched, and None stands for "no usage yet" on either side. A detail count one side does not know (None)
    makes the sum unknown too, rather than a measurement of the other side alone."""
    if additional is None or total is None:
        return total if additional is None else additional.model_copy(deep=True)
    summed = total.model_copy(deep=True)
    for part, names in _SUMMED_USAGE_FIELDS:
        into = summed if part is None else getattr(summed, part)
        extra = additional if part is None else getattr(additional, part)
        for name in names:
            left, right = getattr(into, name), getattr(extra, name)
            setattr(into, name, None if left is None or right is None else left + right)
    return summed
