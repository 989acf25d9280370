"""Servers started by the launcher answer calls from this machine on a Unix socket beside their loopback port.

Rollouts run the same either way; what changes is the kernel path under them. Each test starts the test
environment's stack (scripted model, simple agent, resources server) as separate processes, runs rollouts through
the agent, and looks at which sockets the model and resources servers hold the agent's pooled connections on.
"""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import psutil
import pytest

from nemo_gym.launcher import running_servers
from nemo_gym.transport import http_client, lean_client, local_socket
from tests.rollouts.conftest import reward_of, stack_overrides

pytestmark = pytest.mark.timeout(180)

AGENT = "rollout_test_agent"


def _listening(url: str) -> bool:
    host, _, port = url.removeprefix("http://").rpartition(":")
    name = local_socket.address(host, int(port))
    assert name is not None
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(name)
        return True
    except OSError:
        return False
    finally:
        probe.close()


async def _rollouts(run: object, count: int) -> list[float]:
    async def one(task: int) -> float:
        row = {"responses_create_params": {"input": f"question {task}"}, "expected_reward": reward_of(task)}
        answer = await http_client.request("POST", f"{run.urls[AGENT]}/run", json=row)  # type: ignore[attr-defined]
        http_client.raise_for_status(answer)
        return (await http_client.response_json(answer))["reward"]

    try:
        return await asyncio.gather(*(one(task) for task in range(count)))
    finally:
        await http_client.close_session()


def _accepted(run: object) -> dict[str, tuple[int, int]]:
    """Per server the agent calls (model, resources): (sockets at its Unix address, the listener included; TCP
    connections to its port), after the rollouts, while the agent's pooled connections are kept alive."""
    found = {}
    for server in run.servers:  # type: ignore[attr-defined]
        if server.name == AGENT:
            continue
        process = psutil.Process(server.popen.pid)
        port = int(run.urls[server.name].rsplit(":", 1)[1])  # type: ignore[attr-defined]
        name = f"@nemo-gym-127.0.0.1-{port}"
        unix = sum(1 for c in process.net_connections(kind="unix") if c.laddr == name)
        tcp = sum(1 for c in process.net_connections(kind="tcp") if c.raddr and c.laddr.port == port)
        found[server.name] = (unix, tcp)
    return found


def test_calls_between_the_servers_of_a_run_go_over_their_unix_sockets(workdir: Path, extra_root: Path) -> None:
    # Without the launcher's health probes, whose TCP connections (one a second) would be counted here too.
    with running_servers(stack_overrides(workdir, "+server_supervision={enabled: false}")) as run:
        assert all(_listening(url) for url in run.urls.values())
        rewards = asyncio.run(_rollouts(run, 8))
        accepted = _accepted(run)
    assert rewards == [reward_of(task) for task in range(8)]
    assert len(accepted) == 2 and all(unix >= 2 and tcp == 0 for unix, tcp in accepted.values()), accepted
    pools = [pool for pools in lean_client._pools.values() for pool in pools.values()]
    assert not pools  # this process's pools were closed with its session


def test_server_unix_socket_false_keeps_every_call_on_tcp(workdir: Path, extra_root: Path) -> None:
    with running_servers(stack_overrides(workdir, "+server_unix_socket=false")) as run:
        assert not any(_listening(url) for url in run.urls.values())
        rewards = asyncio.run(_rollouts(run, 8))
        accepted = _accepted(run)
    assert rewards == [reward_of(task) for task in range(8)]
    assert len(accepted) == 2 and all(unix == 0 and tcp >= 1 for unix, tcp in accepted.values()), accepted
