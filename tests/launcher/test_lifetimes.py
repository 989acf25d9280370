"""Issue 13, acceptance 6: servers started for a run do not outlive it, with real processes.

``gym eval run`` starts the servers itself and collects against a scripted model that never answers
(``reply_delay_s``), so rollouts are in flight when its process is SIGKILLed: no orderly shutdown, only the kernel's
parent-death signal, the servers' bounded graceful shutdown and the run's reaper are left to stop the servers.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import psutil
import pytest

from nemo_gym import INSTALL_DIR
from nemo_gym.launcher import running_servers
from nemo_gym.launcher.reaper import CONFIG_FILE, OWNER_FILE, sweep_dead_runs
from nemo_gym.transport.runtime import GRACEFUL_SHUTDOWN_S
from tests.helpers import run_headers, write
from tests.launcher.conftest import base_overrides, server_block

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

GONE_WITHIN_S = 15.0
"""The acceptance figure: every process a SIGKILLed run started has exited this long after the kill."""
HANG_GUARD_S = 120.0
"""Start-up and in-flight waits: reached only when something hangs (each wait returns as soon as it holds)."""
WEATHER = "example_single_tool_call"
T = TypeVar("T")
HUNG = "++policy_model.responses_api_models.scripted_model.reply_delay_s=3600"


def gone(process: psutil.Process) -> bool:
    """Exited (a zombie waiting for a non-reaping init counts as gone)."""
    try:
        return not process.is_running() or process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def wait_until(
    condition: Callable[[], T],
    timeout_s: float,
    what: str,
    proc: subprocess.Popen | None = None,
    log: Path | None = None,
) -> T:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"the run exited ({proc.returncode}) before {what}:\n{logs(log)}")
        time.sleep(0.1)
    pytest.fail(f"no {what} within {timeout_s:g} s:\n{logs(log)}")


def logs(log: Path | None) -> str:
    """The run's output and the end of every server log, for a failure message."""
    if log is None:
        return ""
    parts = [log.read_text(errors="replace")]
    for server_log in sorted((log.parent / "results" / "logs").glob("*.log")):
        parts.append(f"--- {server_log.name}:\n" + "\n".join(server_log.read_text(errors="replace").splitlines()[-15:]))
    return "\n".join(parts)


def start_eval_run(root: Path) -> tuple[subprocess.Popen, Path]:
    log = root / "gym.out"
    command = [
        sys.executable, "-m", "nemo_gym.cli.main", "eval", "run", "--resources-server", WEATHER,
        "--model-type", "scripted_model", "--agent", f"{WEATHER}_simple_agent",
        "--input", str(INSTALL_DIR / "resources_servers" / WEATHER / "data" / "example.jsonl"),
        "--output", str(root / "rollouts.jsonl"), "--num-repeats", "8",
        "+shared_venv=true", "+head_server={port: 0}", f"+results_dir={root / 'results'}",
        f"+cache_dir={root / 'cache'}", HUNG,
    ]  # fmt: skip
    env = os.environ | {"NEMO_GYM_ENV_YAML": "", "PYTHONUNBUFFERED": "1"}
    with log.open("wb") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, cwd=root, env=env)
    return proc, log


def model_server(run: psutil.Process) -> psutil.Process | None:
    for child in run.children():
        if any("scripted_model" in part for part in child.cmdline()):
            return child
    return None


def rollouts_waiting_on(model: psutil.Process) -> int:
    """Connections the hung model server has accepted: each is a model call of a rollout in flight. Over TCP, or
    over the Unix socket beside its port (a caller on this machine: transport/local_socket.py), whose accepted
    connections carry the listener's name."""
    listening = {c.laddr.port for c in model.net_connections("tcp") if c.status == psutil.CONN_LISTEN}
    tcp = sum(1 for c in model.net_connections("tcp") if c.status == "ESTABLISHED" and c.laddr.port in listening)
    names = [c.laddr for c in model.net_connections("unix") if str(c.laddr).startswith("@nemo-gym-")]
    return tcp + max(len(names) - len(set(names)), 0)  # less one listener per name


@pytest.mark.parametrize("model_state", ["hung", "frozen"])
def test_every_server_of_a_sigkilled_eval_run_is_gone_within_15_s(tmp_path: Path, model_state: str) -> None:
    """Hung: the model never answers, so the agent waits on it. Frozen: the model server is SIGSTOPped as well,
    so it cannot act on any signal but SIGKILL."""
    proc, log = start_eval_run(tmp_path)
    run = psutil.Process(proc.pid)
    started: list[psutil.Process] = []
    try:
        model = wait_until(lambda: model_server(run), HANG_GUARD_S, "model server", proc, log)
        assert model is not None
        wait_until(lambda: rollouts_waiting_on(model) > 0, HANG_GUARD_S, "rollout in flight", proc, log)
        started = run.children(recursive=True)  # the servers, anything they started, and the run's reaper
        assert len(started) >= 4, started
        config_files = list((tmp_path / "results" / "run").glob(f"*/{CONFIG_FILE}"))
        assert len(config_files) == 1
        if model_state == "frozen":
            model.send_signal(signal.SIGSTOP)
            wait_until(lambda: model.status() == psutil.STATUS_STOPPED, HANG_GUARD_S, "stopped model server")

        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=HANG_GUARD_S)
        deadline = time.monotonic() + GONE_WITHIN_S
        while time.monotonic() < deadline and not all(gone(p) for p in started):
            time.sleep(0.1)
        alive = [f"{p.pid} {' '.join(p.cmdline())}" for p in started if not gone(p)]
        assert alive == [], f"still running {GONE_WITHIN_S:g} s after the run was SIGKILLed"
        assert not config_files[0].exists(), "the dead run's config file (it holds secrets) was left behind"
    finally:
        for process in [run, *started]:
            if not gone(process):
                process.kill()


