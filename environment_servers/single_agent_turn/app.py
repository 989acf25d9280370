"""single_agent_turn: one episode = seed the resources session, one agent turn in an agent session, verify, close.

The order, and what is released when (each close is registered before the call that opens it, so a lost answer or a
cancelled episode still closes what the other side may have opened):

1. ``/seed_session`` on the resources server, under a session id chosen here; its cookie identifies the episode;
2. ``/v1/agent_sessions`` on the agent, with the resources server's tools (plain HTTP with that cookie, or its MCP
   endpoint) and its sandbox, if any;
3. ``/ng-rollout/<capture key>/v1/responses`` on the agent: the turn, with its model calls filed under the episode;
4. ``/v1/agent_sessions/close``: the agent's observations and the resources cookies as the agent left them;
5. ``/verify`` on the resources server with the task's data and the agent's answer; its answer is the result;
6. ``/close_session`` on the resources server (in the episode's cleanup, also after a failure).

A failure says its stage, its kind (``nemo_gym.failure_kinds``) and whether another attempt can help: an unreachable
or overloaded server (no answer, a 5xx, 408/425/429) can, a refused request (another 4xx) or an invalid answer
cannot.
"""

from __future__ import annotations

import secrets
from typing import Any, Literal

from pydantic import AnyHttpUrl, ConfigDict, Field, ValidationError

from nemo_gym.base_environment_server import (
    BaseEnvironmentServer,
    BaseEnvironmentServerConfig,
    CleanupContext,
    HandledEpisodeError,
)
from nemo_gym.base_resources_server import (
    ResourcesCloseSessionRequest,
    ResourcesSeedSessionRequest,
    ResourcesSeedSessionResponse,
)
from nemo_gym.base_responses_api_agent import (
    AgentCloseSessionRequest,
    AgentCloseSessionResponse,
    AgentSeedSessionRequest,
    AgentSeedSessionResponse,
)
from nemo_gym.config_types import AgentServerRef, AggregateMetrics, AggregateMetricsRequest, ResourcesServerRef
from nemo_gym.failure_kinds import FailureStage
from nemo_gym.openai_utils import NeMoGymResponse
from nemo_gym.single_agent_turn_types import (
    SingleAgentTurnFailure,
    SingleAgentTurnRequest,
    SingleAgentTurnResponse,
    SingleAgentTurnResult,
)
from nemo_gym.tool_access import DirectHTTPToolAccess, MCPStreamableHTTPConnection, MCPToolAccess, ToolAccess
from nemo_gym.transport.http_client import cookies_from, raise_for_status, response_json
from nemo_gym.transport.types import ServerRequestError, ServerTimeoutError, TransportError

_RETRYABLE_STATUSES = frozenset({408, 425, 429})
# The kind of an HTTP error answer at each stage; a call that got no answer is a transport kind.
_ANSWERED_KINDS: dict[str, str] = {
    "seed": "session_lost",
    "agent": "agent_run_error",
    "verification": "verifier_error",
    "cleanup": "session_release_failed",
}


ToolTransport = Literal["direct_http", "mcp"]
_DEFAULT_TRANSPORTS: tuple[ToolTransport, ...] = ("direct_http",)


class SingleAgentTurnConfig(BaseEnvironmentServerConfig):
    model_config = ConfigDict(extra="forbid")

    resources_server: ResourcesServerRef
    agent_server: AgentServerRef
    resources_tool_transports: list[ToolTransport] = Field(default_factory=lambda: list(_DEFAULT_TRANSPORTS))
    """How the agent reaches the resources server's tools: its HTTP routes with the session cookie, its MCP endpoint
    (``expose_tools_over_mcp: true`` on the resources server), or both."""


# NeMo Gym's names for the config class.
SingleAgentTurnEnvironmentServerConfig = SingleAgentTurnConfig


