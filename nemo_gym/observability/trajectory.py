"""The collector's side of observability: a finished rollout's captured calls and observations, joined into records.

:func:`merge_model_call_capture_into_record` reads the rollout's capture file into ``ng_model_call_capture``;
:func:`attach_trajectory_record` projects that, the agent's ``ng_agent_observations`` and any ``ng_trajectory`` the
agent produced itself into one standardized ``ng_trajectory``. Both change only those keys: never the answer or the
reward. Both are called only for runs with capture on or rows that carry observations, so other runs pay nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from importlib import import_module
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from nemo_gym.observability.capture import (
    CAPTURE_KEY,
    OBSERVATIONS_KEY,
    PAYLOAD_FIELDS,
    TRAJECTORY_KEY,
    CaptureStore,
    ModelCallRecord,
    aggregate_model_call_records,
    read_available_model_call_records,
)
from nemo_gym.observability.correlation import rollout_id_from_run_body
from nemo_gym.observability.joins import join_model_call_observations
from nemo_gym.observability.model_call_records import LENGTH_STOPS
from nemo_gym.observability.records import (
    AgentInvocation,
    AgentObservationBundle,
    ObservationGap,
    ToolCallObservation,
    TrajectoryModelCall,
    TrajectoryRecord,
    TrajectoryResponseMetadata,
    TrajectoryTokenStats,
    TrajectoryToolCall,
)
from nemo_gym.openai_utils import NeMoGymFunctionCallOutput
from nemo_gym.row_fields import ROLLOUT_INDEX_KEY, TASK_INDEX_KEY

logger = logging.getLogger(__name__)

_TASK_ID_FIELDS = ("task_id", "problem_id", "instance_id")
_METADATA_FIELDS = tuple(TrajectoryResponseMetadata.model_fields)

_SOURCE_CALL_ASSOCIATIONS: dict[str, str] = {
    "claude_code": "responses_api_agents.claude_code_agent.observability:associate_claude_code_compaction_calls",
}
"""Per observation source, an agent's own ``(bundle, calls) -> bundle`` step run before the generic join: calls the
agent cannot name itself (Claude Code's hidden summary call of a compaction) that only its own reading can place.
Named as ``module:function`` and looked up when used, so the core imports no agent code until a row needs it."""


def _store_for(rollout_id: str, capture_dirs: list[Path]) -> CaptureStore | None:
    for directory in capture_dirs:
        store = CaptureStore(directory)
        if store.path_for(rollout_id).exists() or store.is_incomplete(rollout_id):
            return store
    return None


def clear_model_call_captures(rows: list[dict[str, Any]], capture_dirs: list[Path]) -> None:
    """Remove what an earlier run captured under these rows' rollout ids, before they are run again."""
    for directory in capture_dirs:
        store = CaptureStore(directory)
        for row in rows:
            if rollout_id := rollout_id_from_run_body(row):
                store.path_for(rollout_id).unlink(missing_ok=True)
                store.incomplete_path_for(rollout_id).unlink(missing_ok=True)


def _payloads_left_out(call: ModelCallRecord, include_payloads: bool) -> set[str] | None:
    """The payload fields a merged call leaves in the store: all of them, except the response of a call cut off at
    its length limit, which the runaway-generation health check must read to tell a cut answer from no answer."""
    if include_payloads:
        return None
    if call.finish_reason in LENGTH_STOPS:
        return {"request", "request_raw"}
    return set(PAYLOAD_FIELDS)


def merge_model_call_capture_into_record(
    record: dict[str, Any], capture_dirs: list[Path], *, include_payloads: bool = False
) -> dict[str, Any]:
    """Add ``ng_model_call_capture = {rollout_id, metrics, calls[, gaps]}`` to a finished rollout, in place.

    The rollout id comes from the record's own indices, so every agent gets the same shape. Payloads (request and
    response bodies) stay in the store unless ``include_payloads``, but for the response of a call cut off at its
    length limit. What could not be read becomes a gap; the answer and reward are never changed. Without capture
    directories or a rollout id the record is left as it is.
    """
    rollout_id = rollout_id_from_run_body(record) if capture_dirs else None
    if rollout_id is None:
        return record
    gaps: list[ObservationGap] = []
    calls: list[ModelCallRecord] = []
    store = _store_for(rollout_id, capture_dirs)
    if store is None:
        gaps.append(ObservationGap(code="model_call_capture_no_records"))
    else:
        try:
            calls, damaged = read_available_model_call_records(store, rollout_id)
        except OSError:
            logger.warning("could not read the model-call capture of rollout %s", rollout_id, exc_info=True)
            damaged = 0
            gaps.append(ObservationGap(code="model_call_capture_unreadable"))
        if damaged:
            gaps.append(ObservationGap(code="model_call_capture_records_unreadable", detail=f"count={damaged}"))
        if store.is_incomplete(rollout_id):
            gaps.append(ObservationGap(code="model_call_capture_incomplete"))
        elif not calls and not damaged and not gaps:
            gaps.append(ObservationGap(code="model_call_capture_no_records"))
    if record.get(OBSERVATIONS_KEY) is not None:
        try:
            bundle = AgentObservationBundle.model_validate(record[OBSERVATIONS_KEY])
            bundle = join_model_call_observations(_source_associated(bundle, calls, rollout_id), calls)
            record[OBSERVATIONS_KEY] = bundle.model_dump(mode="json")
        except (ValueError, TypeError, AttributeError):
            logger.warning("could not join the agent observations of rollout %s", rollout_id, exc_info=True)
            gaps.append(ObservationGap(code="agent_observation_join_failed"))
    capture: dict[str, Any] = {
        "rollout_id": rollout_id,
        "metrics": aggregate_model_call_records(calls),
        "calls": [call.model_dump(mode="json", exclude=_payloads_left_out(call, include_payloads)) for call in calls],
    }
    if gaps:
        capture["gaps"] = [gap.model_dump(mode="json", exclude_none=True) for gap in gaps]
    record[CAPTURE_KEY] = capture
    return record


def _source_associated(
    bundle: AgentObservationBundle, calls: list[ModelCallRecord], rollout_id: str
) -> AgentObservationBundle:
    """``bundle`` after its source's own association step, if it has one; a step that fails (or whose agent code is
    not installed) leaves the bundle as it was with a ``compaction_model_call_join_failed`` gap, so the generic join
    of the other calls still happens."""
    target = _SOURCE_CALL_ASSOCIATIONS.get(bundle.source)
    if target is None:
        return bundle
    module_name, _, function_name = target.partition(":")
    try:
        associate: Callable[..., AgentObservationBundle] = getattr(import_module(module_name), function_name)
        return associate(bundle, calls)
    except Exception:  # an agent's own code: whatever it raises must not cost the rollout its other joins
        logger.warning("could not associate the %s calls of rollout %s", bundle.source, rollout_id, exc_info=True)
        return bundle.model_copy(
            update={"gaps": [*bundle.gaps, ObservationGap(code="compaction_model_call_join_failed")]}
        )


# ---------------------------------------------------------------------------------------------------------------------
# The trajectory record


def trajectory_identity(row: dict[str, Any]) -> tuple[str, str]:
    """``(task_id, rollout_id)``: the row's own task id field if it has one, else its task index."""
    task_id = next((str(row[key]) for key in _TASK_ID_FIELDS if row.get(key) is not None), str(row[TASK_INDEX_KEY]))
    return task_id, rollout_id_from_run_body(row) or f"{row[TASK_INDEX_KEY]}-{row[ROLLOUT_INDEX_KEY]}"


def _model_call(raw: dict[str, Any]) -> TrajectoryModelCall:
    metadata = {key: raw[key] for key in _METADATA_FIELDS if raw.get(key) is not None}
    response = raw.get("response")
    if isinstance(response, dict) and isinstance(response.get("status"), str):
        metadata.setdefault("response_status", response["status"])
    return TrajectoryModelCall(
        model_call_id=raw.get("model_call_id"),
        started_at=raw.get("started_at"),
        completed_at=raw.get("completed_at"),
        duration_ms=raw.get("latency_total_ms"),
        request=raw["request"] if raw.get("request") is not None else raw.get("request_raw"),
        response=response if response is not None else raw.get("response_raw"),
        response_metadata=TrajectoryResponseMetadata.model_validate(metadata),
        token_stats=TrajectoryTokenStats(
            prompt_tokens=_count(raw.get("tokens_in")),
            completion_tokens=_count(raw.get("tokens_out")),
            reasoning_tokens=_count(raw.get("tokens_reasoning")),
            total_tokens=_count(raw.get("tokens_total")),
            cached_tokens=_count(raw.get("cached_tokens")),
        ),
    )


def _count(value: Any) -> int | None:
    return value if type(value) is int and value >= 0 else None


def _merge_tool_calls(
    tools: list[TrajectoryToolCall], observed: list[ToolCallObservation], invocations: list[AgentInvocation]
) -> list[TrajectoryToolCall]:
    """The producer's tool calls updated with the agent's observations, and each call's output from the conversation.

    An observation with status ``unknown`` does not overwrite a status the producer knew.
    """
    outputs = {
        (invocation.invocation_id, item.call_id): item.output
        for invocation in invocations
        for item in invocation.conversation
        if isinstance(item, NeMoGymFunctionCallOutput)
    }
    merged = {(tool.invocation_id, tool.tool_call_id): tool.model_dump(mode="json") for tool in tools}
    for observation in observed:
        key = (observation.invocation_id, observation.tool_call_id)
        update = observation.model_dump(mode="json", exclude_none=True)
        if key in merged and observation.status == "unknown" and merged[key]["status"] != "unknown":
            update.pop("status")
        merged.setdefault(key, {}).update(update)
        if key in outputs:
            merged[key]["output"] = outputs[key]
    return [TrajectoryToolCall.model_validate(tool) for tool in merged.values()]


def _produced_trajectory(
    result: dict[str, Any], task_id: str, rollout_id: str, gaps: list[ObservationGap]
) -> TrajectoryRecord:
    """The agent's own ``ng_trajectory`` if it sent a valid one, else an empty record; problems become gaps."""
    offered = result.get(TRAJECTORY_KEY)
    if not isinstance(offered, dict):
        return TrajectoryRecord(task_id=task_id, rollout_id=rollout_id)
    try:
        produced = TrajectoryRecord.model_validate(offered)
    except ValidationError as error:
        gaps.append(ObservationGap(code="producer_trajectory_invalid", detail=type(error).__name__))
        produced = TrajectoryRecord(task_id=task_id, rollout_id=rollout_id)
    expected = {"task_id": task_id, "rollout_id": rollout_id}
    wrong = [name for name, value in expected.items() if getattr(produced, name) != value]
    if wrong:
        gaps.append(ObservationGap(code="producer_trajectory_identity_mismatch", detail=",".join(wrong)))
    return produced


def _overlay_call(base: TrajectoryModelCall, captured: TrajectoryModelCall) -> TrajectoryModelCall:
    """``base`` with every value the capture knows written over it (nested metadata and token stats field by field)."""
    fields = base.model_dump(mode="json")
    known = captured.model_dump(mode="json", exclude_none=True)
    for section in ("response_metadata", "token_stats"):
        fields[section] = {**fields[section], **known.pop(section)}
    fields.update(known)
    return TrajectoryModelCall.model_validate(fields)


def _join_captured_calls(
    model_calls: list[TrajectoryModelCall], capture: dict[str, Any], gaps: list[ObservationGap]
) -> None:
    """Fold the capture's calls into ``model_calls`` (matched by call id, each id at most once) and keep its gaps."""
    unmatched = {call.model_call_id: index for index, call in enumerate(model_calls) if call.model_call_id is not None}
    for raw in filter(lambda entry: isinstance(entry, dict), capture.get("calls") or []):
        captured = _model_call(raw)
        index = None if captured.model_call_id is None else unmatched.pop(captured.model_call_id, None)
        if index is None:
            model_calls.append(captured)
        else:
            model_calls[index] = _overlay_call(model_calls[index], captured)
    for raw_gap in capture.get("gaps") or []:
        try:
            gaps.append(ObservationGap.model_validate(raw_gap))
        except ValidationError:
            gaps.append(ObservationGap(code="model_call_capture_gap_invalid"))


def _distinct(gaps: list[ObservationGap]) -> list[ObservationGap]:
    """Gaps with repeats dropped: the last of equal ``(code, invocation_id, detail)`` wins, at the first's place."""
    by_key: dict[tuple[str, str | None, str | None], ObservationGap] = {}
    for gap in gaps:
        by_key[gap.code, gap.invocation_id, gap.detail] = gap
    return list(by_key.values())


def build_trajectory_record(row: dict[str, Any], result: dict[str, Any]) -> TrajectoryRecord:
    """One rollout's evidence as a :class:`TrajectoryRecord`; everything missing or malformed becomes a gap."""
    task_id, rollout_id = trajectory_identity(row)
    gaps: list[ObservationGap] = []
    produced = _produced_trajectory(result, task_id, rollout_id, gaps)
    gaps.extend(produced.gaps)
    invocations = list(produced.invocations)
    tools = list(produced.tool_calls)
    model_calls = list(produced.model_calls)

    if result.get(OBSERVATIONS_KEY) is not None:
        try:
            bundle = AgentObservationBundle.model_validate(result[OBSERVATIONS_KEY])
        except ValidationError as error:
            gaps.append(ObservationGap(code="agent_observations_invalid", detail=type(error).__name__))
        else:
            gaps.extend(bundle.gaps)
            seen_ids = {invocation.invocation_id for invocation in invocations}
            for record in bundle.records:
                if isinstance(record, AgentInvocation) and record.invocation_id not in seen_ids:
                    invocations.append(record)
            tool_observations = [record for record in bundle.records if isinstance(record, ToolCallObservation)]
            if tool_observations:
                tools = _merge_tool_calls(tools, tool_observations, invocations)

    captured = result.get(CAPTURE_KEY)
    _join_captured_calls(model_calls, captured if isinstance(captured, dict) else {}, gaps)

    turns = sorted(
        (turn.model_copy(update={"task_id": task_id, "rollout_id": rollout_id}) for turn in produced.turns),
        key=lambda turn: (turn.timestamp, turn.invocation_id, turn.turn_no),
    )
    if not model_calls:
        gaps.append(ObservationGap(code="model_calls_unavailable"))
    if not turns:
        gaps.append(ObservationGap(code="turns_unavailable"))
    if all(not invocation.conversation for invocation in invocations):
        gaps.append(ObservationGap(code="conversation_unavailable"))
    return TrajectoryRecord(
        task_id=task_id,
        rollout_id=rollout_id,
        gaps=_distinct(gaps),
        invocations=invocations,
        turns=turns,
        tool_calls=tools,
        model_calls=model_calls,
    )


def _record_projection_failure(row: dict[str, Any], result: dict[str, Any], gap: ObservationGap) -> None:
    """Put ``gap`` where a reader will look: on the capture, else the observations, else a bare trajectory."""
    as_json = gap.model_dump(mode="json", exclude_none=True)
    for key in (CAPTURE_KEY, OBSERVATIONS_KEY):
        holder = result.get(key)
        if not isinstance(holder, dict):
            continue
        listed = holder.setdefault("gaps", [])
        if isinstance(listed, list):
            listed.append(as_json)
            return
    try:
        task_id, rollout_id = trajectory_identity(row)
    except KeyError:
        return
    bare = TrajectoryRecord(task_id=task_id, rollout_id=rollout_id, gaps=[gap])
    result[TRAJECTORY_KEY] = bare.model_dump(mode="json")


def attach_trajectory_record(row: dict[str, Any], result: dict[str, Any]) -> None:
    """Set ``result["ng_trajectory"]`` in place; then drop the capture's payload copies, which it now holds.

    If the projection fails, the raw capture stays as it was and the failure is recorded as a
    ``trajectory_projection_failed`` gap (on the capture, the observations, or a bare trajectory).
    """
    try:
        projected = build_trajectory_record(row, result)
    except (ValidationError, ValueError, KeyError, TypeError, AttributeError) as error:
        logger.warning("could not build the trajectory record of a rollout", exc_info=True)
        result.pop(TRAJECTORY_KEY, None)
        _record_projection_failure(
            row, result, ObservationGap(code="trajectory_projection_failed", detail=type(error).__name__)
        )
        return
    result[TRAJECTORY_KEY] = projected.model_dump(mode="json")
    capture = result.get(CAPTURE_KEY)
    calls = capture.get("calls") if isinstance(capture, dict) else None
    for call in calls or []:
        if isinstance(call, dict):
            for key in PAYLOAD_FIELDS:
                call.pop(key, None)
