"""Did a change help? A baseline run against a candidate run of the same tasks, with a confidence interval.

The numbers ``gym eval compare`` reports (and the viewer's compare page can show from the same code): each task's mean
reward on both sides and their difference, the mean difference with a 95% interval, pass@k of each side, and the tasks
that flipped between solved and unsolved.

Why a *paired bootstrap over tasks*: the task is the unit that varies between runs of the same inputs. Both runs see
the same tasks, so each task's difference removes how hard that task is (pairing); the repeats of one task share its
prompt and are not independent draws, so resampling rollouts would understate the spread. The interval is therefore
the percentile interval of the mean per-task difference over ``resamples`` resamples of the tasks with replacement,
from a fixed seed (the same inputs give the same interval). It makes no assumption about the shape of the
differences (rewards are often 0/1 with many ties), which an exact or t-based test of the mean would.

Failed rollouts carry no reward: they are counted per side and left out of every mean, as the metrics do; a task
with no scored rollout on one side cannot be paired and is left out of the differences (counted as well).
"""

from __future__ import annotations

import re
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

from nemo_gym.errors import ConfigError
from nemo_gym.metrics import ROLLOUT_INDEX_KEY_NAME, pass_metrics

SUCCESS_THRESHOLD = 1.0
"""A rollout passes with at least this reward; a task is *solved* when any of its scored rollouts passes."""
BOOTSTRAP_RESAMPLES = 10_000
BOOTSTRAP_SEED = 0
CONFIDENCE = 0.95
_CHUNK_CELLS = 2_000_000
"""Resampled task draws held at once (bounds the memory of the bootstrap whatever the number of tasks)."""
_PASS_KEY = re.compile(r"^pass@(\d+)$")


@dataclass
class RunRewards:
    """One run's scored rewards by task and rollout index, and its failed rollouts (no reward)."""

    label: str
    """What names the run in reports (its rollouts file)."""
    rewards: dict[int, dict[int, float]] = field(default_factory=dict)
    """task index -> rollout index -> reward."""
    failed: int = 0
    failed_tasks: set[int] = field(default_factory=set)
    """Tasks named by a failed rollout: still tasks of the run, even with no scored rollout."""

    @property
    def tasks(self) -> set[int]:
        return set(self.rewards) | self.failed_tasks

    def task_mean(self, task: int) -> float:
        return statistics.fmean(self.rewards[task].values())

    def solved(self, task: int) -> bool:
        return any(reward >= SUCCESS_THRESHOLD for reward in self.rewards[task].values())


class TaskMismatchError(ConfigError):
    """The two runs are not of the same tasks: a difference between them would mix tasks with the change."""

    def __init__(self, baseline: RunRewards, candidate: RunRewards) -> None:
        self.only_baseline = sorted(baseline.tasks - candidate.tasks)
        self.only_candidate = sorted(candidate.tasks - baseline.tasks)
        super().__init__(
            f"{baseline.label} and {candidate.label} are not runs of the same tasks: "
            f"{len(self.only_baseline) + len(self.only_candidate)} task(s) differ "
            f"({len(self.only_baseline)} only in the baseline, {len(self.only_candidate)} only in the candidate); "
            "compare runs of the same inputs"
        )


@dataclass(frozen=True)
class TaskDifference:
    task_index: int
    baseline_mean: float
    candidate_mean: float

    @property
    def difference(self) -> float:
        return self.candidate_mean - self.baseline_mean


@dataclass(frozen=True)
class PassAtK:
    k: int
    baseline: float
    candidate: float


