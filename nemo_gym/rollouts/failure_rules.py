"""What a finished or failed rollout row means to a later run: terminal or worth retrying, how long it took, whether a
collection that required every rollout got them, and the repair of rows older builds wrote in the wrong file.

These are the rules NeMo Gym 0.7's custom collection drivers (GDPVal's multi-stage run, say) apply to the rollouts
and failures files themselves, outside :class:`~nemo_gym.rollouts.collector.RolloutCollector`; they read rows only, so
they load none of the HTTP machinery. The attempt cap they count against is the collector's
(:func:`~nemo_gym.rollouts.collector.default_max_attempts`).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson
from pydantic import Field

from nemo_gym.rollouts.config import RolloutCollectionConfig
from nemo_gym.rollouts.outputs import failures_path
from nemo_gym.row_fields import (
    ATTEMPT_INDEX_KEY,
    FAILURE_CLASS_KEY,
    FAILURE_TERMINAL_KEY,
    NO_PERSIST_KEY,
    ROLLOUT_INDEX_KEY,
    TASK_INDEX_KEY,
)

__all__ = [
    "ELAPSED_KEY",
    "JUDGE_INVALID",
    "SharedRolloutCollectionConfig",
    "is_terminal_failure",
    "migrate_invalid_judge_main_rows",
    "observed_elapsed",
]

ELAPSED_KEY = "elapsed_seconds"
"""Where an agent reports a rollout's wall time: on the row, or in its response's ``metadata``."""
JUDGE_INVALID = "judge_invalid"
"""The failure class of a row whose judge answered something unreadable (``invalid_judge_response``)."""
MIGRATED_MARK = "_ng_migrated_invalid_judge_response"

_RETRIED_TIMEOUT = "timeout_exceeded"
"""A per-task timeout: it reflects how loaded that attempt was, not the task, so it stays retryable."""
_REPAIRABLE_FAULTS = frozenset({"reference_missing", "eval_missing", "transport_ineligible"})
"""Environment faults (a missing file the task needs) that can be fixed between runs: checked again on resume."""
_UNUSABLE = "skipped"
"""A sample that cannot be run at all, whichever build wrote the row."""


def is_terminal_failure(record: Mapping[str, Any], *, retry_terminal_timeouts: bool = False) -> bool:
    """Whether a failure row must not be run again on resume.

    By default that is the row's own ``_ng_failure_terminal`` flag. ``retry_terminal_timeouts`` is the opt-in of
    environments whose older agents flagged every timeout terminal: then a timeout and a repairable environment fault
    are retried anyway (still within the attempt cap), a ``skipped`` sample never is, and anything else keeps its flag.
    """
    if retry_terminal_timeouts:
        failure_class = record.get(FAILURE_CLASS_KEY)
        if failure_class == _RETRIED_TIMEOUT or failure_class in _REPAIRABLE_FAULTS:
            return False
        if failure_class == _UNUSABLE:
            return True
    return bool(record.get(FAILURE_TERMINAL_KEY))


def observed_elapsed(record: Mapping[str, Any]) -> float | None:
    """A rollout's wall time in seconds, as its row or its response's metadata reports it; None when neither gives a
    positive number."""
    response = record.get("response")
    metadata = response.get("metadata") if isinstance(response, Mapping) else None
    for value in (record.get(ELAPSED_KEY), metadata.get(ELAPSED_KEY) if isinstance(metadata, Mapping) else None):
        try:
            seconds = float(value) if value is not None else 0.0
        except (TypeError, ValueError):
            continue
        if seconds > 0:
            return seconds
    return None


def _migration_key(row: Mapping[str, Any]) -> tuple[int, Any, Any, int]:
    return (
        int(row.get("stage_index") or 0),
        row.get(TASK_INDEX_KEY),
        row.get(ROLLOUT_INDEX_KEY),
        int(row.get(ATTEMPT_INDEX_KEY) or 0),
    )


def _has_reusable_deliverable(directory: Any) -> bool:
    from nemo_gym.deliverables import is_deliverable

    try:
        return bool(directory) and any(is_deliverable(path) for path in Path(directory).iterdir())
    except (OSError, TypeError):
        return False


def _rows(path: Path) -> list[tuple[bytes, dict[str, Any]]]:
    rows = []
    with path.open("rb") as handle:
        for line in handle:
            if line.strip():
                rows.append((line.strip(), orjson.loads(line)))
    return rows


def migrate_invalid_judge_main_rows(output_fpath: Path) -> int:
    """Move rows with ``invalid_judge_response`` from the rollouts file to its failures sidecar; the count found.

    Older builds stored such a row as a scored 0, which both lowered the score and kept resume from asking the judge
    again. Each moved row gets the failure class ``judge_invalid`` (its terminal flag dropped, so resume retries it),
    ``reuse_cached_deliverable`` when its ``deliverables_dir`` still holds work, and a marker that keeps a second
    migration from appending it twice. The sidecar is made durable before the rollouts file is replaced (atomically,
    mode kept), so a crash in between loses nothing. Only for environments that opted in to retrying invalid judge
    answers: elsewhere a zero for an unreadable judge answer is the intended score.
    """
    output_fpath = Path(output_fpath)
    if not output_fpath.exists():
        return 0
    rows = _rows(output_fpath)
    invalid = sum(1 for _, row in rows if row.get("invalid_judge_response"))
    if not invalid:
        return 0
    sidecar = failures_path(output_fpath)
    done = {_migration_key(row) for _, row in _rows(sidecar) if row.get(MIGRATED_MARK)} if sidecar.exists() else set()
    handle, temporary = tempfile.mkstemp(dir=output_fpath.parent, prefix=f".{output_fpath.name}.migrate-")
    try:
        with os.fdopen(handle, "wb") as kept, sidecar.open("ab") as failures:
            for line, row in rows:
                if not row.get("invalid_judge_response"):
                    kept.write(line + b"\n")
                    continue
                key = _migration_key(row)
                if key in done:
                    continue
                done.add(key)
                moved = {k: v for k, v in row.items() if k not in (FAILURE_TERMINAL_KEY, "reuse_cached_deliverable")}
                moved[FAILURE_CLASS_KEY] = row.get(FAILURE_CLASS_KEY) or JUDGE_INVALID
                if _has_reusable_deliverable(row.get("deliverables_dir")):
                    moved["reuse_cached_deliverable"] = True
                moved[MIGRATED_MARK] = True
                failures.write(orjson.dumps(moved) + b"\n")
            failures.flush()
            os.fsync(failures.fileno())
            kept.flush()
            os.fsync(kept.fileno())
        os.chmod(temporary, output_fpath.stat().st_mode & 0o7777)
        os.replace(temporary, output_fpath)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return invalid


class SharedRolloutCollectionConfig(RolloutCollectionConfig):
    """NeMo Gym 0.7's collection settings shared by every way of collecting, with ``require_complete``: a submitted
    evaluation must fail, after its files are written, when any rollout it was meant to produce is missing."""

    require_complete: bool = Field(default=False, description="Fail the run when any rollout did not complete.")

    def check_completion(self, *, expected: int, results: list[dict[str, Any]]) -> None:
        """Raise ``RuntimeError`` when fewer than ``expected`` distinct rollouts succeeded (and completion is
        required); failure rows and rows kept out of the files do not count."""
        if not self.require_complete:
            return
        completed = {
            (row.get("stage_index"), row.get(TASK_INDEX_KEY), row.get(ROLLOUT_INDEX_KEY))
            for row in results
            if row.get(FAILURE_CLASS_KEY) is None and not row.get(NO_PERSIST_KEY)
        }
        if len(completed) < expected:
            raise RuntimeError(
                f"EVAL FAILED: {len(completed)}/{expected} samples completed. "
                f"Partial artifacts retained at {self.output_jsonl_fpath}."
            )
