"""Verifiable instructions: one class per instruction id, its kwargs as fields, ``check(text)`` as the rule.

Ids and kwarg names follow the IFEval convention so that existing IFEval-style rows work unchanged; every rule here
is written for this project and documented on its class. ``describe()`` states the instruction in words, for
authoring prompts that match what is checked.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import cache
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from nemo_gym.verifiers.code_blocks import fenced_blocks
from resources_servers.instruction_following import text_stats
from resources_servers.instruction_following.text_stats import Relation, compare


@dataclass(frozen=True)
class Outcome:
    followed: bool
    detail: str
    """What was measured, so a failure says why (e.g. "212 words; needs at least 300")."""


class Instruction(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    id: ClassVar[str]

    def check(self, text: str) -> Outcome:
        raise NotImplementedError

    def describe(self) -> str:
        raise NotImplementedError


REGISTRY: dict[str, type[Instruction]] = {}


def register(cls: type[Instruction]) -> type[Instruction]:
    REGISTRY[cls.id] = cls
    return cls


def build(instruction_id: str, kwargs: dict[str, Any] | None) -> Instruction:
    """The checker for one (id, kwargs) pair of a row; null kwargs are dropped. KeyError/ValidationError if bad."""
    cls = REGISTRY[instruction_id]
    return cls(**{key: value for key, value in (kwargs or {}).items() if value is not None})


def _counted(count: int, relation: Relation, target: int, noun: str) -> Outcome:
    return Outcome(compare(count, relation, target), f"{count} {noun}; needs {relation} {target}")


def _phrase_pattern(phrase: str) -> re.Pattern[str]:
    """A case-insensitive match of ``phrase`` that does not start or end inside a word."""
    return re.compile(rf"(?<!\w){re.escape(phrase.strip())}(?!\w)", re.IGNORECASE)


# ----------------------------------------------------------------------------------------------------------------------
# keywords
# ----------------------------------------------------------------------------------------------------------------------


@register
class KeywordsExistence(Instruction):
    """Every keyword appears as a whole word or phrase, in any case."""

    id: ClassVar[str] = "keywords:existence"
    keywords: list[str] = Field(min_length=1)

    def check(self, text: str) -> Outcome:
        missing = [k for k in self.keywords if not _phrase_pattern(k).search(text)]
        return Outcome(not missing, f"missing: {missing}" if missing else "all keywords present")

    def describe(self) -> str:
        return f"Include the keywords {', '.join(repr(k) for k in self.keywords)} in the response."


@register
class KeywordFrequency(Instruction):
    """The keyword (whole word or phrase, any case) occurs a number of times that satisfies the relation."""

    id: ClassVar[str] = "keywords:frequency"
    keyword: str = Field(min_length=1)
    frequency: int = Field(ge=0)
    relation: Relation

    def check(self, text: str) -> Outcome:
        count = len(_phrase_pattern(self.keyword).findall(text))
        return _counted(count, self.relation, self.frequency, f"occurrences of {self.keyword!r}")

    def describe(self) -> str:
        return f"In your response, the word {self.keyword!r} should appear {self.relation} {self.frequency} times."


@register
class ForbiddenWords(Instruction):
    """None of the words appears as a whole word or phrase, in any case."""

    id: ClassVar[str] = "keywords:forbidden_words"
    forbidden_words: list[str] = Field(min_length=1)

    def check(self, text: str) -> Outcome:
        used = [w for w in self.forbidden_words if _phrase_pattern(w).search(text)]
        return Outcome(not used, f"used: {used}" if used else "no forbidden word used")

    def describe(self) -> str:
        return f"Do not include the words {', '.join(repr(w) for w in self.forbidden_words)} in the response."


@register
class LetterFrequency(Instruction):
    """The letter (case-insensitive) occurs a number of times that satisfies the relation."""

    id: ClassVar[str] = "keywords:letter_frequency"
    letter: str = Field(min_length=1, max_length=1)
    let_frequency: int = Field(ge=0)
    let_relation: Relation

    def check(self, text: str) -> Outcome:
        count = text.lower().count(self.letter.lower())
        return _counted(count, self.let_relation, self.let_frequency, f"letters {self.letter!r}")

    def describe(self) -> str:
        return f"The letter {self.letter!r} should appear {self.let_relation} {self.let_frequency} times."


# ----------------------------------------------------------------------------------------------------------------------
# language and case
# ----------------------------------------------------------------------------------------------------------------------


@cache
def _language_detector() -> Any:
    """langdetect, seeded so that the same text always gets the same answer (its profiles ship with the wheel)."""
    from langdetect import DetectorFactory, detect

    DetectorFactory.seed = 0
    return detect


def detect_language(text: str) -> str | None:
    """ISO 639-1 code of the text's language, or None when there is nothing to detect."""
    from langdetect.lang_detect_exception import LangDetectException

    if not any(c.isalpha() for c in text):
        return None
    try:
        return str(_language_detector()(text)).lower()
    except LangDetectException:
        return None


