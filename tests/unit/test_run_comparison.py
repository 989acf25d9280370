"""``gym eval compare``: the paired statistics against values computed here by hand, and the command end to end."""

from __future__ import annotations

import json
import random
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from nemo_gym.errors import ConfigError
from nemo_gym.metrics import pass_at_k
from nemo_gym.rollouts.compare import read_run
from nemo_gym.run_comparison import RunRewards, TaskMismatchError, compare_runs, paired_bootstrap_interval

BIN = Path(sys.executable).parent


def run_of(rewards: dict[int, list[float]], label: str = "run") -> RunRewards:
    return RunRewards(label, {task: dict(enumerate(values)) for task, values in rewards.items()})


def rows(rewards: dict[int, list[float]]) -> list[dict]:
    return [
        {"_ng_task_index": task, "_ng_rollout_index": index, "reward": reward}
        for task, values in rewards.items()
        for index, reward in enumerate(values)
    ]


def write(path: Path, lines: list[dict]) -> Path:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def test_a_known_difference_lies_in_its_interval_and_equals_the_mean_of_the_task_differences():
    noise = random.Random(7)
    baseline = {t: [float(noise.random() < 0.4) for _ in range(4)] for t in range(200)}
    candidate = {t: [float(noise.random() < 0.6) for _ in range(4)] for t in range(200)}
    result = compare_runs(run_of(baseline, "a"), run_of(candidate, "b"))

    by_hand = statistics.fmean(statistics.fmean(candidate[t]) - statistics.fmean(baseline[t]) for t in range(200))
    assert result.mean_difference == pytest.approx(by_hand)
    assert result.ci_low < by_hand < result.ci_high
    assert 0 < result.ci_low and result.ci_high < 0.5  # a 0.2 difference over 200 tasks is told from no change
    assert [t.task_index for t in result.tasks] == list(range(200)) and result.unpaired_tasks == 0
    # the same seed gives the same interval; another seed a slightly different one
    assert (result.ci_low, result.ci_high) == paired_bootstrap_interval([t.difference for t in result.tasks])
    assert paired_bootstrap_interval([t.difference for t in result.tasks], seed=1) != (result.ci_low, result.ci_high)


def test_identical_runs_differ_by_zero_with_a_zero_interval():
    rewards = {t: [float(t % 3 == 0), 0.5, 1.0] for t in range(10)}
    result = compare_runs(run_of(rewards, "a"), run_of(rewards, "b"))
    assert (result.mean_difference, result.ci_low, result.ci_high) == (0.0, 0.0, 0.0)
    assert result.fail_to_pass == result.pass_to_fail == []
    assert all(p.baseline == p.candidate for p in result.pass_at_k)


def test_flipped_tasks_both_ways_and_pass_at_k_from_the_metrics_estimator():
    baseline = {0: [1.0, 0.0, 0.0, 0.0], 1: [0.0] * 4, 2: [1.0] * 4, 3: [0.0, 0.5, 0.0, 0.0]}
    candidate = {0: [0.0] * 4, 1: [0.0, 0.0, 1.0, 0.0], 2: [1.0, 0.0, 1.0, 1.0], 3: [1.0, 0.0, 0.0, 0.0]}
    result = compare_runs(run_of(baseline), run_of(candidate))
    assert result.fail_to_pass == [1, 3]  # solved: some rollout reaches reward 1
    assert result.pass_to_fail == [0]
    assert [p.k for p in result.pass_at_k] == [1, 2, 4]
    for p in result.pass_at_k:
        for side, rewards in ((p.baseline, baseline), (p.candidate, candidate)):
            assert side == pytest.approx(
                statistics.fmean(pass_at_k(4, sum(r == 1 for r in v), p.k) for v in rewards.values())
            )


def test_pass_at_k_stops_at_the_repeats_both_runs_have():
    result = compare_runs(run_of({0: [1.0] * 8, 1: [0.0] * 8}), run_of({0: [1.0, 0.0], 1: [0.0, 1.0]}))
    assert [p.k for p in result.pass_at_k] == [1, 2]


def test_runs_of_other_tasks_are_refused_naming_how_many_differ():
    with pytest.raises(TaskMismatchError) as caught:
        compare_runs(
            run_of({0: [1.0], 1: [0.0], 2: [1.0]}, "a.jsonl"), run_of({1: [1.0], 3: [0.0], 4: [0.0]}, "b.jsonl")
        )
    assert (caught.value.only_baseline, caught.value.only_candidate) == ([0, 2], [3, 4])
    assert "4 task(s) differ (2 only in the baseline, 2 only in the candidate)" in str(caught.value)


