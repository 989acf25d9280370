"""Generate multineedle rows: key -> value facts ("needles") hidden in a long, procedurally written haystack.

Everything is made up here, from small word lists, by one seeded ``random.Random``: the same arguments always give the
same row, and no outside text is used. Filler sentences follow a few templates ("The night courier repaired a brass
lantern near the eastern quarry before dawn."); needles use other templates that always state ``<key>`` and
``<value>`` verbatim; decoys are needles for keys the question does not ask about.

``python resources_servers/multineedle/generate_data.py`` rewrites ``data/example.jsonl``; ``--size N --first-seed S
--output PATH`` writes more rows (``--num-sentences``, ``--num-needles``, ``--num-decoys`` set the difficulty).
"""

from __future__ import annotations

import argparse
import json
import random
import string
from pathlib import Path
from typing import Any

SUBJECTS = (
    "The night courier", "A retired cartographer", "The village baker", "Our quartermaster", "A tired lighthouse keeper",
    "The youngest apprentice", "A travelling clockmaker", "The harbour pilot", "An old beekeeper", "The city archivist",
    "A curious botanist", "The ferry captain", "A patient glassblower", "The orchard foreman", "A quiet librarian",
)  # fmt: skip
VERBS = (
    "repaired", "painted", "carried", "measured", "described", "polished", "sketched", "traded", "counted", "hid",
    "inspected", "wrapped", "sorted", "borrowed", "returned",
)  # fmt: skip
OBJECTS = (
    "a brass lantern", "three copper kettles", "an unfinished map", "a crate of pears", "the broken weathervane",
    "a bundle of letters", "a wooden compass", "the spare sails", "a jar of honey", "two silver spoons",
    "a ledger of tides", "the cracked telescope", "a basket of wool", "an iron key ring", "a tin of tea",
)  # fmt: skip
PLACES = (
    "near the eastern quarry", "behind the old mill", "at the river ford", "inside the granary", "on the north pier",
    "beside the chapel wall", "under the market arch", "in the signal tower", "along the canal path",
    "at the crossroads inn", "by the salt marsh", "in the walled garden",
)  # fmt: skip
TIMES = (
    "before dawn", "after the evening bell", "during the spring fair", "on a windy Tuesday", "at midsummer",
    "while it rained", "just before supper", "in the first week of autumn", "after the harvest", "at low tide",
)  # fmt: skip
FILLER_TEMPLATES = (
    "{subject} {verb} {object} {place} {time}.",
    "{time_cap}, {subject_lower} {verb} {object} {place}.",
    "Nobody remembers why {subject_lower} {verb} {object} {place}.",
    "{subject} once {verb} {object} {time}, and nobody asked why.",
    "It is said that {subject_lower} {verb} {object} {place}.",
)
KEY_ADJECTIVES = (
    "amber", "cobalt", "crimson", "silent", "golden", "hollow", "frozen", "velvet", "northern", "scarlet", "copper",
    "misty", "ivory", "rustic", "lunar", "emerald",
)  # fmt: skip
KEY_NOUNS = (
    "heron", "falcon", "lantern", "harbor", "meadow", "anchor", "willow", "compass", "beacon", "orchard", "glacier",
    "sparrow", "quarry", "citadel", "thistle", "otter",
)  # fmt: skip
NEEDLE_TEMPLATES = (
    "The secret value for {key} is {value}.",
    "Remember this: the code word {key} stands for {value}.",
    "A note pinned to the door said that {key} equals {value}.",
    "For the record, the value of {key} is {value}.",
)
SENTENCES_PER_PARAGRAPH = 6


def make_value(rng: random.Random) -> str:
    """A code such as ``QX-4821``: two letters and four digits, unlikely to be guessed or to occur in filler."""
    letters = "".join(rng.choices(string.ascii_uppercase, k=2))
    return f"{letters}-{rng.randrange(1000, 10000)}"


def make_keys(rng: random.Random, count: int) -> list[str]:
    """``count`` distinct ``adjective-noun`` keys."""
    pairs = [f"{adjective}-{noun}" for adjective in KEY_ADJECTIVES for noun in KEY_NOUNS]
    if count > len(pairs):
        raise ValueError(f"at most {len(pairs)} distinct keys, asked for {count}")
    return rng.sample(pairs, count)


