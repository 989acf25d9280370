"""Rollout health checks on real runs: ``gym eval run`` checks its rollouts at the end (unless told not to), and
``gym eval health-check RUN_DIR`` checks a finished run's, with NeMo Gym 0.7's check ids and file names.

The scripted model answers task 1 with an empty message (a hollow agent turn); every other task gets a real answer.
The model calls are captured (``observability_enabled``), which is the evidence most checks read.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nemo_gym.cli.main import main
from tests.rollouts.conftest import stack_overrides, write_dataset

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

ROWS = 4
HOLLOW_TASK = 1


def _scripts(path: Path) -> Path:
    empty = [[{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": ""}]}]]
    path.write_text(json.dumps({"match": f"question {HOLLOW_TASK}", "script": empty}) + "\n")
    return path


def _findings(verdicts: Path) -> dict[int, list[str]]:
    rows = [json.loads(line) for line in verdicts.read_text().splitlines()]
    return {row["_ng_task_index"]: [f["check"] for f in row["findings"]] for row in rows}


def test_a_run_checks_its_rollouts_and_health_check_agrees(workdir: Path, extra_root: Path, capsys) -> None:
    data = write_dataset(workdir / "data.jsonl", ROWS)
    output = workdir / "run" / "rollouts.jsonl"
    overrides = stack_overrides(
        workdir,
        "+observability_enabled=true",
        f"+model_call_capture_dir={workdir / 'captures'}",
        f"++policy_model.responses_api_models.scripted_model.scripts_file={_scripts(workdir / 'scripts.jsonl')}",
    )
    run = ["eval", "run", "--agent", "rollout_test_agent", "--input", str(data), "--output", str(output)]
    assert main([*run, *overrides]) == 0
    printed = capsys.readouterr().err
    assert f"Rollout health: {ROWS} checked, {ROWS - 1} healthy, 1 unhealthy, 0 unobserved" in printed
    assert "findings: agent_turn_hollow 1" in printed

    summary_path, verdicts_path = output.parent / "quality_summary.json", output.parent / "rollout_verdicts.jsonl"
    findings = _findings(verdicts_path)
    assert findings == {task: (["agent_turn_hollow"] if task == HOLLOW_TASK else []) for task in range(ROWS)}
    summary = json.loads(summary_path.read_text())
    assert summary["run"]["verdicts"] == {"healthy": ROWS - 1, "unhealthy": 1, "unobserved": 0}
    assert summary["run"]["issues"]["agent_turn_hollow"] == 1
    assert sum(summary["run"]["issues"].values()) == 1  # nothing else found on a clean run

    # the same verdicts from the command, over the run's folder (rollouts.jsonl is its default file)
    summary_path.unlink()
    assert main(["eval", "health-check", str(output.parent), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["run"] == summary["run"]
    assert _findings(verdicts_path) == findings

    # a check left out by id: no finding, the rollout healthy, the check counted as ignored
    assert main(["eval", "health-check", str(output.parent), "--ignore-checks", "agent_turn_hollow"]) == 0
    assert "4 healthy, 0 unhealthy" in capsys.readouterr().out
    ignored = json.loads(summary_path.read_text())["run"]
    assert ignored["ignored_checks"] == ["agent_turn_hollow"]
    assert ignored["artifacts"]["coverage"]["agent_turn_hollow"]["ignored"] == ROWS

    # off for a run that says so: no reports
    summary_path.unlink()
    verdicts_path.unlink()
    again = workdir / "run" / "again.jsonl"
    assert main([*run[:-1], str(again), "--no-health-check", *overrides]) == 0
    assert "Rollout health" not in capsys.readouterr().err
    assert not summary_path.exists() and not verdicts_path.exists()


def test_health_check_names_what_it_cannot_use(workdir: Path, capsys) -> None:
    run_dir = workdir / "two"
    run_dir.mkdir()
    for name in ("a.jsonl", "b.jsonl"):
        (run_dir / name).write_text('{"_ng_task_index": 0, "_ng_rollout_index": 0, "reward": 1.0}\n')
    assert main(["eval", "health-check", str(run_dir)]) == 1
    assert "not one rollouts file to choose (found: a.jsonl, b.jsonl); name it with --rollouts-file" in (
        capsys.readouterr().err
    )
    assert main(["eval", "health-check", str(run_dir), "--rollouts-file", "a.jsonl", "--ignore", "no_such"]) == 1
    error = capsys.readouterr().err
    assert "unknown rollout health checks: no_such" in error and "Traceback" not in error
    assert main(["eval", "health-check", str(run_dir), "--rollouts-file", "a.jsonl"]) == 0
    assert "1 unobserved" in capsys.readouterr().out  # no trajectory: never read as healthy
