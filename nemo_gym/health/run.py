"""Run the health checks over rollout files: one digest per rollout (map), task checks over repeats (reduce), and
two reports beside the rollouts: ``quality_summary.json`` and ``rollout_verdicts.jsonl``.

Verdicts: a rollout with any finding is ``unhealthy``; one without findings where some check could not look (its
evidence absent or incomplete) is ``unobserved``; otherwise ``healthy``. An absent trajectory never reads as healthy.
"""

from __future__ import annotations

import os
import warnings
from collections import Counter, defaultdict, deque
from collections.abc import Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any, Literal

import orjson
from pydantic import BaseModel, Field

from nemo_gym.health.checks import (
    CALL_GAPS,
    CHECK_REGISTRY,
    CONTRADICTIONS,
    LENGTH_STOPS,
    ROLLOUT_CHECKS,
    CheckSpec,
    Evidence,
    Finding,
    canonical_trajectory,
    count,
    ended_on_failure,
    has_gap,
    is_failed,
    is_successful,
    normalize_ignored_checks,
    subject_of,
    transcript_tokens,
)
from nemo_gym.health.lines import BLOCK_BYTES, Block, blocks
from nemo_gym.row_fields import ROLLOUT_ID_KEY, ROLLOUT_INDEX_KEY, TASK_INDEX_KEY

__all__ = ["HealthCheckResult", "RolloutDigest", "run_health_checks"]

QUALITY_SUMMARY_FILENAME = "quality_summary.json"
ROLLOUT_VERDICTS_FILENAME = "rollout_verdicts.jsonl"
Verdict = Literal["healthy", "unhealthy", "unobserved"]
_ROLLOUT_SPECS = tuple(spec for spec in CHECK_REGISTRY if spec.scope == "rollout")
_TASK_SPECS = tuple(spec for spec in CHECK_REGISTRY if spec.scope == "task")


class RolloutDigest(BaseModel):
    """One rollout's verdict, findings, the checks that could not look, and the call counts the reduce needs."""

    task_index: int | str
    rollout_index: int | str
    stage_index: int | str | None = None
    rollout_id: str
    verdict: Verdict
    findings: list[Finding]
    unobserved: list[str]
    capture_observed: bool
    policy_calls_observed: bool = False
    model_calls: int = 0
    successful_model_calls: int = 0
    model_call_errors: int = 0
    ended_on_error: bool = False
    errors_by_status: dict[str, int] = Field(default_factory=dict)
    transcript_prompt_tokens: int = 0
    transcript_completion_tokens: int = 0
    capture_prompt_tokens: int = 0
    capture_completion_tokens: int = 0


class HealthCheckResult(BaseModel):
    summary: dict[str, Any]
    rollouts: list[RolloutDigest]
    summary_path: Path
    verdicts_path: Path


def _why_unobserved(spec: CheckSpec, evidence: Evidence, observed: dict[str, bool]) -> bool:
    """Whether ``spec`` cannot look at this rollout: evidence it needs is absent, incomplete or empty."""
    needs = spec.needs
    if "trajectory" in needs and not observed["trajectory"]:
        return True
    if "turns" in needs and not observed["turns"]:
        return True
    if "calls" in needs:
        return not (observed["calls"] and evidence.calls)
    bindings = (
        evidence.owned_calls if "owned_calls" in needs else evidence.turn_calls if "turn_calls" in needs else None
    )
    if bindings is None:
        return False
    if not observed["calls"]:
        return True
    if spec.id == "trajectory_capture_mismatch":
        return not (bindings.observed or has_gap(evidence.trajectory, CONTRADICTIONS))
    if not bindings.matched:
        return True
    if spec.id == "rollout_token_count_mismatch":
        counted = all(c.get("tokens_in") is not None and c.get("tokens_out") is not None for c in bindings.matched)
        usage = transcript_tokens(evidence.record)[2]
        return not (observed["turn_scope"] and bindings.complete and counted and usage)
    if spec.id == "model_call_runaway_generation":  # a cut-off call without its response cannot be judged
        return any(c.get("finish_reason") in LENGTH_STOPS and c.get("response") is None for c in bindings.matched)
    return False


