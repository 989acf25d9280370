"""Fenced code blocks in a model's reply (```lang ... ```), for verifiers that grade code or structured payloads.

Models often write a draft block, then a corrected one, so callers usually want the *last* block in a given language.
Only closed blocks count: a reply cut off mid-block has no complete payload to grade.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

# An opening fence (three or more backticks or tildes, optional info string), the body, and a closing fence of the
# same characters on a line of its own.
_FENCE = re.compile(
    r"^[ \t]*(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>[^\n`]*)\n(?P<body>.*?)^[ \t]*(?P=fence)[ \t]*$", re.M | re.S
)


@dataclass(frozen=True)
class FencedBlock:
    language: str
    """The first word of the info string, lower-cased ("" for an untagged block)."""
    content: str


def fenced_blocks(text: str) -> list[FencedBlock]:
    """Every closed fenced block of ``text``, in order of appearance."""
    blocks = []
    for match in _FENCE.finditer(text):
        info = match.group("info").strip().split()
        blocks.append(FencedBlock(language=info[0].lower() if info else "", content=match.group("body")))
    return blocks


def last_fenced_block(text: str, languages: Iterable[str] | None = None, allow_untagged: bool = True) -> str | None:
    """The content of the last block tagged with one of ``languages`` (any tag when None), or untagged when allowed."""
    wanted = {language.lower() for language in languages} if languages is not None else None
    for block in reversed(fenced_blocks(text)):
        if (block.language == "" and allow_untagged) or (
            block.language and (wanted is None or block.language in wanted)
        ):
            return block.content
    return None
