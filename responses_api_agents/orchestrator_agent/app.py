"""orchestrator_agent: a two-agent example. It owns the environment's session and delegates the solving to another agent.

One rollout = ``/seed_session`` on the resources server → ``/v1/responses`` on the worker agent (any agent of the run:
``simple_agent``, ``langgraph_agent``, ...), called through ``ServerClient`` with the rollout's cookies → ``/verify``.
The worker runs its own loop (model calls, tool calls); because it receives the resources server's session cookie, its
tool calls land in the session the orchestrator seeded, and the orchestrator's ``/verify`` sees their effects. Calls
made inside an admitted request carry the nested header, so a worker under load never waits behind its own caller.

``brief``, when set, is handed to the worker as the request's ``instructions``: the orchestrator's word to its worker.
"""

from __future__ import annotations

from typing import Any

from fastapi import Request, Response

from nemo_gym.base_resources_server import BaseRunRequest
from nemo_gym.base_responses_api_agent import (
    BaseResponsesAPIAgentConfig,
    SimpleResponsesAPIAgent,
    forwards_aggregate_metrics,
)
from nemo_gym.config_types import AgentServerRef, AggregateMetrics, AggregateMetricsRequest, ResourcesServerRef
from nemo_gym.openai_utils import NeMoGymResponse, NeMoGymResponseCreateParamsNonStreaming
from nemo_gym.transport.http_client import cookies_from, raise_for_status, response_json


class OrchestratorAgentConfig(BaseResponsesAPIAgentConfig):
    resources_server: ResourcesServerRef
    worker_agent: AgentServerRef
    """The agent that solves each task (its ``/v1/responses``)."""
    brief: str | None = None
    """Instructions for the worker, sent as ``instructions`` on each delegated request (none: the row's own)."""


class OrchestratorAgent(SimpleResponsesAPIAgent):
    config: OrchestratorAgentConfig

    async def delegate(self, params: dict[str, Any], cookies: dict[str, str]) -> dict[str, Any]:
        """The worker's answer to ``params``; ``cookies`` (every server's session) go with it and come back updated."""
        if self.config.brief is not None:
            params = params | {"instructions": self.config.brief}
        worker = self.config.worker_agent.name
        answer = await self.server_client.post(worker, "/v1/responses", json=params, cookies=cookies)
        raise_for_status(answer, worker, "/v1/responses")
        cookies.update(cookies_from(answer))
        return await response_json(answer)

    async def responses(
        self, request: Request, response: Response, body: NeMoGymResponseCreateParamsNonStreaming
    ) -> NeMoGymResponse:
        cookies = dict(request.cookies)
        final = await self.delegate(body.model_dump(mode="json", exclude_unset=True), cookies)
        self.pass_on_new_cookies(request, response, cookies)
        return NeMoGymResponse.model_validate(final)

    async def run(self, request: Request, body: BaseRunRequest) -> Response:
        row = body.model_dump(mode="json", exclude_unset=True)
        cookies = dict(request.cookies)
        resources = self.config.resources_server.name
        await self.seed_rollout(resources, row, cookies)

        final = await self.delegate(row["responses_create_params"], cookies)
        return await self.verify_rollout(resources, row, final, cookies)

    @forwards_aggregate_metrics
    async def aggregate_metrics(self, body: AggregateMetricsRequest) -> AggregateMetrics:
        """Metric logic lives with the environment: ask the resources server."""
        return await self.resources_server_metrics(self.config.resources_server.name, body)


if __name__ == "__main__":
    OrchestratorAgent.run_webserver()
