"""reasoning-gym scoring, run inside the verifier worker processes.

The package's scorers are plain Python, but a few (integration, polynomial tasks) call SymPy and some loop over
search spaces, so they run in the warm worker pool with a deadline like math-verify does. The server process itself
never imports reasoning-gym (an 8-second import on a small machine).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import cache
from typing import Any

HEAVY_MODULES = ("reasoning_gym",)
"""Imported by the pool's forkserver once, so workers start warm while the server process stays light."""


@cache
def scorer(task_name: str) -> Callable[..., float]:
    """The dataset's own ``score_answer``; built once per task and worker (building one can load word lists)."""
    import reasoning_gym

    return reasoning_gym.get_score_answer_fn(task_name)


def score_entry(task_name: str, answer: str | None, entry: dict[str, Any]) -> float:
    """The dataset's score for ``answer`` (a float in [0, 1], partial credit allowed); NaN counts as 0."""
    score = float(scorer(task_name)(answer=answer, entry=entry))
    return 0.0 if math.isnan(score) else min(max(score, 0.0), 1.0)


def warm_up() -> None:
    """Runs once per worker: builds one scorer so the first real call does not pay for it."""
    score_entry("basic_arithmetic", "2", {"question": "1 + 1 =", "answer": "2", "metadata": {}})
