"""``run_health_checks``: NeMo Gym 0.7's check ids and verdicts, each check's finding, over rollout files.

A rollout is ``unhealthy`` with any finding, ``unobserved`` when a check lacked its evidence, else ``healthy``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from nemo_gym.health import lines
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
    assert result.summary["tasks"]["0"]["flags"] == ["task_consistently_unhealthy", "task_no_successful_model_calls"]
    assert result.summary["tasks"]["1"]["flags"] == []  # one repeat recovered: neither task check fires
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


def test_the_registry_has_every_check_of_nemo_gym_07_in_its_order() -> None:
    assert [spec.id for spec in CHECK_REGISTRY] == [
        "check_execution_error", "record_unreadable", "rollout_duplicate_identity", "rollout_missing_agent_turns",
        "rollout_ended_on_failed_model_call", "agent_turn_hollow", "model_call_zero_completion_tokens",
        "model_call_missing_token_counts", "trajectory_capture_mismatch", "model_call_failed",
        "rollout_token_count_mismatch", "model_call_runaway_generation", "task_consistently_unhealthy",
        "task_no_successful_model_calls",
    ]  # fmt: skip


JUDGE = {"type": "responses_api_models", "name": "judge"}


def _timed(call_id: str, started_at: float | None, *, status: int = 200, model: dict = MODEL) -> dict:
    call = _call(call_id, status=status)
    call["response_metadata"]["model_ref"] = model
    return call | {"started_at": started_at}


def _ended(tmp_path: Path, *calls: dict) -> Any:
    trajectory = {"turns": [_turn(1, refs=(calls[0]["model_call_id"],))], "model_calls": list(calls)}
    [digest] = _check(tmp_path, _row(0, 0, trajectory)).rollouts
    return digest


def test_a_rollout_whose_model_last_answered_with_a_failure_ended_on_it(tmp_path: Path) -> None:
    digest = _ended(tmp_path, _timed("a", 1.0), _timed("b", 2.0, status=502))
    [ended] = [f for f in digest.findings if f.check == "rollout_ended_on_failed_model_call"]
    assert ended.locator == {"call_id": "b"}
    assert ended.detail == {"model_ref": "responses_api_models/policy", "status": 502, "error_category": None,
                            "observed_calls": 2, "successful_calls": 1}  # fmt: skip
    assert digest.ended_on_error
    # a later judge call does not hide the policy's failure; the judge's own chain ended fine
    digest = _ended(tmp_path, _timed("a", 1.0, status=500), _timed("j", 3.0, model=JUDGE))
    assert [f.detail["model_ref"] for f in digest.findings if f.check == "rollout_ended_on_failed_model_call"] == [
        "responses_api_models/policy"
    ]


def test_a_retried_failure_or_an_unknown_order_is_not_an_ending(tmp_path: Path) -> None:
    retried = _ended(tmp_path, _timed("b", 2.0), _timed("a", 1.0, status=503))  # the failure came first in time
    assert "rollout_ended_on_failed_model_call" not in _checks(retried) and not retried.ended_on_error
    unordered = _ended(tmp_path, _timed("a", 1.0, status=503), _timed("b", None))
    assert "rollout_ended_on_failed_model_call" not in _checks(unordered)
    only_failures = _ended(tmp_path, _timed("a", None, status=503))  # nothing to order: it ended on a failure
    assert "rollout_ended_on_failed_model_call" in _checks(only_failures)
    [digest] = _check(tmp_path, _row(0, 0, {"turns": [_turn(1)]})).rollouts  # no captured call: cannot tell
    assert "rollout_ended_on_failed_model_call" in digest.unobserved


def test_rows_that_claim_one_rollout_are_each_a_duplicate(tmp_path: Path) -> None:
    clean = {"turns": [_turn(1, refs=("a",))], "model_calls": [_call("a")]}
    staged = _row(0, 0, clean) | {"stage_index": 1}
    result = _check(tmp_path, _row(0, 0, clean), _row(0, 0, clean), _row(0, 1, clean), staged)
    flagged = [(d.rollout_index, d.stage_index, d.verdict, _checks(d)) for d in result.rollouts]
    assert flagged == [
        (0, None, "unhealthy", {"rollout_duplicate_identity"}),
        (0, None, "unhealthy", {"rollout_duplicate_identity"}),
        (1, None, "healthy", set()),
        (0, 1, "healthy", set()),  # another stage of the same repeat is another rollout
    ]
    assert result.rollouts[0].findings[0].detail == {"duplicate_count": 2}
    assert result.summary["run"]["issues"]["rollout_duplicate_identity"] == 2
    rows = [json.loads(line) for line in (tmp_path / "rollout_verdicts.jsonl").read_text().splitlines()]
    assert [row.get("stage_index") for row in rows] == [1, None, None, None]  # by task, repeat, then stage
    ignored = _check(tmp_path, _row(0, 0, clean), _row(0, 0, clean), ignored_checks=["rollout_duplicate_identity"])
    assert [d.verdict for d in ignored.rollouts] == ["healthy", "healthy"]


def test_a_task_is_consistently_unhealthy_when_every_judged_repeat_is(tmp_path: Path) -> None:
    hollow = {"turns": [_turn(1, answer=[], refs=("a",))], "model_calls": [_call("a")]}
    clean = {"turns": [_turn(1, refs=("a",))], "model_calls": [_call("a")]}
    rows = [_row(0, 0, hollow), _row(0, 1, hollow), _row(0, 2, None), _row(1, 0, hollow), _row(1, 1, clean)]
    result = _check(tmp_path, *rows, _row(2, 0, hollow))
    tasks = result.summary["tasks"]
    assert tasks["0"]["flags"] == ["task_consistently_unhealthy"]  # the unobserved repeat is left out
    assert (tasks["0"]["unhealthy"], tasks["0"]["unobserved"]) == (2, 1)
    assert tasks["1"]["flags"] == [] and tasks["2"]["flags"] == []  # one repeat is not a pattern
    coverage = result.summary["run"]["artifacts"]["coverage"]["task_consistently_unhealthy"]
    assert coverage == {"evaluated": 2, "unobserved": 1, "ignored": 0}
    assert result.summary["run"]["issues"]["task_consistently_unhealthy"] == 1


def test_blocks_keep_every_lines_number_and_position_whatever_their_size(tmp_path: Path) -> None:
    first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    first.write_bytes(b"one\n\n  \n" + b"x" * 50 + b"\nlast")  # blank lines, a line longer than a block, no newline
    second.write_bytes(b"two\n")
    expected = [(1, 0, b"one"), (4, 1, b"x" * 50), (5, 2, b"last"), (1, 3, b"two")]
    for size in (1, 7, 1 << 20):
        assert [row for block in lines.blocks([first, second], size) for row in block.rows()] == expected


def test_workers_and_blocks_give_the_serial_verdicts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    clean = {"turns": [_turn(1, refs=("a",))], "model_calls": [_call("a")]}
    hollow = {"turns": [_turn(1, answer=[], refs=("a",))], "model_calls": [_call("a")]}
    rows = [_row(task, 0, hollow if task % 3 == 0 else clean) for task in range(12)]
    serial = _check(tmp_path, *rows)
    monkeypatch.setattr(lines, "BLOCK_BYTES", 512)  # a few rows per block, so several blocks go to the workers
    pooled = run_health_checks(tmp_path / "rollouts.jsonl", workers=2)
    assert [d.model_dump() for d in pooled.rollouts] == [d.model_dump() for d in serial.rollouts]
    assert pooled.summary == serial.summary


def test_a_trajectory_whose_values_need_coercing_is_read_as_the_model_spells_it(tmp_path: Path) -> None:
    call = _call("a") | {"response_metadata": {"response_id": "resp-a", "model_ref": MODEL, "status_code": "503"}}
    [digest] = _check(tmp_path, _row(0, 0, {"turns": [_turn(1, refs=("a",))], "model_calls": [call]})).rollouts
    [failed] = [f for f in digest.findings if f.check == "model_call_failed"]
    assert failed.detail["status"] == 503  # not strictly valid: validated leniently, then the dumped value is read