def _digest(
    record: dict[str, Any], parse_error: str | None, where: tuple[str, int, int], ignored: frozenset[str]
) -> RolloutDigest:
    """Map one row (or its parse error) to its digest. ``where``: file, line number, position across the files."""
    path, line, ordinal = where
    task_index = record.get(TASK_INDEX_KEY, f"__unreadable_record__:{path}:{line}" if parse_error else ordinal)
    rollout_index = record.get(ROLLOUT_INDEX_KEY, 0)
    raw = record.get("ng_trajectory")
    rollout_id = str(
        record.get(ROLLOUT_ID_KEY)
        or (raw.get("rollout_id") if isinstance(raw, dict) else None)
        or f"{task_index}-{rollout_index}"
    )
    subject = subject_of(task_index, rollout_index)
    trajectory, trajectory_error = (None, None) if parse_error else canonical_trajectory(record)
    evidence = Evidence.of(record, subject, trajectory)
    seen = trajectory is not None and not has_gap(trajectory, ["trajectory_projection_failed"])
    observed = {
        "trajectory": seen,
        "turns": seen and not has_gap(evidence.trajectory, ["turns_unavailable"]),
        "turn_scope": seen and not has_gap(evidence.trajectory, ["turn_model_call_scope_incomplete"]),
        "calls": seen and not has_gap(evidence.trajectory, CALL_GAPS),
    }
    calls = evidence.calls if seen else []
    findings: list[Finding] = []
    unobserved: list[str] = []
    for spec in _ROLLOUT_SPECS:
        if spec.id in ignored:
            continue
        if spec.id == "record_unreadable" and (parse_error or trajectory_error):
            reason = "rollout record is unreadable" if parse_error else "canonical trajectory is unreadable"
            locator: dict[str, int | str] | None = {"source_file": path, "line": line} if parse_error else None
            findings.append(
                Finding(
                    check=spec.id,
                    subject=subject,
                    locator=locator,
                    detail={"reason": reason, "error": parse_error or trajectory_error},
                )
            )
            continue
        if parse_error or _why_unobserved(spec, evidence, observed):
            unobserved.append(spec.id)
            continue
        try:
            findings.extend(ROLLOUT_CHECKS[spec.id](evidence))
        except Exception as error:
            unobserved.append(spec.id)
            if "check_execution_error" not in ignored:
                detail = {
                    "reason": "check raised an unexpected exception",
                    "failed_check": spec.id,
                    "error": type(error).__name__,
                }
                findings.append(Finding(check="check_execution_error", subject=subject, detail=detail))
    failed = [call for call in calls if is_failed(call)]
    prompt, completion, _ = transcript_tokens(record)
    return RolloutDigest.model_construct(  # every value below has its field's type: validating would only cost
        task_index=task_index,
        rollout_index=rollout_index,
        stage_index=record.get("stage_index"),
        rollout_id=rollout_id,
        verdict="unhealthy" if findings else "unobserved" if unobserved else "healthy",
        findings=findings,
        unobserved=unobserved,
        capture_observed=bool(calls),
        policy_calls_observed=observed["turn_scope"] and evidence.turn_calls.complete,
        model_calls=len(calls),
        successful_model_calls=sum(is_successful(call) for call in evidence.turn_calls.matched),
        model_call_errors=len(failed),
        ended_on_error=ended_on_failure(calls),
        errors_by_status=dict(Counter(str(call.get("status_code") or "unknown") for call in failed)),
        transcript_prompt_tokens=prompt,
        transcript_completion_tokens=completion,
        capture_prompt_tokens=sum(count(call, "tokens_in") for call in calls),
        capture_completion_tokens=sum(count(call, "tokens_out") for call in calls),
    )


def _check_block(block: Block, ignored: frozenset[str]) -> list[RolloutDigest]:
    """Digest each row of a block of lines (runs in a worker process: a block is plain bytes and numbers)."""
    digests = []
    for line, position, text in block.rows():
        try:
            record = orjson.loads(text)
            if not isinstance(record, dict):
                raise ValueError("a rollout line must be a JSON object")
            parse_error = None
        except Exception as error:
            record, parse_error = {}, type(error).__name__
        digests.append(_digest(record, parse_error, (block.path, line, position), ignored))
    return digests


def _map(paths: Sequence[Path], ignored: frozenset[str], workers: int) -> list[RolloutDigest]:
    """Every row's digest, in file order; with ``workers`` > 1 a few blocks at a time in flight (bounded memory)."""
    if workers == 1:
        return [digest for block in blocks(paths) for digest in _check_block(block, ignored)]
    digests: list[RolloutDigest] = []
    try:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            pending: deque[Future[list[RolloutDigest]]] = deque()
            for block in blocks(paths):
                pending.append(pool.submit(_check_block, block, ignored))
                if len(pending) >= 2 * workers:
                    digests.extend(pending.popleft().result())
            while pending:
                digests.extend(pending.popleft().result())
        return digests
    except (BrokenProcessPool, NotImplementedError, OSError) as error:
        warnings.warn(f"rollout health: no process pool ({error}); checking serially", RuntimeWarning, stacklevel=3)
        return _map(paths, ignored, 1)


