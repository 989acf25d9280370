"""The typed settings of ``gym env loadtest``: ``gym eval run``'s settings plus the ladder's own, defaults once."""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator

from nemo_gym.rollouts.config import RolloutCollectionConfig

DEFAULT_LADDER = (4, 16, 64)
"""Concurrencies tried when ``--concurrency`` is not given."""
DEFAULT_STEP_SECONDS = 10.0
"""How long each step keeps starting rollouts (``--duration``); the rollouts in flight then finish."""
DEFAULT_MAX_FAILURE_RATE = 0.05
"""The ladder stops after a step whose share of failed rollouts is above this (``--max-failure-rate``)."""
DEFAULT_MAX_ROLLOUTS_PER_STEP = 20_000
"""Rollouts materialized for one step: a step that finishes them all ends before its duration (said in the table)."""


class LoadtestConfig(RolloutCollectionConfig):
    """Drive one environment at a ladder of concurrencies until a failure or latency limit; report each step.

    Examples:

        gym env loadtest --resources-server example_single_tool_call --model-type scripted_model \
--concurrency 4,16,64 --duration 10 --output results/loadtest/weather.json
    """

    output_jsonl_fpath: str = Field(default="", description="Unused: each step writes <output stem>_steps/c<N>.jsonl.")
    split: str | None = Field(default="example", description="Without --input: the agents' datasets of this type.")
    loadtest_output_fpath: str = Field(description="The JSON report (--output); the PNG curve and steps sit beside.")
    loadtest_concurrency: list[int] = Field(
        default_factory=lambda: list(DEFAULT_LADDER), description="Concurrencies of the ladder (--concurrency 4,16,64)."
    )
    loadtest_duration_seconds: float = Field(
        default=DEFAULT_STEP_SECONDS, gt=0, description="Seconds each step keeps starting rollouts (--duration)."
    )
    loadtest_max_failure_rate: float = Field(
        default=DEFAULT_MAX_FAILURE_RATE, ge=0, le=1, description="Stop after a step failing more (--max-failure-rate)."
    )
    loadtest_max_p99_ms: float | None = Field(
        default=None, gt=0, description="Stop after a step whose p99 rollout latency is above this (--max-p99-ms)."
    )
    loadtest_model_latency_ms: float | None = Field(
        default=None, ge=0, description="The scripted model's delay per reply (--model-latency-ms)."
    )
    loadtest_max_rollouts_per_step: int = Field(
        default=DEFAULT_MAX_ROLLOUTS_PER_STEP, ge=1, description="Rollouts materialized for one step."
    )

    @field_validator("loadtest_concurrency", mode="before")
    @classmethod
    def _ladder(cls, value: Any) -> Any:
        """``"4,16,64"`` (the flag) or a list (the config): positive, strictly rising."""
        if isinstance(value, str):
            try:
                value = [int(part) for part in value.replace(" ", "").split(",") if part]
            except ValueError:
                raise ValueError(f"--concurrency wants comma-separated integers like 4,16,64, got {value!r}") from None
        if isinstance(value, (list, tuple)):
            if not value or any(int(v) < 1 for v in value):
                raise ValueError("--concurrency needs at least one concurrency, each at least 1")
            if any(b <= a for a, b in zip(value, value[1:], strict=False)):
                raise ValueError(f"--concurrency must rise step by step, got {','.join(str(v) for v in value)}")
        return value
