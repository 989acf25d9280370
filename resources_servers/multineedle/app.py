"""multineedle: find every key -> value fact hidden in a long generated document and report them all.

Trains long-context retrieval where several facts must be recalled at once (and decoy facts for keys that were not
asked must be ignored). The row lists the ``needles`` (``{key, value}``); the prompt asks for one JSON object mapping
each key to its value.

Answer format: the **last JSON object** in the final assistant text (code fences are fine). When the text has no JSON
object, lines ``key: value`` (or ``key = value``, optionally bulleted or quoted) are read instead, so a model that
ignores the format can still be scored, but the response records ``answer_format`` so that can be tracked.

Reward = fraction of needles whose key maps to exactly the expected value (keys are matched case-insensitively and
whitespace-trimmed, because the key only identifies the question; values must match exactly after trimming, unless
``case_sensitive_values`` is false). Extra keys are ignored. Reasoning and tool calls are not read.
"""

from __future__ import annotations

import json
import re
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, Field

from nemo_gym.base_resources_server import (
    BaseResourcesServerConfig,
    BaseVerifyRequest,
    ReverifyMode,
    SimpleResourcesServer,
)
from nemo_gym.openai_utils import NeMoGymResponse, NeMoGymResponseOutputMessage, NeMoGymResponseOutputText

AnswerFormat = Literal["json", "lines", "none"]
_LINE = re.compile(r"""^\s*(?:[-*•]\s*|\d+[.)]\s*)?["'`]?([^:=\n"'`]+?)["'`]?\s*[:=]\s*["'`]?(.*?)["'`]?\s*,?\s*$""")


class MultineedleResourcesServerConfig(BaseResourcesServerConfig):
    REVERIFY_MODE: ClassVar[ReverifyMode] = ReverifyMode.STATELESS

    case_sensitive_values: bool = True
    """False: ``qx-4821`` counts for ``QX-4821``."""


class Needle(BaseModel):
    key: str
    value: str
    sentence_index: int | None = None
    """Where the generator put it (for depth analyses); not used by the verifier."""


class MultineedleVerifyRequest(BaseVerifyRequest):
    needles: list[Needle] = Field(min_length=1)


class NeedleResult(BaseModel):
    key: str
    expected: str
    predicted: str | None
    found: bool


class MultineedleVerifyResponse(MultineedleVerifyRequest):
    reward: float
    answer_format: AnswerFormat
    num_needles: int
    num_found: int
    all_found: bool
    needle_results: list[NeedleResult]


def final_text(response: NeMoGymResponse) -> str:
    """The text of the last assistant message (earlier messages are drafts or commentary)."""
    for item in reversed(response.output):
        if isinstance(item, NeMoGymResponseOutputMessage):
            return "".join(part.text for part in item.content if isinstance(part, NeMoGymResponseOutputText))
    return ""


def last_json_object(text: str) -> dict[str, Any] | None:
    """The last top-level JSON object in ``text`` (objects nested in it are part of it, not candidates)."""
    decoder = json.JSONDecoder()
    found: dict[str, Any] | None = None
    index = text.find("{")
    while index != -1:
        try:
            value, end = decoder.raw_decode(text, index)
        except json.JSONDecodeError:
            index = text.find("{", index + 1)
            continue
        if isinstance(value, dict):
            found = value
        index = text.find("{", end)
    return found


def key_value_lines(text: str) -> dict[str, str]:
    """``key: value`` lines; a later line for the same key wins, like a later JSON key would."""
    pairs: dict[str, str] = {}
    for line in text.splitlines():
        match = _LINE.match(line)
        if match and match.group(2):
            pairs[match.group(1).strip()] = match.group(2).strip()
    return pairs


def parse_answer(text: str) -> tuple[dict[str, Any], AnswerFormat]:
    obj = last_json_object(text)
    if obj is not None:
        return obj, "json"
    lines = key_value_lines(text)
    return (lines, "lines") if lines else ({}, "none")


def _as_text(value: Any) -> str | None:
    """JSON scalars as the model wrote them (a number 4821 reads "4821"); containers and null are no answer."""
    if isinstance(value, str):
        return value.strip()
    if isinstance(value, bool) or value is None or isinstance(value, (dict, list)):
        return None
    return str(value)


def score(needles: list[Needle], answer: dict[str, Any], case_sensitive: bool = True) -> list[NeedleResult]:
    by_key = {" ".join(str(key).split()).casefold(): value for key, value in answer.items()}
    results = []
    for needle in needles:
        predicted = _as_text(by_key.get(" ".join(needle.key.split()).casefold()))
        expected = needle.value.strip()
        if predicted is None:
            found = False
        elif case_sensitive:
            found = predicted == expected
        else:
            found = predicted.casefold() == expected.casefold()
        results.append(NeedleResult(key=needle.key, expected=needle.value, predicted=predicted, found=found))
    return results


class MultineedleResourcesServer(SimpleResourcesServer):
    config: MultineedleResourcesServerConfig

    async def verify(self, body: MultineedleVerifyRequest) -> MultineedleVerifyResponse:
        answer, answer_format = parse_answer(final_text(body.response))
        results = score(body.needles, answer, self.config.case_sensitive_values)
        found = sum(result.found for result in results)
        return MultineedleVerifyResponse(
            **body.model_dump(),
            reward=found / len(results),
            answer_format=answer_format,
            num_needles=len(results),
            num_found=found,
            all_found=found == len(results),
            needle_results=results,
        )


if __name__ == "__main__":
    MultineedleResourcesServer.run_webserver()
