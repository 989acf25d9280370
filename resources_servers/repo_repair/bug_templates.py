"""The bug templates of repo_repair's tasks (used by ``generate_tasks.py``).

Each template draws, from a seeded ``random.Random``, one small buggy function: its name, module, constants and test
data, the line that holds the bug, and two edits of the code: the gold fix and a wrong fix (a plausible change that
leaves the bug, or an edit of another line). The expected values in the tests are computed here with the correct
logic. ``COMPANIONS`` are correct helper functions; each repository gets one, with a test that always passes.
"""

from __future__ import annotations

import json
import random
import string
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from string import Template
from typing import Any, TypeVar

T = TypeVar("T")


class Draw(random.Random):
    """The seeded random source of the templates. ``variant`` deals a list of name variants like cards: each is used
    once before any repeats, so tasks from one template differ in names and not only in data."""

    def __init__(self, seed: int) -> None:
        super().__init__(seed)
        self._decks: dict[str, list[Any]] = {}

    def variant(self, options: Sequence[T]) -> T:
        deck = self._decks.get(repr(options))
        if not deck:
            deck = self._decks[repr(options)] = self.sample(list(options), len(options))
        return deck.pop()


def _q(value: str | list[str]) -> str:
    """Python source of a string or a list of strings, in double quotes."""
    return json.dumps(value)


@dataclass(frozen=True)
class Blueprint:
    """One bug, before it is placed in a package: the buggy module code as a ``string.Template`` and the values of
    its placeholders in the buggy version, and which of them the gold and the wrong fix change."""

    kind: str
    module: str
    doc: str
    code: str
    buggy: dict[str, str]
    fix: dict[str, str]
    wrong: dict[str, str]
    functions: tuple[str, ...]
    tests: str
    failing: tuple[str, ...]

    def source(self, version: str) -> str:
        change = {"buggy": {}, "gold": self.fix, "wrong": self.wrong}[version]
        return Template(self.code).substitute(self.buggy | change).strip()


# --- bug templates: each takes the seeded Draw and returns a Blueprint ------------------------------------------------


def off_by_one_windows(rng: Draw) -> Blueprint:
    fn, module = rng.variant([("window_means", "stats"), ("rolling_average", "series"), ("moving_means", "smoothing")])
    size = rng.choice([2, 4])
    values = [rng.randint(1, 40) for _ in range(size + rng.randint(2, 4))]
    means = [sum(values[i : i + size]) / size for i in range(len(values) - size + 1)]
    code = '''
def ${fn}(values: list[int], size: int) -> list[float]:
    """Return the mean of every run of `size` consecutive values."""
    means = []
    for start in ${loop}:
        window = values[start : start + size]
        ${append}
    return means
'''
    tests = f"""
def test_{fn}_basic():
    assert {fn}({values}, {size}) == {means}


def test_{fn}_input_shorter_than_window():
    assert {fn}({values[: size - 1]}, {size}) == []
"""
    return Blueprint(
        "off_by_one", module, "Moving averages.", code,
        {"fn": fn, "loop": "range(len(values) - size)", "append": "means.append(sum(window) / size)"},
        {"loop": "range(len(values) - size + 1)"}, {"append": "means.append(sum(window) / len(window))"},
        (fn,), tests, (f"test_{fn}_basic",),
    )  # fmt: skip


