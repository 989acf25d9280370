"""How an agent session may reach its tools (NeMo Gym 0.7's ``tool_access``).

An environment server hands an agent a list of accesses when it opens the agent's session: a resources server's
typed tool routes over plain HTTP (``DirectHTTPToolAccess``, with the session's cookies), or an MCP server
(``MCPToolAccess``). Names identify an access within one session and must be unique there.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AnyHttpUrl, BaseModel, ConfigDict, Field

__all__ = ["DirectHTTPToolAccess", "MCPStreamableHTTPConnection", "MCPToolAccess", "ToolAccess"]

_ACCESS_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"


class DirectHTTPToolAccess(BaseModel):
    """Tool routes at ``base_url`` (``POST /<tool>``), called with these cookies and headers."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["direct_http"] = "direct_http"
    name: str = Field(min_length=1, pattern=_ACCESS_NAME)
    required: bool
    base_url: AnyHttpUrl
    cookies: dict[str, str] = Field(default_factory=dict)
    headers: dict[str, str] = Field(default_factory=dict)


class MCPStreamableHTTPConnection(BaseModel):
    """An MCP endpoint reached over streamable HTTP."""

    model_config = ConfigDict(extra="forbid")

    transport: Literal["streamable_http"] = "streamable_http"
    url: AnyHttpUrl
    headers: dict[str, str] = Field(default_factory=dict)


class MCPToolAccess(BaseModel):
    """A named MCP server for the session. A ``required`` one that cannot be connected fails the session's seed; an
    optional one may be skipped. Closing the session disconnects from it, it does not stop it."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["mcp"] = "mcp"
    name: str = Field(min_length=1, pattern=_ACCESS_NAME)
    required: bool
    connection: MCPStreamableHTTPConnection


ToolAccess = Annotated[DirectHTTPToolAccess | MCPToolAccess, Field(discriminator="kind")]
