"""``gym eval compare`` on two real runs (issue 35, item 2): the same five weather tasks, collected twice through the
real servers with the scripted model answering differently, and the report's numbers against ones computed here from
the two rollouts files.

Baseline: Tokyo gets a wrong answer and Nairobi no tool call (reward 0 each). Candidate: Tokyo and Nairobi answered
right, Oslo wrong. So tasks 1 and 3 go fail → pass, task 4 pass → fail, and the mean rises by 1/5.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from nemo_gym import INSTALL_DIR
from nemo_gym.cli.main import main
from nemo_gym.run_comparison import BOOTSTRAP_RESAMPLES, BOOTSTRAP_SEED, CONFIDENCE

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

WEATHER = "example_single_tool_call"
DATA = INSTALL_DIR / "resources_servers" / WEATHER / "data" / "example.jsonl"


def _message(text: str) -> list[dict[str, Any]]:
    return [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}]


def _answered(city: str, weather: str) -> dict[str, Any]:
    call = {"type": "function_call", "name": "get_weather", "arguments": json.dumps({"city": city})}
    return {"match": city, "script": [[call], _message(f"It is {weather} in {city} today.")]}


BASELINE = [_answered("Tokyo", "sunny"), {"match": "Nairobi", "script": [_message("I cannot check the weather.")]}]
CANDIDATE = [_answered("Tokyo", "cold"), _answered("Nairobi", "cold"), _answered("Oslo", "warm")]


def _collect(workdir: Path, name: str, scripts: list[dict[str, Any]]) -> Path:
    scripts_file = workdir / f"{name}_scripts.jsonl"
    scripts_file.write_text("".join(json.dumps(line) + "\n" for line in scripts))
    rollouts = workdir / "results" / f"{name}.jsonl"
    assert main(["eval", "run", "--resources-server", WEATHER, "--agent", f"{WEATHER}_simple_agent",
                 "--model-type", "scripted_model", "--input", str(DATA), "--output", str(rollouts),
                 "--no-health-check", "+shared_venv=true", "+head_server={port: 0}", f"+cache_dir={workdir / 'cache'}",
                 f"++policy_model.responses_api_models.scripted_model.scripts_file={scripts_file}"]) == 0  # fmt: skip
    return rollouts


def _rewards(path: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {row["_ng_task_index"]: float(row["reward"]) for row in rows}


def test_compare_of_two_real_runs_reports_the_differences_computed_from_their_files(workdir: Path) -> None:
    baseline, candidate = _collect(workdir, "baseline", BASELINE), _collect(workdir, "candidate", CANDIDATE)
    before, after = _rewards(baseline), _rewards(candidate)
    assert before == {0: 1.0, 1: 0.0, 2: 1.0, 3: 0.0, 4: 1.0} and after == {0: 1.0, 1: 1.0, 2: 1.0, 3: 1.0, 4: 0.0}

    out = workdir / "compare"
    assert main(["eval", "compare", "--baseline", str(baseline), "--candidates", str(candidate), "-o", str(out)]) == 0
    [report] = json.loads((out / "compare_report.json").read_text())["comparisons"]

    tasks = sorted(before)
    differences = np.array([after[t] - before[t] for t in tasks])
    assert report["mean_difference"] == pytest.approx(differences.mean()) == pytest.approx(0.2)
    assert report["fail_to_pass"] == [t for t in tasks if before[t] < 1 <= after[t]] == [1, 3]
    assert report["pass_to_fail"] == [t for t in tasks if after[t] < 1 <= before[t]] == [4]
    # the percentile interval of the resampled means, resampling the five tasks with the documented seed
    draws = np.random.default_rng(BOOTSTRAP_SEED).integers(0, len(tasks), size=(BOOTSTRAP_RESAMPLES, len(tasks)))
    tail = (1 - CONFIDENCE) / 2
    low, high = np.quantile(differences[draws].mean(axis=1), [tail, 1 - tail])
    assert (report["ci_low"], report["ci_high"]) == (pytest.approx(low), pytest.approx(high))
    assert report["ci_low"] < 0.2 < report["ci_high"]  # five tasks cannot tell +0.2 from no change
    markdown = (out / "compare_report.md").read_text()
    assert "+0.2000" in markdown
