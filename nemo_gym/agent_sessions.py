"""Agent sessions: an environment server opens one on an agent, lets it answer, then closes it (NeMo Gym 0.7).

``POST /v1/agent_sessions`` binds a caller-chosen ``agent_session_id`` to one episode, with the tools (and sandbox)
the agent may use in it; the agent's session cookie then names it on ``/v1/responses``. ``POST
/v1/agent_sessions/close`` releases it and answers what the agent observed and the resources server's cookies as
they ended up. Both are safe to repeat: the same seed again answers the same session, a close is remembered for
``session_close_retry_window_seconds`` (and answered again), and a seed of an id already closed is refused.

An agent supports sessions by implementing ``_seed_agent_session_state`` and ``_close_agent_session_state``
(:class:`~nemo_gym.base_responses_api_agent.SimpleResponsesAPIAgent`); this module keeps the records.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from fastapi import HTTPException
from pydantic import BaseModel, ConfigDict, Field, field_validator

from nemo_gym.episode_types import EpisodeId, TaskId
from nemo_gym.observability.records import AgentObservationBundle
from nemo_gym.sandbox.access import SandboxAccess
from nemo_gym.tool_access import ToolAccess

__all__ = [
    "AGENT_SESSION_COOKIE_KEY",
    "AgentCloseSessionRequest",
    "AgentCloseSessionResponse",
    "AgentSeedSessionRequest",
    "AgentSeedSessionResponse",
    "AgentSessionSetupError",
    "AgentSessionState",
    "AgentSessionTable",
    "unique_access_names",
]


AGENT_SESSION_COOKIE_KEY = "agent_session_id"
"""Where a seeded request's session notes its agent session (``request.session[...]``), as NeMo Gym 0.7 does."""


def unique_access_names(accesses: list[ToolAccess]) -> list[ToolAccess]:
    """``accesses`` when no two share a name (a name identifies an access within a session)."""
    names = [access.name for access in accesses]
    if len(names) != len(set(names)):
        raise ValueError("tool access names must be unique within an agent session")
    return accesses


class AgentSeedSessionRequest(BaseModel):
    """Open ``agent_session_id`` for one episode, with the tools and sandbox it may use."""

    model_config = ConfigDict(extra="forbid")

    agent_session_id: str = Field(min_length=1)
    episode_id: EpisodeId
    task_id: TaskId
    tool_accesses: list[ToolAccess] = Field(default_factory=list)
    sandbox_access: SandboxAccess | None = None

    _unique = field_validator("tool_accesses")(unique_access_names)


class AgentSeedSessionResponse(BaseModel):
    model_config = ConfigDict(extra="forbid")

    agent_session_id: str


class AgentCloseSessionRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    agent_session_id: str
    episode_id: EpisodeId


class AgentCloseSessionResponse(BaseModel):
    """The closed session: what the agent observed, and the resources server's cookies as the agent left them."""

    model_config = ConfigDict(extra="forbid")

    agent_session_id: str
    agent_observations: AgentObservationBundle | None = None
    resources_cookies: dict[str, str] | None = None


@dataclass
class AgentSessionState:
    """What an agent keeps for an open session; subclass it for the harness's own state."""

    request: AgentSeedSessionRequest


class AgentSessionSetupError(Exception):
    """Raised by a seed that failed half way: ``state`` is kept so a close can release what was set up."""

    def __init__(self, state: AgentSessionState, *, error: BaseException) -> None:
        super().__init__(str(error))
        self.state = state
        self.error = error


@dataclass
class _AgentSessionRecord:
    """One session's bookkeeping; ``lock`` serialises its seed and close."""

    episode_id: EpisodeId | None = None
    cookie_session: str | None = None
    state: AgentSessionState | None = None
    closing: bool = False
    close_response: AgentCloseSessionResponse | None = None
    expires_at: float = float("inf")
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


SeedState = Callable[[AgentSeedSessionRequest], Awaitable[AgentSessionState]]
CloseState = Callable[[AgentSessionState], Awaitable[AgentCloseSessionResponse]]