def filler_sentence(rng: random.Random) -> str:
    subject, time = rng.choice(SUBJECTS), rng.choice(TIMES)
    return rng.choice(FILLER_TEMPLATES).format(
        subject=subject,
        subject_lower=subject[0].lower() + subject[1:],
        verb=rng.choice(VERBS),
        object=rng.choice(OBJECTS),
        place=rng.choice(PLACES),
        time=time,
        time_cap=time[0].upper() + time[1:],
    )


def build_haystack(rng: random.Random, facts: list[tuple[str, str]], num_sentences: int) -> tuple[str, dict[str, int]]:
    """The document, and the sentence index where each fact's key landed (facts never share a sentence slot)."""
    sentences = [filler_sentence(rng) for _ in range(num_sentences)]
    slots = sorted(rng.sample(range(num_sentences + 1), len(facts)))
    positions: dict[str, int] = {}
    for offset, (slot, (key, value)) in enumerate(zip(slots, facts, strict=True)):
        sentences.insert(slot + offset, rng.choice(NEEDLE_TEMPLATES).format(key=key, value=value))
        positions[key] = slot + offset
    paragraphs = [
        " ".join(sentences[i : i + SENTENCES_PER_PARAGRAPH]) for i in range(0, len(sentences), SENTENCES_PER_PARAGRAPH)
    ]
    return "\n\n".join(paragraphs), positions


def build_prompt(document: str, keys: list[str]) -> str:
    asked = ", ".join(keys)
    example = json.dumps({key: "..." for key in keys[:2]})
    return (
        "Read the document below. Somewhere in it are facts that give a value (a code such as AB-1234) for a code "
        "word.\n\n<document>\n"
        f"{document}\n</document>\n\n"
        f"Report the value of each of these code words: {asked}.\n"
        "Answer with one JSON object that maps every code word to its value, exactly as written in the document, "
        f"for example {example}. Nothing else is graded."
    )


def build_row(seed: int, num_sentences: int = 200, num_needles: int = 3, num_decoys: int = 2) -> dict[str, Any]:
    """One task; the same arguments always give the same row."""
    if num_needles < 1:
        raise ValueError("a task needs at least one needle")
    rng = random.Random(seed)
    keys = make_keys(rng, num_needles + num_decoys)
    values: list[str] = []
    while len(values) < len(keys):  # distinct values, so a value names its key
        value = make_value(rng)
        if value not in values:
            values.append(value)
    facts = list(zip(keys, values, strict=True))
    document, positions = build_haystack(rng, facts, num_sentences)
    asked = facts[:num_needles]
    return {
        "responses_create_params": {
            "input": [{"role": "user", "content": build_prompt(document, [k for k, _ in asked])}]
        },
        "needles": [{"key": key, "value": value, "sentence_index": positions[key]} for key, value in asked],
        "generation": {
            "seed": seed,
            "num_sentences": num_sentences,
            "num_needles": num_needles,
            "num_decoys": num_decoys,
        },
    }


EXAMPLES = (  # (seed, sentences, needles, decoys): small to mid-sized haystacks
    (1, 120, 2, 1),
    (2, 200, 3, 2),
    (3, 300, 4, 2),
    (4, 200, 1, 3),
    (5, 400, 5, 3),
)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, default=Path(__file__).parent / "data" / "example.jsonl")
    parser.add_argument("--size", type=int, default=None, help="rows with consecutive seeds (default: the examples)")
    parser.add_argument("--first-seed", type=int, default=1000)
    parser.add_argument("--num-sentences", type=int, default=600)
    parser.add_argument("--num-needles", type=int, default=4)
    parser.add_argument("--num-decoys", type=int, default=3)
    args = parser.parse_args(argv)
    specs: tuple[tuple[int, int, int, int], ...]
    if args.size is None:
        specs = EXAMPLES
    else:
        specs = tuple(
            (seed, args.num_sentences, args.num_needles, args.num_decoys)
            for seed in range(args.first_seed, args.first_seed + args.size)
        )
    args.output.parent.mkdir(parents=True, exist_ok=True)
    with args.output.open("w", encoding="utf-8") as out:
        for seed, sentences, needles, decoys in specs:
            out.write(json.dumps(build_row(seed, sentences, needles, decoys)) + "\n")


if __name__ == "__main__":
    main()
