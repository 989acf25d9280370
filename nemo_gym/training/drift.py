"""The token-id chain of a rollout, checked: each turn's prompt ids must start with the previous turn's prompt and
generated ids.

A trainer scores a multi-turn rollout as one sequence. That is only sound if every turn saw, token for token, what the
model produced before; a server that re-tokenizes earlier turns (a chat template that renders a tool call differently,
a tokenizer that merges across a boundary) silently trains on tokens the model never sampled. This module finds the
first place where that happens, so the adapters can refuse such a rollout with a message naming turn and offset.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from nemo_gym.errors import TokenDriftError

__all__ = ["Drift", "Turn", "check_token_chain", "find_drift", "turns_of"]


@dataclass(frozen=True)
class Turn:
    """One model call of a rollout: the ids it was prompted with, the ids it generated and their log-probs."""

    prompt_ids: list[int]
    generation_ids: list[int]
    log_probs: list[float]


@dataclass(frozen=True)
class Drift:
    """Where turn ``turn`` (0-based) stops extending the previous turn: the first differing ``offset``."""

    turn: int
    offset: int
    expected: int | None
    found: int | None

    def message(self, rollout: str = "rollout") -> str:
        return (
            f"{rollout}: token-id drift at turn {self.turn}, offset {self.offset}: the prompt should continue the "
            f"previous turn's prompt + generated ids there (expected token {self.expected}, found {self.found}); "
            "the model server re-tokenized earlier turns instead of reusing their ids"
        )


def turns_of(output: Iterable[Mapping[str, Any]]) -> list[Turn]:
    """The model turns of a Responses ``output``: each item that carries token ids closes one generation."""
    turns = []
    for item in output:
        if item.get("generation_token_ids") is not None and item.get("prompt_token_ids") is not None:
            turns.append(
                Turn(
                    list(item["prompt_token_ids"]),
                    list(item["generation_token_ids"]),
                    [float(x) for x in item.get("generation_log_probs") or []],
                )
            )
    return turns


def find_drift(turns: Sequence[Turn]) -> Drift | None:
    """The first break of the chain, or None when every turn extends the one before."""
    for index in range(1, len(turns)):
        history = turns[index - 1].prompt_ids + turns[index - 1].generation_ids
        prompt = turns[index].prompt_ids
        for offset, expected in enumerate(history):
            found = prompt[offset] if offset < len(prompt) else None
            if found != expected:
                return Drift(index, offset, expected, found)
    return None


def check_token_chain(turns: Sequence[Turn], rollout: str = "rollout") -> None:
    """Raise :class:`~nemo_gym.errors.TokenDriftError` at the first break of the chain."""
    drift = find_drift(turns)
    if drift is not None:
        raise TokenDriftError(drift.message(rollout))
