"""The launcher with real server processes, in shared-venv mode (no venv builds) so each launch takes seconds."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import stat
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from nemo_gym.cli.main import main
from nemo_gym.errors import ConfigError, NeMoGymError
from nemo_gym.launcher import ServerLaunchError, running_servers
from tests.helpers import run_headers, write
from tests.launcher.conftest import base_overrides, server_block

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

HANG_GUARD_S = 60.0
"""The longest any wait below may take before the test fails: reached only when something hangs, never because the
machine is busy (every wait returns as soon as its condition holds)."""


def get_json(url: str) -> Any:
    request = urllib.request.Request(url, headers=run_headers(url, urllib.parse.urlsplit(url).port))
    with urllib.request.urlopen(request, timeout=HANG_GUARD_S) as response:
        return json.loads(response.read())


def gone(pid: int) -> bool:
    """Exited (a zombie waiting for a non-reaping init counts as gone)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def still_running(pids: list[int]) -> list[int]:
    return [pid for pid in pids if not gone(pid)]


def wait_gone(pids: list[int], timeout_s: float = HANG_GUARD_S) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        alive = [pid for pid in pids if not gone(pid)]
        if not alive:
            return []
        time.sleep(0.1)
    return [pid for pid in pids if not gone(pid)]


def two_servers(root: Path, **extra_b: object) -> Path:
    return write(
        root / "config.yaml",
        "my_api_key: sk-test-very-secret\n"
        + server_block("echo_a", "echo")
        + server_block("echo_b", "echo", **extra_b),
    )


