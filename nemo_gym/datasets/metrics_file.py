"""Metrics files kept beside datasets: compare with what is on disk, and write only when it is safe to.

A metrics file is a reviewed record of what a dataset contains. Recomputing it must not silently replace it: when the
new numbers differ from the file's, the new metrics go to ``<stem>_metrics_conflict.json`` beside it, the differences
are reported, and the file itself is left alone unless the caller asked to overwrite. Unchanged metrics are not
rewritten at all, so data in read-only directories can still be prepared.

Comparison rules: every key of the old file must still be there (new keys are fine, and so is a missing
tokenizer-dependent key, see :data:`~nemo_gym.datasets.statistics.OPTIONAL_KEYS`); numbers may differ by half a unit of
the rounding used when writing (5e-3 for magnitudes of 1 or more, 5e-4 below); lists are compared as multisets.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import orjson

from nemo_gym.datasets.statistics import OPTIONAL_KEYS
from nemo_gym.jsonl import write_json_atomic

MetricsStatus = Literal["created", "unchanged", "updated", "overwritten", "conflict"]


@dataclass
class MetricsFileResult:
    """What happened to one metrics file."""

    path: Path
    status: MetricsStatus
    differences: list[str] = field(default_factory=list)
    conflict_path: Path | None = None
    warning: str | None = None
    """Set when an allowed write failed (e.g. a read-only directory); the metrics were still compared."""


def metrics_path_for(jsonl_path: Path) -> Path:
    """``data/train.jsonl`` -> ``data/train_metrics.json``."""
    return jsonl_path.with_name(f"{jsonl_path.stem}_metrics.json")


def conflict_path_for(metrics_path: Path) -> Path:
    """``data/train_metrics.json`` -> ``data/train_metrics_conflict.json``."""
    return metrics_path.with_name(f"{metrics_path.stem}_conflict.json")


def _show(value: Any) -> str:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


def _numbers_match(old: float, new: float) -> bool:
    if math.isnan(old) or math.isnan(new):
        return math.isnan(old) and math.isnan(new)
    tolerance = 5e-3 if max(abs(old), abs(new)) >= 1 else 5e-4
    return abs(old - new) <= tolerance + 1e-12


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def compare_metrics(old: Any, new: Any, path: str = "") -> list[str]:
    """Human-readable differences between an existing metrics value and a new one (empty when they agree)."""
    where = path or "<root>"
    if isinstance(old, dict) and isinstance(new, dict):
        differences = []
        for key, old_value in old.items():
            child = f"{path}.{key}" if path else str(key)
            if key not in new:
                if key not in OPTIONAL_KEYS:
                    differences.append(f"{child}: no longer computed (was {_show(old_value)})")
                continue
            differences.extend(compare_metrics(old_value, new[key], child))
        return differences
    if isinstance(old, list) and isinstance(new, list):
        if Counter(_show(v) for v in old) != Counter(_show(v) for v in new):
            return [f"{where}: was {_show(old)}, now {_show(new)}"]
        return []
    if _is_number(old) and _is_number(new):
        return [] if _numbers_match(float(old), float(new)) else [f"{where}: was {_show(old)}, now {_show(new)}"]
    if old != new or type(old) is not type(new):
        return [f"{where}: was {_show(old)}, now {_show(new)}"]
    return []


def _has_new_keys(old: Any, new: Any) -> bool:
    if isinstance(old, dict) and isinstance(new, dict):
        return any(key not in old or _has_new_keys(old[key], value) for key, value in new.items())
    return False


def _try_write(path: Path, value: Any) -> str | None:
    try:
        write_json_atomic(path, value)
    except OSError as e:
        return f"could not write {path}: {e}"
    return None


def reconcile_metrics_file(path: Path, metrics: dict[str, Any], overwrite: bool = False) -> MetricsFileResult:
    """Write ``metrics`` to ``path`` unless an existing file disagrees (then write a conflict file instead)."""
    conflict_path = conflict_path_for(path)
    if not path.exists():
        write_json_atomic(path, metrics)
        _remove_stale(conflict_path)
        return MetricsFileResult(path, "created")
    try:
        old = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError) as e:
        differences = [f"the existing file cannot be read as JSON ({e})"]
    else:
        differences = compare_metrics(old, metrics)
    if differences and not overwrite:
        write_json_atomic(conflict_path, metrics)
        return MetricsFileResult(path, "conflict", differences, conflict_path)
    if differences:
        warning = _try_write(path, metrics)
        _remove_stale(conflict_path)
        return MetricsFileResult(path, "overwritten", differences, warning=warning)
    _remove_stale(conflict_path)
    if _has_new_keys(old, metrics):
        return MetricsFileResult(path, "updated", warning=_try_write(path, metrics))
    return MetricsFileResult(path, "unchanged")


def _remove_stale(conflict_path: Path) -> None:
    """A conflict file from an earlier run is obsolete once the metrics agree (or were overwritten)."""
    try:
        conflict_path.unlink(missing_ok=True)
    except OSError:
        pass
