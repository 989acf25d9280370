"""Two runs of the same inputs, task by task: mean reward before and after, and which tasks flipped.

A task *passes* in a run when its mean reward is at least :data:`PASS_AT` (for 0/1 rewards: most rollouts solved
it); it *flipped* when it passes in one run and not the other. Tasks are matched by ``_ng_task_index``, which
``gym eval run`` gives the same value for the same input row.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

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
