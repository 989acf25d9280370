"""One server process of a launch: where it lives, how it runs, and how its failures are told.

Shared by the local :class:`~nemo_gym.launcher.runner.Launcher` and the Ray one (``ray_placement.py``), which fill the
same record for servers they place on other nodes.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nemo_gym.errors import LaunchError
from nemo_gym.launcher.processes import LogSink
from nemo_gym.launcher.venvs import VenvSpec

KIND_LABELS = {"responses_api_models": "model server", "resources_servers": "resources server",
               "responses_api_agents": "agent server", "environment_servers": "environment server"}  # fmt: skip
"""How ``/server_instances`` and ``gym env status`` name each server kind."""
LOG_TAIL_LINES = 20
"""Lines of a server's log quoted in the error that names it."""


class ServerLaunchError(LaunchError):
    """A server could not be built, started, or kept running; the message names it and quotes its log."""


@dataclass
class ServerProcess:
    """One server instance of a launch: where it lives, how it runs, and its process once started."""

    name: str
    server_type: str
    implementation: str
    host: str
    port: int
    impl_dir: Path
    root: Path
    entrypoint: Path
    sink: LogSink
    python: str | None = None
    venv: VenvSpec | None = None
    popen: subprocess.Popen | None = None
    reader: threading.Thread | None = None
    started_at: str | None = None
    ready: bool = False
    instance: str = ""
    """The config instance this server runs (set for a replica, ``<instance>@<i>``, placed by Ray); "" for itself."""
    node: str | None = None
    """The Ray node it runs on (``launcher/ray_placement.py``); None on this machine."""
    remote_pid: int | None = None
    log_path: Path | None = None
    """Where its output goes when another process writes it (its node); None: :attr:`sink`'s file."""

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def label(self) -> str:
        return f"{self.server_type}/{self.implementation}"

    def as_dict(self) -> dict[str, Any]:
        """The entry served by the head server's ``/server_instances``."""
        return {
            "name": self.name,
            "server_type": self.server_type,
            "kind": KIND_LABELS.get(self.server_type, self.server_type),
            "implementation": self.implementation,
            "host": self.host,
            "port": self.port,
            "url": self.url,
            "pid": self.popen.pid if self.popen else self.remote_pid,
            "log_path": str(self.log_path or self.sink.path),
            "started_at": self.started_at,
            "ready": self.ready,
            "dir_path": str(self.impl_dir),
            "entrypoint": str(self.entrypoint),
            "python": self.python,
            "instance": self.instance or self.name,
            "node": self.node,
        }


def describe_exit(code: int | None) -> str:
    if code is None:
        return "is still running"
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by {signal.Signals(-code).name}"
        return f"was killed by signal {-code}"
    return f"exited with code {code}"


def tail_text(sink: LogSink) -> str:
    lines = sink.tail(LOG_TAIL_LINES)
    if not lines:
        return f"Its log {sink.path} is empty."
    return f"Last {len(lines)} lines of {sink.path}:\n" + "\n".join(f"  | {line}" for line in lines)
