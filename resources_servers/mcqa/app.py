"""mcqa: multiple-choice questions; reward 1 when the option letter the model chose is the gold letter.

How the letter is read from the answer depends on the row's ``grading_mode`` (or the server's, which wins) and on
optional per-row patterns; see :mod:`resources_servers.mcqa.extraction`. Verification needs nothing but the stored
response, so re-verifying old rollouts is safe (``stateless``).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, field_validator

from nemo_gym.base_resources_server import (
    BaseResourcesServerConfig,
    BaseVerifyRequest,
    BaseVerifyResponse,
    SimpleResourcesServer,
)
from nemo_gym.config_types import AggregateMetrics, AggregateMetricsRequest
from nemo_gym.metrics import aggregate_verify_responses
from nemo_gym.verifiers.answers import assistant_text
from resources_servers.mcqa.extraction import GradingMode, extract_letter


class MCQAResourcesServerConfig(BaseResourcesServerConfig):
    REVERIFY_MODE = "stateless"

    grading_mode: GradingMode | None = None
    """When set, overrides every row's ``grading_mode`` (e.g. to grade one dataset strictly and another leniently)."""


class TemplateMetadata(BaseModel):
    model_config = ConfigDict(extra="allow")

    output_regex: str | list[str] | None = None
    """Patterns the row's prompt template asked the answer to follow; the last match wins."""


class MCQAVerifyRequest(BaseVerifyRequest):
    model_config = ConfigDict(extra="allow")

    options: list[dict[str, str | None]]
    """``[{"A": "text"}, {"B": "text"}, ...]``; an option whose text is null is not offered."""
    expected_answer: str
    grading_mode: GradingMode = "strict_single_letter_boxed"
    template_metadata: TemplateMetadata | None = None

    @field_validator("expected_answer")
    @classmethod
    def _upper(cls, value: str) -> str:
        return value.strip().upper()


class MCQAVerifyResponse(BaseVerifyResponse):
    model_config = ConfigDict(extra="allow")

    expected_answer: str
    extracted_answer: str | None = None


def allowed_options(options: list[dict[str, str | None]]) -> dict[str, str]:
    """Letter -> option text for the options actually offered (upper-cased letters, non-null texts)."""
    return {letter.strip().upper(): text for option in options for letter, text in option.items() if text is not None}


class MCQAResourcesServer(SimpleResourcesServer):
    config: MCQAResourcesServerConfig

    async def verify(self, body: MCQAVerifyRequest) -> MCQAVerifyResponse:
        options = allowed_options(body.options)
        mode = self.config.grading_mode or body.grading_mode
        patterns = body.template_metadata.output_regex if body.template_metadata else None
        if isinstance(patterns, str):
            patterns = [patterns]
        letter = extract_letter(assistant_text(body.response), options, mode, patterns)
        reward = 1.0 if letter is not None and letter == body.expected_answer else 0.0
        fields: dict[str, Any] = {"extracted_answer": letter, "grading_mode": mode}
        return MCQAVerifyResponse(**(body.model_dump() | fields), reward=reward)

    async def aggregate_metrics(self, body: AggregateMetricsRequest) -> AggregateMetrics:
        """Default statistics plus pass@k, majority@k over the chosen letters, and the no-answer rate."""
        return aggregate_verify_responses(body.verify_responses, answer_key="extracted_answer")


if __name__ == "__main__":
    MCQAResourcesServer.run_webserver()
