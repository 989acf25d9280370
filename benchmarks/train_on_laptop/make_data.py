"""Write the benchmark's rows: capital cities, 50 countries to train on and 20 other countries held out, each plain
(``<split>.jsonl``) and after one worked example turn (``<split>_oneshot.jsonl``, the measured run).

Each row asks for the capital and a closing ``Final answer: <city>`` line, which string_match reads
(``extraction_mode: final_answer``). Deterministic: the same files on every run.
"""

from __future__ import annotations

import json
import pathlib
import random

CAPITALS = {
    "France": "Paris", "Japan": "Tokyo", "Italy": "Rome", "Germany": "Berlin", "Spain": "Madrid",
    "Russia": "Moscow", "China": "Beijing", "Egypt": "Cairo", "England": "London", "Greece": "Athens",
    "Portugal": "Lisbon", "Ireland": "Dublin", "Austria": "Vienna", "Norway": "Oslo", "Sweden": "Stockholm",
    "Finland": "Helsinki", "Denmark": "Copenhagen", "Poland": "Warsaw", "Hungary": "Budapest",
    "the Czech Republic": "Prague", "Belgium": "Brussels", "the Netherlands": "Amsterdam", "Switzerland": "Bern",
    "Turkey": "Ankara", "India": "New Delhi", "Thailand": "Bangkok", "South Korea": "Seoul",
    "Indonesia": "Jakarta", "the Philippines": "Manila", "Vietnam": "Hanoi", "Canada": "Ottawa",
    "Mexico": "Mexico City", "Argentina": "Buenos Aires", "Peru": "Lima", "Chile": "Santiago",
    "Colombia": "Bogota", "Kenya": "Nairobi", "Australia": "Canberra", "New Zealand": "Wellington",
    "Iran": "Tehran", "Iraq": "Baghdad", "Cuba": "Havana", "Ukraine": "Kyiv", "Romania": "Bucharest",
    "Bulgaria": "Sofia", "Serbia": "Belgrade", "Croatia": "Zagreb", "Scotland": "Edinburgh", "Wales": "Cardiff",
    "Iceland": "Reykjavik", "Saudi Arabia": "Riyadh", "Lebanon": "Beirut", "Syria": "Damascus",
    "Pakistan": "Islamabad", "Afghanistan": "Kabul", "Nepal": "Kathmandu", "Malaysia": "Kuala Lumpur",
    "Brazil": "Brasilia", "Venezuela": "Caracas", "Ethiopia": "Addis Ababa", "Nigeria": "Abuja",
    "Ghana": "Accra", "Morocco": "Rabat", "Algeria": "Algiers", "Tunisia": "Tunis", "Libya": "Tripoli",
    "the United States": "Washington", "Jamaica": "Kingston", "Estonia": "Tallinn", "Latvia": "Riga",
}  # fmt: skip
HELD_OUT = 20


def row(country: str, city: str) -> dict:
    question = f"What is the capital of {country}? End your reply with a line of the form 'Final answer: <city>'."
    return {"responses_create_params": {"input": [{"role": "user", "content": question}]}, "expected_answer": city}


EXAMPLE_TURN = [
    {"role": "user", "content": "What is the capital of Peru?"},
    {"role": "assistant", "content": "The capital of Peru is Lima.\nFinal answer: Lima"},
]


def one_shot_row(country: str, city: str) -> dict:
    """The same question after one worked example turn: the untrained model follows the answer format only when an
    earlier assistant turn shows it (see README, "Probes")."""
    question = {"role": "user", "content": f"What is the capital of {country}?"}
    return {"responses_create_params": {"input": [*EXAMPLE_TURN, question]}, "expected_answer": city}


def main() -> None:
    items = sorted(CAPITALS.items())
    random.Random(0).shuffle(items)
    data = pathlib.Path(__file__).parent / "data"
    data.mkdir(exist_ok=True)
    for name, part in (("heldout", items[:HELD_OUT]), ("train", items[HELD_OUT:])):
        lines = [json.dumps(row(country, city)) for country, city in part]
        (data / f"{name}.jsonl").write_text("\n".join(lines) + "\n")
        lines = [json.dumps(one_shot_row(country, city)) for country, city in part]
        (data / f"{name}_oneshot.jsonl").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
