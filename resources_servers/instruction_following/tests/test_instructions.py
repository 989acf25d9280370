"""Each instruction's rule: a reply that follows it, one that does not, and the edge cases of its definition."""

from __future__ import annotations

import pytest

from resources_servers.instruction_following import text_stats
from resources_servers.instruction_following.instructions import REGISTRY, build

LOWER = "the moon pulls on the ocean with its gravity, so the water bulges toward it and away from it."
FRENCH = "La forêt sent la mousse et les feuilles mortes. Nous marchons lentement sous les chênes dorés."

CASES = [
    # (id, kwargs, followed text, not-followed text)
    ("keywords:existence", {"keywords": ["moon", "tidal force"]}, "The Moon and its Tidal Force.", "The moonlight."),
    (
        "keywords:frequency",
        {"keyword": "run", "frequency": 2, "relation": "at least"},
        "Run. Then run!",
        "Run, running.",
    ),
    ("keywords:frequency", {"keyword": "run", "frequency": 2, "relation": "less than"}, "Run fast.", "run run"),
    ("keywords:forbidden_words", {"forbidden_words": ["very"]}, "Everyone is quite happy.", "We are VERY happy."),
    ("keywords:letter_frequency", {"letter": "z", "let_frequency": 2, "let_relation": "at least"}, "Zig zag", "Zebra"),
    ("language:response_language", {"language": "fr"}, FRENCH, "The forest smells of moss and dead leaves today."),
    ("change_case:english_capital", {}, LOWER.upper(), LOWER.upper().replace("MOON", "Moon")),
    ("change_case:english_lowercase", {}, LOWER, LOWER.replace("moon", "Moon")),
    (
        "change_case:capital_word_frequency",
        {"capital_frequency": 2, "capital_relation": "at least"},
        "NASA and ESA agree.",
        "NASA agrees.",
    ),
    (
        "length_constraints:number_sentences",
        {"num_sentences": 2, "relation": "exactly"},
        "Dr. Who ran. He hid!",
        "One. Two. Three.",
    ),
    (
        "length_constraints:number_words",
        {"num_words": 5, "relation": "at most"},
        "Don't stop the well-known band.",
        "One two three four five six.",
    ),
    (
        "length_constraints:number_paragraphs",
        {"num_paragraphs": 2},
        "First part.\n***\nSecond part.",
        "First part.\n***\n\n***\nSecond part.",
    ),
    (
        "length_constraints:nth_paragraph_first_word",
        {"num_paragraphs": 2, "nth_paragraph": 2, "first_word": "next"},
        'Opening words.\n\n"Next, the end.',
        "Opening words.\n\nThen the end.",
    ),
    (
        "detectable_content:number_placeholders",
        {"num_placeholders": 2},
        "Dear [name], see you at [place].",
        "Dear [name], see you at [ ].",
    ),
    (
        "detectable_content:postscript",
        {"postscript_marker": "P.S."},
        "Body text.\n\nP.S. Bring snacks.",
        "Body text. P.S. is at the end",
    ),
    (
        "detectable_format:number_bullet_lists",
        {"num_bullets": 2},
        "Tips:\n* one\n- two\n**bold** line",
        "Tips:\n* one\n* two\n* three",
    ),
    ("detectable_format:constrained_response", {}, "My answer is no.", "My answer is yes. My answer is no."),
    ("detectable_format:constrained_response", {"options": ["Agree", "Disagree"]}, "I Disagree.", "Maybe."),
    (
        "detectable_format:number_highlighted_sections",
        {"num_highlights": 2},
        "*one* and **two**",
        "* bullet *\n* another",
    ),
    (
        "detectable_format:multiple_sections",
        {"section_spliter": "Section", "num_sections": 2},
        "SECTION 1\nintro\n## Section 2\nbody",
        "Section 1\nall in one section",
    ),
    ("detectable_format:json_format", {}, '```json\n{"a": 1}\n```', 'Here: {"a": 1}'),
    ("detectable_format:title", {}, "<<Ladder Request>>\nHi.", "<< >>\nHi."),
    ("combination:two_responses", {}, "First answer.\n******\nSecond answer.", "Same.\n******\nSame."),
    ("combination:repeat_prompt", {"prompt_to_repeat": "Name a colour."}, "name a colour. Blue.", "Blue."),
    (
        "startend:end_checker",
        {"end_phrase": "Any other questions?"},
        "Done. Any other questions?  \n",
        "Any other questions? Bye.",
    ),
    ("startend:quotation", {}, '  "Wrapped in quotes."  ', '"Only at the start.'),
    ("punctuation:no_comma", {}, "No commas here.", "One, two."),
]


def test_there_are_at_least_twenty_instruction_types_and_all_are_tested():
    assert len(REGISTRY) >= 20
    assert {case[0] for case in CASES} == set(REGISTRY)


@pytest.mark.parametrize(
    ("instruction_id", "kwargs", "good", "bad"), CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)]
)
def test_rule(instruction_id, kwargs, good, bad):
    instruction = build(instruction_id, kwargs)
    assert instruction.check(good).followed, instruction.check(good).detail
    assert not instruction.check(bad).followed, instruction.check(bad).detail


@pytest.mark.parametrize("instruction_id", sorted(REGISTRY))
def test_every_instruction_handles_an_empty_reply_and_describes_itself(instruction_id):
    kwargs = next(case[1] for case in CASES if case[0] == instruction_id)
    instruction = build(instruction_id, kwargs)
    instruction.check("")  # never raises
    assert instruction.describe().strip()


def test_relations_and_counting_rules():
    assert [text_stats.compare(3, r, 3) for r in text_stats.RELATIONS] == [False, True, True, True, False]
    assert text_stats.words("It's a well-known fact: 3.14 > 3, 1,000 cats.") == [
        "It's", "a", "well-known", "fact", "3.14", "3", "1,000", "cats",
    ]  # fmt: skip
    assert text_stats.count_sentences("Mr. Smith paid $3.50 at 5 p.m. on Monday. Then e.g. J. R. left!\n\nNo stop") == 3
    assert text_stats.blank_line_paragraphs("\n\na\n\n\n b \n\n") == ["a", "b"]


def test_null_kwargs_are_dropped_and_unknown_kwargs_rejected():
    assert build("punctuation:no_comma", {"unused": None}).check("ok").followed
    with pytest.raises(ValueError):
        build("punctuation:no_comma", {"typo": 1})
    with pytest.raises(KeyError):
        build("no:such_instruction", {})