def _mark_duplicates(digests: list[RolloutDigest], ignored: frozenset[str]) -> None:
    """``rollout_duplicate_identity``: rows that claim the same (stage, task, repeat) are each unhealthy."""
    if "rollout_duplicate_identity" in ignored:
        return
    copies: dict[tuple[Any, Any, Any], list[RolloutDigest]] = defaultdict(list)
    for digest in digests:
        copies[(digest.stage_index, digest.task_index, digest.rollout_index)].append(digest)
    for same in copies.values():
        for digest in same if len(same) > 1 else ():
            detail = {"duplicate_count": len(same)}
            subject = subject_of(digest.task_index, digest.rollout_index)
            digest.findings.append(Finding(check="rollout_duplicate_identity", subject=subject, detail=detail))
            digest.verdict = "unhealthy"


def _repeat_verdicts(copies: list[RolloutDigest]) -> dict[Any, Verdict]:
    """One verdict per repeat of a task; copies of one repeat that disagree leave that repeat unobserved."""
    seen: dict[Any, set[Verdict]] = defaultdict(set)
    for copy in copies:
        seen[copy.rollout_index].add(copy.verdict)
    return {repeat: next(iter(v)) if len(v) == 1 else "unobserved" for repeat, v in seen.items()}


def _task_findings(
    by_task: dict[Any, list[RolloutDigest]], ignored: frozenset[str]
) -> tuple[dict[Any, list[Finding]], dict[str, dict[str, int]]]:
    """``task_consistently_unhealthy``: at least two repeats could be judged and every one is unhealthy.
    ``task_no_successful_model_calls``: every repeat's policy calls seen, and none succeeded."""
    coverage = {spec.id: {"evaluated": 0, "unobserved": 0, "ignored": 0} for spec in _TASK_SPECS}
    findings: dict[Any, list[Finding]] = defaultdict(list)
    for task, copies in by_task.items():
        verdicts = _repeat_verdicts(copies)
        judged = [verdict for verdict in verdicts.values() if verdict != "unobserved"]
        unhealthy = "task_consistently_unhealthy"
        if unhealthy in ignored:
            coverage[unhealthy]["ignored"] += 1
        elif len(judged) < 2:
            coverage[unhealthy]["unobserved"] += 1
        else:
            coverage[unhealthy]["evaluated"] += 1
            if all(verdict == "unhealthy" for verdict in judged):
                detail = {"computable_repeats": len(judged)}
                findings[task].append(Finding(check=unhealthy, subject=subject_of(task), detail=detail))
        no_success = "task_no_successful_model_calls"
        if no_success in ignored:
            coverage[no_success]["ignored"] += 1
        elif not all(copy.policy_calls_observed for copy in copies):
            coverage[no_success]["unobserved"] += 1
        else:
            coverage[no_success]["evaluated"] += 1
            if not any(copy.successful_model_calls for copy in copies):
                detail = {"repeats": len(verdicts)}
                findings[task].append(Finding(check=no_success, subject=subject_of(task), detail=detail))
    return findings, coverage


def _summary(digests: list[RolloutDigest], ignored: frozenset[str]) -> dict[str, Any]:
    by_task: dict[Any, list[RolloutDigest]] = defaultdict(list)
    for digest in digests:
        by_task[digest.task_index].append(digest)
    task_findings, task_coverage = _task_findings(by_task, ignored)
    coverage = {spec.id: {"evaluated": 0, "unobserved": 0, "ignored": 0} for spec in CHECK_REGISTRY}
    for digest in digests:
        for spec in _ROLLOUT_SPECS:
            state = "ignored" if spec.id in ignored else "unobserved" if spec.id in digest.unobserved else "evaluated"
            coverage[spec.id][state] += 1
    coverage.update(task_coverage)
    issues = Counter(finding.check for digest in digests for finding in digest.findings)
    issues.update(finding.check for found in task_findings.values() for finding in found)
    verdicts = Counter(digest.verdict for digest in digests)
    statuses: Counter[str] = Counter()
    for digest in digests:
        statuses.update(digest.errors_by_status)
    tasks = {}
    for task in sorted(by_task, key=lambda value: (isinstance(value, str), str(value))):
        repeat_verdicts = Counter(_repeat_verdicts(by_task[task]).values())
        tasks[str(task)] = {
            "repeats": sum(repeat_verdicts.values()),
            **{verdict: repeat_verdicts[verdict] for verdict in ("healthy", "unhealthy", "unobserved")},
            "flags": [finding.check for finding in task_findings.get(task, [])],
        }
    return {
        "run": {
            "ignored_checks": sorted(ignored),
            "artifacts": {
                "records": len(digests),
                "captures": sum(d.capture_observed for d in digests),
                "coverage": coverage,
            },
            "verdicts": {verdict: verdicts[verdict] for verdict in ("healthy", "unhealthy", "unobserved")},
            "issues": {spec.id: issues[spec.id] for spec in CHECK_REGISTRY},
            "stats": {
                "model_call_errors": {
                    "total": sum(d.model_call_errors for d in digests),
                    "by_status": dict(sorted(statuses.items())),
                    "rollouts_affected": sum(bool(d.model_call_errors) for d in digests),
                    "ended_on_error": sum(d.ended_on_error for d in digests),
                },
                "tokens": {key: sum(getattr(d, field) for d in digests) for key, field in _TOKEN_TOTALS.items()},
            },
        },
        "tasks": tasks,
    }


