"""The math-verify check that runs inside the verifier worker processes (kept import-light for the pool).

``check_answer`` compares a model's whole answer text with the gold answer. It is a module-level function so the
worker pool can send it to its workers by name; math-verify's own ``signal.alarm`` timeouts are switched off because
the pool enforces a hard deadline by killing the worker, which also stops computations stuck in C code.
"""

from __future__ import annotations

import logging
from typing import Any

HEAVY_MODULES = ("math_verify", "sympy")
"""Imported by the pool's forkserver once, so workers start warm while the server process stays light."""

_GOLD_WRAPPERS = (("\\(", "\\)"), ("\\[", "\\]"), ("$$", "$$"), ("$", "$"))


def gold_as_boxed(expected_answer: str) -> str:
    """``\\(\\frac{1}{6}\\)`` -> ``\\boxed{\\frac{1}{6}}``: the gold answer in the form math-verify parses best."""
    gold = expected_answer.strip()
    for opening, closing in _GOLD_WRAPPERS:
        if len(gold) > len(opening) + len(closing) and gold.startswith(opening) and gold.endswith(closing):
            gold = gold[len(opening) : -len(closing)].strip()
            break
    return "\\boxed{" + gold + "}"


def check_answer(expected_answer: str, text: str) -> dict[str, Any]:
    """``{"score": 0.0 | 1.0, "extracted_answer": str | None}`` for a model answer text against the gold answer.

    math-verify returns ``[parsed value, extracted text]``; the extracted text (the model's own spelling) is what
    majority voting counts.
    """
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    gold = parse(gold_as_boxed(expected_answer), [LatexExtractionConfig()], parsing_timeout=None)
    if not gold:  # plain text that does not read as LaTeX, e.g. "3 apples": try it as an expression
        gold = parse(expected_answer, [ExprExtractionConfig()], parsing_timeout=None)
    predictions = parse(text, [ExprExtractionConfig(), LatexExtractionConfig()], parsing_timeout=None)
    if not predictions:
        return {"score": 0.0, "extracted_answer": None}
    extracted = next((p for p in predictions if isinstance(p, str)), str(predictions[0]))
    equal = bool(gold) and verify(gold, predictions, timeout_seconds=None)
    return {"score": 1.0 if equal else 0.0, "extracted_answer": extracted}


def warm_up() -> None:
    """Runs once per worker: imports SymPy and math-verify and fills their caches, so the first real call is fast."""
    logging.getLogger("math_verify").setLevel(logging.ERROR)  # it warns that its own timeouts are off (on purpose)
    check_answer("\\frac{1}{2}", "The answer is \\boxed{0.5}.")
    check_answer("x^2+1", "$x^2 + 1$")
