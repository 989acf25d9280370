"""The Unix socket beside a server's loopback port: which addresses get one, who the client will talk to there."""

from __future__ import annotations

import asyncio
import os
import signal
import socket

import pytest

from nemo_gym.config.ports import probe_free_port
from nemo_gym.errors import ConfigError
from nemo_gym.transport import local_socket

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(not hasattr(socket, "SO_PEERCRED"), reason="abstract Unix sockets are Linux's"),
]


async def _connect(name: str) -> socket.socket | None:
    return await local_socket.connect(asyncio.get_running_loop(), name)


def _free_port() -> int:
    return probe_free_port()  # outside the ephemeral range, which outgoing connections take ports from


@pytest.mark.parametrize(
    ("host", "expected"),
    [
        ("127.0.0.1", "\0nemo-gym-127.0.0.1-8000"),
        ("127.0.0.2", "\0nemo-gym-127.0.0.2-8000"),
        ("localhost", "\0nemo-gym-localhost-8000"),
        ("::1", "\0nemo-gym-::1-8000"),
        ("0.0.0.0", None),  # a server reachable from elsewhere: its callers may not be on this machine
        ("10.0.0.5", None),
        ("api.example.com", None),
    ],
)
def test_only_loopback_addresses_have_a_unix_socket(host: str, expected: str | None) -> None:
    assert local_socket.address(host, 8000) == expected


def test_a_listener_answers_and_nothing_else_does() -> None:
    port = _free_port()
    listener = local_socket.listen("127.0.0.1", port, 8)
    assert listener is not None
    name = local_socket.address("127.0.0.1", port)
    assert name is not None

    async def both() -> tuple[socket.socket | None, socket.socket | None]:
        return await _connect(name), await _connect(name + "-nobody")

    try:
        assert local_socket.listen("127.0.0.1", port, 8) is None  # taken: that server answers on TCP alone
        found, missing = asyncio.run(both())
        assert found is not None and missing is None
        found.close()
    finally:
        listener.close()
    assert asyncio.run(both()) == (None, None)  # closed with its server: no file left to go stale


@pytest.mark.skipif(not hasattr(os, "getuid") or os.getuid() != 0, reason="needs root to listen as another user")
def test_a_listener_of_another_user_never_gets_a_connection() -> None:
    """An abstract address has no permissions: someone else may take a server's name first. The client must not
    send them a request (and the run's token in it)."""
    port = _free_port()
    name = local_socket.address("127.0.0.1", port)
    assert name is not None
    ready_read, ready_write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the other user: listens under the name, then waits to be killed
        try:
            os.setuid(65534)
            squatter = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            squatter.bind(name)
            squatter.listen(8)
            os.write(ready_write, b"x")
            signal.pause()
        finally:
            os._exit(0)
    try:
        assert os.read(ready_read, 1) == b"x"
        assert asyncio.run(_connect(name)) is None
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(ready_read)
        os.close(ready_write)


@pytest.mark.parametrize(("config", "expected"), [({}, True), ({"server_unix_socket": False}, False)])
def test_the_setting_defaults_to_on(config: dict[str, object], expected: bool) -> None:
    assert local_socket.wanted(config) is expected


def test_a_setting_that_is_not_a_boolean_is_one_clear_error() -> None:
    with pytest.raises(ConfigError, match=r"^server_unix_socket must be true or false, not 'yes'$"):
        local_socket.wanted({"server_unix_socket": "yes"})
