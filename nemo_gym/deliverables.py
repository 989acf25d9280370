"""Which files in an agent's output directory are its work (NeMo Gym 0.7's ``nemo_gym.deliverables``).

An agent harness keeps its own run state beside what it produced; a judge that grades the directory, and the agent's
file reader, must skip the same names, so both read them from here rather than keeping a copy each.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["IGNORE_FILES", "is_deliverable"]

IGNORE_FILES: frozenset[str] = frozenset(
    {
        # the harness's transcript and checkpoints
        "history.json",
        "history.pkl",
        "inprogress_history.json",
        # its final call, run metadata and log
        "finish_params.json",
        "metadata.json",
        "log.txt",
        # the task's inputs, copied in for the agent to read
        "reference_files",
    }
)
"""Names (files or directories) that are run state or task input, never something the agent delivered."""


def is_deliverable(path: Path) -> bool:
    """True for a regular file the agent produced: directories and the names in :data:`IGNORE_FILES` are not."""
    if path.name in IGNORE_FILES:
        return False
    return path.is_file()
