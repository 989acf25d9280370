"""Failed rollouts counted as zeros in the metrics (NeMo Gym 0.7's ``count_failure_classes_as_zero``).

A failed rollout is never a reward of 0 in the rollouts file: that is the failure contract, so a trainer never learns
from an outage. An evaluation can still want failures in the denominator, so that a policy whose answers crash its
agent scores lower rather than higher. It names the failure classes to count; for every rollout that never succeeded,
the last recorded attempt of such a class becomes a zero in the rows the metrics are computed from. Nothing on disk
changes: the failures file keeps the failure, the rollouts file stays without it.

A name matches a failure record's ``_ng_failure_class`` (``verify_failed``, ``judge_failed``, ...) or its
``failure_kind`` (``agent_run_error``, ``verifier_error``, ...), so a NeMo Gym 0.7 setting keeps its meaning here.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from pathlib import Path
from typing import Any

from nemo_gym.jsonl import iter_jsonl
from nemo_gym.row_fields import FAILURE_CLASS_KEY, FAILURE_KIND_KEY, ROLLOUT_INDEX_KEY, TASK_INDEX_KEY

_DIAGNOSTIC_KEYS = frozenset({FAILURE_KIND_KEY, "failure_reason"})

Key = tuple[Any, Any]


def latest_failures(paths: Iterable[Path]) -> dict[Key, dict[str, Any]]:
    """The last recorded attempt of each failed rollout in these failures files (missing files hold none)."""
    latest: dict[Key, dict[str, Any]] = {}
    for path in paths:
        if path.exists():
            for _, row in iter_jsonl(path):
                latest[(row.get(TASK_INDEX_KEY), row.get(ROLLOUT_INDEX_KEY))] = row
    return latest


def matches(record: dict[str, Any], classes: Collection[str]) -> bool:
    """Whether a failure record is of one of ``classes``, by its class or by its kind."""
    return record.get(FAILURE_CLASS_KEY) in classes or record.get(FAILURE_KIND_KEY) in classes


def zero_for_metrics(record: dict[str, Any]) -> dict[str, Any]:
    """The metrics' copy of a counted failure: its row without the diagnostics (a status code is a number, and the
    metrics average every number they get), reward 0 unless the record holds one, and not masked."""
    row = {k: v for k, v in record.items() if not k.startswith("_ng_failure_") and k not in _DIAGNOSTIC_KEYS}
    row["mask_sample"] = False
    if not isinstance(row.get("reward"), (int, float)):
        row["reward"] = 0.0
    return row


def counted_as_zero(
    failures_paths: Iterable[Path], classes: Collection[str], succeeded: Collection[Key]
) -> list[dict[str, Any]]:
    """The zeros to add to the metrics' rows: one per failed rollout of ``classes`` in these failures files that has
    not ``succeeded``, in (task, rollout) order. Without ``classes`` nothing is read."""
    if not classes:
        return []
    failures = latest_failures(failures_paths)
    picked = [(key, row) for key, row in failures.items() if key not in succeeded and matches(row, classes)]
    return [zero_for_metrics(row) for _, row in sorted(picked, key=_order)]


def _order(item: tuple[Key, dict[str, Any]]) -> tuple[int, int]:
    task, rollout = item[0]
    return int(task or 0), int(rollout or 0)
