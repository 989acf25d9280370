"""``run.py --stack``: the hook that swaps the servers' HTTP server acts in launched servers only, and each round of
each named stack runs on a stack of its own (issue 36, the server-stack comparison)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "benchmarks" / "performance" / "rollout_overhead"
HOOK = BENCH / "server_stack"

PROBE = "import uvicorn; print(uvicorn.Server.run.__name__)"


def probe(stack: str, launched: bool) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("NEMO_GYM_LISTEN_FD", "PYTHONPATH")}
    env |= {"PYTHONPATH": str(HOOK), "ROLLOUT_BENCH_SERVER_STACK": stack}
    if launched:
        env["NEMO_GYM_LISTEN_FD"] = "3"
    return subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(
    ("stack", "launched", "runner"),
    [("uvicorn", True, "run_plain_uvicorn"), ("granian", True, "_serve_with_granian"), ("uvicorn", False, "run")],
)
def test_the_hook_swaps_the_http_server_of_launched_servers_only(stack: str, launched: bool, runner: str) -> None:
    done = probe(stack, launched)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == runner


def test_an_unknown_stack_stops_the_server() -> None:
    done = probe("hypercorn", launched=True)
    assert done.returncode != 0 and "must be fast, uvicorn or granian, not 'hypercorn'" in done.stderr


@pytest.mark.e2e
@pytest.mark.timeout(240)
def test_each_round_runs_on_a_new_stack_served_as_named(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    argv = [sys.executable, str(BENCH / "run.py"), "--stack", "uvicorn", "--concurrency", "4"]
    argv += [
        "--rollouts-per-point",
        "16",
        "--rounds",
        "2",
        "--warmup",
        "4",
        "--json",
        str(out),
        "--keep-logs",
        str(tmp_path),
    ]
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=200)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    report = json.loads(out.read_text())
    assert [(p["round"], p["stack"], p["ok"]) for p in report["points"]] == [(1, "uvicorn", 16), (2, "uvicorn", 16)]
    assert [(s["stack"], s["rounds"], s["failed"]) for s in report["summary"]] == [("uvicorn", 2, 0)]
    assert len(report["startup_s"]["uvicorn"]) == 2  # one stack started per round
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["uvicorn-r1", "uvicorn-r2"]
