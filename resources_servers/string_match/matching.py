"""Answer extraction and lenient comparison for short free-form answers.

Pure functions, no server: ``extract_answer`` pulls the candidate answer out of the model's text in one of four modes,
and ``score_answer`` compares it with the gold answer. Case-insensitive scoring is a cascade of normalisations, each
tried only after the cheaper ones failed, so a rule can never make a match worse:

1. NFKC, outer quotes, case, trailing ``.!?`` and extra whitespace;
2. LaTeX wrappers (``$…$``, ``\\text{}``, ``\\frac{a}{b}``, ``^\\circ`` …) and unicode math signs;
3. list separators (``,`` ``;`` ``and`` ``or``), only when a side looks like a list and neither is a number;
4. US state names and their postal codes, only when a whole answer (or list item) is a state;
5. numbers: thousands separators, floats, simple fractions, scale words, a unit on at most one side. A value within
   about 1 % (``(1 - relative error)² > 0.98``) scores :data:`NEAR_NUMERIC_SCORE` instead of 1.0.
"""

from __future__ import annotations

import math
import re
import unicodedata
from typing import Literal

from nemo_gym.verifiers.answers import last_boxed as core_last_boxed
from nemo_gym.verifiers.answers import strip_text_wrappers

ExtractionMode = Literal["boxed", "final_answer", "last_line", "full_response"]
EXTRACTION_MODES: tuple[str, ...] = ("boxed", "final_answer", "last_line", "full_response")
NEAR_NUMERIC_SCORE = 0.98
"""Score of a numeric answer that is close to, but not exactly, the gold value (partial credit, not a pass)."""

# ---------------------------------------------------------------------------------------------------------------------
# Extraction

