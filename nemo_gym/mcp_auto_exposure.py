"""NeMo Gym's ``nemo_gym.mcp_auto_exposure``: serving a resources server's tool routes over MCP.

A server opts in with ``expose_tools_over_mcp: true`` in its config. Serving tools over MCP is not implemented here
yet: :func:`maybe_auto_expose` does nothing for a server that did not opt in (every server so far), and refuses with
one line naming the key for one that did, instead of starting without the ``/mcp`` endpoint its agent expects.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

from nemo_gym.base_resources_server import NEMO_GYM_MCP_METADATA_KEY
from nemo_gym.errors import ConfigError as _ConfigError

__all__ = ["MCP_CONFIG_KEY", "NEMO_GYM_MCP_METADATA_KEY", "maybe_auto_expose"]

MCP_CONFIG_KEY = "expose_tools_over_mcp"


def maybe_auto_expose(server: Any, app: FastAPI) -> dict[str, Any] | None:
    """None when ``server.config`` does not set ``expose_tools_over_mcp``; a ConfigError when it does."""
    if not getattr(getattr(server, "config", None), MCP_CONFIG_KEY, False):
        return None
    name = getattr(getattr(server, "config", None), "name", None) or type(server).__name__
    raise _ConfigError(
        f"{name}: {MCP_CONFIG_KEY}: true is not supported yet (tools cannot be served over MCP); set it to false"
    )
