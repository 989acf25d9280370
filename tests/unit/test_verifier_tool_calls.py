"""Function calls for verifiers: parsing from trajectories and rows, argument comparison, one-to-one pairing."""

from __future__ import annotations

import pytest

from nemo_gym.openai_utils import NeMoGymResponse
from nemo_gym.verifiers.tool_calls import (
    ArgumentMatchOptions,
    arguments_match,
    function_calls,
    maximum_matching,
    parse_arguments,
    parse_call,
    values_match,
)


def test_function_calls_from_a_response_and_from_plain_items():
    items = [
        {"type": "function_call", "call_id": "a", "name": "f", "arguments": '{"x": 1}'},
        {"type": "function_call_output", "call_id": "a", "output": "{}"},
        {"type": "function_call", "call_id": "b", "name": "g", "arguments": "{oops"},
        {"type": "function_call", "call_id": "c", "name": "h", "arguments": ""},
    ]
    response = NeMoGymResponse.model_validate({"id": "r", "created_at": 0, "model": "m", "output": items})
    for calls in (function_calls(response), function_calls(items)):
        assert [(c.name, c.call_id, c.arguments) for c in calls] == [
            ("f", "a", {"x": 1}),
            ("g", "b", None),
            ("h", "c", {}),
        ]
        assert "not valid JSON" in calls[1].error and calls[1].to_dict()["error"] == calls[1].error


@pytest.mark.parametrize(
    ("raw", "arguments"),
    [({"a": 1}, {"a": 1}), ('{"a": 1}', {"a": 1}), (None, {}), ("  ", {}), ("[1]", None), ("3", None), (7, None)],
)
def test_parse_arguments(raw, arguments):
    assert parse_arguments(raw)[0] == arguments


def test_parse_call_from_a_row():
    call = parse_call({"name": "f", "arguments": '{"city": "Oslo"}'})
    assert (call.name, call.arguments, call.error) == ("f", {"city": "Oslo"}, None)


@pytest.mark.parametrize(
    ("expected", "predicted", "same"),
    [
        (3, 3.0, True),
        (3, "3", True),  # a quoted number equals the number
        ("007", "7", False),  # two strings stay strings (codes, zip codes)
        (0.1 + 0.2, 0.3, True),
        (1.0, 1.01, False),
        (True, 1, False),  # booleans are not numbers
        ("New  York ", "new york", True),
        ([1, 2], [2, 1], False),  # lists are ordered
        ({"a": 1, "b": None}, {"a": 1}, True),  # null means absent
        ({"a": {"b": "X"}}, {"a": {"b": "x", "c": 1}}, False),  # nested extra keys never match
        (None, None, True),
        ("x", ["x"], False),
    ],
)
def test_values_match(expected, predicted, same):
    assert values_match(expected, predicted) is same


def test_exact_strings_and_extra_arguments_are_options():
    assert not values_match("Oslo", "oslo", ArgumentMatchOptions(normalize_strings=False))
    assert not arguments_match({"a": 1}, {"a": 1, "b": 2})
    assert arguments_match({"a": 1}, {"a": 1, "b": 2}, ArgumentMatchOptions(allow_extra_args=True))
    assert not arguments_match({"a": 1}, {})
    assert not arguments_match({}, None)


def test_maximum_matching_finds_a_full_pairing_greedy_would_miss():
    edges = {(0, 0), (0, 1), (1, 0)}  # left 0 fits both; left 1 only fits right 0
    assert maximum_matching(2, 2, lambda i, j: (i, j) in edges) == [(0, 1), (1, 0)]
    assert maximum_matching(2, 1, lambda i, j: True) == [(0, 0)]
    assert maximum_matching(0, 3, lambda i, j: True) == []
