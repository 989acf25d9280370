"""NeMo Gym's ``nemo_gym.rollout_observability``: the typed observation and trajectory records of a rollout.

They are defined in ``observability/records.py``; an agent returns an :class:`AgentObservationBundle` as
``ng_agent_observations`` and the collector builds the :class:`TrajectoryRecord` (``ng_trajectory``).
:func:`join_model_call_observations` (``observability/joins.py``) resolves a bundle's model call references against
the captured calls.
"""

from __future__ import annotations

from nemo_gym.observability.joins import join_model_call_observations
from nemo_gym.observability.records import (
    AgentEpisode,
    AgentInvocation,
    AgentObservationBundle,
    AgentObservationRecord,
    ContextCompactionObservation,
    ModelCallRef,
    ObservationGap,
    ObservationModel,
    SandboxObservation,
    ToolCallObservation,
    TrajectoryModelCall,
    TrajectoryRecord,
    TrajectoryResponseMetadata,
    TrajectoryTokenStats,
    TrajectoryToolCall,
    TrajectoryTurn,
)

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
    "join_model_call_observations",
]
