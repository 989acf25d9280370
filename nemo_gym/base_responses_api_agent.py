"""Agent servers: the loop that drives a model against an environment's tools and asks for a reward.

``/v1/responses`` runs the loop for one set of create params and returns the final Responses object (so an agent can
stand in for a model); ``/run`` takes a whole dataset row, seeds the environment's session, runs the loop and returns
the verified row with its ``reward``.
"""

from __future__ import annotations

from typing import Any

import orjson
from fastapi import FastAPI, Request, Response

from nemo_gym.base_resources_server import BaseRunRequest, BaseVerifyResponse
from nemo_gym.config.server_models import BaseRunServerInstanceConfig
from nemo_gym.metrics import AggregateMetrics, AggregateMetricsRequest, aggregate_verify_responses
from nemo_gym.openai_utils import NeMoGymResponse, NeMoGymResponseCreateParamsNonStreaming
from nemo_gym.server_utils import SimpleServer

__all__ = [
    "AggregateMetrics",
    "AggregateMetricsRequest",
    "BaseResponsesAPIAgentConfig",
    "BaseRunRequest",
    "BaseRunServerInstanceConfig",
    "BaseVerifyResponse",
    "NeMoGymResponse",
    "NeMoGymResponseCreateParamsNonStreaming",
    "SimpleResponsesAPIAgent",
    "SimpleServer",
    "add_usage",
    "aggregate_verify_responses",
]


class BaseResponsesAPIAgentConfig(BaseRunServerInstanceConfig):
    skip_verification: bool = False
    skip_verification_reward: float = 0.0


class SimpleResponsesAPIAgent(SimpleServer):
    config: BaseResponsesAPIAgentConfig

    def setup_webserver(self) -> FastAPI:
        app = super().setup_webserver()
        app.post("/v1/responses")(self.responses)
        app.post("/run")(self.run)
        app.post("/aggregate_metrics")(self.aggregate_metrics)
        return app

    async def responses(
        self, request: Request, response: Response, body: NeMoGymResponseCreateParamsNonStreaming
    ) -> NeMoGymResponse:
        raise NotImplementedError(f"{type(self).__name__} must implement responses()")

    async def run(self, request: Request, body: BaseRunRequest) -> BaseVerifyResponse:
        raise NotImplementedError(f"{type(self).__name__} must implement run()")

    async def aggregate_metrics(self, body: AggregateMetricsRequest) -> AggregateMetrics:
        return aggregate_verify_responses(body.verify_responses)


def add_usage(total: dict[str, Any] | None, usage: dict[str, Any] | None) -> dict[str, Any] | None:
    """Token usage of a multi-call rollout: ``usage`` added into ``total`` (a copy of ``usage`` when ``total`` is None).

    Agents report one ``usage`` per rollout, so the counts (and cached / reasoning token details) of every model call
    are summed; ``total`` is updated in place and returned.
    """
    if not usage:
        return total
    if total is None:
        return orjson.loads(orjson.dumps(usage))
    for key in ("input_tokens", "output_tokens", "total_tokens"):
        total[key] = (total.get(key) or 0) + (usage.get(key) or 0)
    for details, field in (("input_tokens_details", "cached_tokens"), ("output_tokens_details", "reasoning_tokens")):
        if isinstance(usage.get(details), dict) and isinstance(total.get(details), dict):
            total[details][field] = (total[details].get(field) or 0) + (usage[details].get(field) or 0)
    return total