_ANSWER_LABEL = re.compile(r"\b(?:final\s+answer|answer)(?:\s+is)?\s*[*_]*\s*[:：]", re.IGNORECASE)


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{…}`` (or ``\\fbox{…}``), text wrappers removed; None when there is none, it is
    empty, or the last one never closes (an earlier box is not the model's final answer)."""
    content = core_last_boxed(text, final_only=True)
    return (strip_text_wrappers(content) or None) if content is not None else None


def _final_answer(text: str) -> str | None:
    lines = text.splitlines()
    for number in range(len(lines) - 1, -1, -1):
        labels = list(_ANSWER_LABEL.finditer(lines[number]))
        if not labels:
            continue
        rest = lines[number][labels[-1].end() :]
        if not rest.strip(" *_\t"):  # "Final answer:" with the answer on the next non-empty line
            rest = next((line for line in lines[number + 1 :] if line.strip()), "")
        answer = rest.strip().strip("*_").strip()
        boxed = last_boxed(answer)
        if boxed is not None:
            return boxed
        answer = answer.removesuffix(".").strip()
        if answer:
            return answer
    return last_boxed(text)


def extract_answer(text: str, mode: ExtractionMode) -> str | None:
    """The candidate answer in the model's text, or None when the model gave none in the requested form."""
    if mode == "boxed":
        return last_boxed(text)
    if mode == "final_answer":
        return _final_answer(text)
    if mode == "last_line":
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        return lines[-1] if lines else None
    if mode == "full_response":
        return text.strip() or None
    raise ValueError(f"unknown extraction mode {mode!r}; expected one of {', '.join(EXTRACTION_MODES)}")


# ---------------------------------------------------------------------------------------------------------------------
# Normalisation

_QUOTE_PAIRS = (('"', '"'), ("'", "'"), ("`", "`"), ("\u201c", "\u201d"), ("\u2018", "\u2019"), ("\u00ab", "\u00bb"))
_SPACES = re.compile(r"\s+")


def basic_normalize(text: str) -> str:
    """NFKC, lowercase, collapsed whitespace, and no outer quotes or trailing ``.!?`` (repeated until stable)."""
    text = _SPACES.sub(" ", unicodedata.normalize("NFKC", text)).strip().lower()
    previous = None
    while previous != text:
        previous = text
        for opening, closing in _QUOTE_PAIRS:
            if len(text) >= 2 and text.startswith(opening) and text.endswith(closing):
                text = text[len(opening) : -len(closing)].strip()
        text = text.rstrip(".!?").strip()
    return text


_FRACTION = re.compile(r"\\[dt]?frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}")
_LATEX_REPLACEMENTS = (
    (re.compile(r"\^\s*\{?\s*\\circ\s*\}?"), "°"),
    (re.compile(r"\\(?:left|right)\b"), ""),
    (re.compile(r"\\(?:cdot|times)\b"), "*"),
    (re.compile(r"\\div\b"), "/"),
    (re.compile(r"\\[%$&#]"), lambda m: m.group(0)[1]),
    (re.compile(r"\\[,;:! ]|~"), " "),
    (re.compile(r"\\[()\[\]]|\$"), ""),
    (re.compile(r"\\([a-z]+)"), r"\1"),
    (re.compile(r"[{}]"), ""),
)
_UNICODE_MATH = str.maketrans({"\u2212": "-", "\u00d7": "*", "\u22c5": "*", "\u00b7": "*", "\u00f7": "/"})


def strip_latex(text: str) -> str:
    """Plain text of a LaTeX answer: wrappers unwrapped, fractions as ``a/b``, commands and braces dropped."""
    text = strip_text_wrappers(text)
    previous = None
    while previous != text:
        previous = text
        text = _FRACTION.sub(r"\1/\2", text)
    for pattern, replacement in _LATEX_REPLACEMENTS:
        text = pattern.sub(replacement, text)
    return basic_normalize(text.translate(_UNICODE_MATH))


_LIST_SEPARATOR = re.compile(r"\s*(?:[,;&]|\band\b|\bor\b)\s*")


def normalize_list(text: str) -> str:
    """``a, b and c`` → ``a b c``."""
    return _SPACES.sub(" ", _LIST_SEPARATOR.sub(" ", text)).strip()


US_STATES = {
    "alabama": "al", "alaska": "ak", "arizona": "az", "arkansas": "ar", "california": "ca", "colorado": "co",
    "connecticut": "ct", "delaware": "de", "florida": "fl", "georgia": "ga", "hawaii": "hi", "idaho": "id",
    "illinois": "il", "indiana": "in", "iowa": "ia", "kansas": "ks", "kentucky": "ky", "louisiana": "la",
    "maine": "me", "maryland": "md", "massachusetts": "ma", "michigan": "mi", "minnesota": "mn",
    "mississippi": "ms", "missouri": "mo", "montana": "mt", "nebraska": "ne", "nevada": "nv",
    "new hampshire": "nh", "new jersey": "nj", "new mexico": "nm", "new york": "ny", "north carolina": "nc",
    "north dakota": "nd", "ohio": "oh", "oklahoma": "ok", "oregon": "or", "pennsylvania": "pa",
    "rhode island": "ri", "south carolina": "sc", "south dakota": "sd", "tennessee": "tn", "texas": "tx",
    "utah": "ut", "vermont": "vt", "virginia": "va", "washington": "wa", "west virginia": "wv",
    "wisconsin": "wi", "wyoming": "wy", "district of columbia": "dc", "washington d.c": "dc", "washington dc": "dc",
}  # fmt: skip
"""Full state name → postal code (lowercase, as compared after normalisation)."""


def abbreviate_states(text: str) -> str:
    """Replace a whole answer, or whole comma-separated items, that name a US state by the state's postal code."""
    items = [item.strip() for item in text.split(",")]
    return ", ".join(US_STATES.get(item.removesuffix("."), item) for item in items)


# ---------------------------------------------------------------------------------------------------------------------
# Numbers

_NUMBER = r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:e[+-]?\d+)?"
_GROUPED = r"[+-]?\d{1,3}(?:(?:,\d{3})+|(?: \d{3})+)(?:\.\d+)?"
_QUANTITY = re.compile(rf"^([$€£¥]?)\s*({_GROUPED}|{_NUMBER})(?:\s*/\s*({_NUMBER}))?\s*(.*)$")
_UNIT = re.compile(r"[a-z%°'\"µ$€£¥]\S*(?: [a-z]\S*)*")
"""Words that each start with a letter (the first may be a symbol such as ``%``): ``cm``, ``km/h``, ``m2``."""
_SCALES = {"thousand": 1e3, "million": 1e6, "billion": 1e9, "trillion": 1e12}


