"""legacy_agent: an environment server in front of an agent that still runs whole rollouts through ``/run``.

It reads nothing: the row goes to the agent's ``/run`` as the bytes it came in, the agent's answer comes back with
its status and headers, cookies included, so the agent's own contract (its failure rows, its reward) holds unchanged.
``/aggregate_metrics`` goes to the agent likewise. The episode limits of the base do not apply to a relay; the agent
keeps its own. The collector reaches an agent that no environment server names directly, which is this relay
without the extra hop; declare one to put an environment server in front of such an agent explicitly.
"""

from __future__ import annotations

import warnings
from typing import Any

from fastapi import FastAPI, Request, Response
from pydantic import ConfigDict, PositiveFloat, PositiveInt, model_validator

from nemo_gym.base_environment_server import BaseEnvironmentServer, BaseEnvironmentServerConfig, CleanupContext
from nemo_gym.config_types import AgentServerRef, AggregateMetricsRequest
from nemo_gym.episode_types import BaseEpisodeRequest, BaseEpisodeResponse

# Hop-by-hop headers, and those the relay's own client sets (the run token, the nested-call mark).
_NOT_RELAYED = frozenset(
    {"connection", "content-encoding", "content-length", "cookie", "host", "keep-alive", "transfer-encoding",
     "upgrade", "x-nemo-gym-token", "x-nemo-gym-nested", "authorization"}
)  # fmt: skip
_LIMITS = ("max_concurrent_episodes", "queue_timeout_seconds", "default_episode_timeout_seconds",
           "cleanup_timeout_seconds")  # fmt: skip


class LegacyAgentConfig(BaseEnvironmentServerConfig):
    model_config = ConfigDict(extra="forbid")

    agent_server: AgentServerRef
    max_concurrent_episodes: PositiveInt | None = None
    queue_timeout_seconds: PositiveFloat | None = None
    default_episode_timeout_seconds: PositiveFloat = 21600
    cleanup_timeout_seconds: PositiveFloat = 180

    @model_validator(mode="after")
    def _limits_do_nothing(self) -> LegacyAgentConfig:
        ignored = [name for name in _LIMITS if name in self.model_fields_set]
        if ignored:
            warnings.warn(f"{self.name}: a relay does not apply {', '.join(ignored)}; the agent keeps its own limits",
                          stacklevel=2)  # fmt: skip
        return self


LegacyAgentEnvironmentServerConfig = LegacyAgentConfig  # NeMo Gym's name


def _relayed(headers: Any) -> list[tuple[str, str]]:
    return [(name, value) for name, value in headers.items() if name.lower() not in _NOT_RELAYED]


class LegacyAgentEnvironmentServer(BaseEnvironmentServer):
    config: LegacyAgentConfig

    def add_episode_routes(self, app: FastAPI) -> None:
        app.post("/run")(self.relay_run)
        app.post("/aggregate_metrics")(self.relay_metrics)

    async def relay_run(self, request: Request) -> Response:
        """One rollout: the row to the agent's ``/run``, its answer back as it came."""
        return await self._relay(request, "/run")

    async def relay_metrics(self, request: Request) -> Response:
        """The run's rows to the agent's ``/aggregate_metrics``."""
        return await self._relay(request, "/aggregate_metrics")

    async def aggregate_metrics(self, body: AggregateMetricsRequest) -> Any:
        answer = await self.server_client.post(self.config.agent_server.name, "/aggregate_metrics", json=body)
        return await answer.json()

    async def run(self, request: BaseEpisodeRequest[Any], cleanup: CleanupContext) -> BaseEpisodeResponse[Any]:
        raise RuntimeError("legacy_agent relays /run to its agent; it has no typed episode")

    async def _relay(self, request: Request, path: str) -> Response:
        agent = self.config.agent_server.name
        upstream = await self.server_client.post(
            agent, path, data=await request.body(), headers=dict(_relayed(request.headers)), cookies=request.cookies
        )
        body = await upstream.read()
        response = Response(content=body, status_code=upstream.status)
        # raw_headers, so a repeated header (several Set-Cookie) stays repeated
        response.raw_headers = [
            (k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in _relayed(upstream.headers)
        ]
        response.raw_headers.append((b"content-length", str(len(body)).encode()))
        return response


if __name__ == "__main__":
    LegacyAgentEnvironmentServer.run_webserver()
