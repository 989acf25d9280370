"""blackjack: one hand of Blackjack against the dealer, played turn by turn over the gymnasium protocol.

Trains multi-turn decision making under uncertainty with a sparse, signed reward. ``/reset`` deals from a freshly
shuffled 52-card deck (seeded by the row's ``seed``, so a task is reproducible; each session has its own RNG, so
concurrent rollouts never share a deck); each ``/step`` reads one action from the model's turn:

* **Tool call** (preferred when present): ``blackjack_action({"action": "hit" | "stand"})``. The result comes back as
  that call's ``function_call_output``. Only the turn's first call counts; later ones are answered "ignored".
* **Tagged text** otherwise: ``<action>hit</action>`` or ``<action>stand</action>`` anywhere in the assistant text
  (case-insensitive; repeated tags must agree).

Anything else (no action, an unknown action or tool, contradicting tags, bad arguments) is a malformed action: reward
0, the episode goes on, and the observation tells the model what to send. Rules: cards 2-10 count their rank, J/Q/K count 10,
an ace counts 11 unless that busts the hand, then 1. Hit draws a card; above 21 is a bust (reward -1, episode over).
Stand lets the dealer draw until 17 or more (standing on soft 17), then: player natural (ace + ten-value card as the
first two cards) beats anything but a dealer natural and pays ``natural_reward``; a dealer natural beats any other
hand; otherwise dealer bust or higher total +1, equal 0, lower -1.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from typing import Any, Literal, cast

from pydantic import BaseModel, ConfigDict, ValidationError

from nemo_gym.base_gymnasium_server import (
    BaseGymnasiumServerConfig,
    GymnasiumServer,
    ResetRequest,
    ResetResponse,
    StepRequest,
    StepResponse,
)
from nemo_gym.verifiers.answers import assistant_text
from nemo_gym.verifiers.tool_calls import function_calls

RANKS = ("A", "2", "3", "4", "5", "6", "7", "8", "9", "10", "J", "Q", "K")
ACTION_TOOL = "blackjack_action"
DEALER_STANDS_AT = 17
_ACTION_TAG = re.compile(r"<action>\s*([^<]*?)\s*</action>", re.IGNORECASE)
_HOW_TO_ACT = f"Reply with <action>hit</action> or <action>stand</action> (or call {ACTION_TOOL})."

Action = Literal["hit", "stand"]


class BlackjackResourcesServerConfig(BaseGymnasiumServerConfig):
    natural_reward: float = 1.5
    """Reward for winning with a natural (blackjack); 1.5 is the casino's 3:2 payout."""


class BlackjackTask(BaseModel):
    """The row fields this environment reads."""

    model_config = ConfigDict(extra="ignore")

    seed: int | None = None
    """Seeds the shuffle; None deals a random hand (each rollout of the task then differs)."""


class _ActionArguments(BaseModel):
    model_config = ConfigDict(extra="forbid")

    action: str


def card_value(rank: str) -> int:
    """Ace counts 11 here; :func:`hand_value` lowers aces to 1 as needed."""
    if rank == "A":
        return 11
    if rank in ("J", "Q", "K"):
        return 10
    return int(rank)


def hand_value(cards: list[str]) -> int:
    """Best total not over 21 if there is one: each ace drops from 11 to 1 while the hand would bust."""
    total = sum(card_value(card) for card in cards)
    aces = cards.count("A")
    while total > 21 and aces:
        total -= 10
        aces -= 1
    return total


def is_natural(cards: list[str]) -> bool:
    return len(cards) == 2 and hand_value(cards) == 21


@dataclass
class Hand:
    """One episode: the shuffled deck (top = end of list) and both hands."""

    rng: random.Random
    deck: list[str] = field(default_factory=list)
    player: list[str] = field(default_factory=list)
    dealer: list[str] = field(default_factory=list)

    def draw(self) -> str:
        if not self.deck:  # cannot happen within one hand of a 52-card deck, but never fail on it
            self.deck = _shuffled_deck(self.rng)
        return self.deck.pop()


def _shuffled_deck(rng: random.Random) -> list[str]:
    deck = [rank for rank in RANKS for _ in range(4)]
    rng.shuffle(deck)
    return deck


def deal(seed: int | None) -> Hand:
    """Player, dealer, player, dealer, from a deck shuffled by ``seed``'s own RNG."""
    rng = random.Random(seed)
    hand = Hand(rng=rng, deck=_shuffled_deck(rng))
    for _ in range(2):
        hand.player.append(hand.draw())
        hand.dealer.append(hand.draw())
    return hand


@dataclass
class Turn:
    """What one model turn asked for."""

    action: Action | None
    error: str | None = None
    """Why ``action`` is None."""
    call_ids: list[str] = field(default_factory=list)
    """Every function call of the turn; the first is the one acted on, the others are ignored."""