def _same_language(detected: str | None, wanted: str) -> bool:
    return detected is not None and detected.split("-")[0] == wanted.lower().split("-")[0]


@register
class ResponseLanguage(Instruction):
    """The detected language of the whole response is ``language`` (an ISO 639-1 code such as ``fr``)."""

    id: ClassVar[str] = "language:response_language"
    language: str = Field(min_length=2)

    def check(self, text: str) -> Outcome:
        detected = detect_language(text)
        return Outcome(_same_language(detected, self.language), f"detected {detected}; needs {self.language}")

    def describe(self) -> str:
        return f"Your entire response should be in the language with ISO 639-1 code {self.language!r}, and no other."


@register
class EnglishCapital(Instruction):
    """Every letter is a capital letter, and the text is English (detected on its lower-cased form)."""

    id: ClassVar[str] = "change_case:english_capital"

    def check(self, text: str) -> Outcome:
        lower_found = sorted({c for c in text if c.isalpha() and c != c.upper()})[:5]
        detected = detect_language(text.lower())
        followed = not lower_found and any(c.isalpha() for c in text) and _same_language(detected, "en")
        return Outcome(followed, f"lowercase letters: {lower_found}; detected {detected}")

    def describe(self) -> str:
        return "Your entire response should be in English, and in all capital letters."


@register
class EnglishLowercase(Instruction):
    """No capital letters at all, and the text is English."""

    id: ClassVar[str] = "change_case:english_lowercase"

    def check(self, text: str) -> Outcome:
        upper_found = sorted({c for c in text if c.isalpha() and c != c.lower()})[:5]
        detected = detect_language(text)
        followed = not upper_found and any(c.isalpha() for c in text) and _same_language(detected, "en")
        return Outcome(followed, f"capital letters: {upper_found}; detected {detected}")

    def describe(self) -> str:
        return (
            "Your entire response should be in English, and in all lowercase letters. No capital letters are allowed."
        )


@register
class CapitalWordFrequency(Instruction):
    """The number of words written entirely in capitals (``NASA``, ``I``) satisfies the relation."""

    id: ClassVar[str] = "change_case:capital_word_frequency"
    capital_frequency: int = Field(ge=0)
    capital_relation: Relation

    def check(self, text: str) -> Outcome:
        count = sum(1 for word in text_stats.words(text) if word.isupper())
        return _counted(count, self.capital_relation, self.capital_frequency, "all-capital words")

    def describe(self) -> str:
        return (
            f"Words in all capital letters should appear {self.capital_relation} {self.capital_frequency} times "
            "in your response."
        )


# ----------------------------------------------------------------------------------------------------------------------
# length
# ----------------------------------------------------------------------------------------------------------------------


@register
class NumberSentences(Instruction):
    """The number of sentences (``text_stats.sentences``) satisfies the relation."""

    id: ClassVar[str] = "length_constraints:number_sentences"
    num_sentences: int = Field(ge=0)
    relation: Relation

    def check(self, text: str) -> Outcome:
        return _counted(text_stats.count_sentences(text), self.relation, self.num_sentences, "sentences")

    def describe(self) -> str:
        return f"Your response should contain {self.relation} {self.num_sentences} sentences."


@register
class NumberWords(Instruction):
    """The number of words (``text_stats.words``) satisfies the relation."""

    id: ClassVar[str] = "length_constraints:number_words"
    num_words: int = Field(ge=0)
    relation: Relation

    def check(self, text: str) -> Outcome:
        return _counted(text_stats.count_words(text), self.relation, self.num_words, "words")

    def describe(self) -> str:
        return f"Answer with {self.relation} {self.num_words} words."


@register
class NumberParagraphs(Instruction):
    """Exactly ``num_paragraphs`` non-empty paragraphs separated by ``***`` divider lines."""

    id: ClassVar[str] = "length_constraints:number_paragraphs"
    num_paragraphs: int = Field(ge=1)

    def check(self, text: str) -> Outcome:
        paragraphs = text_stats.divider_paragraphs(text)
        empty = sum(1 for p in paragraphs if not p)
        followed = len(paragraphs) == self.num_paragraphs and not empty
        return Outcome(followed, f"{len(paragraphs)} paragraphs ({empty} empty); needs {self.num_paragraphs}")

    def describe(self) -> str:
        return (
            f"There should be {self.num_paragraphs} paragraphs, separated from each other by the markdown divider "
            "*** on a line of its own."
        )


