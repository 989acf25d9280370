"""The head server: service discovery for a running set of servers, served from a thread of the launcher.

Clients only need its address (``head_server.host:port``, default ``127.0.0.1:11000``) to learn the whole topology.
Unlike the reference design it never serves secrets: every route wants the run's token (unless the run was started with
``auth: false``, when anyone who can reach the port may ask), and ``/global_config_dict_yaml`` is masked all the same (the rule: :mod:`nemo_gym.config.secrets`). That is all its clients need:
``gym eval run --no-serve``, ``gym env status`` and ``ServerClient.load_from_global_config`` in a trainer read
instance names, hosts and ports, which are never masked. Servers started by the launcher never ask it for their
config: they read the real one, secrets included, from the file the launcher hands them (``NEMO_GYM_CONFIG_FILE``).
"""

from __future__ import annotations

import errno
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from nemo_gym.errors import ConfigError
from nemo_gym.launcher.port_holder import describe_holder
from nemo_gym.transport.access import AccessMiddleware

_HEAD_MAX_BODY = 64 * 1024
"""Its routes take no body at all."""

__all__ = ["HeadServer", "bind_head_socket", "build_head_app"]


def build_head_app(
    masked_config_yaml: str, server_instances: Callable[[], list[dict[str, Any]]], token: str | None = None
) -> AccessMiddleware:
    """The head server's routes; ``server_instances`` is called per request so pids and start times are live.

    Plain Starlette: three GET routes need no request validation, and FastAPI would add ~11 MB to the launcher.
    With a run ``token``, every route wants it (:mod:`nemo_gym.transport.access`): the topology is no one else's.
    """

    async def health(request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok"})

    async def global_config_dict_yaml(request: Request) -> JSONResponse:
        return JSONResponse(masked_config_yaml)

    async def list_server_instances(request: Request) -> JSONResponse:
        return JSONResponse(server_instances())

    app = Starlette(
        routes=[
            Route("/", health, methods=["GET"]),
            Route("/global_config_dict_yaml", global_config_dict_yaml, methods=["GET"]),
            Route("/server_instances", list_server_instances, methods=["GET"]),
        ]
    )
    return AccessMiddleware(app, token=token, max_body=_HEAD_MAX_BODY)


def bind_head_socket(host: str, port: int) -> socket.socket:
    """Bind the head server's port now, so a clash is reported before anything slow (venv builds) starts."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(128)
    except OSError as e:
        sock.close()
        reason = f"the port is {describe_holder(port)}" if e.errno == errno.EADDRINUSE else (e.strerror or str(e))
        raise ConfigError(
            f"the head server cannot listen on {host}:{port}: {reason}. Stop it, or pick another port with "
            f"+head_server.port=<port>"
        ) from e
    return sock


class HeadServer:
    """uvicorn on an already bound socket, in a daemon thread; ``stop()`` shuts it down and joins the thread."""

    def __init__(self, app: Any, sock: socket.socket) -> None:
        self.sock = sock
        self.host, self.port = sock.getsockname()[:2]
        config = uvicorn.Config(
            app, ws="none", log_level="warning", access_log=False, lifespan="off", timeout_graceful_shutdown=2
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._run, name="nemo-gym-head-server", daemon=True)
        self._error: BaseException | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def _run(self) -> None:
        try:
            self._server.run(sockets=[self.sock])
        except BaseException as e:  # reported by start(); the thread must not die silently
            self._error = e

    def start(self, timeout_s: float = 15.0) -> None:
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise ConfigError(f"the head server did not start on {self.url}: {self._error or 'timed out'}")
            time.sleep(0.02)

    def stop(self) -> None:
        self._server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        self.sock.close()
