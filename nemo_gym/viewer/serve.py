"""Serve the viewer: bind first (port 0 picks a free port), print the URL, then run uvicorn on that socket."""

from __future__ import annotations

import socket
from collections.abc import Callable
from pathlib import Path

import uvicorn

from nemo_gym.errors import ConfigError
from nemo_gym.viewer.app import POLL_S, build_app
from nemo_gym.viewer.runs import open_runs


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise ConfigError(f"gym view: cannot listen on {host}:{port} ({e.strerror}); pass another --port") from e
    sock.listen(128)
    return sock


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}/" if ":" in host else f"http://{host}:{port}/"


def serve(paths: list[Path], host: str, port: int, announce: Callable[[str], None], poll_s: float = POLL_S) -> None:
    """Open the runs, bind, call ``announce(url)``, and serve until interrupted."""
    runs = open_runs(paths)
    sock = bind(host, port)
    app = build_app(runs, poll_s)
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on")
    server = uvicorn.Server(config)
    announce(url_of(sock))
    server.run(sockets=[sock])
