"""A dead server pauses the run instead of burning attempts; the open-file limit is checked against --concurrency.

Real ``gym eval run`` processes against the scripted model. "Mid-run" is a fact, not a moment: verifies after the
1,000th are held until a release file exists, so the model server is killed while the run is known to be half done.
The model server is restarted "the same" way the launcher started it: its command line, directory and environment
(the run's config file, its instance name), listening on the port that file gives it.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from benchmarks.performance.server_down.run import child_serving, kill_for_restart
from tests.rollouts.conftest import CONFIG, ROOT, write_dataset
from tests.rollouts.test_collection import ENV, HANG_GUARD_S, keys, read, wait_for_lines

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

ROWS = 2000
DOWN_FOR_S = 10.0
"""How long the model server stays dead (the scenario of the issue, not a synchronisation)."""


class Run:
    """A ``gym eval run`` process whose output lines are collected as they come."""

    def __init__(self, workdir: Path, data: Path, *extra: str, preexec=None) -> None:
        env = os.environ | {"NEMO_GYM_ENV_YAML": "", "NEMO_GYM_EXTRA_ROOTS": str(ROOT)}
        args = [
            sys.executable, "-m", "nemo_gym.cli.main", "eval", "run", "--config", str(CONFIG), "--input", str(data),
            "--agent", "rollout_test_agent", "--output", str(workdir / "out" / "rollouts.jsonl"), "+shared_venv=true",
            "+head_server={port: 0}", f"+results_dir={workdir / 'results'}", f"+cache_dir={workdir / 'cache'}", *extra,
        ]  # fmt: skip
        self._follow(subprocess.Popen(
            args, cwd=workdir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            preexec_fn=preexec,
        ))  # fmt: skip

    @classmethod
    def reading(cls, process: subprocess.Popen) -> Run:
        """The output lines of another process (text mode, stderr merged into stdout), as they come."""
        run = cls.__new__(cls)
        run._follow(process)
        return run

    def _follow(self, process: subprocess.Popen) -> None:
        self.process = process
        self.lines: list[str] = []
        self._new_line = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            with self._new_line:
                self.lines.append(line.rstrip("\n"))
                self._new_line.notify_all()

    def wait_for_line(self, text: str) -> str:
        """The first output line containing ``text``, waiting for it while the run is alive."""
        deadline = time.monotonic() + HANG_GUARD_S
        with self._new_line:
            while True:
                found = [line for line in self.lines if text in line]
                if found:
                    return found[0]
                assert self.process.poll() is None or self._reader.is_alive(), self.log()
                assert time.monotonic() < deadline, f"no line with {text!r} after {HANG_GUARD_S} s:\n{self.log()}"
                self._new_line.wait(0.5)

    def finish(self) -> int:
        code = self.process.wait(timeout=HANG_GUARD_S)
        self._reader.join(timeout=HANG_GUARD_S)
        return code

    def log(self) -> str:
        return "\n".join(self.lines[-60:])


def check_complete(output: Path) -> None:
    rows = read(output)
    assert len(keys(rows)) == ROWS and set(keys(rows)) == {(t, 0) for t in range(ROWS)}, "2,000 distinct, 0 repeated"
    assert not any("_ng_attempt" in row for row in rows), "no rollout was charged an attempt"
    assert not output.with_name("rollouts_failures.jsonl").exists()


def kill_model_mid_run(workdir: Path, *extra: str) -> tuple[Run, float, Callable[[], subprocess.Popen]]:
    """Start a run of 2,000 rows at concurrency 64, kill its model server once 1,000 are written, release the rest."""
    data = write_dataset(workdir / "data.jsonl", ROWS)
    release = workdir / "release"
    held = (f"{ENV}.hold_verifies_after=1000", f"{ENV}.release_file={release}")
    # Restarted by the test (a server some other supervisor restarts), not by the launcher's (test_supervision.py).
    run = Run(workdir, data, "--concurrency", "64", *held, "+server_supervision={enabled: false}", *extra)
    output = workdir / "out" / "rollouts.jsonl"
    wait_for_lines(1000, output, running=run.process)
    start_again = kill_for_restart(child_serving(run.process.pid, "policy_model"))
    killed_at = time.monotonic()
    release.touch()  # the held rollouts finish; the next ones fail at the dead model server
    return run, killed_at, start_again


def test_model_server_down_10s_at_concurrency_64_pauses_and_completes_2000_rows_with_no_attempt_charged(workdir):
    run, killed_at, start_again = kill_model_mid_run(workdir)
    restarted = None
    try:
        down = run.wait_for_line("is down")
        assert "model server 'policy_model' at http://127.0.0.1:" in down and "(connection refused)" in down, down
        assert not any("is back" in line for line in run.lines)
        time.sleep(max(0.0, killed_at + DOWN_FOR_S - time.monotonic()))  # the server stays dead 10 s in all
        restarted = start_again()
        assert "model server 'policy_model'" in run.wait_for_line("is back")
        code = run.finish()
    finally:
        if restarted is not None:
            os.killpg(restarted.pid, signal.SIGKILL)
            restarted.wait(timeout=HANG_GUARD_S)
    assert code == 0, run.log()
    assert len([line for line in run.lines if "is down" in line]) == 1, run.log()
    check_complete(workdir / "out" / "rollouts.jsonl")


def test_model_server_never_back_stops_the_run_then_resume_completes_2000_rows(workdir):
    run, _, _ = kill_model_mid_run(workdir, "--server-down-deadline", "2")
    code = run.finish()
    assert code == 1, run.log()
    (error,) = [line for line in run.lines if line.startswith("error: ")]
    assert "model server 'policy_model'" in error and "still down after 2 s" in error and "--resume" in error
    assert "Traceback" not in run.log()
    output = workdir / "out" / "rollouts.jsonl"
    written = read(output)
    assert 1000 <= len(written) < ROWS
    failures = read(output.with_name("rollouts_failures.jsonl"))
    assert not [row for row in failures if row["_ng_failure_class"].startswith("model")], "nothing charged for it"

    resumed = Run(workdir, workdir / "data.jsonl", "--concurrency", "64", "--resume")  # a fresh stack
    assert resumed.finish() == 0, resumed.log()
    check_complete(output)


def _open_files(soft: int, hard: int):
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

    return limit


def test_ulimit_1024_with_concurrency_1024_is_raised_and_2000_rows_complete(workdir):
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < 4096:
        pytest.skip(f"this machine's hard open-file limit ({hard}) is too low to raise")
    data = write_dataset(workdir / "data.jsonl", ROWS)
    run = Run(workdir, data, "--concurrency", "1024", preexec=_open_files(1024, hard))
    assert run.finish() == 0, run.log()
    assert any(line.startswith("raised the open-file limit (ulimit -n) from 1024 to ") for line in run.lines)
    check_complete(workdir / "out" / "rollouts.jsonl")


def test_hard_ulimit_1024_with_concurrency_1024_is_refused_at_start_with_one_line(workdir):
    data = write_dataset(workdir / "data.jsonl", ROWS)
    run = Run(workdir, data, "--concurrency", "1024", preexec=_open_files(1024, 1024))
    assert run.finish() == 1, run.log()
    assert "Traceback" not in run.log() and "Starting servers" not in run.log()
    (error,) = [line for line in run.lines if line.startswith("error: ")]
    assert "--concurrency 1024" in error and "ulimit -n" in error and "1024" in error
    assert not (workdir / "out" / "rollouts.jsonl").exists()
    assert json.dumps(run.lines).count("error: ") == 1
