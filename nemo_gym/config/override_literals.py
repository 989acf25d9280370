"""The common shapes of Hydra override tokens, read without loading Hydra.

Hydra's override parser (an ANTLR grammar) costs a command ~0.12 s to import, and most command lines hold only tokens
like ``+head_server={host: 127.0.0.1, port: 11000}``, ``+results_dir=/tmp/run``, ``++limit=5`` or ``~key``. This
module reads those by Hydra's own lexical rules (the same value and type for every token it accepts) and answers
``None`` for anything else: sweeps, functions, interpolations, escapes, whitespace inside a value, quotes holding a
backslash, keys with ``/`` or ``@``. Those go to Hydra, which also words every error. ``tests/unit/
test_override_literals.py`` checks both parsers agree on generated tokens.
"""

from __future__ import annotations

import re
from typing import Any, Literal

OverrideKind = Literal["change", "add", "force", "delete"]

_INT_UNSIGNED = r"(?:0|[1-9](?:_?[0-9])*)"
_DIGITS = r"[0-9](?:_?[0-9])*"
_POINT_FLOAT = rf"(?:{_INT_UNSIGNED}?\.{_DIGITS}|{_INT_UNSIGNED}\.)"
# Hydra's lexer takes the longest match, so a scalar is one typed token only when one of these matches all of it;
# otherwise it is several tokens, and Hydra joins their text into a string.
_FLOAT = re.compile(
    rf"[+-]?(?:(?:{_POINT_FLOAT}|{_INT_UNSIGNED})[eE][+-]?{_DIGITS}|{_POINT_FLOAT}|[Ii][Nn][Ff]|[Nn][Aa][Nn])"
)
_INT = re.compile(rf"[+-]?{_INT_UNSIGNED}")
_BOOL = re.compile(r"[Tt][Rr][Uu][Ee]|[Ff][Aa][Ll][Ss][Ee]")
_NULL = re.compile(r"[Nn][Uu][Ll][Ll]")
_ID = r"[A-Za-z_][A-Za-z0-9_\-]*"
_KEY = re.compile(rf"{_ID}(?:\.(?:{_ID}|0|[1-9][0-9]*))*")
_DICT_KEY = re.compile(_ID)
# Characters every one of which Hydra lexes as part of an unquoted value (":" only outside containers, where it
# separates a mapping's key from its value).
_TOP_SCALAR = re.compile(r"[A-Za-z0-9_./:+\-]+")
_INNER_SCALAR = re.compile(r"[A-Za-z0-9_./+\-]+")
_WS = " \t"
_PREFIXES: tuple[tuple[str, OverrideKind], ...] = (("++", "force"), ("+", "add"))


class _NotCommon(Exception):
    """The token is not one of the shapes read here: Hydra parses it."""


def parse_common(token: str) -> tuple[OverrideKind, str, Any] | None:
    """``(kind, key, value)`` of an override token as Hydra reads it (kind: change, add, force, delete), or None when
    the token is not one of the common shapes (then ask Hydra)."""
    if token.startswith("~"):
        return ("delete", token[1:], None) if _KEY.fullmatch(token[1:]) else None
    kind: OverrideKind = "change"
    rest = token
    for prefix, name in _PREFIXES:
        if token.startswith(prefix):
            kind, rest = name, token[len(prefix) :]
            break
    key, equal, text = rest.partition("=")
    if not equal or not _KEY.fullmatch(key):
        return None
    text = text.lstrip(_WS)  # Hydra's "=" takes the blanks after it
    if not text:
        return None
    try:
        value, end = _element(text, 0, top=True)
    except _NotCommon:
        return None
    return (kind, key, value) if end == len(text) else None


def _element(text: str, i: int, top: bool) -> tuple[Any, int]:
    if i >= len(text):
        raise _NotCommon
    first = text[i]
    if first == "[":
        return _list(text, i + 1)
    if first == "{":
        return _dict(text, i + 1)
    if first in "'\"":
        end = text.find(first, i + 1)
        inner = text[i + 1 : end]
        if end < 0 or "\\" in inner or "$" in inner or not inner.isprintable():
            raise _NotCommon
        return inner, end + 1
    match = (_TOP_SCALAR if top else _INNER_SCALAR).match(text, i)
    if match is None:
        raise _NotCommon
    return _scalar(match.group()), match.end()


def _scalar(word: str) -> Any:
    if _INT.fullmatch(word):
        return int(word)
    if _FLOAT.fullmatch(word):
        return float(word)
    if _BOOL.fullmatch(word):
        return word.lower() == "true"
    if _NULL.fullmatch(word):
        return None
    return word


def _skip(text: str, i: int) -> int:
    while i < len(text) and text[i] in _WS:
        i += 1
    return i


def _list(text: str, i: int) -> tuple[list[Any], int]:
    items: list[Any] = []
    i = _skip(text, i)
    if text.startswith("]", i):
        return items, i + 1
    while True:
        item, i = _element(text, i, top=False)
        items.append(item)
        i = _skip(text, i)
        if text.startswith("]", i):
            return items, i + 1
        if not text.startswith(",", i):
            raise _NotCommon
        i = _skip(text, i + 1)


def _dict(text: str, i: int) -> tuple[dict[str, Any], int]:
    items: dict[str, Any] = {}
    i = _skip(text, i)
    if text.startswith("}", i):
        return items, i + 1
    while True:
        key = _DICT_KEY.match(text, i)
        # Hydra types a mapping's keys like values: true / null / inf would not stay strings.
        if key is None or _scalar(key.group()) != key.group():
            raise _NotCommon
        i = _skip(text, key.end())
        if not text.startswith(":", i):
            raise _NotCommon
        items[key.group()], i = _element(text, _skip(text, i + 1), top=False)
        i = _skip(text, i)
        if text.startswith("}", i):
            return items, i + 1
        if not text.startswith(",", i):
            raise _NotCommon
        i = _skip(text, i + 1)
