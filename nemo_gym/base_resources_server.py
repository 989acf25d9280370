"""Resources servers: an environment's tools, its per-rollout state and its verifier.

A resources server adds one route per tool in ``setup_webserver()`` (the route name is the function tool's name, the
request body is the parsed tool-call arguments, the response JSON is the tool output the model sees), and implements
``verify()``, which scores a finished trajectory. Per-rollout state is keyed by ``request.session["session_id"]``.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from fastapi import FastAPI
from pydantic import BaseModel, ConfigDict

from nemo_gym.config.server_models import BaseRunServerInstanceConfig
from nemo_gym.metrics import AggregateMetrics, AggregateMetricsRequest, aggregate_verify_responses
from nemo_gym.openai_utils import NeMoGymResponse, NeMoGymResponseCreateParamsNonStreaming
from nemo_gym.server_utils import SimpleServer

__all__ = [
    "AggregateMetrics",
    "AggregateMetricsRequest",
    "BaseMultiRewardVerifyResponse",
    "BaseResourcesServerConfig",
    "BaseRunRequest",
    "BaseRunServerInstanceConfig",
    "BaseSeedSessionRequest",
    "BaseSeedSessionResponse",
    "BaseVerifyRequest",
    "BaseVerifyResponse",
    "NeMoGymResponse",
    "NeMoGymResponseCreateParamsNonStreaming",
    "ReverifyMode",
    "SimpleResourcesServer",
    "SimpleServer",
    "aggregate_verify_responses",
]

ReverifyMode = Literal["stateless", "unsupported", "unknown"]


class BaseResourcesServerConfig(BaseRunServerInstanceConfig):
    REVERIFY_MODE: ClassVar[ReverifyMode] = "unknown"
    """Whether ``/verify`` can be re-run on a stored rollout without replaying its tool calls."""


class BaseSeedSessionRequest(BaseModel):
    """The task row, as sent by the agent before the first model call; subclasses declare the fields they need."""


class BaseSeedSessionResponse(BaseModel):
    pass


class BaseVerifyRequest(BaseModel):
    """The task row plus the model's final ``response``; subclasses declare task fields such as ``expected_answer``."""

    responses_create_params: NeMoGymResponseCreateParamsNonStreaming
    response: NeMoGymResponse


class BaseVerifyResponse(BaseVerifyRequest):
    reward: float


class BaseMultiRewardVerifyResponse(BaseVerifyResponse):
    reward_components: dict[str, float]


class BaseRunRequest(BaseModel):
    """One dataset row sent to an agent's ``/run``: the create params plus any task fields."""

    model_config = ConfigDict(extra="allow")

    responses_create_params: NeMoGymResponseCreateParamsNonStreaming


class SimpleResourcesServer(SimpleServer):
    config: BaseResourcesServerConfig

    def setup_webserver(self) -> FastAPI:
        app = super().setup_webserver()
        app.post("/seed_session")(self.seed_session)
        app.post("/verify")(self.verify)
        app.post("/aggregate_metrics")(self.aggregate_metrics)
        app.get("/reverify_mode")(self.reverify_mode)
        return app

    async def seed_session(self, body: BaseSeedSessionRequest) -> BaseSeedSessionResponse:
        return BaseSeedSessionResponse()

    async def verify(self, body: BaseVerifyRequest) -> BaseVerifyResponse:
        raise NotImplementedError(f"{type(self).__name__} must implement verify()")

    async def aggregate_metrics(self, body: AggregateMetricsRequest) -> AggregateMetrics:
        """Default metrics: statistics of ``reward`` and every other numeric field, overall and per task."""
        return aggregate_verify_responses(body.verify_responses)

    async def reverify_mode(self) -> ReverifyMode:
        return self.config.REVERIFY_MODE
