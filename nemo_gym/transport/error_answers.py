"""How a server answers when handling a request fails, instead of dropping the connection.

* A :class:`TransportError` (a call this server made to another one failed) is a 502 that names the upstream server,
  path and status, marked with :data:`UPSTREAM_FAILURE_HEADER` so that no caller repeats the request on its own (the
  server may have done part of the work before the call failed).
* Any other exception is a 500 with the error's type and message (at most 200 characters of it).
* A body that fails its route's model is FastAPI's 422, without echoing a huge input back.

:func:`install_error_handlers` registers these on an app (what ``SimpleServer.create_app`` does).
:class:`UpstreamFailureAnswers` gives the 502 as a middleware instead, for a server whose own middleware must see the
error first: NeMo Gym's servers override ``setup_exception_middleware`` to add one (vLLM's model server answers a
context-length error with the engine's own 400) and then call the base, which wraps theirs.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from nemo_gym.transport import access
from nemo_gym.transport.types import UPSTREAM_FAILURE_HEADER, ServerTimeoutError, TransportError

__all__ = [
    "UpstreamFailureAnswers",
    "answer_upstream_failures_outside",
    "install_error_handlers",
    "upstream_failure_response",
]

logger = logging.getLogger("nemo_gym.server_utils")  # where these lines have always been logged

_UPSTREAM_FAILED = {UPSTREAM_FAILURE_HEADER: "1"}
_Message = MutableMapping[str, Any]


def upstream_failure_response(server_name: str, path: str, error: TransportError) -> JSONResponse:
    """The 502 for ``error``, raised while ``server_name`` handled ``path``."""
    logger.warning("%s %s: %s", server_name, path, error)
    content = {
        "error": str(error),
        "server": server_name,
        "upstream_server": getattr(error, "server", None),
        "upstream_path": getattr(error, "url_path", None),
        "upstream_status": getattr(error, "status", None),
        "upstream_timeout": isinstance(error, ServerTimeoutError),
    }
    return JSONResponse(status_code=502, content=content, headers=_UPSTREAM_FAILED)


def install_error_handlers(app: FastAPI, server_name: str) -> None:
    """Register the three answers on ``app``, once (a second call changes nothing)."""
    if getattr(app.state, "has_error_handlers", False):
        return
    app.state.has_error_handlers = True

    @app.exception_handler(TransportError)
    async def _inner_server_failed(request: Request, error: TransportError) -> JSONResponse:
        return upstream_failure_response(server_name, request.url.path, error)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, error: Exception) -> JSONResponse:
        logger.exception("%s %s failed", server_name, request.url.path)
        message = access.short_echo(f"{type(error).__name__}: {error}")
        return JSONResponse(
            status_code=500, content={"error": message, "server": server_name, "path": request.url.path}
        )

    @app.exception_handler(RequestValidationError)
    async def _invalid_body(request: Request, error: RequestValidationError) -> JSONResponse:
        # FastAPI's own handler echoes each bad value whole: a 15 MB body would come back as a 15 MB error.
        details = [
            {**item, "input": access.short_echo(item.get("input"))} if "input" in item else item
            for item in error.errors()
        ]
        return JSONResponse(status_code=422, content={"detail": jsonable_encoder(details)})


def answer_upstream_failures_outside(app: FastAPI, server_name: str) -> None:
    """Move the 502 out of FastAPI's exception handlers into a middleware added now, so every middleware added
    before this call sees a :class:`TransportError` as raised. Once per app; before the app serves its first
    request (Starlette builds its layers then)."""
    if getattr(app.state, "has_upstream_failure_middleware", False):
        return
    app.state.has_upstream_failure_middleware = True
    app.exception_handlers.pop(TransportError, None)
    app.add_middleware(UpstreamFailureAnswers, server_name=server_name)


class UpstreamFailureAnswers:
    """ASGI middleware: a :class:`TransportError` from inside becomes the 502 of :func:`upstream_failure_response`
    (unless the response had already started: then it is re-raised, as there is no other way to report it)."""

    def __init__(self, app: Callable[..., Awaitable[None]], server_name: str) -> None:
        self.app = app
        self.server_name = server_name

    async def __call__(self, scope: _Message, receive: Any, send: Callable[[_Message], Awaitable[None]]) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def watched_send(message: _Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, watched_send)
        except TransportError as error:
            if started:
                raise
            response = upstream_failure_response(self.server_name, scope.get("path", ""), error)
            await response(scope, receive, send)
