"""A head-server port held by another process: the error names the holder and the override, not `gym env status`."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from nemo_gym.errors import ConfigError
from nemo_gym.launcher.head_server import bind_head_socket
from nemo_gym.launcher.port_holder import describe_holder, port_holder

LISTEN = (
    "import socket, sys; s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(); "
    "print(s.getsockname()[1], flush=True); sys.stdin.read()"
)


@pytest.fixture
def listener(request: pytest.FixtureRequest) -> Iterator[tuple[int, int]]:
    """(pid, port) of a child process listening on a plain socket; ``request.param`` is extra argv for its name."""
    args = [sys.executable, "-c", LISTEN, *getattr(request, "param", [])]
    child = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    try:
        yield child.pid, int(child.stdout.readline())
    finally:
        child.kill()
        child.wait(timeout=30)


def test_a_port_held_by_a_plain_socket_names_that_process_and_the_override(listener: tuple[int, int]) -> None:
    pid, port = listener
    with pytest.raises(ConfigError) as caught:
        bind_head_socket("127.0.0.1", port)
    message = str(caught.value)
    assert f"cannot listen on 127.0.0.1:{port}: the port is held by pid {pid} (" in message
    assert "which is not a gym server" in message and "+head_server.port=<port>" in message
    assert "gym env status" not in message and "\n" not in message


@pytest.mark.parametrize("listener", [["nemo_gym.cli.main", "env", "start"]], indirect=True)
def test_a_port_held_by_another_gym_run_points_at_gym_env_status(listener: tuple[int, int]) -> None:
    pid, port = listener
    holder = port_holder(port)
    assert holder is not None and holder.pid == pid and holder.is_gym
    assert describe_holder(port).startswith(f"held by another gym run (pid {pid}: ") and "gym env status" in (
        describe_holder(port)
    )


def test_a_holder_that_cannot_be_seen_is_not_blamed_on_gym(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        (tmp_path / "net").mkdir()  # a /proc with no process in it: the socket's owner is out of sight
        (tmp_path / "net" / "tcp").write_text(Path("/proc/net/tcp").read_text())
        assert port_holder(port, tmp_path) is None
        told = describe_holder(port, tmp_path)
        assert "cannot see" in told and "not a gym run of this user" in told
        assert port_holder(port) is not None and port_holder(port).pid == os.getpid()  # type: ignore[union-attr]
