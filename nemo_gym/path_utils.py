"""Where a rollout run's side files go, under NeMo Gym's name ``nemo_gym.path_utils``."""

from __future__ import annotations

from pathlib import Path

__all__ = ["failures_path_for"]


def failures_path_for(output_fpath: str | Path) -> Path:
    """``<stem>_failures.jsonl`` next to a rollouts file: the rollouts that failed (HTTP errors, timeouts, judge
    failures), kept out of the metrics and retried on resume. The name is the collector's own."""
    # Imported here: the collector brings the HTTP client, which a caller that only wants a path does not need.
    from nemo_gym.rollouts.collector import failures_path

    return failures_path(Path(output_fpath))
