"""The rollout-overhead benchmark still runs end to end (a tiny sweep: this checks the script, it measures nothing)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "performance" / "rollout_overhead" / "run.py"

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]


@pytest.mark.parametrize("client", ["framework", "raw"])
def test_a_tiny_sweep_reports_every_point_with_no_failure(client: str, tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    argv = [sys.executable, str(SCRIPT), "--client", client, "--concurrency", "2,8", "--rollouts-per-point", "24"]
    argv += ["--rounds", "2", "--warmup", "4", "--json", str(out)]
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=200)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "whole run: peak RSS" in done.stdout

    report = json.loads(out.read_text())
    assert report["client"] == client
    assert [s["concurrency"] for s in report["summary"]] == [2, 8]
    for summary in report["summary"]:
        assert (summary["rounds"], summary["ok"], summary["failed"]) == (2, 48, 0)
        assert summary["rollouts_per_s"] > 0 and summary["cpu_ms_per_rollout"] > 0
        assert summary["rss_peak_mb"] > 0
    points = report["points"]
    assert [(p["round"], p["concurrency"]) for p in points] == [(1, 2), (1, 8), (2, 2), (2, 8)]  # interleaved
    assert all(set(p["rss_peak_by_process_mb"]) >= {"driver", "policy_model"} for p in points)
    if sys.platform == "linux":
        assert all(0 < p["pss_peak_mb"] <= p["rss_peak_mb"] for p in points)


def test_collect_mode_times_the_whole_collect_command_with_every_process(tmp_path: Path) -> None:
    """--client collect runs `gym eval run --no-serve` per point and reports its rates, start-up and processes."""
    out = tmp_path / "bench.json"
    argv = [sys.executable, str(SCRIPT), "--client", "collect", "--concurrency", "2,8", "--rollouts-per-point", "20"]
    argv += ["--rounds", "2", "--warmup", "4", "--json", str(out)]
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=200)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "whole `gym eval run --no-serve` per point" in done.stdout

    report = json.loads(out.read_text())
    assert set(report["process_roles"].values()) == {"agent", "model", "resources"}
    points = report["points"]
    assert [(p["round"], p["concurrency"]) for p in points] == [(1, 2), (1, 8), (2, 2), (2, 8)]  # interleaved
    for p in points:
        assert (p["ok"], p["failures"]) == (20, {})
        assert set(p["cpu_s_by_process"]) >= {"launcher", "collector", "policy_model"}
        assert p["cpu_s_by_process"]["collector"] > 0 and p["collector_rss_peak_mb"] > 0
        assert "collector" in p["rss_peak_by_process_mb"]  # sampled with the stack while it ran
        # The model server saw its first request after the command started, and the command ran past the last one.
        assert 0 < p["first_model_request_s"] < p["wall_s"]
        assert p["startup_cpu_s"] > 0  # the command's CPU (interpreter start-up at least) when that request came
        assert p["steady_rollouts_per_s"] >= p["rollouts_per_s"] > 0
        assert p["startup_floor_s"] > 0  # startup_floor.py's floor for the same 20 rows, beside each point
    for summary in report["summary"]:
        assert (summary["rounds"], summary["ok"], summary["failed"]) == (2, 40, 0)
        ratios = sorted(p["first_model_request_s"] / p["startup_floor_s"] for p in points if p["concurrency"] == 2)
        assert summary["concurrency"] != 2 or summary["startup_over_floor"] == round(sum(ratios) / 2, 2)
        assert summary["cpu_ms_by_process"]["collector"] > 0


def test_the_startup_floor_times_each_stage_in_a_fresh_interpreter() -> None:
    """startup_floor.py times the row checker's and the command's unavoidable start-up, one row per row count."""
    script = SCRIPT.with_name("startup_floor.py")
    argv = [sys.executable, str(script), "--rows", "3,20", "--starts", "1"]
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=200)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    header, *rows = done.stdout.splitlines()[1:]
    assert header.split()[:3] == ["rows", "interpreter", "command"]
    assert [row.split()[0] for row in rows] == ["3", "20"]
    for row in rows:
        medians = [float(cell) for cell in row.split()[1::2]]  # "median (fastest)" per stage
        assert len(medians) == 5 and all(seconds > 0 for seconds in medians)


@pytest.mark.parametrize("path", ["relay", "episode"])
def test_an_environment_server_in_the_path_is_measured_as_its_own_process(path: str, tmp_path: Path) -> None:
    """--path puts NeMo Gym 0.7's environment server in front of the agent; the collect command reaches the agent
    through it, and its CPU is a column of its own."""
    out = tmp_path / "bench.json"
    argv = [sys.executable, str(SCRIPT), "--client", "collect", "--path", path, "--concurrency", "4"]
    argv += ["--rollouts-per-point", "12", "--rounds", "1", "--warmup", "2", "--json", str(out)]
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=200)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    report = json.loads(out.read_text())
    assert report["path"] == path
    assert report["process_roles"]["example_single_tool_call_environment_server"] == "env server"
    (point,) = report["points"]
    assert (point["ok"], point["failures"]) == (12, {})
    # its own column; not "> 0": 12 relayed rollouts can take less CPU than one clock tick (10 ms) on a loaded machine
    assert point["cpu_s_by_process"]["example_single_tool_call_environment_server"] >= 0
