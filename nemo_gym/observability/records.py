"""Typed observation records: what an agent saw of its own run, and the standardized trajectory of one rollout.

An agent may return ``ng_agent_observations`` (an :class:`AgentObservationBundle`) beside its answer; the collector
joins it with the model calls captured on the model server into ``ng_trajectory`` (a :class:`TrajectoryRecord`).
Whatever could not be observed or joined exactly is said as an :class:`ObservationGap`, never guessed. Every model
refuses unknown fields, so a producer's typo is an error rather than a silently dropped fact.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from nemo_gym.config.server_models import ModelServerRef
from nemo_gym.openai_utils import NeMoGymResponse, NeMoGymResponseInputItem

__all__ = [
    "AgentEpisode",
    "AgentInvocation",
    "AgentObservationBundle",
    "AgentObservationRecord",
    "ContextCompactionObservation",
    "ModelCallRef",
    "ObservationGap",
    "ObservationModel",
    "SandboxObservation",
    "ToolCallObservation",
    "TrajectoryModelCall",
    "TrajectoryRecord",
    "TrajectoryResponseMetadata",
    "TrajectoryTokenStats",
    "TrajectoryToolCall",
    "TrajectoryTurn",
]

_Count = Annotated[int | None, Field(default=None, ge=0)]
_Duration = Annotated[float | None, Field(default=None, ge=0)]


class ObservationModel(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ModelCallRef(ObservationModel):
    """How an agent names one of its model calls: the capture's call id, or the model server plus response id."""

    model_call_id: str | None = None
    model_ref: ModelServerRef | None = None
    response_id: str | None = None

    @model_validator(mode="after")
    def _joinable(self) -> ModelCallRef:
        if not self.model_call_id and not (self.model_ref is not None and self.response_id):
            raise ValueError("a model call reference needs model_call_id, or both model_ref and response_id")
        return self


class ObservationGap(ObservationModel):
    """Something the integration could not observe or join exactly (``code`` is a stable snake_case name)."""

    code: str
    invocation_id: str | None = None
    detail: str | None = None


class TrajectoryTokenStats(ObservationModel):
    prompt_tokens: _Count = None
    completion_tokens: _Count = None
    reasoning_tokens: _Count = None
    total_tokens: _Count = None
    cached_tokens: _Count = None


class TrajectoryResponseMetadata(ObservationModel):
    response_id: str | None = None
    model_ref: ModelServerRef | None = None
    model: str | None = None
    dialect: str | None = None
    status_code: int | None = None
    response_status: str | None = None
    finish_reason: str | None = None
    error_category: str | None = None
    latency_ttft_ms: _Duration = None


class TrajectoryModelCall(ObservationModel):
    model_call_id: str | None = None
    started_at: float | None = None
    completed_at: float | None = None
    duration_ms: _Duration = None
    request: Any | None = None
    response: Any | None = None
    response_metadata: TrajectoryResponseMetadata = Field(default_factory=TrajectoryResponseMetadata)
    token_stats: TrajectoryTokenStats = Field(default_factory=TrajectoryTokenStats)


class TrajectoryTurn(ObservationModel):
    """One user-visible turn of one invocation; ``step_count`` is the producer's running count of steps."""

    invocation_id: str
    task_id: str
    rollout_id: str
    turn_no: int = Field(ge=1)
    timestamp: float
    question: Any | None = None
    answer: Any | None = None
    reasoning_content: Any | None = None
    resolved: bool | None = None
    step_count: int = Field(ge=0)
    model_calls: list[ModelCallRef] = Field(default_factory=list)


class AgentInvocation(ObservationModel):
    """One agent or subagent conversation; ``status`` is ``unknown`` unless the harness said so."""

    kind: Literal["agent_invocation"] = "agent_invocation"
    invocation_id: str
    parent_invocation_id: str | None = None
    spawned_by_tool_call_id: str | None = None
    status: Literal["completed", "failed", "incomplete", "unknown"] = "unknown"
    duration_ms: _Duration = None
    error_type: str | None = None
    model_calls: list[ModelCallRef] = Field(default_factory=list)
    conversation: list[NeMoGymResponseInputItem] = Field(default_factory=list)


class ToolCallObservation(ObservationModel):
    """Timing and outcome of one tool call, as seen where the agent ran it."""

    kind: Literal["tool_call"] = "tool_call"
    invocation_id: str
    tool_call_id: str
    sandbox_id: str | None = None
    """The sandbox the call ran in (shared by concurrent calls); not a per-call resource account."""
    tool_name: str | None = None
    started_at: float | None = None
    completed_at: float | None = None
    duration_ms: _Duration = None
    timing_source: Literal["executor", "artifact", "harness"] | None = None
    status: Literal["completed", "failed", "timeout", "cancelled", "incomplete", "unknown"] = "unknown"
    error_type: str | None = None

    @model_validator(mode="after")
    def _ordered(self) -> ToolCallObservation:
        if self.started_at is not None and self.completed_at is not None and self.completed_at < self.started_at:
            raise ValueError("completed_at must not precede started_at")
        return self