# ----------------------------------------------------------------------------------------------------------------------
# Run config files of dead launchers


def dead_process() -> tuple[int, float]:
    """The pid and start time of a process that has exited."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    created = psutil.Process(child.pid).create_time()
    child.wait()
    return child.pid, created


def plant_run_dir(run_root: Path, name: str, owner: str) -> Path:
    run_dir = run_root / name
    write(run_dir / CONFIG_FILE, "policy_api_key: sk-left-behind\n")
    write(run_dir / OWNER_FILE, owner + "\n")
    return run_dir


def test_sweep_removes_dead_launchers_files_only(tmp_path: Path) -> None:
    host = socket.gethostname()
    pid, created = dead_process()
    me = psutil.Process()
    dead = plant_run_dir(tmp_path, "dead", f"{host} {pid} {created}")
    reused = plant_run_dir(tmp_path, "reused", f"{host} {me.pid} {me.create_time() - 100}")  # same pid, other process
    live = plant_run_dir(tmp_path, "live", f"{host} {me.pid} {me.create_time()}")
    elsewhere = plant_run_dir(tmp_path, "elsewhere", f"another-host {pid} {created}")  # its pid means nothing here
    unowned = write(tmp_path / "unowned" / CONFIG_FILE, "x: 1\n").parent  # being written, or an older version's
    extra = plant_run_dir(tmp_path, "extra", f"{host} {pid} {created}")
    write(extra / "notes.txt", "someone else's file\n")

    assert sorted(sweep_dead_runs(tmp_path)) == sorted([dead, reused, extra])
    assert not dead.exists() and not reused.exists()
    assert (live / CONFIG_FILE).exists() and (elsewhere / CONFIG_FILE).exists() and (unowned / CONFIG_FILE).exists()
    assert sorted(p.name for p in extra.iterdir()) == ["notes.txt"]  # ours went, the rest stays


def test_a_sigkilled_launchers_config_is_swept_at_the_next_start_and_a_live_runs_kept(server_root: Path) -> None:
    """A leftover whose reaper died too (``kill -9`` of both, a reboot) goes at the next start; a live run's stays."""
    config = write(server_root / "config.yaml", server_block("echo_a", "echo"))
    run_root = server_root / "results" / "run"
    pid, created = dead_process()
    leftover = plant_run_dir(run_root, "20260101-000000-1", f"{socket.gethostname()} {pid} {created}")
    with running_servers(base_overrides(server_root, config)) as live_run:
        assert not leftover.exists()
        assert live_run.config_path is not None and live_run.config_path.exists()
        with running_servers(base_overrides(server_root, config)) as second_run:
            assert live_run.config_path.exists(), "a live run's config file was swept"
            assert second_run.config_path != live_run.config_path
        assert live_run.config_path.exists()
    assert list(run_root.iterdir()) == []


# ----------------------------------------------------------------------------------------------------------------------
# Bounded graceful shutdown


def test_sigterm_gives_a_hung_request_a_bounded_grace_then_the_server_exits_by_itself(tmp_path: Path) -> None:
    """Before, uvicorn waited for every in-flight request, so an orderly stop of a hung model server always ended
    in the launcher's SIGKILL; now the server cancels the request after GRACEFUL_SHUTDOWN_S and exits on SIGTERM."""
    model_config = INSTALL_DIR / "responses_api_models" / "scripted_model" / "configs" / "scripted_model.yaml"
    overrides = [
        f"+config_paths=[{model_config}]", f"++results_dir={tmp_path / 'results'}", "++head_server.port=0",
        "++shared_venv=true", HUNG, "+server_supervision={enabled: false}",  # no health probes counted as requests
    ]  # fmt: skip
    answered: list[BaseException | int] = []
    with running_servers(overrides, shutdown_grace_s=GRACEFUL_SHUTDOWN_S + 60) as run:
        server = run.servers[0]
        model = psutil.Process(server.popen.pid)  # type: ignore[union-attr]

        def call() -> None:
            request = urllib.request.Request(
                server.url + "/v1/responses",
                data=b'{"input": "hi"}',
                headers={"Content-Type": "application/json", **run_headers(server.url)},
            )
            try:
                with urllib.request.urlopen(request, timeout=HANG_GUARD_S) as response:
                    answered.append(response.status)
            except (urllib.error.URLError, OSError) as error:
                answered.append(error)

        caller = threading.Thread(target=call, daemon=True)
        caller.start()
        wait_until(lambda: rollouts_waiting_on(model) > 0, HANG_GUARD_S, "request in flight")
    caller.join(timeout=HANG_GUARD_S)
    assert server.popen is not None and server.popen.returncode == -signal.SIGTERM, server.sink.tail()
    assert answered and not isinstance(answered[0], int), "the hung request was answered"
