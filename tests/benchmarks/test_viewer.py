"""The viewer benchmark still runs end to end on a small file (the 100,000-row figures are its own, not a test's)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "performance" / "viewer" / "run.py"

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


def test_small_file_reports_first_page_and_peak_memory(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    argv = [sys.executable, str(SCRIPT), "--rows", "1000", "--row-kb", "4", "--dir", str(tmp_path), "--json", str(out)]
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=250)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    report = json.loads(out.read_text())
    for label, rows in (("small", 100), ("large", 1000)):
        assert report[label]["rows"] == rows
        assert report[label]["first_page_s"] > 0 and report[label]["peak_rss_mb"] > 0
