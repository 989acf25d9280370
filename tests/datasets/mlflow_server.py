"""A real ``mlflow server`` on loopback for the registry tests, started as a subprocess and always torn down.

It uses a SQLite backend store and proxied artifacts (``--artifacts-destination``), so runs get ``mlflow-artifacts:/``
URIs and every byte goes through the server's HTTP API, as it does against GitLab.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from nemo_gym.config.ports import probe_free_port

STARTUP_TIMEOUT_S = 240.0
"""Cold starts import a lot (about 10 s on an idle 2-core machine, several times that on a loaded one)."""


def mlflow_server_missing() -> str | None:
    """Why ``mlflow server`` cannot run here, or None. The server lives in the full ``mlflow`` package only."""
    for module in ("mlflow", "flask", "sqlalchemy", "alembic"):
        if importlib.util.find_spec(module) is None:
            return f"`mlflow server` needs the full mlflow package ({module} is missing): pip install -e '.[mlflow-server]'"
    return None


def _free_port() -> int:
    return probe_free_port()  # outside the ephemeral range, which outgoing connections take ports from


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


@contextlib.contextmanager
def running_mlflow_server(workdir: Path) -> Iterator[str]:
    """Yield the tracking URI of a fresh server whose state lives in ``workdir``."""
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = workdir / "mlflow_server.log"
    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true", "DO_NOT_TRACK": "true", "PYTHONUNBUFFERED": "1"}
    command = [
        sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
        "--backend-store-uri", f"sqlite:///{workdir / 'mlflow.db'}",
        "--artifacts-destination", str(workdir / "artifacts"),
    ]  # fmt: skip
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True
        )
    try:
        started = time.monotonic()
        while not _healthy(url):
            if process.poll() is not None or time.monotonic() - started > STARTUP_TIMEOUT_S:
                tail = log_path.read_text(errors="replace")[-3000:]
                raise RuntimeError(f"mlflow server did not become healthy at {url}:\n{tail}")
            time.sleep(0.5)
        print(f"mlflow server healthy after {time.monotonic() - started:.1f}s", file=sys.stderr)
        yield url
    finally:
        _stop(process)


def _stop(process: subprocess.Popen) -> None:
    """Terminate the server's whole process group (uvicorn worker, job runner), then make sure all of it is gone."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        pass
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=15)
