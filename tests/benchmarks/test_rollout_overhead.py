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
