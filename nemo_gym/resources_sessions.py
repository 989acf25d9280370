"""A resources server's session routes: ``/seed_session`` for agents and environment servers, ``/close_session``.

An agent's ``/run`` seeds with the dataset row (NeMo Gym 0.5's body); an environment server (0.7) seeds with a
:class:`~nemo_gym.base_resources_server.ResourcesSeedSessionRequest` that carries the row as ``task_data`` under an
id it chose. A server written for 0.5 declares only the row's shape, so the route takes both bodies: an environment
server's seed calls the server's ``seed_session`` with its ``task_data`` validated as the declared body, and answers
the typed response. A ``seed_session`` whose body type already accepts the environment server's request gets it
unchanged. Closed session ids are remembered (bounded), so a seed that arrives after its close is refused.
"""

from __future__ import annotations

import inspect
import typing
from typing import Annotated, Any, Union

from fastapi import FastAPI, HTTPException, Request
from pydantic import BaseModel, ConfigDict, Field, JsonValue

from nemo_gym.episode_types import EpisodeId, TaskId
from nemo_gym.sandbox.access import SandboxAccess
from nemo_gym.session_store import SessionStore

__all__ = [
    "MCPServerMetadata",
    "ResourcesCloseSessionRequest",
    "ResourcesCloseSessionResponse",
    "ResourcesSeedSessionRequest",
    "ResourcesSeedSessionResponse",
    "add_session_routes",
]

_CLOSED_IDS_KEPT = 100_000


class MCPServerMetadata(BaseModel):
    """Where a rollout's MCP endpoint is on the resources server, and the headers that name its session."""

    server_name: str
    url_path: str = "/mcp"
    transport: str = "http"
    headers: dict[str, str]


class ResourcesSeedSessionRequest(BaseModel):
    """An environment server's seed: state for one episode under an id the caller chose.

    Seeding the same id for the same episode again answers the same session; a close that came first keeps a late
    seed from creating it.
    """

    model_config = ConfigDict(extra="forbid")

    resources_session_id: str = Field(min_length=1)
    episode_id: EpisodeId
    task_id: TaskId
    task_data: dict[str, JsonValue]


class ResourcesSeedSessionResponse(BaseModel):
    """The seeded session, with the MCP tools and the sandbox an agent may use in it, when there are any."""

    model_config = ConfigDict(extra="forbid")

    resources_session_id: str
    resources_tools: MCPServerMetadata | None = None
    sandbox_access: SandboxAccess | None = None


class ResourcesCloseSessionRequest(BaseModel):
    """Release an episode's state (``POST /close_session``)."""

    model_config = ConfigDict(extra="forbid")

    resources_session_id: str
    episode_id: EpisodeId


class ResourcesCloseSessionResponse(BaseModel):
    model_config = ConfigDict(extra="forbid")

    resources_session_id: str


def add_session_routes(app: FastAPI, server: Any) -> None:
    """Add ``POST /seed_session`` and ``POST /close_session`` for ``server`` (a ``SimpleResourcesServer``: not
    imported here, which would make the two modules import each other) to ``app``."""
    closed: SessionStore[bool] = SessionStore(max_sessions=_CLOSED_IDS_KEPT)
    seed: Any = server.seed_session  # an override may take the request too, and its own body type
    declared = _body_model(seed)
    takes_request = "request" in inspect.signature(seed).parameters
    if declared is None:
        app.post("/seed_session")(seed)  # it takes the environment server's body itself (a union) or has no model
    else:
        members = Union[ResourcesSeedSessionRequest, declared]  # type: ignore[valid-type]  # noqa: UP007
        body_type = Annotated[members, Field(union_mode="left_to_right")]

        async def seed_session(request: Request, body: Any) -> Any:
            if not isinstance(body, ResourcesSeedSessionRequest):
                return await (seed(request=request, body=body) if takes_request else seed(body=body))
            if body.resources_session_id in closed:
                raise HTTPException(409, f"resources session {body.resources_session_id!r} is already closed")
            row = declared.model_validate(body.task_data)
            await (seed(request=request, body=row) if takes_request else seed(body=row))
            return ResourcesSeedSessionResponse(resources_session_id=body.resources_session_id)

        seed_session.__annotations__["body"] = body_type
        seed_session.__doc__ = seed.__doc__
        app.post("/seed_session")(seed_session)

    async def close_session(body: ResourcesCloseSessionRequest) -> ResourcesCloseSessionResponse:
        answer = await server.close_resources_session(body)
        closed.set(body.resources_session_id, True)
        return answer

    app.post("/close_session")(close_session)


def _body_model(method: Any) -> type[BaseModel] | None:
    """The pydantic model of ``method``'s ``body`` parameter; None for a union or anything else."""
    try:
        hint = typing.get_type_hints(method).get("body")
    except Exception:  # an annotation that cannot be resolved here: leave the route as the method declares it
        return None
    return hint if isinstance(hint, type) and issubclass(hint, BaseModel) else None
