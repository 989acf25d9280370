"""gymnasium_agent against real HTTP servers on loopback: the scripted model, Blackjack, and a tiny counting env."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, ClassVar

import httpx
from fastapi import Request, Response

from nemo_gym.base_gymnasium_server import (
    BaseGymnasiumServerConfig,
    GymnasiumServer,
    ResetRequest,
    ResetResponse,
    StepRequest,
    StepResponse,
)
from nemo_gym.testing import local_server_client, serve_servers
from resources_servers.blackjack.app import ACTION_TOOL, BlackjackResourcesServer, BlackjackResourcesServerConfig
from resources_servers.blackjack.generate_data import build_row
from responses_api_agents.gymnasium_agent.app import GymnasiumAgent, GymnasiumAgentConfig
from responses_api_models.scripted_model.app import ScriptedModel, ScriptedModelConfig

COMMON = {"host": "127.0.0.1", "port": 0, "entrypoint": "app.py"}


class CountingEnv(GymnasiumServer):
    """Reward 0.5 per step, over after ``steps`` steps; the observation counts down (a generic test env)."""

    steps: int = 3

    def reset_episode(self, row: ResetRequest) -> tuple[dict[str, int], ResetResponse]:
        return {"left": self.steps}, ResetResponse(observation=f"{self.steps} steps to go", info={"started": True})

    def step_episode(self, state: dict[str, int], body: StepRequest) -> StepResponse:
        state["left"] -= 1
        return StepResponse(
            observation=f"{state['left']} steps to go", reward=0.5, terminated=state["left"] == 0, info=dict(state)
        )


class RecordingModel(ScriptedModel):
    """The scripted model, remembering the input of every call."""

    inputs: ClassVar[list[list[dict[str, Any]]]] = []

    async def responses(self, request: Request) -> Response:
        RecordingModel.inputs.append(json.loads(await request.body())["input"])
        return await super().responses(request)


def say(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}


def act(action: str) -> dict[str, Any]:
    return {"type": "function_call", "name": ACTION_TOOL, "arguments": json.dumps({"action": action})}


@contextmanager
def serve(script: list[list[dict[str, Any]]], max_steps: int = 5, env: str = "blackjack") -> Iterator[tuple[str, Any]]:
    """Model, environment and agent on loopback; yields the agent's URL and the environment object."""
    client = local_server_client()
    if env == "blackjack":
        config = BlackjackResourcesServerConfig(**COMMON, name="env", domain="games")
        environment: GymnasiumServer = BlackjackResourcesServer(config=config, server_client=client)
    else:
        config = BaseGymnasiumServerConfig(**COMMON, name="env", domain="other")
        environment = CountingEnv(config=config, server_client=client)
    servers = {
        "policy_model": RecordingModel(
            config=ScriptedModelConfig(**COMMON, name="policy_model", script=script), server_client=client
        ),
        "env": environment,
        "agent": GymnasiumAgent(
            config=GymnasiumAgentConfig(
                **COMMON, name="agent", max_steps=max_steps,
                resources_server={"type": "resources_servers", "name": "env"},
                model_server={"type": "responses_api_models", "name": "policy_model"},
            ),
            server_client=client,
        ),
    }  # fmt: skip
    with serve_servers(servers, client) as urls:
        yield urls["agent"], environment


def run(agent: str, row: dict[str, Any]) -> dict[str, Any]:
    answer = httpx.post(f"{agent}/run", json=row, timeout=30)
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_tool_call_actions_play_a_winning_hand():
    with serve([[act("hit")], [act("stand")]]) as (agent, env):
        rollout = run(agent, build_row(3))
    assert (rollout["reward"], rollout["terminated"], rollout["truncated"]) == (1.0, True, False)
    output = rollout["response"]["output"]
    assert [item["type"] for item in output] == ["function_call", "function_call_output"] * 2
    assert "value 19" in output[1]["output"] and output[3]["output"].startswith("Result: win")
    assert [step["reward"] for step in rollout["steps"]] == [0.0, 1.0]
    assert rollout["info"]["result"] == "win" and rollout["seed"] == 3  # the row's fields come back too
    assert env.live_episodes == 0


def test_the_reset_observation_joins_the_input_and_text_actions_work():
    with serve([[say("Thirteen is risky, so <action>stand</action>.")]]) as (agent, _):
        rollout = run(agent, build_row(3))
    last_input = rollout["responses_create_params"]["input"][-1]
    assert last_input["role"] == "user" and last_input["content"].startswith("Your hand: 4, 9 (value 13)")
    assert (rollout["reward"], rollout["info"]["result"]) == (-1.0, "loss")  # negative rewards are summed too
    assert [item["type"] for item in rollout["response"]["output"]] == ["message"]


def test_malformed_actions_are_observations_until_max_steps_then_truncated_and_closed():
    with serve([[say("I am not sure.")]], max_steps=3) as (agent, env):
        rollout = run(agent, build_row(3))
        assert env.live_episodes == 0  # the agent closed the unfinished episode
    assert (rollout["reward"], rollout["terminated"], rollout["truncated"]) == (0.0, False, True)
    assert len(rollout["steps"]) == 3 and all("No action found" in s["observation"] for s in rollout["steps"])


def test_step_rewards_are_summed_and_usage_accumulates():
    with serve([[say("go")]], env="counting") as (agent, _):
        rollout = run(agent, {"responses_create_params": {"input": "count with me"}})
    assert rollout["reward"] == 1.5 and rollout["terminated"] and len(rollout["steps"]) == 3
    assert rollout["info"] == {"left": 0}
    assert [m["content"] for m in rollout["responses_create_params"]["input"]] == ["count with me", "3 steps to go"]
    assert rollout["response"]["usage"]["output_tokens"] % 3 == 0 and rollout["response"]["usage"]["output_tokens"]


def test_each_model_call_sees_the_observations_so_far():
    RecordingModel.inputs.clear()
    with serve([[say("go")]], env="counting") as (agent, _):
        run(agent, {"responses_create_params": {"input": "count with me"}})
    texts = [[m.get("content") for m in call if m.get("role") == "user"] for call in RecordingModel.inputs]
    assert texts == [
        ["count with me", "3 steps to go"],
        ["count with me", "3 steps to go", "2 steps to go"],
        ["count with me", "3 steps to go", "2 steps to go", "1 steps to go"],
    ]


def test_aggregate_metrics_are_answered_by_the_environment():
    with serve([[say("go")]]) as (agent, _):
        answer = httpx.post(
            f"{agent}/aggregate_metrics", json={"verify_responses": [{"reward": 1.0}, {"reward": -1.0}]}
        )
    assert answer.status_code == 200 and answer.json()["agent_metrics"]["mean/reward"] == 0.0


def test_v1_responses_runs_an_episode_for_bare_create_params():
    with serve([[say("go")]], env="counting") as (agent, _):
        answer = httpx.post(f"{agent}/v1/responses", json={"input": "count with me"}, timeout=30)
    assert answer.status_code == 200, answer.text
    assert [item["type"] for item in answer.json()["output"]] == ["message"] * 3