@register
class NthParagraphFirstWord(Instruction):
    """Exactly ``num_paragraphs`` blank-line-separated paragraphs, and paragraph ``nth_paragraph`` (1-based) starts
    with ``first_word`` (case and surrounding punctuation ignored)."""

    id: ClassVar[str] = "length_constraints:nth_paragraph_first_word"
    num_paragraphs: int = Field(ge=1)
    nth_paragraph: int = Field(ge=1)
    first_word: str = Field(min_length=1)

    def check(self, text: str) -> Outcome:
        paragraphs = text_stats.blank_line_paragraphs(text)
        if len(paragraphs) != self.num_paragraphs or self.nth_paragraph > len(paragraphs):
            return Outcome(False, f"{len(paragraphs)} paragraphs; needs {self.num_paragraphs}")
        first = text_stats.words(paragraphs[self.nth_paragraph - 1])
        word = first[0].lower() if first else ""
        return Outcome(word == self.first_word.lower(), f"paragraph {self.nth_paragraph} starts with {word!r}")

    def describe(self) -> str:
        return (
            f"There should be {self.num_paragraphs} paragraphs, separated by blank lines. Paragraph "
            f"{self.nth_paragraph} must start with the word {self.first_word!r}."
        )


# ----------------------------------------------------------------------------------------------------------------------
# content and format
# ----------------------------------------------------------------------------------------------------------------------


@register
class NumberPlaceholders(Instruction):
    """At least ``num_placeholders`` square-bracket placeholders such as ``[address]``."""

    id: ClassVar[str] = "detectable_content:number_placeholders"
    num_placeholders: int = Field(ge=1)

    def check(self, text: str) -> Outcome:
        count = len(re.findall(r"\[[^\[\]\n]*[^\s\[\]][^\[\]\n]*\]", text))
        return _counted(count, "at least", self.num_placeholders, "placeholders")

    def describe(self) -> str:
        return (
            f"The response must contain at least {self.num_placeholders} placeholders represented by square "
            "brackets, such as [address]."
        )


@register
class Postscript(Instruction):
    """A line that starts with ``postscript_marker`` (e.g. ``P.S.``) and has text after it."""

    id: ClassVar[str] = "detectable_content:postscript"
    postscript_marker: str = Field(min_length=1)

    def check(self, text: str) -> Outcome:
        found = re.search(rf"(?im)^\s*{re.escape(self.postscript_marker.strip())}\s*\S", text)
        return Outcome(found is not None, "postscript found" if found else "no postscript line")

    def describe(self) -> str:
        return f"At the end of your response, add a postscript starting with {self.postscript_marker!r}."


@register
class NumberBulletLists(Instruction):
    """Exactly ``num_bullets`` markdown bullet lines (starting with ``* ``, ``- `` or ``• ``)."""

    id: ClassVar[str] = "detectable_format:number_bullet_lists"
    num_bullets: int = Field(ge=0)

    def check(self, text: str) -> Outcome:
        count = len(re.findall(r"(?m)^\s*[*\-•]\s+\S", text))
        return _counted(count, "exactly", self.num_bullets, "bullet points")

    def describe(self) -> str:
        return f"Your answer must contain exactly {self.num_bullets} bullet points, written as markdown bullets ('* item')."


DEFAULT_OPTIONS = ("My answer is yes.", "My answer is no.", "My answer is maybe.")


@register
class ConstrainedResponse(Instruction):
    """Exactly one of the allowed options appears in the response (default: the yes/no/maybe answers)."""

    id: ClassVar[str] = "detectable_format:constrained_response"
    options: list[str] = Field(default_factory=lambda: list(DEFAULT_OPTIONS), min_length=1)

    def check(self, text: str) -> Outcome:
        present = [option for option in self.options if option.strip() in text]
        return Outcome(len(present) == 1, f"options present: {present}")

    def describe(self) -> str:
        return f"Answer with one of the following options: {', '.join(repr(o) for o in self.options)}"


@register
class HighlightedSections(Instruction):
    """At least ``num_highlights`` markdown highlights: ``*text*`` or ``**text**``, the text touching both markers."""

    id: ClassVar[str] = "detectable_format:number_highlighted_sections"
    num_highlights: int = Field(ge=1)

    def check(self, text: str) -> Outcome:
        # Markdown emphasis: the text hugs its asterisks, so a bullet's "* " never opens a highlight.
        spans = re.findall(r"\*\*(?=\S)([^*\n]+?)(?<=\S)\*\*|(?<!\*)\*(?=[^\s*])([^*\n]+?)(?<=\S)\*(?!\*)", text)
        count = sum(1 for bold, italic in spans if (bold or italic).strip())
        return _counted(count, "at least", self.num_highlights, "highlighted sections")

    def describe(self) -> str:
        return (
            f"Highlight at least {self.num_highlights} sections in your answer with markdown, i.e. *highlighted "
            "section*."
        )


