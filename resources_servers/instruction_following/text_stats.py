"""Counting words, sentences and paragraphs without NLTK or spaCy (nothing to download at run time).

The definitions are deliberately simple and documented, because a reward is only useful when the model can know
what is being counted:

* a **word** is a run of letters or digits, with inner apostrophes or hyphens kept (``don't``, ``well-known``: one
  word each), or a number with decimal or thousands separators (``3.14``, ``1,000``);
* a **sentence** ends at ``.``, ``!`` or ``?`` (repeated or followed by closing quotes/brackets) before whitespace and
  a capital letter, digit or opening quote, or at the end of the text, or at a blank line; common abbreviations
  (``Dr.``, ``e.g.``), initials (``J. R.``) and decimals do not end a sentence;
* **paragraphs** are separated either by blank lines or, for the ``***`` instruction, by divider lines of asterisks.
"""

from __future__ import annotations

import re
from typing import Literal

Relation = Literal["less than", "at most", "exactly", "at least", "more than"]
RELATIONS: tuple[str, ...] = ("less than", "at most", "exactly", "at least", "more than")

_WORD = re.compile(r"\d+(?:[.,]\d+)+|[^\W_]+(?:['’\-][^\W_]+)*")
_ABBREVIATIONS = frozenset(
    "mr mrs ms dr prof sr jr st vs etc e.g i.e inc ltd co corp no fig approx dept est mt ave blvd jan feb mar apr jun "
    "jul aug sep sept oct nov dec a.m p.m u.s u.k".split()
)
_SENTENCE_END = re.compile(r"[.!?]+[\"'”’)\]]*(?=\s+[\"'“‘(\[]?[A-Z0-9À-ÖØ-Þ]|\s*$)")
_BLANK_LINE = re.compile(r"\n\s*\n")
_DIVIDER = re.compile(r"^[ \t]*\*[ \t]*\*[ \t]*\*[ \t*]*$", re.M)


def compare(count: int, relation: Relation, target: int) -> bool:
    """``count <relation> target``, e.g. ``compare(12, "at least", 10)``."""
    return {
        "less than": count < target,
        "at most": count <= target,
        "exactly": count == target,
        "at least": count >= target,
        "more than": count > target,
    }[relation]


def words(text: str) -> list[str]:
    return _WORD.findall(text)


def count_words(text: str) -> int:
    return len(words(text))


def sentences(text: str) -> list[str]:
    """The sentences of ``text`` (see the module docstring for the rule)."""
    found: list[str] = []
    for block in _BLANK_LINE.split(text):
        start = 0
        for match in _SENTENCE_END.finditer(block):
            candidate = block[start : match.end()]
            if _ends_with_abbreviation(candidate):
                continue
            if candidate.strip():
                found.append(candidate.strip())
            start = match.end()
        rest = block[start:].strip()
        if rest and _WORD.search(rest):
            found.append(rest)
    return found


def _ends_with_abbreviation(candidate: str) -> bool:
    """True when the final period belongs to an abbreviation, an initial or a number rather than ending a sentence."""
    stripped = candidate.rstrip("\"'”’)] ")
    if not stripped.endswith(".") or stripped.endswith(".."):
        return False
    last = stripped.split()[-1].lower().rstrip(".") if stripped.split() else ""
    return last in _ABBREVIATIONS or (len(last) == 1 and last.isalpha())


def count_sentences(text: str) -> int:
    return len(sentences(text))


def blank_line_paragraphs(text: str) -> list[str]:
    """Paragraphs separated by one or more blank lines (empty ones dropped)."""
    return [part.strip() for part in _BLANK_LINE.split(text.strip()) if part.strip()]


def divider_paragraphs(text: str) -> list[str]:
    """Paragraphs separated by ``***`` divider lines; empty ones are kept so that a stray divider shows up."""
    return [part.strip() for part in _DIVIDER.split(text.strip())]
