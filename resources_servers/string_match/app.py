"""string_match: a generic verifier for short free-form answers (a city, a number, a date, a short list).

Many knowledge and arithmetic tasks need no judge model: the answer is a short string that can be pulled out of the
reply and compared leniently. Each row gives ``expected_answer`` and may choose how the answer is found
(``extraction_mode``: ``boxed``, ``final_answer`` (default; falls back to boxed), ``last_line``, ``full_response``)
and whether comparison is exact (``case_sensitive: true``); the server config supplies the defaults. The rules are
in :mod:`resources_servers.string_match.matching`.

Verification only reads the stored trajectory, so rollouts can be re-verified later (``REVERIFY_MODE = "stateless"``).
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import ConfigDict, field_validator

from nemo_gym.base_resources_server import (
    BaseResourcesServerConfig,
    BaseVerifyRequest,
    BaseVerifyResponse,
    ReverifyMode,
    SimpleResourcesServer,
)
from nemo_gym.config_types import AggregateMetrics, AggregateMetricsRequest
from nemo_gym.metrics import aggregate_verify_responses
from nemo_gym.openai_utils import NeMoGymResponse, NeMoGymResponseOutputMessage, NeMoGymResponseOutputText
from resources_servers.string_match.matching import ExtractionMode, canonical_answer, extract_answer, score_answer


class StringMatchResourcesServerConfig(BaseResourcesServerConfig):
    REVERIFY_MODE: ClassVar[ReverifyMode] = ReverifyMode.STATELESS

    extraction_mode: ExtractionMode = "final_answer"
    """Used for rows that do not set their own ``extraction_mode``."""
    case_sensitive: bool = False
    """Used for rows that do not set their own ``case_sensitive``."""


class StringMatchVerifyRequest(BaseVerifyRequest):
    """The task row plus the final response; other task fields (ids, subsets) are kept and echoed back."""

    model_config = ConfigDict(extra="allow")

    expected_answer: str
    extraction_mode: ExtractionMode | None = None
    case_sensitive: bool | None = None

    @field_validator("expected_answer", mode="before")
    @classmethod
    def _number_as_text(cls, value: Any) -> Any:
        """Datasets often store numeric answers as JSON numbers; compare their text."""
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
        return value


class StringMatchVerifyResponse(StringMatchVerifyRequest, BaseVerifyResponse):
    extracted_answer: str | None
    """None when the reply held no answer in the requested form (counted by the ``no_answer`` metric)."""


def assistant_text(response: NeMoGymResponse) -> str:
    """The text of every assistant message in the trajectory, one message per line."""
    messages = [
        "".join(part.text for part in item.content if isinstance(part, NeMoGymResponseOutputText))
        for item in response.output
        if isinstance(item, NeMoGymResponseOutputMessage)
    ]
    return "\n".join(messages)


class StringMatchResourcesServer(SimpleResourcesServer):
    config: StringMatchResourcesServerConfig

    async def verify(self, body: StringMatchVerifyRequest) -> StringMatchVerifyResponse:
        mode = body.extraction_mode or self.config.extraction_mode
        case_sensitive = self.config.case_sensitive if body.case_sensitive is None else body.case_sensitive
        extracted = extract_answer(assistant_text(body.response), mode)
        reward = score_answer(extracted, body.expected_answer, case_sensitive)
        return StringMatchVerifyResponse(**body.model_dump(), extracted_answer=extracted, reward=reward)

    async def aggregate_metrics(self, body: AggregateMetricsRequest) -> AggregateMetrics:
        return string_match_metrics(body.verify_responses)


VOTE_KEY = "_string_match_vote"


def string_match_metrics(rows: list[dict[str, Any]]) -> AggregateMetrics:
    """The default statistics and pass@k, plus majority@k over extracted answers and the ``no_answer`` rate.

    Votes are cast on :func:`canonical_answer`, so ``1,000`` and ``1000.0`` count as one answer. pass@k counts a
    rollout as passed at reward 1.0 (a near-numeric 0.98 is partial credit, not a pass).
    """
    voted = [row | {VOTE_KEY: canonical_answer(row.get("extracted_answer"))} for row in rows]
    metrics = aggregate_verify_responses(voted, answer_key=VOTE_KEY)
    if "no_answer" in metrics.agent_metrics:
        metrics.key_metrics["no_answer"] = metrics.agent_metrics["no_answer"]
    return metrics


if __name__ == "__main__":
    StringMatchResourcesServer.run_webserver()
