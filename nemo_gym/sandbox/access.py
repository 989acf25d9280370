"""A sandbox lent to another server (NeMo Gym 0.7's ``sandbox.access``).

The server that created a sandbox (its owner, e.g. a resources server) keeps it alive and removes it; a borrower
(an agent session) gets a ``SandboxAccess`` that names the provider configuration to reconnect through and the
provider's own descriptor of the sandbox.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, JsonValue

__all__ = ["DirectSandboxConnection", "SandboxAccess"]


class DirectSandboxConnection(BaseModel):
    """Reconnect with the top-level provider configuration named ``provider_config_ref``."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["direct"] = "direct"
    provider_config_ref: str
    descriptor: dict[str, JsonValue]


class SandboxAccess(BaseModel):
    """What a borrower needs: how to reach the sandbox and the directory to work in."""

    model_config = ConfigDict(extra="forbid")

    connection: DirectSandboxConnection
    workdir: str
