"""The optional LLM judge of math_with_judge: "are these two answers the same value?".

A judge that answers, even unreadably, gives a verdict (unreadable counts as "not equal"). A judge that cannot be
*reached* (connection error, HTTP error, malformed body) raises :class:`JudgeError`, which the server turns into a
``judge_failed`` failure row: the rollout is retried or re-verified later instead of being scored 0.
"""

from __future__ import annotations

from typing import Any

import aiohttp
from pydantic import ValidationError

from nemo_gym.openai_utils import NeMoGymResponse
from nemo_gym.server_utils import ServerClient
from nemo_gym.transport.http_client import TransportError, raise_for_status, response_json
from nemo_gym.verifiers.answers import assistant_text

EQUAL_LABEL = "[[A=B]]"
NOT_EQUAL_LABEL = "[[A!=B]]"

JUDGE_PROMPT = """You compare two final answers to a math problem and decide whether they denote the same \
mathematical object. Ignore formatting (LaTeX or plain text, fractions or decimals that are exactly equal, \
reordered terms, a unit written or omitted). Answers that differ in value, in the number of solutions, or that \
only partly agree are different.

Problem:
{question}

Answer A:
{first}

Answer B:
{second}

Think briefly, then end with exactly one verdict: {equal} if A and B are the same, {not_equal} if they differ."""


class JudgeError(Exception):
    """The judge could not be asked (as opposed to: it answered "not equal")."""


def verdict_is_equal(text: str) -> bool:
    """True when the equal label appears and comes before any not-equal label; anything else is "not equal"."""
    equal_at = text.find(EQUAL_LABEL)
    not_equal_at = text.find(NOT_EQUAL_LABEL)
    return equal_at != -1 and (not_equal_at == -1 or equal_at < not_equal_at)


async def ask_judge(server_client: ServerClient, judge_server: str, create_params: dict[str, Any], prompt: str) -> str:
    """The judge's answer text for one prompt; every transport-level failure becomes :class:`JudgeError`."""
    body = {**create_params, "input": [{"role": "user", "content": prompt}]}
    try:
        answer = await server_client.post(judge_server, "/v1/responses", json=body)
        raise_for_status(answer, judge_server, "/v1/responses")
        response = NeMoGymResponse.model_validate(await response_json(answer))
    except (TimeoutError, TransportError, aiohttp.ClientError, ValidationError, ValueError) as e:
        raise JudgeError(f"judge {judge_server!r} failed: {type(e).__name__}: {e}") from e
    return assistant_text(response)


async def judge_equivalence(
    server_client: ServerClient,
    judge_server: str,
    create_params: dict[str, Any],
    *,
    question: str,
    gold: str,
    candidate: str,
    both_orders: bool = True,
) -> tuple[bool, list[dict[str, Any]]]:
    """Whether the judge deems ``candidate`` equal to ``gold``, and a record of each judge call."""
    orders = [("gold_first", gold, candidate)]
    if both_orders:
        orders.append(("answer_first", candidate, gold))
    evaluations: list[dict[str, Any]] = []
    for order, first, second in orders:
        prompt = JUDGE_PROMPT.format(
            question=question or "(not given)", first=first, second=second, equal=EQUAL_LABEL, not_equal=NOT_EQUAL_LABEL
        )
        text = await ask_judge(server_client, judge_server, create_params, prompt)
        equal = verdict_is_equal(text)
        evaluations.append({"order": order, "judge_text": text, "equal": equal})
        if not equal:  # one "different" settles it; no need for the second opinion
            break
    return all(e["equal"] for e in evaluations), evaluations