class SingleAgentTurnEnvironmentServer(BaseEnvironmentServer[SingleAgentTurnRequest, SingleAgentTurnResponse]):
    config: SingleAgentTurnConfig
    request_model = SingleAgentTurnRequest
    response_model = SingleAgentTurnResponse

    async def aggregate_metrics(self, body: AggregateMetricsRequest) -> AggregateMetrics:
        """The resources server verified the rows, so it computes their metrics."""
        answer = await self.server_client.post(self.config.resources_server.name, "/aggregate_metrics", json=body)
        raise_for_status(answer, self.config.resources_server.name, "/aggregate_metrics")
        return AggregateMetrics.model_validate(await response_json(answer))

    async def run(self, request: SingleAgentTurnRequest, cleanup: CleanupContext) -> SingleAgentTurnResponse:
        task = request.task.task_input
        resources = self.config.resources_server.name
        agent = self.config.agent_server.name
        episode = request.episode_id

        resources_session_id = f"resources-{secrets.token_hex(12)}"
        resources_cookies: dict[str, str] = {}

        async def close_resources() -> None:
            closing = ResourcesCloseSessionRequest(resources_session_id=resources_session_id, episode_id=episode)
            answer = await self.server_client.post(resources, "/close_session", json=closing.model_dump(mode="json"),
                                                   cookies=resources_cookies)  # fmt: skip
            raise_for_status(answer, resources, "/close_session")

        resources_close = cleanup.register_cleanup("resources session", close_resources)
        with _stage("seed"):
            seeding = ResourcesSeedSessionRequest(
                resources_session_id=resources_session_id,
                episode_id=episode,
                task_id=request.task.task_id,
                task_data=task.task_data,
            )
            answer = await self.server_client.post(resources, "/seed_session", json=seeding.model_dump(mode="json"))
            raise_for_status(answer, resources, "/seed_session")
            resources_cookies = cookies_from(answer)
            seeded = ResourcesSeedSessionResponse.model_validate(await response_json(answer))
            if seeded.resources_session_id != resources_session_id:
                raise ValueError(f"{resources} seeded session {seeded.resources_session_id!r}, not the one asked for")
            accesses = self._tool_accesses(seeded, resources_cookies)

        agent_session_id = f"agent-{secrets.token_hex(12)}"
        agent_cookies: dict[str, str] = {}
        closed: list[AgentCloseSessionResponse] = []

        async def close_agent() -> None:
            nonlocal resources_cookies
            closing = AgentCloseSessionRequest(agent_session_id=agent_session_id, episode_id=episode)
            answer = await self.server_client.post(agent, "/v1/agent_sessions/close",
                                                   json=closing.model_dump(mode="json"), cookies=agent_cookies)  # fmt: skip
            raise_for_status(answer, agent, "/v1/agent_sessions/close")
            receipt = AgentCloseSessionResponse.model_validate(await response_json(answer))
            if receipt.agent_session_id != agent_session_id:
                raise ValueError(f"{agent} closed session {receipt.agent_session_id!r}, not the one asked for")
            closed.append(receipt)
            if receipt.resources_cookies is not None:
                resources_cookies = receipt.resources_cookies

        agent_close = cleanup.register_cleanup("agent session", close_agent)
        with _stage("agent"):
            opening = AgentSeedSessionRequest(
                agent_session_id=agent_session_id,
                episode_id=episode,
                task_id=request.task.task_id,
                tool_accesses=accesses,
                sandbox_access=seeded.sandbox_access,
            )
            answer = await self.server_client.post(agent, "/v1/agent_sessions", json=opening.model_dump(mode="json"))
            raise_for_status(answer, agent, "/v1/agent_sessions")
            agent_cookies = cookies_from(answer)
            opened = AgentSeedSessionResponse.model_validate(await response_json(answer))
            if opened.agent_session_id != agent_session_id:
                raise ValueError(f"{agent} opened session {opened.agent_session_id!r}, not the one asked for")

            path = f"/ng-rollout/{episode.capture_key}/v1/responses"
            params = task.responses_create_params.model_dump(mode="json", exclude_unset=True)
            answer = await self.server_client.post(agent, path, json=params, cookies=agent_cookies)
            raise_for_status(answer, agent, path)
            agent_cookies |= cookies_from(answer)
            turn = NeMoGymResponse.model_validate(await response_json(answer))

        with _stage("cleanup", partial_response=turn):
            await agent_close.close()  # its receipt carries the observations and the cookies verification needs
        with _stage("verification", partial_response=turn):
            verifying = task.task_data | {"responses_create_params": params, "response": turn.model_dump(mode="json")}
            answer = await self.server_client.post(resources, "/verify", json=verifying, cookies=resources_cookies)
            raise_for_status(answer, resources, "/verify")
            verified = SingleAgentTurnResult.model_validate(await response_json(answer))
        # The resources session is closed by the cleanup; registering its handle again gives it a second chance
        # there without turning a verified episode into a failure here.
        cleanup.register_cleanup("resources session (after verification)", resources_close.close)
        observations = closed[0].agent_observations if closed else None
        return SingleAgentTurnResponse(
            episode_id=episode,
            task_id=request.task.task_id,
            result=verified.model_copy(update={"ng_agent_observations": observations}),
        )

    def _tool_accesses(self, seeded: ResourcesSeedSessionResponse, cookies: dict[str, str]) -> list[ToolAccess]:
        resources = self.config.resources_server.name
        base_url = self.server_client.server_base_url(resources)
        accesses: list[ToolAccess] = []
        if "direct_http" in self.config.resources_tool_transports:
            accesses.append(DirectHTTPToolAccess(name=f"{resources}.direct_http", required=True, base_url=AnyHttpUrl(base_url),
                                                 cookies=cookies))  # fmt: skip
        if "mcp" in self.config.resources_tool_transports:
            tools = seeded.resources_tools
            if tools is None or tools.transport != "http":
                raise ValueError(f"{resources} offers no MCP endpoint over HTTP: set expose_tools_over_mcp on it")
            url = f"{base_url}/{tools.url_path.lstrip('/')}"
            connection = MCPStreamableHTTPConnection(url=AnyHttpUrl(url), headers=tools.headers)
            accesses.append(MCPToolAccess(name=tools.server_name, required=True, connection=connection))
        return accesses


