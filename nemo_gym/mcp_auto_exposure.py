"""NeMo Gym's ``nemo_gym.mcp_auto_exposure``: serving a resources server's tool routes over MCP.

A server opts in with ``expose_tools_over_mcp: true`` in its config; ``SimpleResourcesServer.setup_webserver`` then
mounts ``/mcp`` (:mod:`nemo_gym.mcp_exposure` says how). :func:`maybe_auto_expose` is NeMo Gym's explicit entry point
for an app built by hand; on an app that already serves ``/mcp`` it only reports the tools. A ``tools/call`` carries the
session token ``/seed_session`` answered in the ``NEMO_GYM_MCP_SESSION_TOKEN_HEADER`` header (0.7 also names it
``TOKEN_HEADER``).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

from nemo_gym.base_resources_server import NEMO_GYM_MCP_METADATA_KEY, NEMO_GYM_MCP_SESSION_TOKEN_HEADER
from nemo_gym.base_resources_server import NEMO_GYM_MCP_SESSION_TOKEN_HEADER as TOKEN_HEADER
from nemo_gym.mcp_exposure import MCP_CONFIG_KEY
from nemo_gym.mcp_exposure import expose_tools_over_mcp as _expose_tools_over_mcp
from nemo_gym.mcp_exposure import harvest_tools as _harvest_tools

__all__ = [
    "MCP_CONFIG_KEY",
    "NEMO_GYM_MCP_METADATA_KEY",
    "NEMO_GYM_MCP_SESSION_TOKEN_HEADER",
    "TOKEN_HEADER",
    "maybe_auto_expose",
]


def maybe_auto_expose(server: Any, app: FastAPI) -> dict[str, Any] | None:
    """None when ``server.config`` does not set ``expose_tools_over_mcp``; else serve ``/mcp`` and return its tools."""
    config = getattr(server, "config", None)
    if not getattr(config, MCP_CONFIG_KEY, False):
        return None
    name = getattr(config, "name", None) or type(server).__name__
    _expose_tools_over_mcp(app, name, server.session_cookie_name)
    return _harvest_tools(app)
