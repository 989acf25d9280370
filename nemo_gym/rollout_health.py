"""Rollout health checks (NeMo Gym 0.7's ``nemo_gym.rollout_health``): a public face over ``nemo_gym/health/``.

``run_health_checks(path)`` checks every rollout of a rollouts JSONL file from its recorded trajectory and model-call
capture, writes ``quality_summary.json`` and ``rollout_verdicts.jsonl`` beside it, and returns the summary with one
digest per rollout (``healthy``, ``unhealthy`` with findings, or ``unobserved`` where evidence was missing).
"""

from __future__ import annotations

from nemo_gym.health.checks import CHECK_REGISTRY, CheckSpec, Finding, normalize_ignored_checks
from nemo_gym.health.run import HealthCheckResult, RolloutDigest, run_health_checks

__all__ = [
    "CHECK_REGISTRY",
    "CheckSpec",
    "Finding",
    "HealthCheckResult",
    "RolloutDigest",
    "normalize_ignored_checks",
    "run_health_checks",
]
