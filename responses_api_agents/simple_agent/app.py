"""simple_agent: seed the environment's session, loop model -> tools until a final answer, then verify.

One rollout = ``/seed_session`` → (``/v1/responses`` on the model, then one ``/<tool>`` call per function call) × up to
``max_steps`` → ``/verify``. The loop ends when a model turn has an assistant message and no function call, when the
model's response is incomplete (e.g. it ran out of tokens), or after ``max_steps`` model calls, so a model that only
ever reasons cannot loop forever. A bad tool call (unparseable arguments, unknown tool, a tool error) becomes a
``function_call_output`` the model can read and react to; a failing model or verifier fails the rollout.

In an environment server's episode (an agent session, ``nemo_gym.agent_sessions``) the environment server seeds and
verifies: ``/v1/responses`` runs the loop with the resources session the episode's tool access names, and closing the
session hands its cookies back.

With ``execute_tools: false`` a rollout is one model call whose function calls are the answer: ``/verify`` judges them
(function-calling datasets scored by argument comparison) and no tool route is ever called.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson
from fastapi import HTTPException, Request, Response
from pydantic import Field

from nemo_gym.base_resources_server import BaseRunRequest
from nemo_gym.base_responses_api_agent import (
    AgentCloseSessionResponse,
    AgentSeedSessionRequest,
    AgentSessionState,
    BaseResponsesAPIAgentConfig,
    SimpleResponsesAPIAgent,
    add_usage,
    forwards_aggregate_metrics,
)
from nemo_gym.config_types import AggregateMetrics, AggregateMetricsRequest, ModelServerRef, ResourcesServerRef
from nemo_gym.openai_utils import NeMoGymResponse, NeMoGymResponseCreateParamsNonStreaming
from nemo_gym.tool_access import DirectHTTPToolAccess
from nemo_gym.transport.http_client import TransportError, cookies_from, raise_for_status, response_json

if TYPE_CHECKING:
    from nemo_gym.observability.agent_turns import AgentTurns

RESERVED_ROUTES = frozenset({"seed_session", "verify", "aggregate_metrics", "reverify_mode"})
_TOOL_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,128}$")
_MAX_TOOL_OUTPUT_ERROR_CHARS = 2000


class SimpleAgentConfig(BaseResponsesAPIAgentConfig):
    resources_server: ResourcesServerRef
    model_server: ModelServerRef
    max_steps: int = Field(default=10, ge=1)
    """Most model calls in one rollout."""
    execute_tools: bool = True
    """False: one model call, and its function calls are the answer to judge (never run, no tool outputs)."""


@dataclass
class ToolSession(AgentSessionState):
    """An agent session's resources cookies, as the episode's tool access gave them and the tools then set them."""

    cookies: dict[str, str] = field(default_factory=dict)


class SimpleAgent(SimpleResponsesAPIAgent):
    config: SimpleAgentConfig

    async def responses(
        self, request: Request, response: Response, body: NeMoGymResponseCreateParamsNonStreaming
    ) -> NeMoGymResponse:
        params = body.model_dump(mode="json", exclude_unset=True)
        session = self.agent_session_of(request)
        if isinstance(session, ToolSession):
            capture = self._model_call_capture_enabled()  # the model server takes /ng-rollout/ paths only then
            model_path = self.url_path_for_request("/v1/responses", request) if capture else "/v1/responses"
            return NeMoGymResponse.model_validate(await self.run_loop(params, session.cookies, model_path))
        cookies = dict(request.cookies)
        final = await self.run_loop(params, cookies)
        self.pass_on_new_cookies(request, response, cookies)
        return NeMoGymResponse.model_validate(final)

    async def _seed_agent_session_state(self, body: AgentSeedSessionRequest) -> AgentSessionState:
        """The tools are the resources server's HTTP routes: take its session cookies from the episode's access."""
        direct = [a for a in self.effective_tool_accesses(body) if isinstance(a, DirectHTTPToolAccess)]
        if not direct and any(access.required for access in body.tool_accesses):
            raise HTTPException(422, "simple_agent reaches tools over HTTP only: give it a direct_http tool access")
        return ToolSession(request=body, cookies=dict(direct[0].cookies) if direct else {})

    async def _close_agent_session_state(self, state: AgentSessionState) -> AgentCloseSessionResponse:
        cookies = state.cookies if isinstance(state, ToolSession) else None
        return AgentCloseSessionResponse(agent_session_id=state.request.agent_session_id, resources_cookies=cookies)

    async def run(self, request: Request, body: BaseRunRequest) -> Response:
        row = body.model_dump(mode="json", exclude_unset=True)
        cookies = dict(request.cookies)
        resources = self.config.resources_server.name
        await self.seed_rollout(resources, row, cookies)

        if not self._model_call_capture_enabled():
            final = await self.run_loop(row["responses_create_params"], cookies)
            return await self.verify_rollout(resources, row, final, cookies)
        # capture on: this rollout's model calls go to /ng-rollout/<id>/v1/responses, where the model server records
        # them, and the result names each turn's call, so the collector joins the two into its ng_trajectory
        from nemo_gym.observability.agent_turns import AgentTurns
        from nemo_gym.observability.capture import TRAJECTORY_KEY

        turns = AgentTurns(self.config.model_server.name)
        model_path = self.url_path_for_run("/v1/responses", body)
        final = await self.run_loop(row["responses_create_params"], cookies, model_path, turns)
        verified = await self.verify_rollout(resources, row, final, cookies)
        result = orjson.loads(verified.body)
        result.setdefault(TRAJECTORY_KEY, turns.trajectory(row))
        return Response(content=orjson.dumps(result), media_type="application/json")

    @forwards_aggregate_metrics
    async def aggregate_metrics(self, body: AggregateMetricsRequest) -> AggregateMetrics:
        """Metric logic lives with the environment: ask the resources server."""
        return await self.resources_server_metrics(self.config.resources_server.name, body)

    async def run_loop(
        self,
        params: dict[str, Any],
        cookies: dict[str, str],
        model_path: str = "/v1/responses",
        turns: AgentTurns | None = None,
    ) -> dict[str, Any]:
        """Run the tool loop for one set of create params; returns the final Responses object as a dict.

        Its ``output`` holds every item produced after the original input (model items and tool outputs, in order)
        and its ``usage`` sums all model calls. ``cookies`` is updated in place with every server's session cookie;
        ``turns``, when given, gets each model answer.
        """
        original_input = params.get("input", [])
        if isinstance(original_input, str):
            original_input = [{"role": "user", "content": original_input, "type": "message"}]
        model = self.config.model_server.name
        new_outputs: list[dict[str, Any]] = []
        usage: dict[str, Any] | None = None
        last: dict[str, Any] = {}
        for _ in range(self.config.max_steps):
            answer = await self.server_client.post(
                model, model_path, json=params | {"input": original_input + new_outputs}, cookies=cookies
            )
            raise_for_status(answer, model, model_path)
            cookies.update(cookies_from(answer))
            last = await response_json(answer)
            if turns is not None:
                turns.add(last)
            outputs = last.get("output") or []
            new_outputs.extend(outputs)
            usage = add_usage(usage, last.get("usage"))
            if not self.config.execute_tools or last.get("status") == "incomplete" or last.get("incomplete_details"):
                break
            calls = [item for item in outputs if item.get("type") == "function_call"]
            has_message = any(item.get("type") == "message" and item.get("role") == "assistant" for item in outputs)
            if not calls and has_message:
                break
            for call in calls:
                output = await self.call_tool(call, cookies)
                new_outputs.append({"type": "function_call_output", "call_id": call.get("call_id"), "output": output})
        return last | {"output": new_outputs, "usage": usage}

    async def call_tool(self, call: dict[str, Any], cookies: dict[str, str]) -> str:
        """Run one function call on the resources server; every failure becomes text the model can read."""
        name = str(call.get("name", ""))
        if not _TOOL_NAME.match(name) or name in RESERVED_ROUTES:
            return _error(f"Unknown tool {name!r}.")
        try:
            arguments = orjson.loads(call.get("arguments") or "{}")
        except orjson.JSONDecodeError as e:
            return _error(f"Invalid tool call arguments for {name!r}: {e}")
        if not isinstance(arguments, dict):
            return _error(f"Invalid tool call arguments for {name!r}: expected a JSON object")
        resources = self.config.resources_server.name
        try:
            answer = await self.server_client.post(resources, f"/{name}", json=arguments, cookies=cookies)
        except TransportError as e:
            return _error(f"Tool {name!r} could not be reached: {e}")
        cookies.update(cookies_from(answer))
        text = await answer.text()
        if answer.status == 404:
            return _error(f"Unknown tool {name!r}.")
        if answer.status == 422:
            return _error(f"Invalid arguments for tool {name!r}: {_validation_detail(text)}")
        if answer.status >= 400:
            return _error(f"Tool {name!r} failed (HTTP {answer.status}): {text[:_MAX_TOOL_OUTPUT_ERROR_CHARS]}")
        return text


def _error(message: str) -> str:
    return orjson.dumps({"error": message}).decode()


def _validation_detail(text: str) -> str:
    """FastAPI's 422 body, shortened to 'field: problem' pairs."""
    try:
        detail = orjson.loads(text).get("detail")
    except (orjson.JSONDecodeError, AttributeError):
        return text[:_MAX_TOOL_OUTPUT_ERROR_CHARS]
    if not isinstance(detail, list):
        return str(detail)[:_MAX_TOOL_OUTPUT_ERROR_CHARS]
    return "; ".join(
        f"{'.'.join(str(p) for p in item.get('loc', [])[1:]) or 'arguments'}: {item.get('msg')}" for item in detail
    )


if __name__ == "__main__":
    SimpleAgent.run_webserver()
