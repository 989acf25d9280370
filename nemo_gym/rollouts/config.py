"""The typed settings of the ``gym eval`` commands: read from the composed config, with their flags set on top.

Each default is written here once; the collector, reverify and the flags' help text read it from here.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from nemo_gym.config.command_config import BaseNeMoGymCLIConfig

DEFAULT_CONCURRENCY = 256
"""Rollouts in flight at once when neither ``--concurrency`` nor ``num_samples_in_parallel`` says otherwise."""
DEFAULT_SERVER_DOWN_DEADLINE_S = 60.0
"""How long a run waits for a server that went down to come back before it stops (``--server-down-deadline``)."""
DEFAULT_REVERIFY_CONCURRENCY = 64
"""Verifications in flight at once in ``gym eval reverify`` (its ``--concurrency``)."""


COUNT_FAILURES_DESCRIPTION = (
    "Failure classes or kinds to count as zeros in the aggregate metrics (--count-failures-as-zero), e.g. "
    "[agent_run_error]: the last attempt of each failed rollout of such a class enters the metrics as reward 0, so "
    "failures stay in the denominator. The files are unchanged: a failure is never a reward in the rollouts file."
)


class RolloutCollectionConfig(BaseNeMoGymCLIConfig):
    """Collect scored rollouts: run every row of a JSONL dataset through its agent, ``num_repeats`` times.

    Examples:

        gym eval run --resources-server example_single_tool_call --agent example_single_tool_call_simple_agent \
