"""Comparing two runs task by task: flips, and a warning when the files were not runs of the same inputs."""

from __future__ import annotations

from pathlib import Path

from nemo_gym.viewer.compare import compare, differing_inputs
from nemo_gym.viewer.runs import open_runs
from tests.viewer import rows


def _runs(before: Path, after: Path):  # type: ignore[no-untyped-def]
    runs = open_runs([before, after])
    for run in runs:
        run.refresh()
    return runs


def test_runs_of_the_same_inputs_compare_without_a_warning(tmp_path: Path) -> None:
    before = rows.run_files(tmp_path / "a", "before", {0: 1.0, 1: 0.0})
    after = rows.run_files(tmp_path / "b", "after", {0: 0.0, 1: 1.0})
    a, b = _runs(before, after)
    deltas = compare(a, b)
    assert [(d.task, d.change) for d in deltas] == [(0, "broken"), (1, "fixed")]
    assert differing_inputs(a, b, deltas) == []


def test_a_task_asked_something_else_in_the_other_run_is_named(tmp_path: Path) -> None:
    before = rows.run_files(tmp_path / "a", "before", {0: 1.0, 1: 0.0})
    changed = rows.rollout(1, 0, 1.0, "It is cold.")
    changed["responses_create_params"]["input"][-1]["content"] = "What is the weather on Mars?"
    (tmp_path / "b").mkdir()
    after = rows.write(tmp_path / "b" / "after.jsonl", [rows.rollout(0, 0, 1.0, "It is cold."), changed])
    a, b = _runs(before, after)
    assert differing_inputs(a, b, compare(a, b)) == [1]
