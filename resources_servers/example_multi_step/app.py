"""example_multi_step: look up several values with one tool, then hand them all in, in order, with another.

This example teaches a multi-step tool loop and a verifier that grades a structured final tool call. The prompt lists
terms and their synonyms; the model works out which terms the user's question is about, calls ``get_synonym_value``
once per matching *synonym* (never the term itself), and finishes with a single ``extract_synonym_values`` call
carrying the values in the order the terms come up. ``/verify`` takes the last such call in ``response.output`` and
rewards 1.0 only for an exact, order-sensitive match with the row's ``expected_synonym_values``.

Besides the reward, verify reports diagnostics that separate the ways a model fails: partial overlap, the right values
in the wrong order, and the "minefield" of submitting the value of the original term instead of its synonym.
"""

from __future__ import annotations

import json
from typing import ClassVar, Literal

from fastapi import FastAPI
from pydantic import BaseModel, Field, StrictInt, ValidationError

from nemo_gym.base_resources_server import (
    BaseResourcesServerConfig,
    BaseVerifyRequest,
    ReverifyMode,
    SimpleResourcesServer,
)
from nemo_gym.openai_utils import NeMoGymResponse, NeMoGymResponseFunctionToolCall

SUBMIT_TOOL_NAME = "extract_synonym_values"
LOOKUP_TOOL_NAME = "get_synonym_value"

SubmissionStatus = Literal["ok", "missing", "invalid_json", "invalid_arguments"]


def synonym_value(synonym: str) -> int:
    """The value of a word: the sum of its characters' code points (deterministic, but not guessable at a glance)."""
    return sum(ord(character) for character in synonym)


class ExampleMultiStepResourcesServerConfig(BaseResourcesServerConfig):
    # Verify reads only the row and the transcript, so a stored rollout can be verified again.
    REVERIFY_MODE: ClassVar[ReverifyMode] = ReverifyMode.STATELESS


class GetSynonymValueRequest(BaseModel):
    synonym: str


class GetSynonymValueResponse(BaseModel):
    synonym_value: int


class ExtractSynonymValuesRequest(BaseModel):
    # Strict ints: "711" or 711.5 is a malformed submission, not a coincidental match.
    synonym_values: list[StrictInt]


class ExtractSynonymValuesResponse(BaseModel):
    success: bool


class MultiStepVerifyRequest(BaseVerifyRequest):
    id: int | str | None = None
    expected_synonyms: list[str] = Field(default_factory=list)
    expected_synonym_values: list[int]
    minefield_label: str | None = None
    """The term the synonyms stand for: submitting its value instead of a synonym's is the trap this task sets."""
    minefield_label_value: int | None = None


class MultiStepVerifyResponse(MultiStepVerifyRequest):
    reward: float
    parsed_synonym_values: list[int] | None
    """The last submission, or None when there was none or it could not be read."""
    submission_status: SubmissionStatus
    accuracy: bool
    set_overlap: float
    """Share of the distinct expected values that were submitted, ignoring order."""
    original_term_minefield_hit: bool
    order_instruction_following_failure: bool
    """The right values, each the right number of times, in the wrong order."""
    num_lookup_calls: int
    num_submit_calls: int


def last_submission(response: NeMoGymResponse) -> tuple[list[int] | None, SubmissionStatus]:
    """The values of the last ``extract_synonym_values`` call: only the final answer counts, earlier ones are drafts."""
    call = next(
        (
            item
            for item in reversed(response.output)
            if isinstance(item, NeMoGymResponseFunctionToolCall) and item.name == SUBMIT_TOOL_NAME
        ),
        None,
    )
    if call is None:
        return None, "missing"
    try:
        arguments = json.loads(call.arguments)
    except json.JSONDecodeError:
        return None, "invalid_json"
    try:
        return ExtractSynonymValuesRequest.model_validate(arguments).synonym_values, "ok"
    except ValidationError:
        return None, "invalid_arguments"


class ExampleMultiStepResourcesServer(SimpleResourcesServer):
    config: ExampleMultiStepResourcesServerConfig

    def setup_webserver(self) -> FastAPI:
        app = super().setup_webserver()
        app.post(f"/{LOOKUP_TOOL_NAME}")(self.get_synonym_value)
        app.post(f"/{SUBMIT_TOOL_NAME}")(self.extract_synonym_values)
        return app

    async def get_synonym_value(self, body: GetSynonymValueRequest) -> GetSynonymValueResponse:
        return GetSynonymValueResponse(synonym_value=synonym_value(body.synonym))

    async def extract_synonym_values(self, body: ExtractSynonymValuesRequest) -> ExtractSynonymValuesResponse:
        # Grading happens in /verify from the transcript; the tool only acknowledges (and validates) the submission.
        return ExtractSynonymValuesResponse(success=True)

    async def verify(self, body: MultiStepVerifyRequest) -> MultiStepVerifyResponse:
        actual, status = last_submission(body.response)
        expected = body.expected_synonym_values
        submitted = actual or []
        accuracy = actual is not None and actual == expected
        distinct_expected = set(expected)
        if distinct_expected:
            set_overlap = len(set(submitted) & distinct_expected) / len(distinct_expected)
        else:
            set_overlap = 1.0 if actual == [] else 0.0
        trap = body.minefield_label_value
        wrong_order = actual is not None and not accuracy and sorted(actual) == sorted(expected)
        names = [item.name for item in body.response.output if isinstance(item, NeMoGymResponseFunctionToolCall)]
        return MultiStepVerifyResponse(
            **body.model_dump(),
            reward=float(accuracy),
            parsed_synonym_values=actual,
            submission_status=status,
            accuracy=accuracy,
            set_overlap=set_overlap,
            original_term_minefield_hit=trap is not None and trap in submitted and trap not in distinct_expected,
            order_instruction_following_failure=wrong_order,
            num_lookup_calls=names.count(LOOKUP_TOOL_NAME),
            num_submit_calls=names.count(SUBMIT_TOOL_NAME),
        )


if __name__ == "__main__":
    ExampleMultiStepResourcesServer.run_webserver()