class AgentSessionTable:
    """The sessions of one agent server: open ones, and closed ones for their retry window.

    ``cookie_session`` is the agent's own session cookie id (``request.session["session_id"]``): the session it was
    opened under, so ``/v1/responses`` finds its state from the cookie alone.
    """

    def __init__(self, retry_window_s: float) -> None:
        self.retry_window_s = retry_window_s
        self._records: dict[str, _AgentSessionRecord] = {}
        self._closed: OrderedDict[str, _AgentSessionRecord] = OrderedDict()
        self._by_cookie: dict[str, str] = {}

    def id_for_cookie(self, cookie_session: str | None) -> str | None:
        """The agent session this cookie was seeded under (open, or closed within its retry window), if any."""
        return self._by_cookie.get(cookie_session or "")

    def require(self, agent_session_id: str) -> AgentSessionState:
        """The open session's state; a closed or unknown one answers 409, so a late call cannot run unbound."""
        record = self._records.get(agent_session_id)
        if record is None or record.state is None or record.closing:
            raise HTTPException(409, f"agent session {agent_session_id!r} is unknown, closed or closing")
        return record.state

    def state_for_cookie(self, cookie_session: str | None) -> AgentSessionState | None:
        """The open session bound to this cookie; a closed one answers 409, so a late call cannot run unbound."""
        agent_session_id = self.id_for_cookie(cookie_session)
        return None if agent_session_id is None else self.require(agent_session_id)

    async def seed(
        self, body: AgentSeedSessionRequest, cookie_session: str | None, make_state: SeedState
    ) -> AgentSeedSessionResponse:
        """Open (or, for the same request again, re-answer) a session; ``cookie_session`` None binds no cookie."""
        bound = self.id_for_cookie(cookie_session)
        if bound is not None and bound != body.agent_session_id:
            raise HTTPException(409, "this cookie already names another agent session")
        async with self._locked(body.agent_session_id) as record:
            if record.close_response is not None or record.closing:
                where = "already closed" if record.close_response is not None else "closing"
                raise HTTPException(409, f"agent session {body.agent_session_id!r} is {where}")
            if record.state is None:
                record.episode_id = body.episode_id
                try:
                    record.state = await make_state(body.model_copy(deep=True))
                except AgentSessionSetupError as error:
                    record.state, record.closing = error.state, True  # kept for the close, never used
                    raise error.error from None
            elif record.state.request != body:
                raise HTTPException(409, f"agent session {body.agent_session_id!r} was opened by another request")
            if cookie_session is not None:
                self._by_cookie[cookie_session] = body.agent_session_id
                record.cookie_session = cookie_session
            return AgentSeedSessionResponse(agent_session_id=body.agent_session_id)

    async def close(self, body: AgentCloseSessionRequest, release: CloseState) -> AgentCloseSessionResponse:
        async with self._locked(body.agent_session_id) as record:
            if record.episode_id is not None and record.episode_id != body.episode_id:
                raise HTTPException(409, "episode_id is not the one this agent session was opened for")
            if record.close_response is not None:
                return record.close_response.model_copy(deep=True)  # a retried close: the same answer
            if record.state is None:
                answer = AgentCloseSessionResponse(agent_session_id=body.agent_session_id)
            else:
                record.closing = True
                answer = await release(record.state)  # raises: the state is kept, a later close tries again
            record.state, record.episode_id = None, body.episode_id
            record.close_response = answer.model_copy(deep=True)
            record.expires_at = time.monotonic() + self.retry_window_s
            self._closed[body.agent_session_id] = record
            return answer

    def _expire(self) -> None:
        now = time.monotonic()
        while self._closed:
            agent_session_id, record = next(iter(self._closed.items()))
            if record.expires_at > now:
                break
            del self._closed[agent_session_id]
            self._records.pop(agent_session_id, None)
            self._by_cookie.pop(record.cookie_session or "", None)

    @asynccontextmanager
    async def _locked(self, agent_session_id: str) -> AsyncIterator[_AgentSessionRecord]:
        self._expire()
        while True:
            record = self._records.setdefault(agent_session_id, _AgentSessionRecord())
            async with record.lock:
                if self._records.get(agent_session_id) is not record:
                    continue  # replaced while this call waited: take the new record's lock instead
                try:
                    yield record
                finally:
                    if record.state is None and record.close_response is None:
                        del self._records[agent_session_id]
                return
