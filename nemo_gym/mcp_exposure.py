"""A resources server's tool routes served over MCP (streamable HTTP at ``/mcp``), one rollout session per token.

A resources server opts in with ``expose_tools_over_mcp: true``. Then:

- ``POST /seed_session`` answers, besides its own fields, ``"mcp": {"server_name", "url_path": "/mcp", "transport":
  "http", "headers": {"X-NeMo-Gym-Session-Token": <token>}}``. The token names the rollout's session (it is the same
  random 128-bit id the session cookie carries), so an MCP client that sends it lands in that rollout's state.
- ``/mcp`` speaks MCP with the official ``mcp`` SDK's server side, stateless and JSON-answered: each request stands
  on its own, and the token header (not an MCP session id) says which rollout it belongs to. ``tools/list`` lists
  every POST route that is not one of the server's own (``/seed_session``, ``/verify``, ...), with its body model's
  JSON schema; ``tools/call`` without a valid token is an error result.
- A tool call is dispatched as ``POST /<tool>`` on the same app, in process, with the rollout's session cookie: the
  handler sees exactly what it sees over plain HTTP (middleware, validation, error handlers), so two MCP sessions
  with different tokens never see each other's state, and a 4xx/5xx becomes an error result the model can read.

The ``mcp`` package is imported only when a server opts in (``pip install nemo-gym[mcp]``).
"""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, get_type_hints

from fastapi import FastAPI
from fastapi.routing import APIRoute
from pydantic import BaseModel
from starlette.middleware import Middleware
from starlette.routing import Mount, Route

from nemo_gym.errors import ConfigError
from nemo_gym.server_utils import SESSION_ID_KEY

if TYPE_CHECKING:
    import mcp.types

__all__ = ["MCP_CONFIG_KEY", "MCP_URL_PATH", "SESSION_TOKEN_HEADER", "expose_tools_over_mcp", "mcp_metadata"]

MCP_CONFIG_KEY = "expose_tools_over_mcp"
MCP_URL_PATH = "/mcp"
SESSION_TOKEN_HEADER = "X-NeMo-Gym-Session-Token"
METADATA_KEY = "mcp"  # re-exported as NEMO_GYM_MCP_METADATA_KEY by base_resources_server

# The routes every resources server has; they run the rollout, they are not tools the model calls.
SERVER_ROUTES = frozenset(
    {"/seed_session", "/close_session", "/verify", "/aggregate_metrics", "/reverify_mode", MCP_URL_PATH}
)
_TOKEN = re.compile(r"^[0-9a-f]{32}$")  # the session ids SessionCookieMiddleware hands out
_ANY_OBJECT: dict[str, Any] = {"type": "object", "additionalProperties": True}


def mcp_metadata(server_name: str, session_id: str) -> dict[str, Any]:
    """What ``/seed_session`` adds under ``"mcp"``: where the MCP endpoint is and the header naming the rollout."""
    return {
        "server_name": server_name,
        "url_path": MCP_URL_PATH,
        "transport": "http",
        "headers": {SESSION_TOKEN_HEADER: session_id},
    }


def harvest_tools(app: FastAPI) -> dict[str, mcp.types.Tool]:
    """Every tool route of ``app`` as an MCP tool: its name, its docstring, its body model's JSON schema."""
    from mcp import types

    tools: dict[str, types.Tool] = {}
    for route in app.router.routes:
        if not isinstance(route, APIRoute) or "POST" not in (route.methods or ()) or route.path in SERVER_ROUTES:
            continue
        name = route.path.lstrip("/")
        if "{" in name or "/" in name:  # a catch-all or nested path is no single tool name
            continue
        schema = _input_schema(route)
        description = inspect.getdoc(route.endpoint) or route.description or None
        tools[name] = types.Tool(name=name, description=description, inputSchema=schema)
    return tools


def _input_schema(route: APIRoute) -> dict[str, Any]:
    """The body model's JSON schema; no arguments for a route without a body; any object for an untyped one."""
    try:
        hints = get_type_hints(route.endpoint)
    except Exception:  # an annotation that does not resolve: FastAPI would have refused the route already
        hints = {}
    params = [name for name in inspect.signature(route.endpoint).parameters if name != "request"]
    for name in params:
        annotation = hints.get(name)
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            return annotation.model_json_schema()
    return {"type": "object", "properties": {}} if not route.dependant.body_params else _ANY_OBJECT