--input resources_servers/example_single_tool_call/data/example.jsonl --output results/weather.jsonl
    """

    model_config = ConfigDict(extra="ignore")

    output_jsonl_fpath: str = Field(description="Where scored rollouts go (--output); sidecar files sit beside it.")
    input_jsonl_fpath: str | None = Field(default=None, description="Dataset rows to run (--input).")
    split: str | None = Field(
        default=None, description="Without --input: run the agents' datasets of this type (train/validation/example)."
    )
    agent_name: str | None = Field(default=None, description="Agent for rows without agent_ref (--agent).")
    limit: int | None = Field(default=None, ge=1, description="Only the first N rows (--limit).")
    num_repeats: int | dict[str, int] = Field(default=1, description="Rollouts per row (--num-repeats; null: 1).")
    num_samples_in_parallel: int = Field(
        default=DEFAULT_CONCURRENCY, ge=1, description="Rollouts in flight at once (--concurrency)."
    )
    resume_from_cache: bool = Field(default=False, description="Continue a previous run (--resume).")
    overwrite: bool = Field(
        default=False, description="Replace the results of an earlier run in the output (--overwrite); else refused."
    )
    retry_terminal_timeouts: bool = Field(
        default=False,
        description="On resume, run again failures of class `timeout_exceeded` and the repairable environment faults "
        "(`reference_missing`, `eval_missing`, `transport_ineligible`) even where the agent marked them terminal "
        "(within the attempt cap); `skipped` rows never. Off: a failure is terminal exactly when it is marked so.",
    )
    retry_invalid_judge_responses: bool = Field(
        default=False,
        description="On resume, first move rollouts flagged `invalid_judge_response` from the output to the failures "
        "file (class `judge_invalid`), so they leave the score and are judged again. Off: such a rollout keeps its "
        "score (a verifier that scores an unreadable judge answer 0 on purpose).",
    )
    responses_create_params: dict[str, Any] = Field(
        default_factory=dict, description="Overrides merged over every row's create params (--temperature, …)."
    )
    disable_aggregation: bool = Field(default=False, description="Skip aggregate metrics (--disable-aggregation).")
    count_failure_classes_as_zero: list[str] = Field(default_factory=list, description=COUNT_FAILURES_DESCRIPTION)
    disable_health_check: bool = Field(
        default=False, description="Skip the rollout health checks after the run (--no-health-check)."
    )
    health_check_workers: int | None = Field(
        default=None, ge=1, description="Processes for the health checks (default: health/run.py default_workers)."
    )
    health_check_ignored_checks: list[str] = Field(
        default_factory=list,
        description="Health-check ids left out of the checks and verdicts (--health-check-ignore).",
    )
    num_repeats_add_seed: bool = Field(default=False, description="Seed each repeat with its rollout index.")
    rollout_timeout_seconds: float = Field(default=3600.0, gt=0, description="Deadline of one rollout.")
    server_down_deadline_seconds: float = Field(
        default=DEFAULT_SERVER_DOWN_DEADLINE_S, gt=0,
        description="How long to wait for a server that went down before stopping the run (--server-down-deadline).",
    )  # fmt: skip
    environment_routing_mode: Literal["agent", "legacy", "taskset"] = Field(
        default="agent",
        description="Where rows go (rollouts/routing.py): `agent`, each row through the environment server that "
        "fronts its agent (the agent itself when none does); `legacy`, every row through environment_server_name; "
        "`taskset`, only materialized tasks, by environment_server_routes.",
    )
    environment_server_name: str | None = Field(
        default=None, description="The environment server every row goes through with environment_routing_mode=legacy."
    )
    environment_server_routes: dict[str, str] = Field(
        default_factory=dict, description="Task set -> environment server, for materialized task rows."
    )

    @model_validator(mode="after")
    def _routing_is_complete(self) -> RolloutCollectionConfig:
        if self.environment_routing_mode == "legacy" and not self.environment_server_name:
            raise ValueError("environment_routing_mode=legacy needs environment_server_name")
        if self.environment_routing_mode == "taskset" and not self.environment_server_routes:
            raise ValueError("environment_routing_mode=taskset needs environment_server_routes")
        return self

    @field_validator("health_check_ignored_checks", mode="before")
    @classmethod
    def _known_checks(cls, value: Any) -> Any:
        from nemo_gym.health.checks import normalize_ignored_checks

        return list(normalize_ignored_checks(value))

    @field_validator("num_repeats", mode="before")
    @classmethod
    def _none_is_one(cls, value: Any) -> Any:
        return 1 if value is None else value

    @field_validator("num_samples_in_parallel", mode="before")
    @classmethod
    def _default_concurrency(cls, value: Any) -> Any:
        return DEFAULT_CONCURRENCY if value is None else value


class AggregateRolloutsConfig(BaseNeMoGymCLIConfig):
    """Merge rollout shards and compute their aggregate metrics from the files alone.

    Examples:

        gym eval aggregate --input-glob 'results/shard_*.jsonl' --output results/all.jsonl
    """

    model_config = ConfigDict(extra="ignore")

    input_glob: str | list[str] = Field(description="Comma-separated globs of rollout shards (--input-glob).")
    output_jsonl_fpath: str = Field(description="Merged rollouts; metrics go to <stem>_aggregate_metrics.json.")
    merge_shards: bool = Field(default=True, description="Write the merged file (--no-merge: metrics only).")
    count_failure_classes_as_zero: list[str] = Field(default_factory=list, description=COUNT_FAILURES_DESCRIPTION)


class RewardProfileConfig(BaseNeMoGymCLIConfig):
    """Profile rewards per task: pass rate, pass@k and rollout rewards, aligned with the materialized inputs.

    Examples:

        gym eval profile --rollouts results/x.jsonl --inputs results/x_materialized_inputs.jsonl
    """

    model_config = ConfigDict(extra="ignore")

    rollouts_jsonl_fpath: str = Field(description="Scored rollouts (--rollouts).")
    materialized_inputs_jsonl_fpath: str | None = Field(
        default=None, description="The run's materialized inputs (--inputs; default: <rollouts stem>_materialized_…)."
    )
    allow_partial_rollouts: bool = Field(default=False, description="Profile an unfinished run (--allow-partial).")


class ReverifyConfig(BaseNeMoGymCLIConfig):
    """Re-score stored rollouts with the current verifier, without inference.

    Examples:

        gym eval reverify --resources-server example_multi_step --rollouts results/x.jsonl --output results/x_v2.jsonl
    """

    model_config = ConfigDict(extra="ignore")

    rollouts_jsonl_fpath: str = Field(description="Stored rollouts to re-score (--rollouts).")
    materialized_inputs_jsonl_fpath: str | None = Field(
        default=None, description="The run's materialized inputs (--inputs; default: <rollouts stem>_materialized_…)."
    )
    output_jsonl_fpath: str = Field(description="Where the re-scored rollouts go (--output).")
    num_samples_in_parallel: int = Field(
        default=DEFAULT_REVERIFY_CONCURRENCY, ge=1, description="Verifications in flight (--concurrency)."
    )
    force: bool = Field(default=False, description="Re-verify even where /reverify_mode is not stateless (--force).")
    limit: int | None = Field(default=None, ge=1, description="Only the first N stored rollouts (--limit).")
    disable_aggregation: bool = Field(default=False, description="Skip aggregate metrics (--disable-aggregation).")
    verify_timeout_seconds: float = Field(default=600.0, gt=0, description="Deadline of one /verify call.")

    @field_validator("num_samples_in_parallel", mode="before")
    @classmethod
    def _default_concurrency(cls, value: Any) -> Any:
        return DEFAULT_REVERIFY_CONCURRENCY if value is None else value
