"""``run_health_checks``: NeMo Gym 0.7's check ids and verdicts for the checks built so far, over rollout files.

A rollout is ``unhealthy`` with any finding, ``unobserved`` when a check lacked its evidence, else ``healthy``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from nemo_gym.observability.capture import ModelCallRecord
from nemo_gym.observability.records import ModelCallRef, TrajectoryRecord, TrajectoryTurn
from nemo_gym.rollout_collection import _build_trajectory_record
from nemo_gym.rollout_health import CHECK_REGISTRY, run_health_checks
from nemo_gym.rollout_observability import AgentInvocation, AgentObservationBundle, join_model_call_observations

TEXT = [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "done"}]}]
MODEL = {"type": "responses_api_models", "name": "policy"}


def _call(call_id: str, *, status: int = 200, tokens: tuple[int | None, int | None] = (10, 2), **meta: Any) -> dict:
    return {
        "model_call_id": call_id,
        "response": {"output": TEXT},
        "response_metadata": {"response_id": f"resp-{call_id}", "model_ref": MODEL, "status_code": status, **meta},
        "token_stats": {"prompt_tokens": tokens[0], "completion_tokens": tokens[1]},
    }


def _turn(turn_no: int, answer: Any = TEXT, refs: tuple[str, ...] = ()) -> dict:
    return {
        "invocation_id": "root",
        "task_id": "0",
        "rollout_id": "0-0",
        "turn_no": turn_no,
        "timestamp": 1.0,
        "answer": answer,
        "step_count": 1,
        "model_calls": [{"model_call_id": ref} for ref in refs],
    }


def _row(task: int, repeat: int, trajectory: dict | None, usage: tuple[int, int] | None = (10, 2)) -> dict:
    row: dict[str, Any] = {"_ng_task_index": task, "_ng_rollout_index": repeat, "reward": 1.0}
    if usage is not None:
        row["response"] = {"usage": {"input_tokens": usage[0], "output_tokens": usage[1]}}
    if trajectory is not None:
        ids = {"task_id": str(task), "rollout_id": f"{task}-{repeat}"}
        turns = [turn | ids for turn in trajectory.get("turns", [])]
        row["ng_trajectory"] = {**ids, **trajectory, "turns": turns}
    return row


def _check(tmp_path: Path, *rows: dict | str, **options: Any) -> Any:
    path = tmp_path / "rollouts.jsonl"
    path.write_text("".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows))
    return run_health_checks(path, workers=1, **options)


def _checks(digest: Any) -> set[str]:
    return {finding.check for finding in digest.findings}


def test_a_complete_clean_rollout_is_healthy(tmp_path: Path) -> None:
    trajectory = {"turns": [_turn(1, refs=("a",))], "model_calls": [_call("a")]}
    result = _check(tmp_path, _row(0, 0, trajectory))
    [digest] = result.rollouts
    assert (digest.verdict, digest.findings, digest.unobserved) == ("healthy", [], [])
    assert digest.policy_calls_observed and digest.successful_model_calls == 1
    coverage = result.summary["run"]["artifacts"]["coverage"]
    assert coverage["task_no_successful_model_calls"]["evaluated"] == 1
    assert set(coverage) == {spec.id for spec in CHECK_REGISTRY}
    verdicts = [json.loads(line) for line in (tmp_path / "rollout_verdicts.jsonl").read_text().splitlines()]
    assert verdicts == [
        {"_ng_task_index": 0, "_ng_rollout_index": 0, "rollout_id": "0-0", "verdict": "healthy", "findings": [],
         "unobserved": []}
    ]  # fmt: skip
    assert json.loads((tmp_path / "quality_summary.json").read_text()) == result.summary


def test_a_rollout_without_a_trajectory_is_unobserved_never_healthy(tmp_path: Path) -> None:
    [digest] = _check(tmp_path, _row(0, 0, None)).rollouts
    assert digest.verdict == "unobserved" and digest.findings == []
    assert {"agent_turn_hollow", "model_call_failed", "rollout_token_count_mismatch"} <= set(digest.unobserved)
    assert "record_unreadable" not in digest.unobserved


def test_failed_zero_token_and_cut_off_calls_are_findings(tmp_path: Path) -> None:
    calls = [
        _call("a", status=503, tokens=(10, 0)),
        _call("b", tokens=(None, 3)),
        _call("c", finish_reason="length") | {"response": {"output": []}},
    ]
    trajectory = {"turns": [_turn(1, refs=("a", "b", "c"))], "model_calls": calls}
    [digest] = _check(tmp_path, _row(0, 0, trajectory)).rollouts
    assert digest.verdict == "unhealthy"
    found = {(f.check, f.locator["call_id"]) for f in digest.findings if f.locator}
    assert {("model_call_failed", "a"), ("model_call_zero_completion_tokens", "a")} <= found
    assert {("model_call_missing_token_counts", "b"), ("model_call_runaway_generation", "c")} <= found
    assert "rollout_token_count_mismatch" in digest.unobserved  # a call without counts cannot be summed
    failed = next(f for f in digest.findings if f.check == "model_call_failed")
    assert failed.detail == {"status": 503, "error_category": None, "terminal": False}


def test_hollow_turns_and_a_rollout_without_model_activity(tmp_path: Path) -> None:
    trajectory = {"turns": [_turn(1, answer=[]), _turn(2, answer=[{"type": "function_call", "name": "ls"}])]}
    [digest] = _check(tmp_path, _row(0, 0, trajectory)).rollouts
    hollow = [f.locator for f in digest.findings if f.check == "agent_turn_hollow"]
    assert hollow == [{"turn": 1}]  # a tool call is activity; the empty turn is hollow
    assert "rollout_missing_agent_turns" not in _checks(digest)
    [digest] = _check(tmp_path, _row(0, 0, {"turns": [_turn(1, answer="  ")]})).rollouts
    assert {"agent_turn_hollow", "rollout_missing_agent_turns"} <= _checks(digest)


def test_references_the_capture_cannot_back_are_a_capture_mismatch(tmp_path: Path) -> None:
    trajectory = {"turns": [_turn(1, refs=("a", "ghost"))], "model_calls": [_call("a")]}
    [digest] = _check(tmp_path, _row(0, 0, trajectory)).rollouts
    [mismatch] = [f for f in digest.findings if f.check == "trajectory_capture_mismatch"]
    assert (mismatch.locator, mismatch.detail) == ({"call_id": "ghost"}, {"kind": "missing_captured_call"})
    assert not digest.policy_calls_observed  # the turns' calls are not all accounted for


def test_token_totals_must_match_the_transcript(tmp_path: Path) -> None:
    trajectory = {"turns": [_turn(1, refs=("a",)), _turn(2, refs=("b",))], "model_calls": [_call("a"), _call("b")]}
    [digest] = _check(tmp_path, _row(0, 0, trajectory, usage=(20, 5))).rollouts
    [mismatch] = [f for f in digest.findings if f.check == "rollout_token_count_mismatch"]
    assert mismatch.detail == {"transcript_prompt": 20, "transcript_completion": 5, "capture_prompt": 20,
                               "capture_completion": 4}  # fmt: skip


def test_a_task_whose_repeats_all_failed_their_model_calls_is_flagged(tmp_path: Path) -> None:
    failing = {"turns": [_turn(1, refs=("a",))], "model_calls": [_call("a", status=500)]}
    fine = {"turns": [_turn(1, refs=("a",))], "model_calls": [_call("a")]}
    result = _check(tmp_path, _row(0, 0, failing), _row(0, 1, failing), _row(1, 0, failing), _row(1, 1, fine))
    assert result.summary["tasks"]["0"]["flags"] == ["task_no_successful_model_calls"]
    assert result.summary["tasks"]["1"]["flags"] == []
    assert result.summary["run"]["issues"]["task_no_successful_model_calls"] == 1
    assert result.summary["run"]["stats"]["model_call_errors"]["by_status"] == {"500": 3}


def test_an_unreadable_line_is_a_finding_and_ignored_checks_are_counted(tmp_path: Path) -> None:
    result = _check(tmp_path, "{not json", _row(0, 0, None), ignored_checks=["agent_turn_hollow"])
    unreadable = next(d for d in result.rollouts if "record_unreadable" in _checks(d))
    assert unreadable.verdict == "unhealthy"
    assert result.summary["run"]["artifacts"]["coverage"]["agent_turn_hollow"]["ignored"] == 2
    with pytest.raises(ValueError, match="unknown rollout health checks: no_such_check"):
        _check(tmp_path, _row(0, 0, None), ignored_checks="no_such_check")


def test_a_trajectory_our_collector_builds_is_checked_through_invocation_bound_calls(tmp_path: Path) -> None:
    """The shape NeMo Gym 0.7's sandboxed agents produce: turns without call references, an agent invocation that
    owns the captured call. Content and call checks run; the token totals cannot (the turns bind no calls)."""
    call = ModelCallRecord(call_index=0, model_call_id="captured", client_session_id="root", tokens_in=10,
                           tokens_out=0, status_code=503, response_status="completed")  # fmt: skip
    invocation = AgentInvocation(invocation_id="root", model_calls=[ModelCallRef(model_call_id="captured")])
    observations = join_model_call_observations(AgentObservationBundle(source="test", records=[invocation]), [call])
    produced = TrajectoryRecord(task_id="0", rollout_id="0-0", turns=[TrajectoryTurn.model_validate(_turn(1))])
    row = {"_ng_task_index": 0, "_ng_rollout_index": 0}
    result = {
        "ng_agent_observations": observations.model_dump(mode="json"),
        "ng_trajectory": produced.model_dump(mode="json"),
        "ng_model_call_capture": {"calls": [call.model_dump(mode="json")]},
        "response": {"usage": {"input_tokens": 999, "output_tokens": 999}},
    }
    canonical = _build_trajectory_record(row, result)
    [digest] = _check(tmp_path, row | result | {"ng_trajectory": canonical.model_dump(mode="json")}).rollouts
    assert {"model_call_failed", "model_call_zero_completion_tokens"} <= _checks(digest)
    assert not {"agent_turn_hollow", "rollout_missing_agent_turns"} & _checks(digest)
    assert digest.unobserved == ["rollout_token_count_mismatch"]
