"""``ng_perf``: one rollout's turns, tool calls and tokens, summed from its ``ng_trajectory``.

Only a run with observability on gets it, and only a rollout whose trajectory has invocations: per-turn evidence, not
just captured calls, is what the numbers are about. Tokens are summed over the captured calls the invocations own (a
reference that names no single call adds nothing), and ``token_observability_coverage`` says what share of the turns
had their call found, since a lost call would otherwise just lower the sums without a trace.
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any

from pydantic import ValidationError

from nemo_gym.observability.capture import TRAJECTORY_KEY
from nemo_gym.observability.joins import CallIndex
from nemo_gym.observability.records import TrajectoryModelCall, TrajectoryRecord

__all__ = ["PERF_KEY", "attach_ng_perf", "build_ng_perf"]

logger = logging.getLogger(__name__)

PERF_KEY = "ng_perf"
_TOKEN_SUMS = (
    ("prompt_tokens", "prompt_tokens"),
    ("cached_prompt_tokens", "cached_tokens"),
    ("completion_tokens", "completion_tokens"),
    ("reasoning_tokens", "reasoning_tokens"),
)
"""``ng_perf`` key -> the token-stats field it sums."""


def _parsed_trajectory(raw: dict[str, Any]) -> TrajectoryRecord | None:
    """``raw`` as a trajectory record, or None when it does not validate (a perf summary is never worth a failure)."""
    try:
        return TrajectoryRecord.model_validate(raw)
    except ValidationError:
        return None


def build_ng_perf(result: dict[str, Any], *, rollout_latency_ms: float | None) -> dict[str, Any] | None:
    """The ``ng_perf`` of a finished rollout, or None when its trajectory is absent, invalid or has no invocation."""
    raw = result.get(TRAJECTORY_KEY)
    trajectory = _parsed_trajectory(raw) if isinstance(raw, dict) else None
    if trajectory is None or not trajectory.invocations:
        return None
    calls = trajectory.model_calls
    index = CallIndex(
        (call.model_call_id, call.response_metadata.model_ref, call.response_metadata.response_id) for call in calls
    )
    owned: list[TrajectoryModelCall] = []
    owned_by_invocation: Counter[str] = Counter()
    taken: set[int] = set()
    for invocation in trajectory.invocations:
        for ref in invocation.model_calls:
            position = index.unique(ref)
            if position is None or position in taken:
                continue  # one physical call is counted once, whichever invocations name it
            taken.add(position)
            owned.append(calls[position])
            owned_by_invocation[invocation.invocation_id] += 1
    invocation_ids = {invocation.invocation_id for invocation in trajectory.invocations}
    turns_by_invocation = Counter(turn.invocation_id for turn in trajectory.turns)
    # An invocation counts its reported turns, else one turn per call it owns, else one: it ran at least once.
    num_turns = sum(
        turns_by_invocation[i.invocation_id] or owned_by_invocation[i.invocation_id] or 1
        for i in trajectory.invocations
    )
    perf: dict[str, Any] = {
        "num_turns": num_turns,
        "num_tool_calls": sum(1 for tool in trajectory.tool_calls if tool.invocation_id in invocation_ids),
        "token_observability_coverage": min(1.0, len(owned) / num_turns),
    }
    for key, field in _TOKEN_SUMS:
        values = [getattr(call.token_stats, field) for call in owned]
        known = [value for value in values if value is not None]
        if known:
            perf[key] = sum(known)
    if isinstance(rollout_latency_ms, (int, float)) and not isinstance(rollout_latency_ms, bool):
        perf["total_latency_ms"] = rollout_latency_ms
    return perf


def attach_ng_perf(
    result: dict[str, Any], *, observability_enabled: bool, rollout_latency_ms: float | None = None
) -> None:
    """Set ``result["ng_perf"]`` in place when observability is on and the trajectory allows it; never raises (a
    summary that cannot be built is logged and left out: the rollout and its score stand as they are)."""
    if not observability_enabled:
        return
    try:
        perf = build_ng_perf(result, rollout_latency_ms=rollout_latency_ms)
    except Exception:  # a summary must never cost the rollout
        logger.warning("could not build ng_perf for a rollout", exc_info=True)
        return
    if perf is not None:
        result[PERF_KEY] = perf
