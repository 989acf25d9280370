"""Function calls as verifiers see them: the model's calls from a trajectory, and expected calls from a dataset row.

Models emit ``arguments`` as a raw JSON string that may be invalid; datasets write expected arguments either as that
same string or as a JSON object. Both end up as :class:`ParsedCall`, whose ``arguments`` is a dict or None, with
``error`` saying why it is None, so a verifier can score a malformed call instead of crashing on it.

:func:`arguments_match` and :func:`maximum_matching` then score calls by argument comparison (name + arguments, with
number and string normalisation, in order or as a set), for function-calling datasets whose calls are judged, not run.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from nemo_gym.openai_base import get_field
from nemo_gym.openai_responses import NeMoGymResponse


@dataclass(frozen=True)
class ParsedCall:
    name: str
    arguments: dict[str, Any] | None
    """The arguments object; None when they were not valid JSON or not an object (see ``error``)."""
    call_id: str | None = None
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form for verify responses (``predicted_calls`` and the like)."""
        found: dict[str, Any] = {"name": self.name, "arguments": self.arguments}
        if self.error is not None:
            found["error"] = self.error
        return found


def parse_arguments(raw: Any) -> tuple[dict[str, Any] | None, str | None]:
    """``(arguments, None)`` for a JSON object given as text or dict; ``(None, reason)`` otherwise.

    An empty or missing string means "no arguments" (``{}``), as OpenAI-compatible servers send for argument-less tools.
    """
    if isinstance(raw, Mapping):
        return dict(raw), None
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return {}, None
    if not isinstance(raw, (str, bytes)):
        return None, f"arguments must be a JSON object, got {type(raw).__name__}"
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        return None, f"arguments are not valid JSON: {e}"
    if not isinstance(value, dict):
        return None, f"arguments must be a JSON object, got {type(value).__name__}"
    return value, None


def parse_call(spec: Mapping[str, Any]) -> ParsedCall:
    """A call written in a dataset row: ``{"name": ..., "arguments": <JSON text or object>}``."""
    arguments, error = parse_arguments(spec.get("arguments"))
    return ParsedCall(name=str(spec.get("name", "")), arguments=arguments, call_id=spec.get("call_id"), error=error)


def function_calls(trajectory: NeMoGymResponse | Iterable[Any]) -> list[ParsedCall]:
    """Every ``function_call`` item of a trajectory (a response or its output items, models or dicts), in order."""
    items = trajectory.output if isinstance(trajectory, NeMoGymResponse) else trajectory
    calls = []
    for item in items:
        if get_field(item, "type") != "function_call":
            continue
        arguments, error = parse_arguments(get_field(item, "arguments"))
        calls.append(
            ParsedCall(
                name=str(get_field(item, "name") or ""),
                arguments=arguments,
                call_id=get_field(item, "call_id"),
                error=error,
            )
        )
    return calls


# ---------------------------------------------------------------------------------------------------------------------
# Comparing arguments, and pairing predicted calls with expected ones


@dataclass(frozen=True)
class ArgumentMatchOptions:
    """How leniently predicted argument values are compared with expected ones.

    ``normalize_strings``: compare strings with whitespace collapsed and case folded (``" New  York"`` = ``"new
    york"``). ``float_tolerance``: relative and absolute tolerance for numbers; a number written as a string
    (``"3"``) equals the number (``3``), since models often quote numbers. ``allow_extra_args``: the predicted call may
    carry top-level arguments the expected call does not list (optional parameters left to the model). Keys whose value
    is null count as absent on both sides.
    """

    normalize_strings: bool = True
    float_tolerance: float = 1e-6
    allow_extra_args: bool = False


def _as_number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value.strip())
        except ValueError:
            return None
    return None


def _normal_string(text: str) -> str:
    return " ".join(text.split()).casefold()


def values_match(expected: Any, predicted: Any, options: ArgumentMatchOptions = ArgumentMatchOptions()) -> bool:
    """Recursive comparison: numbers within tolerance, strings per options, lists in order, objects key by key."""
    if isinstance(expected, dict) or isinstance(predicted, dict):
        if not (isinstance(expected, dict) and isinstance(predicted, dict)):
            return False
        nested = ArgumentMatchOptions(options.normalize_strings, options.float_tolerance, allow_extra_args=False)
        return arguments_match(expected, predicted, nested)
    if isinstance(expected, list) or isinstance(predicted, list):
        if not (isinstance(expected, list) and isinstance(predicted, list)) or len(expected) != len(predicted):
            return False
        return all(values_match(e, p, options) for e, p in zip(expected, predicted, strict=True))
    if isinstance(expected, bool) or isinstance(predicted, bool):
        return expected is predicted
    expected_number, predicted_number = _as_number(expected), _as_number(predicted)
    if (
        expected_number is not None
        and predicted_number is not None
        and not (isinstance(expected, str) and isinstance(predicted, str))
    ):
        tolerance = options.float_tolerance
        return math.isclose(expected_number, predicted_number, rel_tol=tolerance, abs_tol=tolerance)
    if isinstance(expected, str) and isinstance(predicted, str):
        if options.normalize_strings:
            return _normal_string(expected) == _normal_string(predicted)
        return expected == predicted
    return expected == predicted


def arguments_match(
    expected: dict[str, Any], predicted: dict[str, Any] | None, options: ArgumentMatchOptions = ArgumentMatchOptions()
) -> bool:
    """Whether a predicted arguments object matches the expected one (None, i.e. unparseable, never does)."""
    if predicted is None:
        return False
    expected = {key: value for key, value in expected.items() if value is not None}
    predicted = {key: value for key, value in predicted.items() if value is not None}
    if expected.keys() - predicted.keys():
        return False
    if not options.allow_extra_args and predicted.keys() - expected.keys():
        return False
    return all(values_match(value, predicted[key], options) for key, value in expected.items())


def maximum_matching(num_left: int, num_right: int, edge: Callable[[int, int], bool]) -> list[tuple[int, int]]:
    """A largest one-to-one pairing of left items with right items, using only pairs where ``edge(i, j)`` holds.

    Greedy pairing can miss a full match (two expected calls that both fit the first predicted one), so this finds
    augmenting paths (Kuhn's algorithm); fine for the handful of calls one turn makes. Pairs come back sorted.
    """
    allowed = [[j for j in range(num_right) if edge(i, j)] for i in range(num_left)]
    owner: list[int | None] = [None] * num_right

    def augment(i: int, seen: set[int]) -> bool:
        for j in allowed[i]:
            if j in seen:
                continue
            seen.add(j)
            current = owner[j]
            if current is None or augment(current, seen):
                owner[j] = i
                return True
        return False

    for i in range(num_left):
        augment(i, set())
    return sorted((i, j) for j, i in enumerate(owner) if i is not None)
