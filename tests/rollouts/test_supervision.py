"""Runs that heal themselves: the launcher restarts a server that dies or freezes, and the run finishes by itself.

Real ``gym eval run`` (and ``gym env start``) processes with the scripted model. "Mid-run" is a fact, not a moment:
the test environment holds every ``/verify`` after the 1,000th (then the 1,500th) until a release file exists, so each
server is killed while the run is known to be at that point, whatever the speed of the machine.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.performance.server_down.run import child_serving
from tests.rollouts.conftest import CONFIG, ROOT, write_dataset
from tests.rollouts.test_collection import ENV, HANG_GUARD_S, wait_for_lines
from tests.rollouts.test_server_down import ROWS, Run, check_complete

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

MODEL, RESOURCES = "policy_model", "rollout_test_env"
FAST_RESTARTS = ("+server_supervision={backoff_s: 0.2, probe_interval_s: 0.5}",)


def holds(workdir: Path) -> tuple[list[str], Path, Path]:
    """Verifies held after the 1,000th until ``first`` exists and after the 1,500th until ``second`` does."""
    first, second = workdir / "release-1", workdir / "release-2"
    spec = f"[{{after: 1000, release_file: {first}}}, {{after: 1500, release_file: {second}}}]"
    return [f"{ENV}.holds={spec}"], first, second


def kill(launcher_pid: int, instance: str) -> int:
    pid = child_serving(launcher_pid, instance)
    os.killpg(pid, signal.SIGKILL)
    return pid


def kill_model_then_resources(launcher_pid: int, output: Path, running: subprocess.Popen, workdir: Path,
                              first: Path, second: Path, said: Run) -> None:  # fmt: skip
    """At 1,000 rows the model server dies (its rollouts then fail at it), at 1,500 the resources server does (with
    64 verifies held in it). Neither is restarted by the test."""
    wait_for_lines(1000, output, running=running)
    kill(launcher_pid, MODEL)
    first.touch()  # the held verifies finish; the next rollouts call the dead model server
    said.wait_for_line(f"server '{MODEL}' (responses_api_models/scripted_model) is back on")
    wait_for_lines(1500, output, running=running)
    kill(launcher_pid, RESOURCES)
    said.wait_for_line(f"server '{RESOURCES}' (resources_servers/rollout_test_env) is back on")
    second.touch()


def assert_two_restarts(lines: list[str]) -> None:
    restarts = [line for line in lines if "restarting it on" in line]
    assert len(restarts) == 2, "\n".join(lines[-60:])
    assert f"server '{MODEL}'" in restarts[0] and "was killed by SIGKILL" in restarts[0]
    assert f"server '{RESOURCES}'" in restarts[1] and "was killed by SIGKILL" in restarts[1]
    assert "Traceback" not in "\n".join(lines)


def test_gym_eval_run_restarts_a_killed_model_then_resources_server_and_finishes_with_nothing_charged(workdir):
    data = write_dataset(workdir / "data.jsonl", ROWS)
    overrides, first, second = holds(workdir)
    run = Run(workdir, data, "--concurrency", "64", *overrides, *FAST_RESTARTS)
    output = workdir / "out" / "rollouts.jsonl"
    kill_model_then_resources(run.process.pid, output, run.process, workdir, first, second, run)
    assert run.finish() == 0, run.log()
    assert_two_restarts(run.lines)
    check_complete(output)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_gym_env_start_restarts_them_too_and_a_no_serve_run_finishes_with_nothing_charged(workdir):
    overrides, first, second = holds(workdir)
    port = free_port()
    env = os.environ | {"NEMO_GYM_ENV_YAML": "", "NEMO_GYM_EXTRA_ROOTS": str(ROOT)}
    start = [
        sys.executable, "-m", "nemo_gym.cli.main", "env", "start", "--config", str(CONFIG), "+shared_venv=true",
        f"+head_server={{host: 127.0.0.1, port: {port}}}", f"+results_dir={workdir / 'results'}",
        f"+cache_dir={workdir / 'cache'}", *overrides, *FAST_RESTARTS,
    ]  # fmt: skip
    servers = subprocess.Popen(start, cwd=workdir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    said = Run.reading(servers)
    try:
        said.wait_for_line("servers ready")
        data = write_dataset(workdir / "data.jsonl", ROWS)
        run = Run(
            workdir, data, "--concurrency", "64", "--no-serve", f"++head_server={{host: 127.0.0.1, port: {port}}}"
        )
        output = workdir / "out" / "rollouts.jsonl"
        kill_model_then_resources(servers.pid, output, run.process, workdir, first, second, said)
        assert run.finish() == 0, run.log()
    finally:
        servers.send_signal(signal.SIGINT)
        servers.wait(timeout=HANG_GUARD_S)
    assert_two_restarts(said.lines)
    check_complete(output)


def test_a_server_that_dies_on_every_restart_is_given_up_on_with_one_line_and_exit_1(workdir):
    data = write_dataset(workdir / "data.jsonl", ROWS)
    overrides, first, _ = holds(workdir)
    doomed = workdir / "dies-at-start"
    run = Run(workdir, data, "--concurrency", "64", *overrides, f"{ENV}.exit_at_start_if={doomed}",
              "+server_supervision={backoff_s: 0.1, max_restarts: 2}")  # fmt: skip
    wait_for_lines(1000, workdir / "out" / "rollouts.jsonl", running=run.process)
    doomed.touch()
    kill(run.process.pid, RESOURCES)
    first.touch()
    assert run.finish() == 1, run.log()
    log = "\n".join(run.lines)
    assert "Traceback" not in log
    (error,) = [line for line in run.lines if line.startswith("error: ")]
    assert f"server '{RESOURCES}'" in error and "given up on after 2 restarts in a row" in error, error
    assert "exited with code 3 while starting again" in error, error
    assert len([line for line in run.lines if "restarting it on" in line]) == 2, log


def test_a_frozen_model_server_is_named_and_the_run_continues_when_it_thaws(workdir):
    data = write_dataset(workdir / "data.jsonl", ROWS)
    overrides, first, second = holds(workdir)
    run = Run(workdir, data, "--concurrency", "64", *overrides, "+server_supervision={restart_frozen_after_s: null}")
    output = workdir / "out" / "rollouts.jsonl"
    wait_for_lines(1000, output, running=run.process)
    model = child_serving(run.process.pid, MODEL)
    os.kill(model, signal.SIGSTOP)
    first.touch()  # the next rollouts' model calls hang on the stopped server
    try:
        frozen = run.wait_for_line(f"server '{MODEL}' (responses_api_models/scripted_model) is frozen")
        assert "did not answer on GET /" in frozen or "took the connection but did not answer" in frozen, frozen
    finally:
        os.kill(model, signal.SIGCONT)
    run.wait_for_line("answers again")
    second.touch()
    assert run.finish() == 0, run.log()
    assert not [line for line in run.lines if "restarting it on" in line], run.log()
    check_complete(output)


def test_a_model_server_frozen_for_good_is_killed_and_restarted(workdir):
    data = write_dataset(workdir / "data.jsonl", ROWS)
    overrides, first, second = holds(workdir)
    run = Run(workdir, data, "--concurrency", "64", *overrides,
              "+server_supervision={restart_frozen_after_s: 2, backoff_s: 0.2}")  # fmt: skip
    output = workdir / "out" / "rollouts.jsonl"
    wait_for_lines(1000, output, running=run.process)
    model = child_serving(run.process.pid, MODEL)
    os.kill(model, signal.SIGSTOP)
    first.touch()
    restart = run.wait_for_line(f"server '{MODEL}' (responses_api_models/scripted_model) was frozen for")
    assert "was killed; restarting it on" in restart, restart
    run.wait_for_line(f"server '{MODEL}' (responses_api_models/scripted_model) is back on")
    assert child_serving(run.process.pid, MODEL) != model
    with pytest.raises(ProcessLookupError):
        os.kill(model, 0)  # killed and reaped: not even a zombie is left
    second.touch()
    assert run.finish() == 0, run.log()
    check_complete(output)
