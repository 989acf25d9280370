"""Two runs of the same inputs, task by task: mean reward before and after, and which tasks flipped.

A task *passes* in a run when its mean reward is at least :data:`PASS_AT` (for 0/1 rewards: most rollouts solved
it); it *flipped* when it passes in one run and not the other. Tasks are matched by ``_ng_task_index``, which
``gym eval run`` gives the same value for the same input row; :func:`differing_inputs` checks that the matched tasks
really were asked the same thing.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from nemo_gym.viewer.runs import Run

PASS_AT = 0.5


@dataclass(frozen=True)
class TaskDelta:
    task: int
    before: float | None
    after: float | None
    rollouts_before: int
    rollouts_after: int

    @property
    def change(self) -> str:
        """``fixed``, ``broken``, ``same`` or ``missing`` (the task is in one run only)."""
        if self.before is None or self.after is None:
            return "missing"
        was, now = self.before >= PASS_AT, self.after >= PASS_AT
        if was == now:
            return "same"
        return "fixed" if now else "broken"

    @property
    def delta(self) -> float | None:
        return None if self.before is None or self.after is None else self.after - self.before


def compare(before: Run, after: Run) -> list[TaskDelta]:
    """One entry per task found in either run, flipped tasks first, then by task index."""
    a, b = before.task_rewards(), after.task_rewards()
    deltas = [
        TaskDelta(
            task,
            statistics.fmean(a[task]) if task in a else None,
            statistics.fmean(b[task]) if task in b else None,
            len(a.get(task, ())),
            len(b.get(task, ())),
        )
        for task in sorted(set(a) | set(b))
    ]
    order = {"fixed": 0, "broken": 0, "missing": 1, "same": 2}
    return sorted(deltas, key=lambda d: (order[d.change], d.task))


def rollouts_of_task(run: Run, task: int) -> list[int]:
    """The rows of ``run``'s rollouts file that belong to ``task``, in rollout order."""
    index = run.rollouts
    rows = [i for i in range(len(index)) if index.task[i] == task]
    return sorted(rows, key=lambda i: index.rollout[i])


INPUT_CHECK_TASKS = 50
"""How many matched tasks :func:`differing_inputs` reads (two rows each), so the check stays cheap on any file."""


def differing_inputs(before: Run, after: Run, deltas: list[TaskDelta]) -> list[int]:
    """Tasks, among the first :data:`INPUT_CHECK_TASKS` found in both runs, whose input messages differ: a sign that
    the two files are not runs of the same inputs (sampling settings may differ; the messages may not)."""
    differing = []
    matched = [d.task for d in deltas if d.before is not None and d.after is not None][:INPUT_CHECK_TASKS]
    for task in matched:
        first_before, first_after = rollouts_of_task(before, task)[:1], rollouts_of_task(after, task)[:1]
        if first_before and first_after:
            if _input_of(before.rollouts.row(first_before[0])) != _input_of(after.rollouts.row(first_after[0])):
                differing.append(task)
    return differing


def _input_of(row: dict[str, Any]) -> Any:
    params = row.get("responses_create_params")
    return params.get("input") if isinstance(params, dict) else None