def expose_tools_over_mcp(app: FastAPI, server_name: str, cookie_name: str) -> None:
    """Mount ``/mcp`` on ``app`` and make ``/seed_session`` hand out the token; a second call does nothing.

    Call it before the app starts. Tools are read from the app's routes at the first MCP request, so routes a
    subclass adds after this call are served too.
    """
    if getattr(app.state, "mcp_exposed", False):
        return
    try:
        from mcp import types
        from mcp.server.lowlevel import Server
        from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
        from mcp.server.transport_security import TransportSecuritySettings
    except ImportError:
        raise ConfigError(
            f"{server_name}: {MCP_CONFIG_KEY}: true needs the `mcp` package in this server's venv: add "
            "`nemo-gym[mcp]` to its requirements.txt, or set it to false"
        ) from None
    import httpx

    mcp_server: Server = Server(server_name)
    tools: dict[str, types.Tool] = {}

    def current_tools() -> dict[str, types.Tool]:
        if not tools:
            tools.update(harvest_tools(app))
        return tools

    @mcp_server.list_tools()
    async def list_tools() -> list[types.Tool]:
        return list(current_tools().values())

    @mcp_server.call_tool(validate_input=False)
    async def call_tool(name: str, arguments: dict[str, Any]) -> types.CallToolResult:
        if name not in current_tools():
            return _error(f"Unknown tool {name!r}; this server has {sorted(current_tools())}")
        request = mcp_server.request_context.request
        token = request.headers.get(SESSION_TOKEN_HEADER, "") if request is not None else ""
        if not _TOKEN.match(token):
            return _error(f"{SESSION_TOKEN_HEADER} is missing or invalid: send the one /seed_session answered")
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://mcp.invalid") as client:
            answer = await client.post(f"/{name}", json=arguments, headers={"cookie": f"{cookie_name}={token}"})
        if answer.status_code >= 400:
            return _error(f"Tool {name!r} failed (HTTP {answer.status_code}): {answer.text[:2000]}")
        try:
            payload = answer.json()
        except json.JSONDecodeError:
            payload = answer.text
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=answer.text)],
            structuredContent=payload if isinstance(payload, dict) else None,
        )

    manager = StreamableHTTPSessionManager(
        app=mcp_server,
        json_response=True,
        stateless=True,
        # Agents reach this server by whatever host the config resolved; the run token guards it, not Host checks.
        security_settings=TransportSecuritySettings(enable_dns_rebinding_protection=False),
    )

    endpoint = _ASGIEndpoint(manager.handle_request)
    # In front, so a catch-all POST /{path} of the server cannot shadow it; the Mount takes /mcp/ as well.
    app.router.routes[0:0] = [Route(MCP_URL_PATH, endpoint), Mount(MCP_URL_PATH, app=endpoint)]
    app.user_middleware.append(Middleware(_SeedSessionMetadata, server_name=server_name))  # innermost
    outer_lifespan = app.router.lifespan_context

    @asynccontextmanager
    async def lifespan(app_: Any) -> AsyncIterator[Any]:
        async with manager.run(), outer_lifespan(app_) as state:
            yield state

    app.router.lifespan_context = lifespan
    app.state.mcp_exposed = True


class _ASGIEndpoint:
    """An ASGI app Starlette's ``Route`` passes the raw request to (a plain function would get a ``Request``)."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self.handle(scope, receive, send)


def _error(text: str) -> mcp.types.CallToolResult:
    from mcp import types

    return types.CallToolResult(content=[types.TextContent(type="text", text=text)], isError=True)


class _SeedSessionMetadata:
    """Adds ``"mcp"`` (with the rollout's token) to a successful JSON-object answer of ``POST /seed_session``."""

    def __init__(self, app: Any, server_name: str) -> None:
        self.app = app
        self.server_name = server_name

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        session = scope.get("session") or {}
        if scope["type"] != "http" or scope.get("path") != "/seed_session" or SESSION_ID_KEY not in session:
            await self.app(scope, receive, send)
            return
        start: dict[str, Any] = {}
        chunks: list[bytes] = []

        async def buffer(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                start.update(message)
                return
            if message["type"] != "http.response.body":
                await send(message)
                return
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                await self._send(send, start, b"".join(chunks), session[SESSION_ID_KEY])

        await self.app(scope, receive, buffer)

    async def _send(self, send: Any, start: dict[str, Any], body: bytes, session_id: str) -> None:
        if start.get("status") == 200:
            try:
                payload = json.loads(body)
            except ValueError:
                payload = None
            if isinstance(payload, dict) and "resources_session_id" in payload:
                # An environment server's seed: its typed answer carries the details as `resources_tools`.
                if payload.get("resources_tools") is None:
                    payload["resources_tools"] = mcp_metadata(self.server_name, session_id)
                    body = json.dumps(payload).encode()
            elif isinstance(payload, dict) and METADATA_KEY not in payload:
                payload[METADATA_KEY] = mcp_metadata(self.server_name, session_id)
                body = json.dumps(payload).encode()
        headers = [(k, v) for k, v in start.get("headers", []) if k.lower() != b"content-length"]
        await send({**start, "headers": [*headers, (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
