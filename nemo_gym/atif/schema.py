"""Our pydantic model of ATIF v1.7, so every trajectory we write or read is checked against the format.

Unknown keys are refused everywhere except the ``extra`` objects the format reserves for producers, so a file that
drifts from the format fails loudly instead of being half-read. The rules the RFC states beside the field list are
checked too: step ids count up from 1, agent-only fields stay on agent steps, an observation names only its own
step's tool calls, and a step that made no model call carries no model output.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, NonNegativeFloat, NonNegativeInt, field_validator, model_validator

ATIF_VERSION: Literal["ATIF-v1.7"] = "ATIF-v1.7"

JsonObject = dict[str, Any]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class ImageSource(_Strict):
    media_type: Literal["image/jpeg", "image/png", "image/gif", "image/webp"]
    path: str


class ContentPart(_Strict):
    """One part of a multimodal message: text, or an image stored beside the trajectory."""

    type: Literal["text", "image"]
    text: str | None = None
    source: ImageSource | None = None

    @model_validator(mode="after")
    def _one_payload(self) -> ContentPart:
        if (self.type == "text") != (self.text is not None) or (self.type == "image") != (self.source is not None):
            raise ValueError(f"a {self.type!r} part carries exactly its own payload ('text' or 'source')")
        return self


Content = str | list[ContentPart]


class Agent(_Strict):
    name: str
    version: str
    model_name: str | None = None
    tool_definitions: list[JsonObject] | None = None
    extra: JsonObject | None = None


class ToolCall(_Strict):
    tool_call_id: str
    function_name: str
    arguments: JsonObject
    extra: JsonObject | None = None


class SubagentTrajectoryRef(_Strict):
    trajectory_id: str | None = None
    trajectory_path: str | None = None
    session_id: str | None = None
    extra: JsonObject | None = None

    @model_validator(mode="after")
    def _resolvable(self) -> SubagentTrajectoryRef:
        if self.trajectory_id is None and self.trajectory_path is None:
            raise ValueError("a subagent reference needs trajectory_id or trajectory_path")
        return self


class ObservationResult(_Strict):
    source_call_id: str | None = None
    content: Content | None = None
    subagent_trajectory_ref: list[SubagentTrajectoryRef] | None = None
    extra: JsonObject | None = None


class Observation(_Strict):
    results: list[ObservationResult]


class Metrics(_Strict):
    prompt_tokens: NonNegativeInt | None = None
    completion_tokens: NonNegativeInt | None = None
    cached_tokens: NonNegativeInt | None = None
    cost_usd: NonNegativeFloat | None = None
    prompt_token_ids: list[NonNegativeInt] | None = None
    completion_token_ids: list[NonNegativeInt] | None = None
    logprobs: list[float] | None = None
    extra: JsonObject | None = None


class FinalMetrics(_Strict):
    total_prompt_tokens: NonNegativeInt | None = None
    total_completion_tokens: NonNegativeInt | None = None
    total_cached_tokens: NonNegativeInt | None = None
    total_cost_usd: NonNegativeFloat | None = None
    total_steps: NonNegativeInt | None = None
    extra: JsonObject | None = None


AGENT_ONLY_FIELDS = ("model_name", "reasoning_effort", "reasoning_content", "tool_calls", "metrics")


class Step(_Strict):
    step_id: int = Field(ge=1)
    source: Literal["system", "user", "agent"]
    message: Content
    timestamp: str | None = None
    model_name: str | None = None
    reasoning_effort: str | float | None = None
    reasoning_content: str | None = None
    tool_calls: list[ToolCall] | None = None
    observation: Observation | None = None
    metrics: Metrics | None = None
    llm_call_count: NonNegativeInt | None = None
    is_copied_context: bool | None = None
    extra: JsonObject | None = None

    @field_validator("timestamp")
    @classmethod
    def _iso_8601(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                datetime.fromisoformat(value.replace("Z", "+00:00"))
            except ValueError:
                raise ValueError(f"timestamp {value!r} is not ISO 8601") from None
        return value

    @model_validator(mode="after")
    def _rules(self) -> Step:
        if self.source != "agent":
            present = [name for name in AGENT_ONLY_FIELDS if getattr(self, name) is not None]
            if present:
                raise ValueError(f"{', '.join(present)}: only agent steps have these, not a {self.source} step")
        if self.llm_call_count == 0 and (self.metrics is not None or self.reasoning_content is not None):
            raise ValueError("a step with llm_call_count 0 made no model call, so it has no metrics or reasoning")
        if self.observation is not None:
            calls = {call.tool_call_id for call in self.tool_calls or []}
            for result in self.observation.results:
                if result.source_call_id is not None and result.source_call_id not in calls:
                    raise ValueError(f"observation names tool call {result.source_call_id!r}, not made in this step")
        return self


class Trajectory(_Strict):
    """One ATIF v1.7 document: an agent's whole interaction, step by step."""

    schema_version: Literal["ATIF-v1.7"]
    session_id: str | None = None
    trajectory_id: str | None = None
    agent: Agent
    steps: list[Step] = Field(min_length=1)
    notes: str | None = None
    final_metrics: FinalMetrics | None = None
    continued_trajectory_ref: str | None = None
    subagent_trajectories: list[Trajectory] | None = None
    extra: JsonObject | None = None

    @model_validator(mode="after")
    def _rules(self) -> Trajectory:
        for position, step in enumerate(self.steps, 1):
            if step.step_id != position:
                raise ValueError(f"steps[{position - 1}] has step_id {step.step_id}; ids count up from 1")
        seen: set[str] = set()
        for index, sub in enumerate(self.subagent_trajectories or []):
            if sub.trajectory_id is None or sub.trajectory_id in seen:
                raise ValueError(f"subagent_trajectories[{index}] needs a trajectory_id of its own")
            seen.add(sub.trajectory_id)
        return self
