"""A real two-node Ray cluster on this machine, for the tests of a launch on Ray (issue 18).

``ray start --head`` on 127.0.0.1 with its own ports, temp dir and token, then a second ``ray start`` joining it with
its own custom resource ``{"node2": 1}``. Each runs with ``--block`` in its own session, so the test owns both process
groups: killing the second one is losing a node, and teardown kills both groups (and every process they started)
without touching any other Ray on the machine. Memory stays modest: 100 MB object stores, one or two CPUs, no
dashboard.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

from nemo_gym import PARENT_DIR
from nemo_gym.config.ports import probe_free_port

RAY = Path(sys.executable).parent / "ray"
HANG_GUARD_S = 120.0
"""A cluster starts in ~15 s on a loaded machine; this bounds a start that hangs."""
OBJECT_STORE_BYTES = 100 * 1024 * 1024


WORKER_PORTS = 41
"""Ports of one node's worker range (``--min-worker-port`` .. ``--max-worker-port``)."""


def _free_ports(count: int, taken: list[int]) -> list[int]:
    """Free ports outside the ephemeral range (which outgoing connections take ports from), distinct from ``taken``
    and from each other; they are added to ``taken``, so every port of one cluster is different."""
    ports: list[int] = []
    for _ in range(count):
        ports.append(probe_free_port(disallowed=taken))
        taken.append(ports[-1])
    return ports


def _worker_ports(taken: list[int]) -> list[str]:
    """A node's worker port range, none of whose ports is in ``taken`` (Ray refuses a node whose components share a
    port, as a random range over the runtime-env agent's port once did); its ports are added to ``taken``."""
    for _ in range(50):
        low = probe_free_port(disallowed=taken)
        span = range(low, low + WORKER_PORTS)
        if span.stop < 65535 and not any(port in span for port in taken):
            taken.extend(span)
            return [f"--min-worker-port={low}", f"--max-worker-port={span[-1]}"]
    return []  # Ray picks the workers' ports itself


def _kill_group(process: subprocess.Popen) -> None:
    """SIGKILL a ``ray start --block`` and everything it started (raylet, workers, the servers they spawned)."""
    with contextlib.suppress(psutil.Error):
        family = psutil.Process(process.pid).children(recursive=True)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    for child in locals().get("family", []):
        with contextlib.suppress(psutil.Error):
            child.kill()
    process.wait(timeout=30)


@dataclass
class RayCluster:
    address: str
    env: dict[str, str]
    workdir: Path
    head: subprocess.Popen
    taken: list[int]
    """Every port the cluster's nodes were given: a node joining later gets none of them."""
    node2: subprocess.Popen | None = None
    logs: list[Path] = field(default_factory=list)

    def start_node2(self) -> None:
        workers = _worker_ports(self.taken)
        node_manager, object_manager, agent_listen, agent_grpc, runtime_env, metrics = _free_ports(6, self.taken)
        log = self.workdir / f"node2-{len(self.logs)}.log"
        self.logs.append(log)
        self.node2 = _ray_start(
            [f"--address={self.address}", "--num-cpus=1", '--resources={"node2": 1}',
             f"--node-manager-port={node_manager}", f"--object-manager-port={object_manager}",
             f"--dashboard-agent-listen-port={agent_listen}", f"--dashboard-agent-grpc-port={agent_grpc}",
             f"--runtime-env-agent-port={runtime_env}", f"--metrics-export-port={metrics}", *workers],
            self.env, log,
        )  # fmt: skip
        self.wait_for_nodes(2)

    def kill_node2(self) -> None:
        """Lose the second node: SIGKILL its raylet, its workers and the servers they started, all at once."""
        assert self.node2 is not None
        _kill_group(self.node2)
        self.node2 = None

    def wait_for_nodes(self, count: int) -> None:
        """Until exactly ``count`` nodes are alive (asked from one short-lived driver, polling every 0.2 s)."""
        script = (
            "import sys, time, ray\n"
            f"ray.init(address={self.address!r}, log_to_driver=False)\n"
            f"while sum(n['Alive'] for n in ray.nodes()) != {count}: time.sleep(0.2)\n"
        )
        try:
            done = subprocess.run([sys.executable, "-c", script], env=self.env, capture_output=True,
                                  timeout=HANG_GUARD_S)  # fmt: skip
        except subprocess.TimeoutExpired:
            pytest.fail(f"the cluster did not reach {count} alive nodes in {HANG_GUARD_S} s (logs in {self.workdir})")
        assert done.returncode == 0, done.stderr.decode()[-2000:]

    def stop(self) -> None:
        for process in (self.node2, self.head):
            if process is not None:
                _kill_group(process)
        self.node2 = None


def _ray_start(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    with log.open("wb") as out:
        return subprocess.Popen(
            [str(RAY), "start", "--block", "--disable-usage-stats",
             f"--object-store-memory={OBJECT_STORE_BYTES}", *args],
            env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip


@pytest.fixture(scope="package")
def ray_cluster() -> Iterator[RayCluster]:
    """Head (2 CPUs) + node2 (1 CPU, resource ``node2``), joined with a token of their own; killed at the end."""
    workdir = Path(tempfile.mkdtemp(prefix="rt", dir="/tmp"))  # short: Ray's socket paths must fit 107 bytes
    token = workdir / "token"
    token.write_text(secrets.token_hex(32))
    env = os.environ | {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token),
                        "RAY_health_check_period_ms": "1000", "RAY_health_check_failure_threshold": "3",
                        # Ray workers import functions by module name (tests.ray.burn): the checkout is the code
                        "PYTHONPATH": os.pathsep.join(p for p in (str(PARENT_DIR), os.environ.get("PYTHONPATH")) if p)}  # fmt: skip
    taken: list[int] = []
    workers = _worker_ports(taken)
    gcs, node_manager, object_manager, client, agent_listen, agent_grpc, runtime_env, metrics = _free_ports(8, taken)
    head = _ray_start(
        ["--head", "--node-ip-address=127.0.0.1", f"--port={gcs}", "--num-cpus=2", f"--temp-dir={workdir}",
         "--include-dashboard=false", f"--node-manager-port={node_manager}",
         f"--object-manager-port={object_manager}", f"--ray-client-server-port={client}",
         f"--dashboard-agent-listen-port={agent_listen}", f"--dashboard-agent-grpc-port={agent_grpc}",
         f"--runtime-env-agent-port={runtime_env}", f"--metrics-export-port={metrics}", *workers],
        env, workdir / "head.log",
    )  # fmt: skip
    cluster = RayCluster(f"127.0.0.1:{gcs}", env, workdir, head, taken)
    try:
        cluster.wait_for_nodes(1)
        cluster.start_node2()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def ray_env(ray_cluster: RayCluster, monkeypatch: pytest.MonkeyPatch) -> RayCluster:
    """This process joins the cluster with its token (the launcher's ``ray.init``), two nodes up."""
    for key in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH"):
        monkeypatch.setenv(key, ray_cluster.env[key])
    if ray_cluster.node2 is None:
        ray_cluster.start_node2()
    return ray_cluster
