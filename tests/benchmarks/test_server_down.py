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


def test_one_kill_reports_the_time_to_the_down_line(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    argv = [sys.executable, str(SCRIPT), "--kills", "1", "--rows-between", "50", "--json", str(out)]
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=350)
    assert "kill -> 'model server ... is down' line" in done.stdout, done.stdout[-2000:] + done.stderr[-2000:]
    report = json.loads(out.read_text())
    assert len(report["kill_to_down_s"]) == len(report["restart_to_back_s"]) == 1
