"""Shared answer extraction: assistant text, balanced ``\\boxed{}`` contents, text-wrapper stripping."""

from __future__ import annotations

import pytest

from nemo_gym.testing import assistant_response
from nemo_gym.verifiers.answers import assistant_text, boxed_contents, last_boxed, strip_text_wrappers


def test_assistant_text_joins_messages_and_skips_other_items():
    call = {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}
    response = assistant_response("first", "second", extra_output=[call])
    assert assistant_text(response) == "first\nsecond"
    assert assistant_text(response, separator="") == "firstsecond"
    assert assistant_text(assistant_response()) == ""


@pytest.mark.parametrize(
    ("text", "expected"),
    [("\\boxed{42}", "42"), ("a \\boxed{1} b \\boxed{\\frac{1}{2}}", "\\frac{1}{2}"), ("\\boxed {x}", "x"),
     ("\\fbox{B} then \\boxed{C}", "C"), ("\\boxed{C} then \\fbox{B}", "B"), ("\\boxed{ 7 }", "7"),
     ("no box", None), ("\\boxed{}", None), ("\\boxed{unclosed", None), ("\\boxed{{a}{b}}", "{a}{b}"),
     ("\\boxed{1} and \\boxed{2", "1"), ("\\boxed", None)],
)  # fmt: skip
def test_last_boxed(text, expected):
    assert last_boxed(text) == expected


def test_boxed_contents_in_order():
    assert boxed_contents("\\boxed{a}\\fbox{b}\\boxed{c}") == ["a", "b", "c"]


def test_strip_text_wrappers():
    assert strip_text_wrappers("\\text{B}") == "B"
    assert strip_text_wrappers(" \\textbf{\\text{Paris}} ") == "Paris"
    assert strip_text_wrappers("\\mathrm{kg}\\,m") == "kg\\,m"
