"""NeMo Gym's ``nemo_gym.rollout_correlation``: which rollout a request belongs to (see ``observability/correlation.py``)."""

from __future__ import annotations

from nemo_gym.observability.correlation import (
    ROLLOUT_ID_PATTERN,
    RolloutContextMiddleware,
    current_rollout_id,
    rollout_context,
)
from nemo_gym.observability.correlation import rollout_id_from_run_body as maybe_rollout_id_from_run_body

__all__ = [
    "ROLLOUT_ID_PATTERN",
    "RolloutContextMiddleware",
    "current_rollout_id",
    "maybe_rollout_id_from_run_body",
    "rollout_context",
]