def test_failed_rollouts_are_counted_and_left_out_of_the_means(tmp_path):
    write(tmp_path / "a.jsonl", rows({0: [1.0, 1.0], 1: [0.0, 0.0]}))
    candidate = rows({0: [1.0, 0.0], 1: [0.0, 1.0]})
    write(tmp_path / "b.jsonl", [r for r in candidate if (r["_ng_task_index"], r["_ng_rollout_index"]) != (0, 1)])
    failure = {"_ng_task_index": 0, "_ng_rollout_index": 1, "_ng_failure_class": "agent"}
    write(tmp_path / "b_failures.jsonl", [failure, failure | {"_ng_attempt_index": 1}])  # two attempts, one rollout
    result = compare_runs(read_run(tmp_path / "a.jsonl"), read_run(tmp_path / "b.jsonl"))
    assert (result.baseline_failed, result.candidate_failed) == (0, 1)
    assert [t.candidate_mean for t in result.tasks] == [1.0, 0.5]  # task 0: its one scored rollout
    assert result.mean_difference == pytest.approx(0.25)


def test_a_task_with_only_failures_on_one_side_is_a_task_of_that_run_but_not_paired(tmp_path):
    write(tmp_path / "a.jsonl", rows({0: [1.0], 1: [0.0]}))
    failed = {"_ng_task_index": 1, "_ng_rollout_index": 0, "_ng_failure_class": "model"}
    write(tmp_path / "b.jsonl", [*rows({0: [1.0]}), failed])  # a failure record inside the rollouts file
    result = compare_runs(read_run(tmp_path / "a.jsonl"), read_run(tmp_path / "b.jsonl"))
    assert (len(result.tasks), result.unpaired_tasks, result.candidate_failed) == (1, 1, 1)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"_ng_task_index": 0, "_ng_rollout_index": 0}\n', "r.jsonl:1: the rollout has no numeric reward"),
        ('{"_ng_task_index": 0, "_ng_rollout_index": 0, "reward": 1}\n{"x": \n', "r.jsonl:2: not valid JSON"),
        ('{"reward": 1}\n', "r.jsonl:1: a rollout row needs integer _ng_task_index"),
        ("\n", "r.jsonl: no scored rollout"),
    ],
)
def test_bad_files_name_the_file_and_line(tmp_path, content, message):
    (tmp_path / "r.jsonl").write_text(content)
    with pytest.raises(ConfigError) as caught:
        read_run(tmp_path / "r.jsonl")
    assert message in str(caught.value)


def _gym(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(BIN / "gym"), "eval", "compare", *args], cwd=cwd, capture_output=True, text=True, timeout=60
    )


def test_the_command_writes_the_reports_and_refuses_bad_input(tmp_path):
    write(tmp_path / "base.jsonl", rows({t: [float(t < 2)] * 2 for t in range(4)}))
    write(tmp_path / "cand.jsonl", rows({t: [float(t < 3)] * 2 for t in range(4)}))
    write(tmp_path / "other.jsonl", rows({t: [1.0] for t in range(5)}))

    done = _gym("--baseline", "base.jsonl", "--candidates", "cand.jsonl", "base.jsonl", "-o", "out", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    report = json.loads((tmp_path / "out" / "compare_report.json").read_text())
    first, second = report["comparisons"]
    assert (first["candidate"], first["mean_difference"], first["fail_to_pass"], first["pass_to_fail"]) == (
        "cand.jsonl",
        0.25,
        [2],
        [],
    )
    assert (second["mean_difference"], second["ci_low"], second["ci_high"]) == (0.0, 0.0, 0.0)
    assert [p["k"] for p in first["pass_at_k"]] == [1, 2]
    markdown = (tmp_path / "out" / "compare_report.md").read_text()
    assert "| mean reward | 0.5000 | 0.7500 | +0.2500 |" in markdown and "- fail → pass: 2" in markdown
    assert "cand.jsonl: mean reward 0.5000 -> 0.7500, difference +0.2500" in done.stdout

    # by default the reports go beside the (last) candidate, as NeMo Gym 0.7 writes them; --report-format picks one
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "cand.jsonl").write_bytes((tmp_path / "cand.jsonl").read_bytes())
    assert _gym("--baseline", "base.jsonl", "--candidates", "runs/cand.jsonl", "--report-format", "md",
                cwd=tmp_path).returncode == 0  # fmt: skip
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["cand.jsonl", "compare_report.md"]

    for args, line in [
        (("--baseline", "base.jsonl", "--candidates", "other.jsonl"), "1 task(s) differ (0 only in the baseline, 1 only in the candidate)"),
        (("--baseline", "missing.jsonl", "--candidates", "cand.jsonl"), "missing.jsonl: no such rollouts file"),
        (("--baseline", "base.jsonl"), "needs --baseline PATH and --candidates PATH"),
        (("--baseline", "base.jsonl", "--candidates", "cand.jsonl", "--report-format", "html"), "--report-format must be one of md, json, both"),
    ]:  # fmt: skip
        refused = _gym(*args, cwd=tmp_path)
        assert refused.returncode == 1 and line in refused.stderr and "Traceback" not in refused.stderr, refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1