def off_by_one_chunks(rng: Draw) -> Blueprint:
    fn, module = rng.variant([("chunk_text", "text"), ("split_fixed", "chunking"), ("pieces_of", "formatting")])
    width = rng.randint(2, 4)

    def word(length: int) -> str:
        return "".join(rng.choice(string.ascii_lowercase) for _ in range(length))

    uneven, even = word(width * rng.randint(2, 3) + 1), word(width * rng.randint(2, 3))
    code = '''
def ${fn}(text: str, width: int) -> list[str]:
    """Split text into consecutive pieces of `width` characters; the last piece may be shorter."""
    return [text[i : i + width] for i in ${bug}]
'''
    tests = f"""
def test_{fn}_uneven_length():
    assert {fn}({_q(uneven)}, {width}) == {_q([uneven[i : i + width] for i in range(0, len(uneven), width)])}


def test_{fn}_exact_multiple():
    assert {fn}({_q(even)}, {width}) == {_q([even[i : i + width] for i in range(0, len(even), width)])}
"""
    return Blueprint(
        "off_by_one", module, "Text splitting.", code,
        {"fn": fn, "bug": "range(0, len(text) - 1, width)"}, {"bug": "range(0, len(text), width)"},
        {"bug": "range(0, len(text) - width, width)"}, (fn,), tests, (f"test_{fn}_uneven_length",),
    )  # fmt: skip


