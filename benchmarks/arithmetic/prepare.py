"""Generate the arithmetic benchmark: integer expressions with exact answers, the same set for the same arguments.

``gym eval prepare --benchmark arithmetic`` imports this file and calls :func:`prepare`. Nothing is downloaded: the
problems are drawn from a seeded generator, so every machine gets the identical file, and the first N problems do not
depend on how many more are asked for. Rows are raw tasks (``question``, ``expected_answer`` …); the prompt in
``prompt.yaml`` turns them into ``responses_create_params.input`` when the benchmark is run or collated, which keeps
the template in one place instead of baking a copy of it into the data.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

DATA_PATH = Path(__file__).resolve().parent / "data" / "arithmetic.jsonl"

MAX_REDRAWS = 1000
# One problem kind per slot, cycled: mostly one-step, 30 % two-step with parentheses, 10 % multi-digit.
KIND_CYCLE = ("add", "sub", "mul", "two_step", "add", "sub", "mul", "two_step", "two_step", "multi_digit")


def _add(rng: random.Random) -> tuple[str, int]:
    a, b = rng.randint(2, 99), rng.randint(2, 99)
    return f"{a} + {b}", a + b


def _sub(rng: random.Random) -> tuple[str, int]:
    a, b = rng.randint(2, 99), rng.randint(2, 99)
    return f"{a} - {b}", a - b


def _mul(rng: random.Random) -> tuple[str, int]:
    a, b = rng.randint(2, 30), rng.randint(2, 30)
    return f"{a} × {b}", a * b


def _two_step(rng: random.Random) -> tuple[str, int]:
    a, b, c = rng.randint(2, 49), rng.randint(2, 49), rng.randint(2, 12)
    shapes: list[tuple[str, int]] = [
        (f"({a} + {b}) × {c}", (a + b) * c),
        (f"({a} - {b}) × {c}", (a - b) * c),
        (f"{c} × ({a} + {b})", c * (a + b)),
        (f"({a} × {c}) - {b}", a * c - b),
        (f"{a} - ({b} - {c})", a - (b - c)),
    ]
    return shapes[rng.randrange(len(shapes))]


def _multi_digit(rng: random.Random) -> tuple[str, int]:
    if rng.random() < 0.5:
        a, b = rng.randint(100, 999), rng.randint(11, 99)
        return f"{a} × {b}", a * b
    a, b = rng.randint(1000, 9999), rng.randint(1000, 9999)
    return f"{a} + {b}", a + b


GENERATORS: dict[str, Callable[[random.Random], tuple[str, int]]] = {
    "add": _add, "sub": _sub, "mul": _mul, "two_step": _two_step, "multi_digit": _multi_digit,
}  # fmt: skip


def generate(num_problems: int, seed: int = 0) -> list[dict[str, Any]]:
    """``num_problems`` distinct problems as raw rows; a repeated expression is redrawn (deterministically)."""
    if num_problems < 1:
        raise ValueError(f"num_problems must be at least 1, got {num_problems}")
    rng = random.Random(seed)
    seen: set[str] = set()
    rows = []
    for index in range(num_problems):
        kind = KIND_CYCLE[index % len(KIND_CYCLE)]
        question, answer = GENERATORS[kind](rng)
        for _ in range(MAX_REDRAWS):
            if question not in seen:
                break
            question, answer = GENERATORS[kind](rng)
        else:
            raise ValueError(f"cannot draw {num_problems} distinct problems: the {kind!r} problems ran out")
        seen.add(question)
        rows.append(
            {
                "id": f"arithmetic-{index:05d}",
                "operation": kind,
                "question": question,
                "expected_answer": str(answer),
                "extraction_mode": "boxed",
            }
        )
    return rows


def prepare(num_problems: int = 200, seed: int = 0, **_: Any) -> Path:
    """Write the benchmark file (atomically: a reader never sees half of it) and return its path."""
    rows = generate(int(num_problems), int(seed))
    DATA_PATH.parent.mkdir(parents=True, exist_ok=True)
    temporary = DATA_PATH.with_name(f".{DATA_PATH.name}.{os.getpid()}.tmp")
    try:
        with temporary.open("w", encoding="utf-8") as handle:
            for row in rows:
                handle.write(json.dumps(row, ensure_ascii=False) + "\n")
        os.replace(temporary, DATA_PATH)
    finally:
        temporary.unlink(missing_ok=True)
    return DATA_PATH


if __name__ == "__main__":
    print(prepare())