def test_servers_start_answer_and_stop(server_root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = two_servers(server_root)
    with running_servers(base_overrides(server_root, config), echo=True) as run:
        assert set(run.urls) == {"echo_a", "echo_b"}
        infos = {name: get_json(url + "/info") for name, url in run.urls.items()}
        assert infos["echo_a"]["name"] == "echo_a"
        # The child reads the unmasked config from the file; it runs in its implementation dir with the contract env.
        assert infos["echo_a"]["secret"] == "sk-test-very-secret"
        impl_dir = server_root / "resources_servers" / "echo"
        assert Path(infos["echo_b"]["cwd"]) == impl_dir
        assert infos["echo_b"]["pythonpath"].split(os.pathsep)[:2] == [str(impl_dir), str(server_root)]
        assert infos["echo_a"]["python"] == sys.executable

        assert get_json(run.head_url + "/") == {"status": "ok"}
        instances = {i["name"]: i for i in get_json(run.head_url + "/server_instances")}
        assert instances["echo_a"]["pid"] == infos["echo_a"]["pid"]
        assert instances["echo_b"]["url"] == run.urls["echo_b"]
        assert {"server_type", "implementation", "host", "port", "log_path", "started_at"} <= set(instances["echo_a"])

        masked = get_json(run.head_url + "/global_config_dict_yaml")
        assert "sk-test-very-secret" not in masked
        assert yaml.safe_load(masked)["my_api_key"] == "****"

        assert run.config_path is not None
        assert stat.S_IMODE(run.config_path.stat().st_mode) == 0o600
        assert "sk-test-very-secret" in run.config_path.read_text()
        assert run.config_path.parent.parent == server_root / "results" / "run"
        pids = [infos["echo_a"]["pid"], infos["echo_b"]["pid"]]
    assert still_running(pids) == []  # stopping reaps the servers before it returns: no waiting needed
    out = capsys.readouterr().out
    assert "(echo_a) echo_a starting" in out
    log = (server_root / "results" / "logs" / "echo_b.log").read_text()
    assert "echo_b starting" in log and "(echo_b)" not in log


def test_status_lists_healthy_servers(server_root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = write(server_root / "config.yaml", server_block("echo_a", "echo"))
    with running_servers(base_overrides(server_root, config)) as run:
        port = run.config.head_server.port
        capsys.readouterr()
        assert main(["env", "status", f"+head_server.port={port}"]) == 0
        out = capsys.readouterr().out
        assert re.search(r"echo_a\s+resources_servers/echo\s+http://127\.0\.0\.1:\d+\s+\d+\s+healthy", out), out
        assert "1 / 1 servers healthy" in out

        assert main(["env", "status", "--json", f"+head_server.port={port}"]) == 0
        payload = json.loads(capsys.readouterr().out)
        assert payload["running"] is True
        assert [(s["name"], s["healthy"]) for s in payload["servers"]] == [("echo_a", True)]

        # Stop the server behind the head server's back: status reports it unhealthy and exits non-zero.
        os.kill(payload["servers"][0]["pid"], signal.SIGKILL)
        assert wait_gone([payload["servers"][0]["pid"]]) == []
        assert main(["env", "status", f"+head_server.port={port}"]) == 1
        assert "unhealthy" in capsys.readouterr().out


def test_dry_run_prepares_and_starts_nothing(server_root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = two_servers(server_root)
    assert main(["env", "start", *base_overrides(server_root, config), "++dry_run=true"]) == 0
    assert "nothing was started" in capsys.readouterr().out
    assert "shared venv" in (server_root / "results" / "logs" / "echo_a.log").read_text()


def test_status_without_head_server(server_root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound but not listening: nothing answers there
        assert main(["env", "status", f"+head_server.port={port}"]) == 1
    assert f"No NeMo Gym servers are running (no head server at 127.0.0.1:{port})" in capsys.readouterr().err


def test_crash_at_startup_names_the_server_and_quotes_its_log(server_root: Path) -> None:
    config = two_servers(server_root, crash="true")
    with pytest.raises(ServerLaunchError) as info:
        with running_servers(base_overrides(server_root, config)):
            pytest.fail("the launch should have failed")
    message = str(info.value)
    assert "server 'echo_b'" in message and "exited with code 3 during startup" in message
    assert "boom: failing on purpose" in message
    assert str(server_root / "results" / "logs" / "echo_b.log") in message
    assert isinstance(info.value, NeMoGymError)  # the CLI prints it as one line


def test_server_not_ready_in_time(server_root: Path) -> None:
    # One server that never listens (only the startup timeout can end the launch; the test's own timeout guards that),
    # and a timeout far above the moment it takes to log "starting", which it does before any slow import.
    config = write(server_root / "config.yaml", server_block("echo_b", "echo", startup_delay=3600))
    with pytest.raises(ServerLaunchError, match=r"server 'echo_b' .*did not become ready in 10 s") as info:
        with running_servers([*base_overrides(server_root, config), "++server_startup_timeout_seconds=10"]):
            pytest.fail("the launch should have failed")
    assert "echo_b starting" in str(info.value)


def test_server_dying_later_is_reported_when_supervision_is_off(server_root: Path) -> None:
    config = two_servers(server_root)
    overrides = [*base_overrides(server_root, config), "+server_supervision={enabled: false}"]
    with running_servers(overrides) as run:
        victim = next(s for s in run.servers if s.name == "echo_a")
        assert victim.popen is not None
        os.kill(victim.popen.pid, signal.SIGKILL)
        with pytest.raises(ServerLaunchError, match=r"server 'echo_a' .*was killed by SIGKILL unexpectedly"):
            run.wait(poll_s=0.1)


def test_a_killed_server_is_reaped_and_restarted_on_its_own_address(
    server_root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = two_servers(server_root)
    overrides = [*base_overrides(server_root, config), "+server_supervision={backoff_s: 0.1}"]
    with running_servers(overrides) as run:
        victim = next(s for s in run.servers if s.name == "echo_a")
        assert victim.popen is not None
        old_pid, url = victim.popen.pid, victim.url
        os.kill(old_pid, signal.SIGKILL)
        deadline = time.monotonic() + 120
        while not (victim.ready and victim.popen.pid != old_pid):
            assert time.monotonic() < deadline, "not restarted"
            time.sleep(0.1)
        assert victim.url == url
        with pytest.raises(psutil.NoSuchProcess):
            psutil.Process(old_pid)  # reaped at once: not even a zombie
        listed = {s["name"]: s for s in run.server_instances()}
        assert listed["echo_a"]["pid"] == victim.popen.pid and listed["echo_a"]["url"] == url
        with urllib.request.urlopen(urllib.request.Request(f"{url}/", headers=run_headers(url))) as answer:
            assert answer.status == 200
    err = capsys.readouterr().err
    assert "server 'echo_a' (resources_servers/echo) was killed by SIGKILL; restarting it on " + url in err
    assert "server 'echo_a' (resources_servers/echo) is back on " + url in err


def test_a_server_that_keeps_dying_is_given_up_on_and_wait_raises(server_root: Path) -> None:
    config = two_servers(server_root)
    overrides = [*base_overrides(server_root, config), "+server_supervision={max_restarts: 0}"]
    # The launch runs in this (the main) thread, so the failure interrupts it wherever it is, as it does a collection.
    with pytest.raises(ServerLaunchError, match=r"server 'echo_a' .*was killed by SIGKILL; given up on after 0"):
        with running_servers(overrides) as run:
            victim = next(s for s in run.servers if s.name == "echo_a")
            assert victim.popen is not None
            os.kill(victim.popen.pid, signal.SIGKILL)
            run.wait(poll_s=0.1)


def test_head_port_taken_is_one_clear_error(server_root: Path) -> None:
    config = two_servers(server_root)
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        port = blocker.getsockname()[1]
        overrides = [*base_overrides(server_root, config), f"++head_server.port={port}"]
        with pytest.raises(
            ConfigError, match=rf"head server cannot listen on 127\.0\.0\.1:{port}.*\+head_server\.port="
        ):
            with running_servers(overrides):
                pytest.fail("the launch should have failed")


def test_missing_implementation_or_entrypoint(server_root: Path) -> None:
    config = write(server_root / "config.yaml", server_block("ghost", "no_such_impl"))
    with pytest.raises(ConfigError, match=r"ghost\.resources_servers\.no_such_impl: implementation directory"):
        with running_servers(base_overrides(server_root, config)):
            pass
    write(server_root / "resources_servers" / "empty" / "README.md", "")
    config = write(server_root / "config.yaml", server_block("hollow", "empty"))
    with pytest.raises(ConfigError, match=r"hollow\.resources_servers\.empty\.entrypoint: 'app.py' not found"):
        with running_servers(base_overrides(server_root, config)):
            pass


def start_cli_launcher(root: Path, config: Path, extra: list[str]) -> tuple[subprocess.Popen, Path]:
    """``gym env start`` as a real process; returns it and the file its output goes to."""
    out_path = root / "launcher.out"
    command = [sys.executable, "-m", "nemo_gym.cli.main", "env", "start", *base_overrides(root, config), *extra]
    with open(out_path, "wb") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, cwd=root, env=dict(os.environ))
    return proc, out_path


def wait_for_banner(proc: subprocess.Popen, out_path: Path, timeout_s: float = 240.0) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text = out_path.read_text(errors="replace")
        match = re.search(r"Head server: (http://\S+)", text)
        if match:
            return match.group(1)
        if proc.poll() is not None:
            pytest.fail(f"gym env start exited early ({proc.returncode}):\n{text}")
        time.sleep(0.1)
    proc.kill()
    pytest.fail(f"no ready banner:\n{out_path.read_text(errors='replace')}")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_killing_the_launcher_leaves_no_child(server_root: Path, sig: signal.Signals) -> None:
    config = two_servers(server_root, spawn_grandchild="true")
    proc, out_path = start_cli_launcher(server_root, config, [])
    grandchild = None
    try:
        head_url = wait_for_banner(proc, out_path)
        instances = get_json(head_url + "/server_instances")
        pids = [i["pid"] for i in instances]
        grandchild = get_json(next(i["url"] for i in instances if i["name"] == "echo_b") + "/info")["grandchild"]
        assert all(not gone(pid) for pid in [*pids, grandchild])
        proc.send_signal(sig)
        code = proc.wait(timeout=HANG_GUARD_S)
        if sig == signal.SIGTERM:
            assert code == 0, out_path.read_text()
            assert "NeMo Gym servers stopped." in out_path.read_text()
            # An orderly stop takes the whole process group of each server, grandchildren included.
            assert wait_gone([*pids, grandchild]) == []
        else:
            # SIGKILL leaves no chance to clean up: the parent-death signal and the run's reaper stop the servers, and
            # the reaper their process groups, grandchildren included.
            assert wait_gone([*pids, grandchild]) == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if grandchild is not None and not gone(grandchild):
            os.kill(grandchild, signal.SIGKILL)
