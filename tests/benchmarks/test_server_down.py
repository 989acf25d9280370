"""The server-down benchmark still runs end to end (one kill: this checks the script, the figure is its own)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "performance" / "server_down" / "run.py"

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(400)]


def test_one_kill_reports_the_times_to_down_restarted_and_the_next_rollout(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    argv = [sys.executable, str(SCRIPT), "--kills", "1", "--rows-between", "50", "--json", str(out)]
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=350)
    assert "kill -> 'model server ... is down' line" in done.stdout, done.stdout[-2000:] + done.stderr[-2000:]
    report = json.loads(out.read_text())
    assert len(report["kill_to_down_s"]) == len(report["kill_to_restarted_s"]) == 1
    assert report["kill_to_down_s"][0] <= report["kill_to_restarted_s"][0] <= report["kill_to_first_rollout_s"][0]
