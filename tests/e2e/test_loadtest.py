"""`gym env loadtest` end to end, as a user runs it: the weather environment and code_gen (whose rollouts run code in
its sandbox), each through the real command with the launcher's servers in their own processes and the scripted
model answering from the environment's data, on a small ladder with short steps. Both commands run at once.

What it shows: the printed table's rollouts/s and p99 equal an independent count over the rollouts each step wrote
(numpy's percentile, not the command's quantile), the JSON agrees, every server was measured, and code_gen's
rollouts really ran their code (reward 1, ``passed``).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from nemo_gym.config.ports import probe_free_port
from nemo_gym.row_fields import ROLLOUT_SECONDS_KEY, ROLLOUT_STARTED_AT_KEY

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

LADDER = (2, 4)
ROW = re.compile(r"^\s*(\d+)\s+([\d.]+)\s+(\d+|-)\s+(\d+|-)\s+(\d+|-)\s+(\d+)\s")


def _start(workdir: Path, resources_server: str) -> subprocess.Popen[str]:
    args = [sys.executable, "-m", "nemo_gym.cli.main", "env", "loadtest", "--resources-server", resources_server,
            "--model-type", "scripted_model", "--concurrency", ",".join(map(str, LADDER)), "--duration", "1",
            "--output", str(workdir / f"{resources_server}.json"), "+shared_venv=true",
            f"+head_server={{port: {probe_free_port()}}}", f"+results_dir={workdir / 'results'}",
            f"+cache_dir={workdir / 'cache'}"]  # fmt: skip
    env = os.environ | {"NEMO_GYM_ENV_YAML": "", "COLUMNS": "200"}
    workdir.mkdir(parents=True)
    return subprocess.Popen(args, cwd=workdir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _independent_count(rollouts: Path) -> tuple[int, float, float]:
    """Scored rollouts, rollouts/s and p99 (ms) from a step's files alone."""
    failures = rollouts.with_name(f"{rollouts.stem}_failures.jsonl")
    scored = [json.loads(line) for line in rollouts.read_text().splitlines() if line.strip()]
    failed = [json.loads(line) for line in failures.read_text().splitlines()] if failures.exists() else []
    starts = [r[ROLLOUT_STARTED_AT_KEY] for r in scored + failed]
    ends = [r[ROLLOUT_STARTED_AT_KEY] + r[ROLLOUT_SECONDS_KEY] for r in scored + failed]
    p99 = float(np.percentile([r[ROLLOUT_SECONDS_KEY] for r in scored], 99)) * 1000
    return len(scored), len(scored) / (max(ends) - min(starts)), p99


def test_loadtest_table_matches_the_rollouts_it_wrote(tmp_path: Path) -> None:
    environments = ("example_single_tool_call", "code_gen")
    runs = {name: _start(tmp_path / name, name) for name in environments}
    outputs = {name: run.communicate(timeout=240)[0] for name, run in runs.items()}
    for name in environments:
        assert runs[name].returncode == 0, outputs[name]
        report = json.loads((tmp_path / name / f"{name}.json").read_text())
        table = {int(m[1]): m for line in outputs[name].splitlines() if (m := ROW.match(line))}
        assert sorted(table) == list(LADDER), outputs[name]
        assert [step["concurrency"] for step in report["steps"]] == list(LADDER)
        assert report["first_limit"] and (tmp_path / name / f"{name}.png").stat().st_size > 0
        for step in report["steps"]:
            scored, rate, p99 = _independent_count(Path(step["rollouts_file"]))
            assert scored == step["scored"] > 0 and step["failed"] == 0
            row = table[step["concurrency"]]
            assert (row[2], row[5], row[6]) == (f"{rate:.1f}", f"{p99:.0f}", str(scored))
            assert step["rollouts_per_s"] == pytest.approx(rate) and step["latency_ms"]["p99"] == pytest.approx(p99)
            names = {server["name"] for server in step["servers"]}
            assert names == {name, f"{name}_simple_agent", "policy_model"}
            assert all(s["peak_rss_mb"] > 0 and s["peak_fds"] > 0 and s["cpu_s"] >= 0 for s in step["servers"])
            assert sum(s["cpu_s"] for s in step["servers"]) > 0  # one server may stay under psutil's 10 ms tick
    code_gen = Path(report["steps"][-1]["rollouts_file"])
    rows = [json.loads(line) for line in code_gen.read_text().splitlines()]
    assert {(r["reward"], r["result"]) for r in rows} == {(1.0, "passed")}  # the sandbox ran each answer's code