def off_by_one_multiples(rng: Draw) -> Blueprint:
    fn, module = rng.variant([("multiples_between", "ranges"), ("list_multiples", "sequences"), ("steps_in", "arith")])
    step = rng.randint(3, 7)
    low = rng.randint(1, 10)
    high = step * rng.randint(low // step + 2, low // step + 4)
    code = '''
def ${fn}(low: int, high: int, step: int) -> list[int]:
    """Return the multiples of step from low to high, both ends included."""
    return [n for n in range(low, ${end}) if ${cond}]
'''
    tests = f"""
def test_{fn}_includes_high():
    assert {fn}({low}, {high}, {step}) == {[n for n in range(low, high + 1) if n % step == 0]}


def test_{fn}_high_not_a_multiple():
    assert {fn}({low}, {high - 1}, {step}) == {[n for n in range(low, high) if n % step == 0]}
"""
    return Blueprint(
        "off_by_one", module, "Integer ranges.", code,
        {"fn": fn, "end": "high", "cond": "n % step == 0"}, {"end": "high + 1"}, {"cond": "n % step == 0 and n <= high"},
        (fn,), tests, (f"test_{fn}_includes_high",),
    )  # fmt: skip


def wrong_operator_threshold(rng: Draw) -> Blueprint:
    fn, arg, const, module, low, high, at_least = rng.variant(
        [
            ("is_passing", "score", "PASS_MARK", "grading", 40, 70, True),
            ("can_rent_car", "age", "MIN_AGE", "rental", 18, 25, True),
            ("has_quorum", "votes", "QUORUM", "meetings", 3, 12, True),
            ("needs_restock", "count", "RESTOCK_LEVEL", "inventory", 5, 20, False),
        ]
    )
    limit = rng.randint(low, high)
    op, word, sign = (">", "at least", 1) if at_least else ("<", "at most", -1)
    code = '''
${const} = ${limit}


def ${fn}(${arg}: int) -> bool:
    """Return True when ${arg} is ${word} ${const}."""
    return ${bug}
'''
    tests = f"""
def test_{fn}_at_the_limit():
    assert {fn}({limit}) is True


def test_{fn}_far_from_the_limit():
    assert {fn}({limit + 5 * sign}) is True
    assert {fn}({limit - 3 * sign}) is False
"""
    return Blueprint(
        "wrong_operator", module, f"Rules about {arg}.", code,
        {"fn": fn, "arg": arg, "const": const, "limit": str(limit), "word": word, "bug": f"{arg} {op} {const}"},
        {"bug": f"{arg} {op}= {const}"}, {"bug": f"{arg} {op}= {const} {'+' if at_least else '-'} 1"},
        (fn,), tests, (f"test_{fn}_at_the_limit",),
    )  # fmt: skip


def wrong_operator_discount(rng: Draw) -> Blueprint:
    fn, module = rng.variant([("apply_discount", "pricing"), ("sale_price", "checkout"), ("reduced_price", "billing")])
    price, percent = rng.choice([40, 60, 80, 120, 250, 300]), rng.choice([10, 15, 20, 25, 50])
    other = rng.choice([19.99, 45.5, 72.0])
    code = '''
def ${fn}(price: float, percent: float) -> float:
    """Return price reduced by `percent` per cent, rounded to cents."""
    return ${bug}
'''
    tests = f"""
def test_{fn}_reduces_price():
    assert {fn}({price}, {percent}) == {round(price - price * percent / 100, 2)}


def test_{fn}_zero_percent():
    assert {fn}({other}, 0) == {other}
"""
    return Blueprint(
        "wrong_operator", module, "Prices.", code,
        {"fn": fn, "bug": "round(price + price * percent / 100, 2)"}, {"bug": "round(price - price * percent / 100, 2)"},
        {"bug": "round(price - percent, 2)"}, (fn,), tests, (f"test_{fn}_reduces_price",),
    )  # fmt: skip


def wrong_operator_average(rng: Draw) -> Blueprint:
    fn, module = rng.variant([("average", "summary"), ("mean_value", "measures"), ("arithmetic_mean", "aggregates")])
    values = [0, 0]
    while sum(values) % len(values) == 0:  # a mean with a fraction, so floor division is caught too
        values = [rng.randint(1, 50) for _ in range(rng.choice([2, 4]))]
    single = rng.randint(2, 99)
    code = '''
def ${fn}(values: list[int]) -> float:
    """Return the arithmetic mean of values."""
    if not values:
        raise ValueError("no values")
    return ${bug}
'''
    tests = f"""
def test_{fn}_of_several_values():
    assert {fn}({values}) == {sum(values) / len(values)}


def test_{fn}_of_one_value():
    assert {fn}([{single}]) == {single}
"""
    return Blueprint(
        "wrong_operator", module, "Summary statistics.", code,
        {"fn": fn, "bug": "sum(values) * len(values)"}, {"bug": "sum(values) / len(values)"},
        {"bug": "sum(values) // len(values)"}, (fn,), tests, (f"test_{fn}_of_several_values",),
    )  # fmt: skip


def swapped_arguments_percent(rng: Draw) -> Blueprint:
    fn, part, whole, module = rng.variant(
        [("percent_done", "done", "total", "progress"), ("hit_rate", "hits", "attempts", "cache_stats"),
         ("share_of", "part", "whole", "shares")]
    )  # fmt: skip
    b = rng.choice([4, 8, 20, 40, 50])
    a = rng.randint(1, b - 1)
    same = rng.randint(2, 30)
    code = '''
def _ratio(numerator: float, denominator: float) -> float:
    return numerator / denominator


def ${fn}(${part}: int, ${whole}: int) -> float:
    """Return ${part} as a percentage of ${whole}, rounded to one decimal."""
    return ${bug}
'''
    tests = f"""
def test_{fn}_partial():
    assert {fn}({a}, {b}) == {round(100 * a / b, 1)}


def test_{fn}_complete():
    assert {fn}({same}, {same}) == 100.0
"""
    bug = f"round(100 * _ratio({whole}, {part}), 1)"
    return Blueprint(
        "swapped_arguments", module, "Ratios.", code, {"fn": fn, "part": part, "whole": whole, "bug": bug},
        {"bug": f"round(100 * _ratio({part}, {whole}), 1)"}, {"bug": bug.replace(", 1)", ", 2)")},
        (fn,), tests, (f"test_{fn}_partial",),
    )  # fmt: skip


def swapped_arguments_elapsed(rng: Draw) -> Blueprint:
    fn, unit, module = rng.variant(
        [("elapsed_seconds", "seconds", "timing"), ("duration_minutes", "minutes", "clock"),
         ("days_between", "days", "schedule")]
    )  # fmt: skip
    start = rng.randint(0, 500)
    end = start + rng.randint(5, 300)
    code = '''
def _difference(later: int, earlier: int) -> int:
    return later - earlier


def ${fn}(start: int, end: int) -> int:
    """Return how many ${unit} passed from start to end."""
    return ${bug}
'''
    tests = f"""
def test_{fn}_forward():
    assert {fn}({start}, {end}) == {end - start}


def test_{fn}_same_moment():
    assert {fn}({end}, {end}) == 0
"""
    return Blueprint(
        "swapped_arguments", module, f"Durations in {unit}.", code,
        {"fn": fn, "unit": unit, "bug": "_difference(start, end)"}, {"bug": "_difference(end, start)"},
        {"bug": "_difference(start, end) if end >= start else 0"}, (fn,), tests, (f"test_{fn}_forward",),
    )  # fmt: skip


def swapped_arguments_join(rng: Draw) -> Blueprint:
    fn, head, tail, sep, module, heads, tails = rng.variant(
        [("log_path", "directory", "filename", "/", "paths", ["logs", "var/log", "tmp"], ["app.txt", "db.log"]),
         ("qualified_name", "namespace", "name", ".", "naming", ["core", "billing.api"], ["User", "run", "Invoice"]),
         ("route_url", "base", "route", "/", "urls", ["https://example.com", "/api"], ["users", "v1/items"])]
    )  # fmt: skip
    h, t = rng.choice(heads), rng.choice(tails)
    code = '''
def _join(head: str, tail: str) -> str:
    return head.rstrip("${sep}") + "${sep}" + tail.lstrip("${sep}")


def ${fn}(${head}: str, ${tail}: str) -> str:
    """Return ${tail} placed under ${head}, joined with "${sep}"."""
    return ${bug}
'''
    tests = f"""
def test_{fn}_joins():
    assert {fn}({_q(h)}, {_q(t)}) == {_q(h + sep + t)}


def test_{fn}_trailing_separator():
    assert {fn}({_q(h + sep)}, {_q(t)}) == {_q(h + sep + t)}
"""
    return Blueprint(
        "swapped_arguments", module, "Joining names.", code,
        {"fn": fn, "head": head, "tail": tail, "sep": sep, "bug": f"_join({tail}, {head})"},
        {"bug": f"_join({head}, {tail})"}, {"bug": f'_join({tail}, {head}).strip("{sep}")'},
        (fn,), tests, (f"test_{fn}_joins", f"test_{fn}_trailing_separator"),
    )  # fmt: skip


def string_case_count(rng: Draw) -> Blueprint:
    fn, module = rng.variant([("count_word", "words"), ("occurrences", "wordcount"), ("word_frequency", "corpus")])
    word, *others = rng.sample(["apple", "river", "stone", "cloud", "maple", "tiger", "piano", "lemon"], 3)
    n = rng.randint(2, 4)
    mixed = [rng.choice([word.upper(), word.title(), word]) for _ in range(n - 1)] + [word.title()]
    mixed_text = " ".join(rng.sample(mixed + others, len(mixed + others)))
    lower_text = " ".join([word, others[0], word])
    code = '''
def ${fn}(text: str, word: str) -> int:
    """Count how often word occurs in text, ignoring case."""
    return sum(1 for token in text.split() if ${bug})
'''
    tests = f"""
def test_{fn}_mixed_case():
    assert {fn}({_q(mixed_text)}, {_q(word)}) == {n}


def test_{fn}_lower_case():
    assert {fn}({_q(lower_text)}, {_q(word)}) == 2
"""
    return Blueprint(
        "string_case", module, "Word counts.", code,
        {"fn": fn, "bug": "token == word.lower()"}, {"bug": "token.lower() == word.lower()"},
        {"bug": "token == word.lower().strip()"}, (fn,), tests, (f"test_{fn}_mixed_case",),
    )  # fmt: skip


def string_case_affirmative(rng: Draw) -> Blueprint:
    fn, const, module, words = rng.variant(
        [("is_yes", "YES_WORDS", "answers", ["yes", "y", "sure"]),
         ("is_confirmed", "CONFIRM_WORDS", "prompts", ["ok", "okay", "confirm"]),
         ("accepts_terms", "ACCEPT_WORDS", "consent", ["agree", "accept", "yes"])]
    )  # fmt: skip
    chosen = rng.choice(words)
    shouted = rng.choice([chosen.upper(), chosen.title()])
    code = '''
${const} = {${words}}


def ${fn}(answer: str) -> bool:
    """Return True if answer is one of ${const}, ignoring case and surrounding spaces."""
    return ${bug} in ${const}
'''
    tests = f"""
def test_{fn}_capitalised():
    assert {fn}({_q("  " + shouted + " ")}) is True


def test_{fn}_plain_answers():
    assert {fn}({_q(words[-1])}) is True
    assert {fn}("no") is False
"""
    return Blueprint(
        "string_case", module, "Reading answers.", code,
        {"fn": fn, "const": const, "words": ", ".join(_q(w) for w in words), "bug": "answer.strip()"},
        {"bug": "answer.strip().lower()"}, {"bug": 'answer.strip(" .!")'}, (fn,), tests, (f"test_{fn}_capitalised",),
    )  # fmt: skip


def string_case_lookup(rng: Draw) -> Blueprint:
    fn, const, module, names = rng.variant(
        [("color_code", "COLOR_CODES", "colors", ["red", "green", "blue", "amber"]),
         ("fruit_id", "FRUIT_IDS", "produce", ["pear", "plum", "kiwi", "fig"]),
         ("planet_number", "PLANETS", "astronomy", ["mercury", "venus", "earth", "mars"])]
    )  # fmt: skip
    codes = rng.sample(range(10, 99), len(names))
    key = rng.randrange(len(names))
    code = '''
${const} = {${mapping}}


def ${fn}(name: str) -> int:
    """Return the code of name (case-insensitive, surrounding spaces ignored), or -1 if it is unknown."""
    return ${const}.get(${bug}, -1)
'''
    tests = f"""
def test_{fn}_messy_input():
    assert {fn}({_q("  " + names[key].title() + " ")}) == {codes[key]}


def test_{fn}_unknown():
    assert {fn}("pluto") == -1
"""
    mapping = ", ".join(f'"{n}": {c}' for n, c in zip(names, codes, strict=True))
    return Blueprint(
        "string_case", module, "Code tables.", code, {"fn": fn, "const": const, "mapping": mapping, "bug": "name.strip()"},
        {"bug": "name.strip().lower()"}, {"bug": "name.lower()"}, (fn,), tests, (f"test_{fn}_messy_input",),
    )  # fmt: skip


TEMPLATES: dict[str, list[Callable[[Draw], Blueprint]]] = {
    "off_by_one": [off_by_one_windows, off_by_one_chunks, off_by_one_multiples],
    "wrong_operator": [wrong_operator_threshold, wrong_operator_discount, wrong_operator_average],
    "swapped_arguments": [swapped_arguments_percent, swapped_arguments_elapsed, swapped_arguments_join],
    "string_case": [string_case_count, string_case_affirmative, string_case_lookup],
}

# Correct helpers, one per repository: a second function with a test that passes before and after the fix.
COMPANIONS: list[tuple[str, str, str]] = [
    ("clamp", 'def clamp(value: float, low: float, high: float) -> float:\n    """Limit value to [low, high]."""\n'
     "    return max(low, min(value, high))",
     "def test_clamp():\n    assert clamp(15, 0, 10) == 10\n    assert clamp(-3, 0, 10) == 0\n    assert clamp(4, 0, 10) == 4"),
    ("is_blank", 'def is_blank(text: str) -> bool:\n    """True if text has no visible characters."""\n'
     "    return not text.strip()",
     'def test_is_blank():\n    assert is_blank("  ")\n    assert not is_blank(" x ")'),
    ("safe_divide", "def safe_divide(a: float, b: float, default: float = 0.0) -> float:\n"
     '    """a / b, or default when b is zero."""\n    return default if b == 0 else a / b',
     "def test_safe_divide():\n    assert safe_divide(6, 3) == 2\n    assert safe_divide(1, 0) == 0.0"),
    ("unique_items", "def unique_items(items: list) -> list:\n"
     '    """The items without repeats, in first-seen order."""\n    return list(dict.fromkeys(items))',
     "def test_unique_items():\n    assert unique_items([3, 1, 3, 2, 1]) == [3, 1, 2]"),
]  # fmt: skip