@register
class MultipleSections(Instruction):
    """At least ``num_sections`` section headers: a line starting with ``section_spliter`` and a number (e.g.
    ``SECTION 1``; markdown heading marks allowed before it, case ignored)."""

    id: ClassVar[str] = "detectable_format:multiple_sections"
    section_spliter: str = Field(min_length=1)
    num_sections: int = Field(ge=1)

    def check(self, text: str) -> Outcome:
        header = rf"(?im)^\s*[#*]*\s*{re.escape(self.section_spliter.strip())}\s+\d+\b"
        return _counted(len(re.findall(header, text)), "at least", self.num_sections, "sections")

    def describe(self) -> str:
        return (
            f"Your response must have {self.num_sections} sections. Mark the beginning of each section with "
            f"{self.section_spliter} X, such as: {self.section_spliter} 1"
        )


@register
class JsonFormat(Instruction):
    """The whole response is JSON, optionally wrapped in a single ``` fence with nothing outside it."""

    id: ClassVar[str] = "detectable_format:json_format"

    def check(self, text: str) -> Outcome:
        payload = text.strip()
        blocks = fenced_blocks(payload)
        if len(blocks) == 1 and payload.startswith(("```", "~~~")) and payload.endswith(("```", "~~~")):
            payload = blocks[0].content
        try:
            json.loads(payload)
        except ValueError as e:
            return Outcome(False, f"not JSON: {e}")
        return Outcome(True, "valid JSON")

    def describe(self) -> str:
        return "Entire output should be wrapped in JSON format. You can use markdown ticks such as ```."


@register
class Title(Instruction):
    """A title in double angular brackets, e.g. ``<<poem of joy>>``, with non-blank text."""

    id: ClassVar[str] = "detectable_format:title"

    def check(self, text: str) -> Outcome:
        titles = [t for t in re.findall(r"<<([^<>\n]+)>>", text) if t.strip()]
        return Outcome(bool(titles), f"title: {titles[0]!r}" if titles else "no <<title>>")

    def describe(self) -> str:
        return "Your answer must contain a title, wrapped in double angular brackets, such as <<poem of joy>>."


# ----------------------------------------------------------------------------------------------------------------------
# combinations, start and end, punctuation
# ----------------------------------------------------------------------------------------------------------------------


@register
class TwoResponses(Instruction):
    """Two different, non-empty responses separated by a line of six asterisks (``******``)."""

    id: ClassVar[str] = "combination:two_responses"

    def check(self, text: str) -> Outcome:
        parts = [part.strip() for part in re.split(r"(?m)^\s*\*{6}\s*$", text.strip())]
        followed = len(parts) == 2 and all(parts) and parts[0] != parts[1]
        return Outcome(followed, f"{len(parts)} parts separated by ******")

    def describe(self) -> str:
        return "Give two different responses. Responses and only responses should be separated by 6 asterisk symbols: ******."


@register
class RepeatPrompt(Instruction):
    """The response starts with ``prompt_to_repeat`` word for word (case and surrounding whitespace ignored)."""

    id: ClassVar[str] = "combination:repeat_prompt"
    prompt_to_repeat: str = Field(min_length=1)

    def check(self, text: str) -> Outcome:
        followed = text.strip().lower().startswith(self.prompt_to_repeat.strip().lower())
        return Outcome(followed, "starts with the request" if followed else "does not start with the request")

    def describe(self) -> str:
        return (
            "First repeat the request word for word without change, then give your answer (do not say anything "
            "before repeating the request)."
        )


@register
class EndChecker(Instruction):
    """The response ends with ``end_phrase`` (case ignored); nothing but whitespace may follow."""

    id: ClassVar[str] = "startend:end_checker"
    end_phrase: str = Field(min_length=1)

    def check(self, text: str) -> Outcome:
        followed = text.strip().lower().endswith(self.end_phrase.strip().lower())
        return Outcome(followed, f"ends with {text.strip()[-40:]!r}")

    def describe(self) -> str:
        return f"Finish your response with this exact phrase: {self.end_phrase!r}. No other words should follow it."


@register
class Quotation(Instruction):
    """The whole response is wrapped in double quotation marks."""

    id: ClassVar[str] = "startend:quotation"

    def check(self, text: str) -> Outcome:
        stripped = text.strip()
        followed = len(stripped) > 1 and stripped[0] in '"“' and stripped[-1] in '"”'
        return Outcome(followed, "wrapped in quotes" if followed else "not wrapped in double quotes")

    def describe(self) -> str:
        return "Wrap your entire response with double quotation marks."


@register
class NoComma(Instruction):
    """No comma anywhere (ASCII ``,`` or the full-width ``，``)."""

    id: ClassVar[str] = "punctuation:no_comma"

    def check(self, text: str) -> Outcome:
        count = text.count(",") + text.count("，")
        return Outcome(count == 0, f"{count} commas")

    def describe(self) -> str:
        return "In your entire response, refrain from the use of any commas."
