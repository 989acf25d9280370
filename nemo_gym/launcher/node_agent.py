"""The part of a Ray launch that runs on each cluster node: it starts our normal server processes there.

Ray places one :class:`NodeAgent` actor per node (``launcher/ray_placement.py`` pins it with a node-affinity
strategy). The actor does on its node what :class:`~nemo_gym.launcher.runner.Launcher` does on one machine, with the
same helpers: it binds each server's listening socket (so the launcher learns the port before any server starts),
writes the node's copy of the resolved config (mode 0600), builds or reuses each implementation's venv, and spawns
``<venv python> <entrypoint>`` with the inherited socket. Servers are tied to the actor's life
(``processes.spawn``: own process group, parent-death signal), and the actor is tied to the launcher by Ray (a
non-detached actor dies with its driver), so no server outlives a launch, and a lost node takes its servers with it.

This module never imports Ray: it is a plain class that ``ray_placement.py`` wraps with ``ray.remote``.
"""

from __future__ import annotations

import os
import platform
import shutil
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nemo_gym.config import ports
from nemo_gym.global_config import NEMO_GYM_CONFIG_FILE_ENV_VAR_NAME, NEMO_GYM_CONFIG_PATH_ENV_VAR_NAME
from nemo_gym.launcher.processes import (
    LogSink,
    exit_code,
    read_lines_into,
    server_pythonpath,
    spawn,
    stop_process_groups,
)
from nemo_gym.launcher.venvs import BuildContext, build_venv, venv_spec
from nemo_gym.verifiers.offload import RAY_ADDRESS_ENV_VAR

__all__ = ["NodeAgent", "ServerSpec", "advertised_host"]

_WILDCARD_HOSTS = ("", "0.0.0.0", "::")


def advertised_host(bind_host: str, node_ip: str) -> str:
    """The address other nodes use: the node's IP for a wildcard bind, else the host bound."""
    return node_ip if bind_host in _WILDCARD_HOSTS else bind_host


@dataclass(frozen=True)
class ServerSpec:
    """What a node needs to start one server: the names, where its code is, and how its interpreter is made."""

    name: str
    """The replica's name (``<instance>@<i>`` for a replicated instance), its log file's name."""
    instance: str
    """The config's instance name: ``NEMO_GYM_CONFIG_PATH``, the block the server reads."""
    server_type: str
    implementation: str
    impl_dir: str
    root: str
    entrypoint: str
    shared_venv: bool
    cache_dir: str
    python_version: str


class NodeAgent:
    """Starts, watches and stops the servers placed on this node (one Ray actor per node)."""

    def __init__(self, log_dir: str) -> None:
        self.log_dir = Path(log_dir)
        self._procs: dict[str, Any] = {}
        self._readers: list[threading.Thread] = []
        self._sinks: list[LogSink] = []
        self._config_dir: str | None = None

    def node_ip(self) -> str:
        """This node's IP as other nodes reach it."""
        import ray.util  # this class only ever runs as a Ray actor

        return str(ray.util.get_node_ip_address())

    def _gcs_address(self) -> str:
        import ray

        return str(ray.get_runtime_context().gcs_address)

    def reserve(self, hosts: dict[str, str]) -> dict[str, tuple[str, int]]:
        """Bind a listening socket for each server (``name -> bind host``); ``name -> (advertised host, port)``."""
        node_ip = self.node_ip()
        placed = {}
        for name, host in hosts.items():
            reservation = ports.reserve_port(name, host)
            placed[name] = (advertised_host(host, node_ip), reservation.port)
        return placed

    def start(self, config_text: str, specs: list[ServerSpec], env: dict[str, str]) -> dict[str, int]:
        """Write this node's config, then build and start every server of ``specs``; ``name -> pid``."""
        self._config_dir = tempfile.mkdtemp(prefix="nemo-gym-node-")
        config_path = Path(self._config_dir) / "config.yaml"
        fd = os.open(config_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(config_text)
        pids = {}
        for spec in specs:
            sink = LogSink(spec.name, self.log_dir / f"{spec.name}.log", echo=False)
            self._sinks.append(sink)
            python = self._interpreter(spec, sink)
            reservation = ports.get_reservation(spec.name)
            assert reservation is not None, f"{spec.name} was not reserved on this node"
            child_env = {**os.environ, **env}
            child_env[NEMO_GYM_CONFIG_FILE_ENV_VAR_NAME] = str(config_path)
            child_env[NEMO_GYM_CONFIG_PATH_ENV_VAR_NAME] = spec.instance
            child_env[ports.LISTEN_FD_ENV_VAR] = str(reservation.fileno())
            child_env["PYTHONPATH"] = server_pythonpath(spec.impl_dir, spec.root, env.get("PYTHONPATH"))
            child_env["PYTHONUNBUFFERED"] = "1"
            child_env[RAY_ADDRESS_ENV_VAR] = self._gcs_address()  # verify offload (verifiers/offload.py) uses it
            if python != sys.executable:
                venv = Path(python).parent.parent
                child_env["VIRTUAL_ENV"] = str(venv)
                child_env["PATH"] = os.pathsep.join([str(venv / "bin"), child_env.get("PATH", "")])
            sink.note(f"starting {python} {spec.entrypoint} on node {self.node_ip()}")
            popen = spawn([python, spec.entrypoint], cwd=spec.impl_dir, env=child_env, pass_fds=[reservation.fileno()])
            self._procs[spec.name] = popen
            assert popen.stdout is not None
            reader = threading.Thread(target=read_lines_into, args=(popen.stdout, [sink]), daemon=True)
            reader.start()
            self._readers.append(reader)
            pids[spec.name] = popen.pid
        ports.release_all()  # the children hold the sockets now
        return pids

    def exited(self) -> dict[str, int]:
        """``name -> exit code`` of every server that is no longer running."""
        codes = {name: exit_code(popen) for name, popen in self._procs.items()}
        return {name: code for name, code in codes.items() if code is not None}

    def tail(self, name: str, lines: int = 20) -> list[str]:
        """The last lines of a server's log on this node (quoted in the launcher's errors)."""
        return next((sink.tail(lines) for sink in self._sinks if sink.name == name), [])

    def stop(self, grace_s: float) -> None:
        """Stop every server (SIGTERM, grace, SIGKILL) and remove this node's config file."""
        stop_process_groups(list(self._procs.values()), grace_s)
        for reader in self._readers:
            reader.join(timeout=2)
        for sink in self._sinks:
            sink.close()
        ports.release_all()
        if self._config_dir is not None:
            shutil.rmtree(self._config_dir, ignore_errors=True)

    def _interpreter(self, spec: ServerSpec, sink: LogSink) -> str:
        """This node's Python for shared venvs; otherwise the implementation's venv, built here if missing."""
        if spec.shared_venv:
            return sys.executable
        python_version = spec.python_version or platform.python_version()
        venv = venv_spec(
            spec.server_type, spec.implementation, Path(spec.impl_dir), Path(spec.cache_dir), python_version
        )
        return str(build_venv(venv, BuildContext(log=lambda line: sink.write(line, echo=False))))
