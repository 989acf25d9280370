"""orchestrator_agent with a real worker (simple_agent), the scripted model and the counter environment, all on
loopback (in threads). The counter lives in the resources server's session, so a reward of 1 shows that the worker's
tool calls landed in the session the orchestrator seeded. `gym eval run` with separate processes:
tests/e2e/test_agent_frameworks.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from nemo_gym.testing import local_server_client, serve_servers
from resources_servers.example_session_state_mgmt.app import (
    ExampleSessionStateMgmtResourcesServer,
    ExampleSessionStateMgmtResourcesServerConfig,
)
from responses_api_agents.orchestrator_agent.app import OrchestratorAgent, OrchestratorAgentConfig
from responses_api_agents.simple_agent.app import SimpleAgent, SimpleAgentConfig
from responses_api_models.scripted_model.app import ScriptedModel, ScriptedModelConfig

COMMON = {"host": "127.0.0.1", "port": 0, "entrypoint": "app.py"}
DATA = Path(__file__).parents[3] / "resources_servers" / "example_session_state_mgmt" / "data" / "example.jsonl"
ROW = json.loads(DATA.read_text().splitlines()[0])  # starts at 3, expects 6


def _call(count: int) -> list[dict[str, Any]]:
    return [{"type": "function_call", "name": "increment_counter", "arguments": json.dumps({"count": count})}]


ANSWER = [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "6"}]}]


@contextmanager
def serve(script: list[list[dict[str, Any]]], worker: str = "worker") -> Iterator[str]:
    """Model, counter server, simple_agent worker and the orchestrator; yields the orchestrator's URL."""
    client = local_server_client()
    resources = {"type": "resources_servers", "name": "counter"}
    servers = {
        "policy_model": ScriptedModel(
            config=ScriptedModelConfig(**COMMON, name="policy_model", script=script), server_client=client
        ),
        "counter": ExampleSessionStateMgmtResourcesServer(
            config=ExampleSessionStateMgmtResourcesServerConfig(**COMMON, name="counter"), server_client=client
        ),
        "worker": SimpleAgent(
            config=SimpleAgentConfig(
                **COMMON, name="worker", resources_server=resources,
                model_server={"type": "responses_api_models", "name": "policy_model"},
            ),
            server_client=client,
        ),
        "orchestrator": OrchestratorAgent(
            config=OrchestratorAgentConfig(
                **COMMON, name="orchestrator", resources_server=resources,
                worker_agent={"type": "responses_api_agents", "name": worker}, brief="Count carefully.",
            ),
            server_client=client,
        ),
    }  # fmt: skip
    with serve_servers(servers, client) as urls:
        yield urls["orchestrator"]


def test_the_worker_solves_in_the_session_the_orchestrator_seeded():
    with serve([_call(1), _call(2), ANSWER]) as orchestrator:
        answer = httpx.post(f"{orchestrator}/run", json=ROW, timeout=60)
    assert answer.status_code == 200, answer.text
    row = answer.json()
    types = [item["type"] for item in row["response"]["output"]]
    assert types == ["function_call", "function_call_output"] * 2 + ["message"]
    assert row["reward"] == 1.0  # the counter went 3 -> 6 in the orchestrator's session


def test_a_wrong_count_by_the_worker_scores_zero():
    with serve([_call(5), ANSWER]) as orchestrator:
        row = httpx.post(f"{orchestrator}/run", json=ROW, timeout=60).json()
    assert row["reward"] == 0.0


def test_a_missing_worker_fails_the_rollout_naming_it():
    with serve([ANSWER], worker="nobody") as orchestrator:
        answer = httpx.post(f"{orchestrator}/run", json=ROW, timeout=60)
    assert answer.status_code >= 500 and "nobody" in answer.text
