"""The wire shapes of an environment server's episode (NeMo Gym 0.7's ``episode_types``).

An episode is one attempt at one task: ``EpisodeId`` (rollout id + attempt) says which attempt, ``TaskId`` (task set +
task id) which task. An environment server answers a ``BaseEpisodeRequest`` with a ``BaseEpisodeResponse`` that holds
exactly one of a ``result`` or an ``EpisodeFailure``; the collector stores the first as a rollout and the second as a
typed failure row.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Generic, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
    model_validator,
)

from nemo_gym.failure_kinds import FailureStage, validate_failure_kind

__all__ = [
    "BaseEpisodeRequest",
    "BaseEpisodeResponse",
    "EpisodeFailure",
    "EpisodeId",
    "MaterializedTask",
    "TaskId",
    "is_materialized_task_row",
]

_ATTEMPT_SUFFIX = re.compile(r"-a[1-9][0-9]*$")


class EpisodeId(BaseModel):
    """One attempt of one rollout. Attempts after the first get ``-a<N>`` in their capture key."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rollout_id: str = Field(min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    attempt: int = Field(default=0, ge=0)

    @field_validator("rollout_id")
    @classmethod
    def _no_attempt_suffix(cls, value: str) -> str:
        # `x` attempt 1 and `x-a1` attempt 0 would share the capture key `x-a1`.
        if _ATTEMPT_SUFFIX.search(value):
            raise ValueError("rollout_id may not end in '-a<N>': that suffix marks an attempt")
        return value

    @property
    def capture_key(self) -> str:
        """The id the model-call capture and ``/ng-rollout/<id>/`` paths use for this attempt."""
        return self.rollout_id if self.attempt == 0 else f"{self.rollout_id}-a{self.attempt}"


class TaskId(BaseModel):
    """A task within a task set; in a run that blends environments, name the set ``<environment>:<set>``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    taskset: str = Field(min_length=1)
    task_id: str = Field(min_length=1)


def is_materialized_task_row(row: Mapping[str, object]) -> bool:
    """Whether a row is shaped as a materialized task (``task_id`` object + ``task_input``), valid or not: a bad
    ``task_input`` must fail as a task, not be taken for a flat row."""
    return isinstance(row.get("task_id"), Mapping) and "task_input" in row


class EpisodeFailure(BaseModel):
    """Why an episode has no result. ``terminal``: retrying this episode cannot help. ``failure_kind`` and
    ``stage`` are left out of the JSON when unknown."""

    model_config = ConfigDict(extra="forbid")

    failure_reason: str = Field(max_length=2000)
    terminal: bool
    failure_kind: str | None = None
    stage: FailureStage | None = None

    @field_validator("failure_kind")
    @classmethod
    def _known_kind(cls, value: str | None) -> str | None:
        return validate_failure_kind(value)

    @model_serializer(mode="wrap")
    def _drop_unknown(self, handler: SerializerFunctionWrapHandler) -> Any:
        # The two optional labels are left out of the wire form while unset, so older readers never see them.
        optional_labels = {"failure_kind", "stage"}
        return {key: value for key, value in handler(self).items() if value is not None or key not in optional_labels}


TaskInputT = TypeVar("TaskInputT", bound=BaseModel)
ResultT = TypeVar("ResultT")


class MaterializedTask(BaseModel, Generic[TaskInputT]):
    """A task's identity with its input, in the shape its environment server reads."""

    model_config = ConfigDict(extra="forbid")

    task_id: TaskId
    task_input: TaskInputT


class BaseEpisodeRequest(BaseModel, Generic[TaskInputT]):
    """What an environment server's ``/run`` takes."""

    model_config = ConfigDict(extra="forbid")

    episode_id: EpisodeId
    task: MaterializedTask[TaskInputT]


class BaseEpisodeResponse(BaseModel, Generic[ResultT]):
    """What it answers: the request's ids echoed, and a result or a failure, never both."""

    model_config = ConfigDict(extra="forbid")

    episode_id: EpisodeId
    task_id: TaskId
    result: ResultT | None = None
    failure: EpisodeFailure | None = None

    @model_validator(mode="after")
    def _one_outcome(self) -> BaseEpisodeResponse[ResultT]:
        outcomes = [outcome for outcome in (self.result, self.failure) if outcome is not None]
        if len(outcomes) != 1:
            raise ValueError("an episode response holds exactly one of `result` and `failure`")
        return self
