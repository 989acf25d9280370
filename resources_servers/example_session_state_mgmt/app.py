"""example_session_state_mgmt: a counter that lives on the server, one per rollout, found through the session cookie.

This example teaches per-rollout state. ``/seed_session`` stores the row's ``initial_count`` under the caller's session
id, the tools ``increment_counter`` and ``get_counter_value`` read and change that counter, and ``/verify`` rewards 1.0
when the counter ended at the row's ``expected_count``. The reward comes from server state, not from the transcript, so
it only works when the agent threads the session cookie from seed through every tool call to verify.

Counters sit in an LRU store capped at ``max_sessions``: rollouts that never reach ``/verify`` (crashed agents, aborted
runs) are evicted oldest-first instead of leaking memory, and ``/verify`` drops the state it has read.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import ClassVar

from fastapi import FastAPI, Request
from pydantic import BaseModel, Field, PrivateAttr

from nemo_gym.base_resources_server import (
    BaseResourcesServerConfig,
    BaseSeedSessionRequest,
    BaseSeedSessionResponse,
    BaseVerifyRequest,
    ReverifyMode,
    SimpleResourcesServer,
)
from nemo_gym.openai_utils import NeMoGymResponseFunctionToolCall
from nemo_gym.server_utils import SESSION_ID_KEY

DEFAULT_MAX_SESSIONS = 100_000


class ExampleSessionStateMgmtResourcesServerConfig(BaseResourcesServerConfig):
    # The state is consumed by /verify, so a stored rollout cannot be verified a second time.
    REVERIFY_MODE: ClassVar[ReverifyMode] = ReverifyMode.UNSUPPORTED

    max_sessions: int = Field(default=DEFAULT_MAX_SESSIONS, ge=1)
    """Most counters held at once; the least recently used one is evicted beyond this."""


class CounterStore:
    """Session id -> counter, bounded: once full, storing a new session evicts the least recently used one.

    Handlers run on one event loop and never await while touching the store, so no lock is needed.
    """

    def __init__(self, max_sessions: int = DEFAULT_MAX_SESSIONS) -> None:
        if max_sessions < 1:
            raise ValueError(f"max_sessions must be at least 1, got {max_sessions}")
        self.max_sessions = max_sessions
        self._counters: OrderedDict[str, int] = OrderedDict()

    def __len__(self) -> int:
        return len(self._counters)

    def __contains__(self, session_id: object) -> bool:
        return session_id in self._counters

    def get(self, session_id: str) -> int | None:
        """The counter, or None for an unknown session; reading counts as use, so it delays eviction."""
        if session_id not in self._counters:
            return None
        self._counters.move_to_end(session_id)
        return self._counters[session_id]

    def set(self, session_id: str, value: int) -> None:
        self._counters[session_id] = value
        self._counters.move_to_end(session_id)
        while len(self._counters) > self.max_sessions:
            self._counters.popitem(last=False)

    def pop(self, session_id: str) -> int | None:
        return self._counters.pop(session_id, None)


class SeedSessionRequest(BaseSeedSessionRequest):
    initial_count: int = 0


class IncrementCounterRequest(BaseModel):
    count: int


class IncrementCounterResponse(BaseModel):
    success: bool


class GetCounterValueResponse(BaseModel):
    count: int


class SessionStateVerifyRequest(BaseVerifyRequest):
    expected_count: int


class SessionStateVerifyResponse(SessionStateVerifyRequest):
    reward: float
    final_count: int | None
    """The session's counter when verify ran; None when this session was never seeded nor touched (or was evicted)."""
    num_increment_calls: int
    num_get_calls: int


class ExampleSessionStateMgmtResourcesServer(SimpleResourcesServer):
    config: ExampleSessionStateMgmtResourcesServerConfig
    _store: CounterStore = PrivateAttr()

    def model_post_init(self, context: object, /) -> None:
        super().model_post_init(context)
        self._store = CounterStore(self.config.max_sessions)

    @property
    def store(self) -> CounterStore:
        """Session id -> that rollout's counter."""
        return self._store

    def setup_webserver(self) -> FastAPI:
        app = super().setup_webserver()
        app.post("/increment_counter")(self.increment_counter)
        app.post("/get_counter_value")(self.get_counter_value)
        return app

    async def seed_session(self, request: Request, body: SeedSessionRequest) -> BaseSeedSessionResponse:
        # Seeding starts a rollout, so it overwrites whatever an earlier use of this cookie left behind.
        self.store.set(request.session[SESSION_ID_KEY], body.initial_count)
        return BaseSeedSessionResponse()

    async def increment_counter(self, request: Request, body: IncrementCounterRequest) -> IncrementCounterResponse:
        session_id = request.session[SESSION_ID_KEY]
        current = self.store.get(session_id)
        self.store.set(session_id, (current or 0) + body.count)
        return IncrementCounterResponse(success=True)

    async def get_counter_value(self, request: Request) -> GetCounterValueResponse:
        # No body model: the tool takes no arguments, and the agent may send {} or nothing at all.
        current = self.store.get(request.session[SESSION_ID_KEY])
        return GetCounterValueResponse(count=current or 0)

    async def verify(self, request: Request, body: SessionStateVerifyRequest) -> SessionStateVerifyResponse:
        final_count = self.store.pop(request.session[SESSION_ID_KEY])
        calls = [item.name for item in body.response.output if isinstance(item, NeMoGymResponseFunctionToolCall)]
        return SessionStateVerifyResponse(
            **body.model_dump(),
            reward=1.0 if final_count is not None and final_count == body.expected_count else 0.0,
            final_count=final_count,
            num_increment_calls=calls.count("increment_counter"),
            num_get_calls=calls.count("get_counter_value"),
        )


if __name__ == "__main__":
    ExampleSessionStateMgmtResourcesServer.run_webserver()
