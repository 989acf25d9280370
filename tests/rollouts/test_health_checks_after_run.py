"""Rollout health checks on real runs: ``gym eval run`` checks its rollouts at the end (unless told not to), and
``gym eval health-check RUN_DIR`` checks a finished run's, with NeMo Gym 0.7's check ids and file names.

One launch, three kinds of problem made by the servers themselves: the scripted model answers task 1 with an empty
message (a hollow agent turn) and task 4 with a response whose status is ``failed`` (a failed model call the rollout
ended on), and the embedded SmolLM2 model, serving a second agent with a 256-token context, is cut off at that length limit on
task 5 before it says anything (a runaway generation: its long prompt fills the context). A small output
limit would not do: SmolLM2 cut after a token or two has still said something (a piece of its tool call header). Every other task gets a real answer and no finding. The model calls are
captured (``observability_enabled``), which is the evidence most checks read.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from nemo_gym.cli.main import main
from tests.rollouts.conftest import CONFIG, stack_overrides, write_dataset

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

ROWS = 6
HOLLOW_TASK, FAILED_TASK, TRUNCATED_TASK = 1, 4, 5
EXPECTED = {
    HOLLOW_TASK: ["agent_turn_hollow"],
    FAILED_TASK: ["rollout_ended_on_failed_model_call", "model_call_failed"],
    # cut off before its first token: a hollow turn, a call with no completion tokens, a runaway generation
    TRUNCATED_TASK: ["agent_turn_hollow", "model_call_zero_completion_tokens", "model_call_runaway_generation"],
}
SMALL_AGENT = """
truncating_agent:
  responses_api_agents:
    simple_agent:
      entrypoint: app.py
      resources_server: {type: resources_servers, name: rollout_test_env}
      model_server: {type: responses_api_models, name: small_model}
      max_steps: 1
small_model:
  responses_api_models:
    llamacpp_model:
      entrypoint: app.py
      n_ctx: 256
      return_token_id_information: false
"""
TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Get the current weather of a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


def _said(text: str) -> list[dict[str, object]]:
    return [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}]


def _scripts(path: Path) -> Path:
    empty = [_said("")]
    lines = [
        {"match": f"question {HOLLOW_TASK}", "script": empty},
        {"match": f"question {FAILED_TASK}", "script": [_said("partial")], "status": "failed"},
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def _dataset(workdir: Path) -> Path:
    """Tasks 0-4 for the scripted agent; task 5 for SmolLM2, asked for the weather with a tool."""
    path = write_dataset(workdir / "data.jsonl", ROWS - 1)
    truncated = {
        "responses_create_params": {
            "input": "What is the weather in Paris right now? " * 40,
            "tools": [TOOL],
            "temperature": 0.0,
        },
        "expected_reward": 0.0,
        "agent_ref": {"type": "responses_api_agents", "name": "truncating_agent"},
    }
    with path.open("a") as file:
        file.write(json.dumps(truncated) + "\n")
    return path


def _details(verdicts: Path) -> dict[int, dict[str, dict[str, object]]]:
    """Per task, each finding's detail by check, without null fields."""
    rows = [json.loads(line) for line in verdicts.read_text().splitlines()]
    return {
        row["_ng_task_index"]: {
            f["check"]: {k: v for k, v in f["detail"].items() if v is not None} for f in row["findings"]
        }
        for row in rows
    }


def _findings(verdicts: Path) -> dict[int, list[str]]:
    rows = [json.loads(line) for line in verdicts.read_text().splitlines()]
    return {row["_ng_task_index"]: [f["check"] for f in row["findings"]] for row in rows}


def test_a_run_checks_its_rollouts_and_health_check_agrees(workdir: Path, extra_root: Path, capsys) -> None:
    pytest.importorskip("xllamacpp")
    data = _dataset(workdir)
    output = workdir / "run" / "rollouts.jsonl"
    (workdir / "small_agent.yaml").write_text(SMALL_AGENT)
    overrides = stack_overrides(
        workdir,
        "+observability_enabled=true",
        f"+model_call_capture_dir={workdir / 'captures'}",
        f"++policy_model.responses_api_models.scripted_model.scripts_file={_scripts(workdir / 'scripts.jsonl')}",
    )
    assert overrides[0] == f"+config_paths=[{CONFIG}]"
    overrides[0] = f"+config_paths=[{CONFIG},{workdir / 'small_agent.yaml'}]"  # both agents, one launch
    run = ["eval", "run", "--agent", "rollout_test_agent", "--input", str(data), "--output", str(output)]
    assert main([*run, *overrides]) == 0
    printed = capsys.readouterr().err
    sick = len(EXPECTED)
    assert f"Rollout health: {ROWS} checked, {ROWS - sick} healthy, {sick} unhealthy, 0 unobserved" in printed

    summary_path, verdicts_path = output.parent / "quality_summary.json", output.parent / "rollout_verdicts.jsonl"
    findings = _findings(verdicts_path)
    assert findings == {task: EXPECTED.get(task, []) for task in range(ROWS)}  # the other tasks: no finding
    summary = json.loads(summary_path.read_text())
    assert summary["run"]["verdicts"] == {"healthy": ROWS - sick, "unhealthy": sick, "unobserved": 0}
    expected_issues = Counter(check for checks in EXPECTED.values() for check in checks)
    expected_issues["task_no_successful_model_calls"] = 1  # task 4's only repeat had no successful call
    assert {check: n for check, n in summary["run"]["issues"].items() if n} == expected_issues
    assert summary["tasks"][str(FAILED_TASK)]["flags"] == ["task_no_successful_model_calls"]
    assert summary["run"]["stats"]["model_call_errors"]["ended_on_error"] == 1
    details = _details(verdicts_path)
    assert details[FAILED_TASK]["model_call_failed"] == {"status": 200, "terminal": True}  # 200, status "failed"
    assert details[FAILED_TASK]["rollout_ended_on_failed_model_call"] == {
        "model_ref": "responses_api_models/policy_model", "status": 200, "observed_calls": 1, "successful_calls": 0
    }  # fmt: skip
    assert details[TRUNCATED_TASK]["model_call_runaway_generation"] == {"finish_reason": "max_output_tokens"}
    assert details[TRUNCATED_TASK]["model_call_zero_completion_tokens"] == {"completion_tokens": 0}

    # the same verdicts from the command, over the run's folder (rollouts.jsonl is its default file)
    summary_path.unlink()
    assert main(["eval", "health-check", str(output.parent), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["run"] == summary["run"]
    assert _findings(verdicts_path) == findings

    # a check left out by id: no finding, the rollout healthy, the check counted as ignored
    assert main(["eval", "health-check", str(output.parent), "--ignore-checks", "agent_turn_hollow"]) == 0
    assert f"{ROWS - sick + 1} healthy, {sick - 1} unhealthy" in capsys.readouterr().out
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