def parse_quantity(text: str) -> tuple[float, str] | None:
    """``(value, unit)`` of an answer that is a number with an optional unit (``12 cm``, ``$1,200``, ``3/4``, ``50%``).

    The unit is the rest of the text in lowercase ("" for a bare number; a currency sign counts as a unit); scale
    words (``2 million``) are multiplied in. None when the text does not start with a number.
    """
    match = _QUANTITY.match(text)
    if match is None:
        return None
    currency, number, denominator, unit = match.groups()
    value = float(number.replace(",", "").replace(" ", ""))
    if denominator is not None:
        if float(denominator) == 0:
            return None
        value /= float(denominator)
    unit = unit.strip().rstrip(".")
    words = unit.split(" ", 1)
    if words[0] in _SCALES:
        value *= _SCALES[words[0]]
        unit = words[1] if len(words) > 1 else ""
    if unit and not _UNIT.fullmatch(unit):
        return None  # "3 4" or "1 + 2" is not a number with a unit
    unit = (currency + " " + unit).strip() if currency and unit else currency or unit
    return (value, unit) if math.isfinite(value) else None


def numeric_score(answer: str, expected: str) -> float:
    """1.0 for the same number, :data:`NEAR_NUMERIC_SCORE` within ~1 %, else 0.0 (units may be missing on one side)."""
    got, gold = parse_quantity(answer), parse_quantity(expected)
    if got is None or gold is None:
        return 0.0
    (value, unit), (gold_value, gold_unit) = got, gold
    if unit and gold_unit and unit != gold_unit:
        return 0.0
    if math.isclose(value, gold_value, rel_tol=1e-9, abs_tol=1e-12):
        return 1.0
    if gold_value == 0:
        return 0.0  # no relative error around zero
    error = abs(value - gold_value) / abs(gold_value)
    return NEAR_NUMERIC_SCORE if error < 1 and (1 - error) ** 2 > NEAR_NUMERIC_SCORE else 0.0


def _is_number(text: str) -> bool:
    quantity = parse_quantity(text)
    return quantity is not None and quantity[1] == ""


# ---------------------------------------------------------------------------------------------------------------------
# Scoring


def score_answer(answer: str | None, expected: str, case_sensitive: bool = False) -> float:
    """Reward of an extracted answer against the gold answer: 1.0, :data:`NEAR_NUMERIC_SCORE`, or 0.0."""
    if answer is None:
        return 0.0
    if case_sensitive:
        return 1.0 if answer.strip() == expected.strip() else 0.0
    got, gold = basic_normalize(answer), basic_normalize(expected)
    if not got:
        return 0.0
    if got == gold:
        return 1.0
    got, gold = strip_latex(got), strip_latex(gold)
    if got == gold:
        return 1.0
    if not (_is_number(got) or _is_number(gold)) and (_LIST_SEPARATOR.search(got) or _LIST_SEPARATOR.search(gold)):
        if normalize_list(got) == normalize_list(gold):
            return 1.0
    if abbreviate_states(got) == abbreviate_states(gold):
        return 1.0
    return numeric_score(got, gold)


def canonical_answer(answer: str | None) -> str | None:
    """A voting key for majority@k: equal for answers that normalisation treats as the same (``1,000`` / ``1000.0``)."""
    if answer is None:
        return None
    text = strip_latex(basic_normalize(answer))
    quantity = parse_quantity(text)
    if quantity is not None:
        value, unit = quantity
        return f"{value:.12g} {unit}".strip()
    return normalize_list(abbreviate_states(text))
