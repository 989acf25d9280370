"""Small helpers shared by tests."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import uvicorn

from nemo_gym.transport import access, runtime


def run_headers(url: str, head_port: int | None = None) -> dict[str, str]:
    """The run-token header a server of a run wants: of a run this process started (its launcher registered the
    token), or of the ``gym env start`` whose head server listens on ``head_port`` (the token file it wrote)."""
    token = access.registered_token(url) or (access.read_token_file("127.0.0.1", head_port) if head_port else None)
    return {access.TOKEN_HEADER: token} if token else {}


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


@contextlib.asynccontextmanager
async def serving(
    app: Any, loop_name: str = "auto", max_active: int | None = None
) -> AsyncIterator[tuple[str, uvicorn.Server]]:
    """Serve ``app`` in this event loop the way ``run_webserver`` does: uvicorn configured by ``runtime``, on a
    listening socket handed over as a bare descriptor (what the child of a launcher gets)."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(256)
    sock = runtime.inherited_socket(listener.detach())
    config = runtime.uvicorn_config(app, "127.0.0.1", 0, {"server_event_loop": loop_name}, max_active)
    config.log_level = "warning"
    config.lifespan = "off"
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:  # no deadline needed: the server is in this loop, and pytest's timeout guards a hang
        if task.done():
            task.result()  # it failed to start: raise its error here
            raise RuntimeError("uvicorn exited before it started serving")
        await asyncio.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}", server
    finally:
        server.should_exit = True
        await task
        sock.close()


def app_with_routes(route_class: type[Any]) -> Any:
    """An app whose routes are ``route_class``: FastAPI's own app for its ``APIRoute``, else ours (``ServerApp``,
    telemetry off), so a test can give the same routes to both and compare their answers."""
    from fastapi import FastAPI
    from fastapi.routing import APIRoute

    from nemo_gym.transport.routes import ServerApp

    app = (
        FastAPI()
        if route_class is APIRoute
        else ServerApp(telemetry={"tracing": False, "metrics": False, "logs": False})
    )
    app.router.route_class = route_class
    return app