@dataclass
class Comparison:
    """Baseline against one candidate; ``mean_difference`` is candidate minus baseline."""

    baseline: str
    candidate: str
    tasks: list[TaskDifference]
    """The paired tasks (a scored rollout on both sides), in task order."""
    unpaired_tasks: int
    baseline_failed: int
    candidate_failed: int
    mean_difference: float
    ci_low: float
    ci_high: float
    pass_at_k: list[PassAtK]
    fail_to_pass: list[int]
    pass_to_fail: list[int]
    confidence: float = CONFIDENCE
    resamples: int = BOOTSTRAP_RESAMPLES
    seed: int = BOOTSTRAP_SEED

    @property
    def baseline_mean(self) -> float:
        return statistics.fmean(t.baseline_mean for t in self.tasks)

    @property
    def candidate_mean(self) -> float:
        return statistics.fmean(t.candidate_mean for t in self.tasks)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict: every field, the means, and each task's difference."""
        data = asdict(self)
        data["tasks"] = [asdict(t) | {"difference": t.difference} for t in self.tasks]
        return {"baseline_mean": self.baseline_mean, "candidate_mean": self.candidate_mean} | data


def paired_bootstrap_interval(
    differences: list[float],
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
    confidence: float = CONFIDENCE,
) -> tuple[float, float]:
    """The percentile interval of the mean of ``differences`` (one per task) over resamples of the tasks."""
    import numpy as np  # loaded only by a comparison

    if not differences:
        raise ValueError("a bootstrap needs at least one paired task")
    values = np.asarray(differences, dtype=float)
    count = values.size
    rng = np.random.default_rng(seed)
    means = np.empty(resamples)
    step = max(1, _CHUNK_CELLS // count)
    for start in range(0, resamples, step):
        stop = min(resamples, start + step)
        means[start:stop] = values[rng.integers(0, count, size=(stop - start, count))].mean(axis=1)
    tail = (1.0 - confidence) / 2
    low, high = np.quantile(means, [tail, 1.0 - tail])
    return float(low), float(high)


def compare_runs(
    baseline: RunRewards,
    candidate: RunRewards,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
) -> Comparison:
    """The comparison of two runs of the same tasks; a :class:`TaskMismatchError` when their tasks differ."""
    if baseline.tasks != candidate.tasks:
        raise TaskMismatchError(baseline, candidate)
    paired = sorted(set(baseline.rewards) & set(candidate.rewards))
    if not paired:
        raise ConfigError(
            f"{baseline.label} and {candidate.label} have no task with a scored rollout on both sides: nothing to "
            "compare"
        )
    tasks = [TaskDifference(t, baseline.task_mean(t), candidate.task_mean(t)) for t in paired]
    differences = [t.difference for t in tasks]
    low, high = paired_bootstrap_interval(differences, resamples, seed)
    return Comparison(
        baseline=baseline.label,
        candidate=candidate.label,
        tasks=tasks,
        unpaired_tasks=len(baseline.tasks) - len(paired),
        baseline_failed=baseline.failed,
        candidate_failed=candidate.failed,
        mean_difference=statistics.fmean(differences),
        ci_low=low,
        ci_high=high,
        pass_at_k=_pass_at_ks(baseline, candidate, paired),
        fail_to_pass=[t for t in paired if candidate.solved(t) and not baseline.solved(t)],
        pass_to_fail=[t for t in paired if baseline.solved(t) and not candidate.solved(t)],
        resamples=resamples,
        seed=seed,
    )


def _pass_at_ks(baseline: RunRewards, candidate: RunRewards, paired: list[int]) -> list[PassAtK]:
    """pass@k of both sides over the paired tasks, by the metrics' own rule, for the k both runs have repeats for."""
    sides = [pass_metrics(_groups(run, paired), SUCCESS_THRESHOLD) for run in (baseline, candidate)]
    ks = sorted(
        int(match[1]) for key in sides[0] if (match := _PASS_KEY.match(key)) and key in sides[1]
    )  # pass_metrics names k up to each run's repeats: the shared names are those up to the smaller
    return [PassAtK(k, sides[0][f"pass@{k}"], sides[1][f"pass@{k}"]) for k in ks]


def _groups(run: RunRewards, tasks: list[int]) -> dict[int, list[dict[str, Any]]]:
    """The run as the rows :func:`nemo_gym.metrics.pass_metrics` reads: a reward and a rollout index each."""
    return {
        task: [{"reward": reward, ROLLOUT_INDEX_KEY_NAME: index} for index, reward in sorted(run.rewards[task].items())]
        for task in tasks
    }