class TrajectoryToolCall(ToolCallObservation):
    """A tool observation with the output the model saw."""

    output: Any | None = None


class SandboxObservation(ObservationModel):
    """Outcome and measured lifetime usage of a sandbox (never its configured limits)."""

    kind: Literal["sandbox"] = "sandbox"
    role: Literal["agent", "verifier", "environment"]
    provider: str | None = None
    sandbox_id: str | None = None
    outcome: Literal["completed", "failed", "timeout", "oom", "sandbox_error", "cancelled", "unknown"] = "unknown"
    exit_code: int | None = None
    wall_time_s: _Duration = None
    cpu_time_s: _Duration = None
    peak_memory_mib: _Duration = None
    resource_usage_source: str | None = None
    error_type: str | None = None


class ContextCompactionObservation(ObservationModel):
    """A context compaction the harness reported, with the model calls around and inside it."""

    kind: Literal["context_compaction"] = "context_compaction"
    invocation_id: str
    observed_at: float | None = None
    trigger: str | None = None
    tokens_before: _Count = None
    tokens_after: _Count = None
    outcome: Literal["completed", "failed", "aborted", "unknown"] = "unknown"
    summary: str | None = None
    first_kept_item_id: str | None = None
    before_model_call: ModelCallRef | None = None
    model_calls: list[ModelCallRef] = Field(default_factory=list)
    after_model_call: ModelCallRef | None = None


AgentObservationRecord = Annotated[
    AgentInvocation | ToolCallObservation | ContextCompactionObservation | SandboxObservation,
    Field(discriminator="kind"),
]


class AgentObservationBundle(ObservationModel):
    """What one agent server observed of one rollout; ``records`` are unordered."""

    source: str
    records: list[AgentObservationRecord] = Field(default_factory=list)
    gaps: list[ObservationGap] = Field(default_factory=list)

    @model_validator(mode="after")
    def _invocation_tree(self) -> AgentObservationBundle:
        """Invocation ids are unique and parents form no cycle (a missing parent is allowed: partial views)."""
        parent_of: dict[str, str | None] = {}
        for invocation in (r for r in self.records if isinstance(r, AgentInvocation)):
            if invocation.invocation_id in parent_of:
                raise ValueError(f"invocation {invocation.invocation_id!r} appears twice in one observation bundle")
            parent_of[invocation.invocation_id] = invocation.parent_invocation_id
        _reject_parent_cycles(parent_of)
        return self


def _reject_parent_cycles(parent_of: dict[str, str | None]) -> None:
    """Follow each invocation's chain of parents; a chain that comes back on itself is a ``ValueError``."""
    settled: set[str] = set()
    for origin in parent_of:
        chain: list[str] = []
        node = origin
        while node not in settled:
            if node in chain:
                raise ValueError(f"parent_invocation_id of {node!r} leads back to itself")
            chain.append(node)
            parent = parent_of[node]
            if parent is None or parent not in parent_of:
                break
            node = parent
        settled.update(chain)


class TrajectoryRecord(ObservationModel):
    """The standardized evidence of one rollout (``ng_trajectory``)."""

    schema_version: Literal["1.0"] = "1.0"
    task_id: str
    rollout_id: str
    invocations: list[AgentInvocation] = Field(default_factory=list)
    turns: list[TrajectoryTurn] = Field(default_factory=list)
    model_calls: list[TrajectoryModelCall] = Field(default_factory=list)
    tool_calls: list[TrajectoryToolCall] = Field(default_factory=list)
    gaps: list[ObservationGap] = Field(default_factory=list)

    @model_validator(mode="after")
    def _identity(self) -> TrajectoryRecord:
        """Ids are unique where they must be, and every turn belongs to this trajectory's task and rollout."""
        _require_unique([i.invocation_id for i in self.invocations], "invocation_id", "a trajectory")
        _require_unique([c.model_call_id for c in self.model_calls if c.model_call_id], "model_call_id", "a trajectory")
        foreign = [t for t in self.turns if t.task_id != self.task_id or t.rollout_id != self.rollout_id]
        if foreign:
            raise ValueError("a turn's task_id and rollout_id must be the trajectory's")
        _require_unique([(t.invocation_id, t.turn_no) for t in self.turns], "turn_no", "an invocation")
        return self


def _require_unique(keys: list[Any], field: str, scope: str) -> None:
    seen: set[Any] = set()
    for key in keys:
        if key in seen:
            raise ValueError(f"{field} must be unique within {scope} ({key!r} repeats)")
        seen.add(key)


@dataclass(frozen=True, slots=True)
class AgentEpisode:
    """An agent's final response together with what it observed on the way."""

    response: NeMoGymResponse
    observations: AgentObservationBundle
