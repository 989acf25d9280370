"""Which option letter did the model choose? Extraction rules for multiple-choice answers.

Every rule returns an *allowed* letter (a key of the row's ``options`` with a non-null text) or None. Rules differ in
how much formatting they forgive, because datasets differ in what their prompts ask for:

* ``strict_single_letter_boxed``: the last ``\\boxed{}`` holds a lone letter (``B``, ``(B)``) or a label (``B:``,
  ``B)``, ``B.``, ``B-``, optionally followed by the option's text).
* ``lenient_boxed``: the strict rule, else the last box contains the text of exactly one option.
* ``lenient_answer_colon``: the last ``Answer: X`` (a letter, or an option's exact text).
* ``lenient_answer_colon_md``: like the previous one, but tolerant of Markdown around the line (``**Answer:** B``,
  ``## Answer: (B)``); the lines are read from the last one up, and a line naming several different letters is
  rejected.

A row may also carry its own patterns (``template_metadata.output_regex``), tried before the mode.
Letters written in Arabic or Bengali script, or as full-width characters, are read as A-D (A-Z for full-width).
"""

from __future__ import annotations

import re
import unicodedata
from typing import Literal

from nemo_gym.verifiers.answers import boxed_contents, strip_text_wrappers

GradingMode = Literal["strict_single_letter_boxed", "lenient_boxed", "lenient_answer_colon", "lenient_answer_colon_md"]
GRADING_MODES: tuple[str, ...] = (
    "strict_single_letter_boxed",
    "lenient_boxed",
    "lenient_answer_colon",
    "lenient_answer_colon_md",
)

# Option letters as written in prompts localised to Arabic (alif, ba, jim, dal) and Bengali (ka, kha, ga, gha).
_SCRIPT_LETTERS = {"أ": "A", "ا": "A", "ب": "B", "ج": "C", "د": "D", "ক": "A", "খ": "B", "গ": "C", "ঘ": "D"}

_LONE_LETTER = re.compile(r"^[\(\[]?\s*([A-Za-z])\s*[\)\]]?\.?$")
_LABELLED_LETTER = re.compile(r"^[\(\[]?([A-Za-z])\s*[:\)\]\.\-](?:\s.*)?$", re.DOTALL)
_ANSWER_COLON = re.compile(r"answer\s*:\s*(.+)", re.IGNORECASE)
_LEADING_LETTER = re.compile(r"^[\(\[]?([A-Z])(?:[\)\]]|(?![A-Za-z0-9]))")
_MARKDOWN = re.compile(r"[*_#`>~]")
_LETTER_TOKEN = re.compile(r"(?<![A-Za-z])([A-Z])(?![A-Za-z])")


def normalize_letters(text: str) -> str:
    """Full-width and other compatibility forms to ASCII (NFKC), and Arabic/Bengali option letters to A-D."""
    text = unicodedata.normalize("NFKC", text)
    return "".join(_SCRIPT_LETTERS.get(char, char) for char in text)


def _clean(text: str) -> str:
    return " ".join(strip_text_wrappers(text).split())


def _option_by_text(candidate: str, options: dict[str, str]) -> str | None:
    """The letter whose option text equals ``candidate`` (case- and space-insensitive), if exactly one does."""
    wanted = _clean(candidate).rstrip(".").casefold()
    matches = [letter for letter, text in options.items() if _clean(text).rstrip(".").casefold() == wanted]
    return matches[0] if len(matches) == 1 else None


def letter_or_option_text(candidate: str, options: dict[str, str]) -> str | None:
    """A lone (possibly bracketed) allowed letter, or the exact text of one option."""
    candidate = normalize_letters(_clean(candidate))
    match = _LONE_LETTER.match(candidate)
    if match and match.group(1).upper() in options:
        return match.group(1).upper()
    return _option_by_text(candidate, options)


def strict_boxed(text: str, options: dict[str, str]) -> str | None:
    contents = boxed_contents(text)
    if not contents:
        return None
    inside = normalize_letters(_clean(contents[-1]))
    match = _LONE_LETTER.match(inside) or _LABELLED_LETTER.match(inside)
    if match and match.group(1).upper() in options:
        return match.group(1).upper()
    return None


def lenient_boxed(text: str, options: dict[str, str]) -> str | None:
    letter = strict_boxed(text, options)
    if letter is not None:
        return letter
    contents = boxed_contents(text)
    if not contents:
        return None
    inside = _clean(contents[-1]).casefold()
    containing = [letter for letter, option in options.items() if _clean(option).casefold() in inside]
    return containing[0] if len(containing) == 1 else None


def leading_letter_or_text(candidate: str, options: dict[str, str]) -> str | None:
    """What follows ``Answer:``: a lone letter, an option's exact text, or a capital letter opening the phrase
    (``B. because…``, ``(B) PCR``)."""
    candidate = normalize_letters(_clean(candidate))
    letter = letter_or_option_text(candidate, options)
    if letter is not None:
        return letter
    match = _LEADING_LETTER.match(candidate)
    return match.group(1) if match and match.group(1) in options else None


def answer_colon(text: str, options: dict[str, str]) -> str | None:
    matches = _ANSWER_COLON.findall(text)
    return leading_letter_or_text(matches[-1], options) if matches else None


def answer_colon_markdown(text: str, options: dict[str, str]) -> str | None:
    for line in reversed(text.splitlines()):
        match = _ANSWER_COLON.search(_MARKDOWN.sub("", line))
        if not match:
            continue
        candidate = normalize_letters(_clean(match.group(1)))
        named = {token for token in _LETTER_TOKEN.findall(candidate) if token in options}
        if len(named) > 1:
            return None  # "Answer: A or C": the model did not commit to one option
        letter = leading_letter_or_text(candidate, options) or (named.pop() if named else None)
        if letter is not None:
            return letter
    return None


_MODES = {
    "strict_single_letter_boxed": strict_boxed,
    "lenient_boxed": lenient_boxed,
    "lenient_answer_colon": answer_colon,
    "lenient_answer_colon_md": answer_colon_markdown,
}


def by_patterns(text: str, patterns: list[str], options: dict[str, str]) -> str | None:
    """The row's own patterns: the last match over all of them (group 1 when the pattern has a group)."""
    best: tuple[int, str] | None = None
    for pattern in patterns:
        try:
            compiled = re.compile(pattern, re.IGNORECASE | re.MULTILINE)
        except re.error:
            continue  # a broken pattern in one row should not fail the whole verify
        for match in compiled.finditer(text):
            captured = match.group(1) if compiled.groups else match.group(0)
            if captured is not None and (best is None or match.start() >= best[0]):
                best = (match.start(), captured)
    return letter_or_option_text(best[1], options) if best is not None else None


def extract_letter(
    text: str, options: dict[str, str], mode: GradingMode, output_regex: list[str] | None = None
) -> str | None:
    """The chosen letter: the row's patterns first, then the grading mode's rule."""
    if not text.strip():
        return None
    if output_regex:
        letter = by_patterns(text, output_regex, options)
        if letter is not None:
            return letter
    return _MODES[mode](text, options)