_TOKEN_TOTALS = {
    "prompt": "transcript_prompt_tokens",
    "completion": "transcript_completion_tokens",
    "capture_prompt": "capture_prompt_tokens",
    "capture_completion": "capture_completion_tokens",
}
"""Summary key under ``tokens`` -> the ``RolloutDigest`` count it totals."""


def _write(summary: dict[str, Any], digests: list[RolloutDigest], directory: Path) -> tuple[Path, Path]:
    directory.mkdir(parents=True, exist_ok=True)
    summary_path, verdicts_path = directory / QUALITY_SUMMARY_FILENAME, directory / ROLLOUT_VERDICTS_FILENAME
    summary_path.write_bytes(orjson.dumps(summary, option=orjson.OPT_INDENT_2))
    with verdicts_path.open("wb") as out:
        for digest in sorted(digests, key=_order):
            row = {
                TASK_INDEX_KEY: digest.task_index,
                ROLLOUT_INDEX_KEY: digest.rollout_index,
                "rollout_id": digest.rollout_id,
                "verdict": digest.verdict,
                "findings": [
                    f.model_dump(mode="json", exclude={"subject"}, exclude_none=True) for f in digest.findings
                ],
                "unobserved": digest.unobserved,
            }
            if digest.stage_index is not None:
                row["stage_index"] = digest.stage_index
            out.write(orjson.dumps(row, option=orjson.OPT_APPEND_NEWLINE))
    return summary_path, verdicts_path


def _order(digest: RolloutDigest) -> tuple[tuple[int, Any], ...]:
    """Verdict rows by task, rollout index, then stage; integer indexes before any other value."""
    keys = (digest.task_index, digest.rollout_index, digest.stage_index)
    return tuple((0, v) if isinstance(v, int) else (1, str(v)) for v in keys)


SERIAL_BELOW_BYTES = 16 * BLOCK_BYTES
"""Below this many bytes of rollouts (64 MiB) the checks run in this process: starting worker processes costs more
than they save. Measured at 03:07 on the 2-core box: 5,000 captured rows (64 MiB) 1.4-1.7 s serially and 1.4-2.5 s
with two workers; 10,000 rows without trajectories (32 MB) 0.9 s serially, 1.75 s with two workers."""


def default_workers(rollout_bytes: int) -> int:
    """Worker processes for ``rollout_bytes`` of rollout files when none are asked for: one below
    :data:`SERIAL_BELOW_BYTES`, else a process per CPU, at most 8."""
    return 1 if rollout_bytes < SERIAL_BELOW_BYTES else min(os.cpu_count() or 1, 8)


def run_health_checks(
    rollout_paths: Path | Sequence[Path],
    *,
    output_dir: Path | None = None,
    workers: int | None = None,
    ignored_checks: Sequence[str] = (),
) -> HealthCheckResult:
    """Check every rollout of the given JSONL files and write both reports (to ``output_dir``, else beside the first
    file). ``workers``: processes for the per-rollout map (default: :func:`default_workers`)."""
    given: Sequence[str | Path] = [rollout_paths] if isinstance(rollout_paths, (str, Path)) else rollout_paths
    ignored = frozenset(normalize_ignored_checks(ignored_checks))
    paths = [Path(path) for path in given]
    if not paths:
        raise ValueError("run_health_checks needs at least one rollout JSONL file")
    for path in paths:
        if not path.is_file():
            raise FileNotFoundError(f"rollout JSONL not found: {path}")
    count_workers = workers if workers is not None else default_workers(sum(path.stat().st_size for path in paths))
    if count_workers < 1:
        raise ValueError("workers must be at least 1")
    digests = _map(paths, ignored, count_workers)
    _mark_duplicates(digests, ignored)
    summary = _summary(digests, ignored)
    summary["run"]["rollouts_files"] = [path.name for path in paths]  # which run the reports are of (the viewer asks)
    summary_path, verdicts_path = _write(summary, digests, output_dir or paths[0].parent)
    return HealthCheckResult(summary=summary, rollouts=digests, summary_path=summary_path, verdicts_path=verdicts_path)