def read_turn(body: StepRequest) -> Turn:
    """The action of this turn: its first function call if it made any, else its ``<action>`` tags."""
    calls = function_calls(body.response)
    if calls:
        call_ids = [call.call_id or "" for call in calls]
        first = calls[0]
        if first.name != ACTION_TOOL:
            return Turn(None, f"Unknown tool {first.name!r}. {_HOW_TO_ACT}", call_ids)
        action, error = _tool_action(first.arguments, first.error)
        return Turn(action, error, call_ids)
    choices = {match.lower() for match in _ACTION_TAG.findall(assistant_text(body.response))}
    if not choices:
        return Turn(None, f"No action found. {_HOW_TO_ACT}")
    if len(choices) > 1:
        return Turn(None, f"Contradicting actions {sorted(choices)}: give exactly one. {_HOW_TO_ACT}")
    choice = choices.pop()
    if choice not in ("hit", "stand"):
        return Turn(None, f"Unknown action {choice!r}. {_HOW_TO_ACT}")
    return Turn(choice)


def _tool_action(arguments: dict[str, Any] | None, parse_error: str | None) -> tuple[Action | None, str | None]:
    if arguments is None:
        return None, f"Invalid {ACTION_TOOL} call: {parse_error}. {_HOW_TO_ACT}"
    try:
        choice = _ActionArguments.model_validate(arguments).action.strip().lower()
    except ValidationError:
        return None, f'Invalid {ACTION_TOOL} arguments: expected {{"action": "hit" | "stand"}}. {_HOW_TO_ACT}'
    if choice not in ("hit", "stand"):
        return None, f"Unknown action {choice!r}. {_HOW_TO_ACT}"
    return cast(Action, choice), None  # the test above leaves only the two actions


def describe(hand: Hand) -> str:
    return (
        f"Your hand: {', '.join(hand.player)} (value {hand_value(hand.player)})\n"
        f"Dealer shows: {hand.dealer[0]}\n{_HOW_TO_ACT}"
    )


def _hands_info(hand: Hand) -> dict[str, Any]:
    return {
        "player_hand": list(hand.player),
        "player_value": hand_value(hand.player),
        "dealer_hand": list(hand.dealer),
        "dealer_value": hand_value(hand.dealer),
    }


class BlackjackResourcesServer(GymnasiumServer):
    config: BlackjackResourcesServerConfig

    def reset_episode(self, row: ResetRequest) -> tuple[Hand, ResetResponse]:
        task = BlackjackTask.model_validate(row.model_extra or {})
        hand = deal(task.seed)
        return hand, ResetResponse(observation=describe(hand), info={"seed": task.seed})

    def step_episode(self, state: Hand, body: StepRequest) -> StepResponse:
        turn = read_turn(body)
        if turn.action is None:
            result = StepResponse(
                observation=f"{turn.error}\n{describe(state)}", info={"invalid_action": True, "error": turn.error}
            )
        elif turn.action == "hit":
            result = self._hit(state)
        else:
            result = self._stand(state)
        if turn.call_ids:
            # The acted-on call is answered with what happened; the conversation then needs no extra user message.
            answer = result.observation if result.observation is not None else _final_words(result)
            ignored = "Ignored: only one action per turn."
            result.info["tool_outputs"] = [
                {"call_id": call_id, "output": answer if i == 0 else ignored} for i, call_id in enumerate(turn.call_ids)
            ]
            result.observation = None
        return result

    def _hit(self, hand: Hand) -> StepResponse:
        hand.player.append(hand.draw())
        if hand_value(hand.player) > 21:
            return StepResponse(reward=-1.0, terminated=True, info={"result": "bust", **_hands_info(hand)})
        return StepResponse(observation=describe(hand), info={"action": "hit"})

    def _stand(self, hand: Hand) -> StepResponse:
        player_natural, dealer_natural = is_natural(hand.player), is_natural(hand.dealer)
        if not dealer_natural:
            while hand_value(hand.dealer) < DEALER_STANDS_AT:
                hand.dealer.append(hand.draw())
        player, dealer = hand_value(hand.player), hand_value(hand.dealer)
        if player_natural and dealer_natural:
            result, reward = "push", 0.0
        elif player_natural:
            result, reward = "natural", self.config.natural_reward
        elif dealer_natural:
            result, reward = "loss", -1.0
        elif dealer > 21 or player > dealer:
            result, reward = "win", 1.0
        elif player == dealer:
            result, reward = "push", 0.0
        else:
            result, reward = "loss", -1.0
        return StepResponse(reward=reward, terminated=True, info={"result": result, **_hands_info(hand)})


def _final_words(result: StepResponse) -> str:
    info = result.info
    return (
        f"Result: {info.get('result')} (reward {result.reward:g}). Your hand: {', '.join(info['player_hand'])} "
        f"(value {info['player_value']}); dealer: {', '.join(info['dealer_hand'])} (value {info['dealer_value']})."
    )


if __name__ == "__main__":
    BlackjackResourcesServer.run_webserver()
