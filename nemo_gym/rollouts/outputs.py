"""The files of one run, named after its output ``<stem>.jsonl``, and what a later ``--resume`` reads back from them.

Kept apart from the collector so that claiming an output and checking the inputs (which come before any rollout)
load nothing of the HTTP machinery that only the rollouts need.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import orjson

from nemo_gym.errors import ConfigError
from nemo_gym.jsonl import BadLineError


def failures_path(output_path: Path) -> Path:
    return output_path.with_name(f"{output_path.stem}_failures.jsonl")


def materialized_inputs_path(output_path: Path) -> Path:
    return output_path.with_name(f"{output_path.stem}_materialized_inputs.jsonl")


def manifest_path(output_path: Path) -> Path:
    return output_path.with_name(f"{output_path.stem}_run.json")


def aggregate_metrics_path(output_path: Path) -> Path:
    return output_path.with_name(f"{output_path.stem}_aggregate_metrics.json")


def recorded_fingerprint(output_path: Path) -> str | None:
    """The fingerprint of the run that ``--resume`` would continue ("" if unreadable), or None if there is none."""
    manifest = manifest_path(output_path)
    if not (output_path.exists() and manifest.exists()):
        return None
    try:
        return str(orjson.loads(manifest.read_bytes()).get("fingerprint") or "")
    except (orjson.JSONDecodeError, AttributeError):
        return ""


@contextmanager
def damaged_line_hint() -> Iterator[None]:
    """Reading an earlier run's results back for ``--resume``: a damaged line is told with what to do about it."""
    try:
        yield
    except BadLineError as e:
        raise ConfigError(
            f"cannot resume: {e}. Delete line {e.line} of {e.path.name} (that rollout runs again), or start over "
            "with --overwrite"
        ) from e
