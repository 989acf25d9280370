"""Gymnasium-style resources servers: an episode driven by ``/reset`` and ``/step`` instead of tools and ``/verify``.

Some environments are games or simulators whose reward arrives turn by turn. They speak a protocol shaped like
Gymnasium's ``Env``, over HTTP and keyed by the session cookie:

* ``POST /reset``: body = the dataset row. Starts a fresh episode for this session (replacing any earlier one) and
  returns ``{observation, info}``; a non-null observation is shown to the model as a user message. A row whose task
  fields fail the subclass's validation is answered with HTTP 422.
* ``POST /step``: body = the row plus ``response`` (the model's latest turn, which holds the action). Returns
  ``{observation, reward, terminated, truncated, info}``. ``info.tool_outputs = [{call_id, output}]`` answers function
  calls the model made, so the conversation stays well formed. The episode's state is dropped once ``terminated`` or
  ``truncated`` is true; a later ``/step`` is answered with HTTP 409.
* ``POST /close``: drops the episode early (an agent that ran out of steps calls it).

``gymnasium_agent`` drives this loop and sums the step rewards. Episode state lives in a bounded LRU store, so
abandoned episodes cannot grow memory without limit. Subclasses implement :meth:`GymnasiumServer.reset_episode` and
:meth:`GymnasiumServer.step_episode`; both are synchronous on purpose (no await while a session's state changes).
"""

from __future__ import annotations

from typing import Any, ClassVar

from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError

from nemo_gym.base_resources_server import BaseResourcesServerConfig, ReverifyMode
from nemo_gym.metrics import AggregateMetrics, AggregateMetricsRequest, aggregate_verify_responses
from nemo_gym.openai_utils import NeMoGymResponse, NeMoGymResponseCreateParamsNonStreaming
from nemo_gym.server_utils import SESSION_ID_KEY, SimpleServer
from nemo_gym.session_store import DEFAULT_MAX_SESSIONS, SessionStore

__all__ = [
    "DEFAULT_MAX_SESSIONS",
    "SESSION_ID_KEY",
    "AggregateMetrics",
    "AggregateMetricsRequest",
    "BaseGymnasiumServerConfig",
    "BaseResourcesServerConfig",
    "CloseResponse",
    "GymnasiumServer",
    "NeMoGymResponse",
    "NeMoGymResponseCreateParamsNonStreaming",
    "ResetRequest",
    "ResetResponse",
    "ReverifyMode",
    "SessionStore",
    "SimpleServer",
    "StepRequest",
    "StepResponse",
    "aggregate_verify_responses",
]


class BaseGymnasiumServerConfig(BaseResourcesServerConfig):
    # Rewards are produced step by step against live state; a stored rollout cannot be re-scored.
    REVERIFY_MODE: ClassVar[ReverifyMode | str] = ReverifyMode.UNSUPPORTED

    max_sessions: int = Field(default=DEFAULT_MAX_SESSIONS, ge=1)
    """Most live episodes held at once; the least recently used one is evicted beyond this."""


class ResetRequest(BaseModel):
    """The dataset row; task fields beyond ``responses_create_params`` arrive as extras (``model_extra``)."""

    model_config = ConfigDict(extra="allow")

    responses_create_params: NeMoGymResponseCreateParamsNonStreaming


class ResetResponse(BaseModel):
    observation: str | None = None
    info: dict[str, Any] = Field(default_factory=dict)


class StepRequest(ResetRequest):
    response: NeMoGymResponse
    """The model's latest turn (its output items hold the action)."""


class StepResponse(BaseModel):
    observation: str | None = None
    """Shown to the model as the next user message; None when there is nothing new to say."""
    reward: float = 0.0
    terminated: bool = False
    """The episode reached an end state (win, loss, ...)."""
    truncated: bool = False
    """The episode was cut short by the environment (e.g. its own step limit)."""
    info: dict[str, Any] = Field(default_factory=dict)


class CloseResponse(BaseModel):
    closed: bool
    """Whether this session had a live episode."""


class GymnasiumServer(SimpleServer):
    """Base class: owns the routes and the per-session episode store; subclasses own the game."""

    config: BaseGymnasiumServerConfig
    _episodes: SessionStore[Any] = PrivateAttr()

    def model_post_init(self, context: Any, /) -> None:
        super().model_post_init(context)
        self._episodes = SessionStore(self.config.max_sessions)

    def setup_webserver(self) -> FastAPI:
        app = super().setup_webserver()
        app.post("/reset")(self.reset)
        app.post("/step")(self.step)
        app.post("/close")(self.close)
        app.post("/aggregate_metrics")(self.aggregate_metrics)
        app.get("/reverify_mode")(self.reverify_mode)
        return app

    # --- to implement -------------------------------------------------------------------------------------------

    def reset_episode(self, row: ResetRequest) -> tuple[Any, ResetResponse]:
        """A new episode for this row: ``(state, first observation)``. The state is kept for this session."""
        raise NotImplementedError(f"{type(self).__name__} must implement reset_episode()")

    def step_episode(self, state: Any, body: StepRequest) -> StepResponse:
        """Apply the action in ``body.response`` to ``state`` (mutating it) and report the transition."""
        raise NotImplementedError(f"{type(self).__name__} must implement step_episode()")

    # --- routes -------------------------------------------------------------------------------------------------

    async def reset(self, request: Request, body: ResetRequest) -> ResetResponse:
        try:
            state, answer = self.reset_episode(body)
        except ValidationError as error:  # the row's task fields, read by the subclass: a bad row, so a 422
            raise RequestValidationError(error.errors(include_url=False, include_context=False)) from error
        self._episodes.set(request.session[SESSION_ID_KEY], state)
        return answer

    async def step(self, request: Request, body: StepRequest) -> StepResponse:
        session_id = request.session[SESSION_ID_KEY]
        state = self._episodes.get(session_id)
        if state is None:
            raise HTTPException(
                status_code=409,
                detail="No live episode for this session: call /reset first (the episode may have ended or been evicted).",
            )
        answer = self.step_episode(state, body)
        if answer.terminated or answer.truncated:
            self._episodes.pop(session_id)
        return answer

    async def close(self, request: Request) -> CloseResponse:
        return CloseResponse(closed=self._episodes.pop(request.session[SESSION_ID_KEY]) is not None)

    async def aggregate_metrics(self, body: AggregateMetricsRequest) -> AggregateMetrics:
        return aggregate_verify_responses(body.verify_responses)

    async def get_reverify_mode(self) -> ReverifyMode:
        return ReverifyMode(self.config.REVERIFY_MODE)

    async def reverify_mode(self) -> ReverifyMode:
        """The route: :meth:`get_reverify_mode` (NeMo Gym's name; override either)."""
        return await self.get_reverify_mode()

    @property
    def live_episodes(self) -> int:
        """How many episodes are held (for tests and monitoring)."""
        return len(self._episodes)
