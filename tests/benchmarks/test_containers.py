"""The containers benchmark still runs end to end (one small step: this checks the script, the figures are its own)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from nemo_gym.sandbox.providers.docker.runtime import ContainerRuntimeError, base_image_tag, find_runtime, image_exists

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "performance" / "containers" / "run.py"

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(400)]


def test_one_step_reports_start_latency_throughput_and_memory(tmp_path: Path) -> None:
    try:
        runtime = find_runtime()
    except ContainerRuntimeError:
        pytest.skip("no container runtime: `make test` installs podman (`make containers`)")
    if not image_exists(runtime, base_image_tag()):
        pytest.skip(f"the base image {base_image_tag()} is not built: `make containers` builds it")
    out = tmp_path / "bench.json"
    argv = [sys.executable, str(SCRIPT), "--concurrency", "2", "--rows", "4", "--json", str(out)]
    done = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=350)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    [step] = json.loads(out.read_text())["steps"]
    assert (step["concurrency"], step["rollouts"]) == (2, 4)
    assert 0 < step["start_p50_s"] <= step["start_max_s"] and step["rollouts_per_s"] > 0
    assert "rollouts/s" in done.stdout
