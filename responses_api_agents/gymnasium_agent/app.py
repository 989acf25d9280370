"""gymnasium_agent: drive a gymnasium-style environment (``/reset``, then model -> ``/step`` per turn), summing rewards.

One rollout = ``POST <env>/reset`` with the row → up to ``max_steps`` times: a model call on the conversation so far,
then ``POST <env>/step`` with the row and that model turn. The environment reads the action from the turn, so a
malformed action is the environment's to report: it answers with an observation the model reads on its next turn.
The rollout's ``reward`` is the sum of the step rewards; it ends when a step is ``terminated`` or ``truncated``, or
after ``max_steps`` model calls (then ``truncated`` is true and the agent calls ``/close`` so the episode is freed).

Observations become user messages in the model's input; ``info.tool_outputs`` answer the model's function calls as
``function_call_output`` items. A Responses ``output`` cannot hold user messages, so the returned ``response.output``
has the model's items and tool outputs, and ``steps`` lists each step's observation, reward and flags in order.
"""

from __future__ import annotations

from typing import Any

from fastapi import Request, Response
from pydantic import Field

from nemo_gym.base_resources_server import BaseRunRequest
from nemo_gym.base_responses_api_agent import BaseResponsesAPIAgentConfig, SimpleResponsesAPIAgent, add_usage
from nemo_gym.config_types import AggregateMetrics, AggregateMetricsRequest, ModelServerRef, ResourcesServerRef
from nemo_gym.openai_utils import NeMoGymResponse, NeMoGymResponseCreateParamsNonStreaming
from nemo_gym.server_utils import json_response
from nemo_gym.transport.http_client import TransportError, cookies_from, raise_for_status, response_json


class GymnasiumAgentConfig(BaseResponsesAPIAgentConfig):
    resources_server: ResourcesServerRef
    model_server: ModelServerRef
    max_steps: int = Field(default=10, ge=1)
    """Most model calls (= environment steps) in one rollout."""


def _user_message(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": text}


class GymnasiumAgent(SimpleResponsesAPIAgent):
    config: GymnasiumAgentConfig

    async def responses(
        self, request: Request, response: Response, body: NeMoGymResponseCreateParamsNonStreaming
    ) -> NeMoGymResponse:
        """One episode for bare create params (no task fields), so the agent can stand in for a model."""
        cookies = dict(request.cookies)
        episode = await self.run_episode(
            {"responses_create_params": body.model_dump(mode="json", exclude_unset=True)}, cookies
        )
        for name, value in cookies.items():
            if request.cookies.get(name) != value:
                response.set_cookie(name, value)
        return NeMoGymResponse.model_validate(episode["response"])

    async def run(self, request: Request, body: BaseRunRequest) -> Response:
        row = body.model_dump(mode="json", exclude_unset=True)
        episode = await self.run_episode(row, dict(request.cookies))
        return json_response(row | episode)

    async def aggregate_metrics(self, body: AggregateMetricsRequest) -> AggregateMetrics:
        """Metric logic lives with the environment: ask the resources server."""
        env = self.config.resources_server.name
        answer = await self.server_client.post(env, "/aggregate_metrics", json=body)
        raise_for_status(answer, env, "/aggregate_metrics")
        return AggregateMetrics.model_validate(await response_json(answer))

    async def run_episode(self, row: dict[str, Any], cookies: dict[str, str]) -> dict[str, Any]:
        """Reset, then alternate model calls and steps. ``cookies`` is updated in place with every server's cookie.

        Returns ``responses_create_params`` (with the reset observation appended to the input), ``response`` (the
        last model response, with every model item and tool output in ``output`` and usage summed), ``reward``,
        ``terminated``, ``truncated``, ``info`` (the last step's) and ``steps``.
        """
        env, model = self.config.resources_server.name, self.config.model_server.name
        reset = await self.server_client.post(env, "/reset", json=row, cookies=cookies)
        raise_for_status(reset, env, "/reset")
        cookies.update(cookies_from(reset))
        first = await response_json(reset)

        params = dict(row["responses_create_params"])
        base_input = params.get("input", [])
        if isinstance(base_input, str):
            base_input = [_user_message(base_input)]
        if first.get("observation") is not None:
            base_input = [*base_input, _user_message(first["observation"])]
        params["input"] = base_input

        conversation: list[dict[str, Any]] = []  # what the model sees after base_input
        output: list[dict[str, Any]] = []  # what the returned response holds (no user messages)
        steps: list[dict[str, Any]] = []
        usage: dict[str, Any] | None = None
        last: dict[str, Any] = {}
        total, terminated, truncated, info = 0.0, False, False, dict(first.get("info") or {})
        for _ in range(self.config.max_steps):
            answer = await self.server_client.post(
                model, "/v1/responses", json=params | {"input": base_input + conversation}, cookies=cookies
            )
            raise_for_status(answer, model, "/v1/responses")
            cookies.update(cookies_from(answer))
            last = await response_json(answer)
            usage = add_usage(usage, last.get("usage"))
            items = last.get("output") or []
            conversation.extend(items)
            output.extend(items)

            stepped = await self.server_client.post(env, "/step", json=row | {"response": last}, cookies=cookies)
            raise_for_status(stepped, env, "/step")
            cookies.update(cookies_from(stepped))
            step = await response_json(stepped)
            reward = float(step.get("reward") or 0.0)
            terminated, truncated = bool(step.get("terminated")), bool(step.get("truncated"))
            info = step.get("info") or {}
            total += reward
            observation = step.get("observation")
            steps.append(
                {"observation": observation, "reward": reward, "terminated": terminated, "truncated": truncated}
            )
            for tool_output in info.get("tool_outputs") or []:
                item = {
                    "type": "function_call_output",
                    "call_id": tool_output["call_id"],
                    "output": tool_output["output"],
                }
                conversation.append(item)
                output.append(item)
            if terminated or truncated:
                break
            if observation is not None:
                conversation.append(_user_message(observation))
        else:
            truncated = True
            await self._close(env, cookies)

        return {
            "responses_create_params": params,
            "response": last | {"output": output, "usage": usage},
            "reward": total,
            "terminated": terminated,
            "truncated": truncated,
            "info": info,
            "steps": steps,
        }

    async def _close(self, env: str, cookies: dict[str, str]) -> None:
        """Free the unfinished episode; a failure here must not lose a finished rollout, so it is ignored."""
        try:
            await self.server_client.post(env, "/close", json={}, cookies=cookies)
        except TransportError:
            pass


if __name__ == "__main__":
    GymnasiumAgent.run_webserver()