class _stage:
    """Turns what fails inside it into the episode's failure at ``stage``: retryable when the server could not be
    reached or was overloaded, terminal when it refused the request or answered something invalid."""

    def __init__(self, stage: FailureStage, partial_response: NeMoGymResponse | None = None) -> None:
        self.stage = stage
        self.partial_response = partial_response

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: Any) -> None:
        if error is None or not isinstance(error, (TransportError, ValidationError, ValueError)):
            return  # success, or a bug: the base answers an unexpected error as a terminal failure
        failure_kind, terminal = _classify(self.stage, error)
        failure = SingleAgentTurnFailure(
            failure_reason=str(error)[:2000],
            terminal=terminal,
            failure_kind=failure_kind,
            stage=self.stage,
            partial_response=self.partial_response,
        )
        raise HandledEpisodeError(failure) from error


def _classify(stage: str, error: BaseException) -> tuple[str, bool]:
    """``(failure_kind, terminal)`` of an error at ``stage``."""
    if isinstance(error, ServerTimeoutError):
        return "transport_timeout", False
    if isinstance(error, ServerRequestError) and error.status is None:
        return "transport_unreachable", False
    if isinstance(error, TransportError):
        status = getattr(error, "status", None) or 0
        return _ANSWERED_KINDS[stage], not (status >= 500 or status in _RETRYABLE_STATUSES)
    return _ANSWERED_KINDS[stage], True  # an answer that does not parse: asking again gets the same


if __name__ == "__main__":
    SingleAgentTurnEnvironmentServer.run_webserver()
