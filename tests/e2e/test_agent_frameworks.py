"""Agents from other frameworks and agents calling agents, scored through `gym eval run` with real processes.

`langgraph_agent` is a LangGraph graph that reaches the model server through LangChain's ChatOpenAI (the model
server's OpenAI-compatible /v1); `orchestrator_agent` delegates each task to another agent through ServerClient. The
policy is the scripted model, so the reward of each rollout is known.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from nemo_gym import PARENT_DIR

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

AGENTS = PARENT_DIR / "responses_api_agents"
WEATHER = "example_single_tool_call"
COUNTER = "example_session_state_mgmt"
ENV = os.environ | {"NEMO_GYM_ENV_YAML": "", "PYTHONUNBUFFERED": "1"}


def _call(name: str, **arguments: Any) -> list[dict[str, Any]]:
    return [{"type": "function_call", "name": name, "arguments": json.dumps(arguments)}]


ANSWER = [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Done."}]}]
WEATHER_ANSWER = [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "It is cold."}]}]
"""The weather verifier wants the tool's weather in the answer."""


def eval_run(workdir: Path, resources_server: str, agent: str, script: list[Any], *extra: str) -> list[dict[str, Any]]:
    """`gym eval run` on the resources server's example data with the scripted model; returns the scored rows."""
    script_file = workdir / "script.yaml"
    script_file.write_text(
        json.dumps({"policy_model": {"responses_api_models": {"scripted_model": {"script": script}}}})
    )
    output = workdir / "rollouts.jsonl"
    args = [
        sys.executable, "-m", "nemo_gym.cli.main", "eval", "run", "--resources-server", resources_server,
        "--model-type", "scripted_model", "--config", str(script_file), "--agent", agent, "--output", str(output),
        "--input", str(PARENT_DIR / "resources_servers" / resources_server / "data" / "example.jsonl"),
        "+shared_venv=true", "+head_server={port: 0}", f"+cache_dir={workdir / 'cache'}", *extra,
    ]  # fmt: skip
    done = subprocess.run(args, cwd=workdir, env=ENV, capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stdout + done.stderr
    return [json.loads(line) for line in output.read_text().splitlines()]


def test_langgraph_agent_completes_scored_rollouts(workdir: Path) -> None:
    config = AGENTS / "langgraph_agent" / "configs" / "weather.yaml"
    rows = eval_run(workdir, WEATHER, f"{WEATHER}_langgraph_agent", [_call("get_weather", city="Paris"), WEATHER_ANSWER],
                    "--config", str(config))  # fmt: skip
    assert len(rows) == 5 and all(row["reward"] == 1.0 for row in rows)
    for row in rows:
        assert [item["type"] for item in row["response"]["output"]] == [
            "function_call", "function_call_output", "message"
        ]  # fmt: skip
        assert row["response"]["id"].startswith("chatcmpl_")  # LangChain's ChatOpenAI called /v1/chat/completions


def test_orchestrator_delegates_to_simple_agent_in_the_seeded_session(workdir: Path) -> None:
    """The generic config, wired by overrides: the counter lives in the session the orchestrator seeded, so a reward
    of 1 means the worker's tool calls reached it. Only the first task (3 -> 6) matches the script."""
    (workdir / "first.jsonl").write_text(
        (PARENT_DIR / "resources_servers" / COUNTER / "data" / "example.jsonl").read_text().splitlines()[0] + "\n"
    )
    inner = "++orchestrator_agent.responses_api_agents.orchestrator_agent"
    rows = eval_run(
        workdir, COUNTER, "orchestrator_agent",
        [_call("increment_counter", count=1), _call("increment_counter", count=2), ANSWER],
        "--config", str(AGENTS / "orchestrator_agent" / "configs" / "orchestrator_agent.yaml"),
        f"{inner}.resources_server.name={COUNTER}", f"{inner}.worker_agent.name={COUNTER}_simple_agent",
        "--limit", "1",
    )  # fmt: skip
    assert len(rows) == 1 and rows[0]["reward"] == 1.0
    types = [item["type"] for item in rows[0]["response"]["output"]]
    assert types == ["function_call", "function_call_output"] * 2 + ["message"]


def test_orchestrator_delegates_to_the_langgraph_agent(workdir: Path) -> None:
    rows = eval_run(
        workdir, WEATHER, f"{WEATHER}_orchestrator_agent", [_call("get_weather", city="Tokyo"), WEATHER_ANSWER],
        "--config", str(AGENTS / "orchestrator_agent" / "configs" / "weather.yaml"),
        "--config", str(AGENTS / "langgraph_agent" / "configs" / "weather.yaml"),
        f"++{WEATHER}_orchestrator_agent.responses_api_agents.orchestrator_agent.worker_agent.name="
        f"{WEATHER}_langgraph_agent",
    )  # fmt: skip
    assert len(rows) == 5 and all(row["reward"] == 1.0 for row in rows)
    assert all(row["response"]["id"].startswith("chatcmpl_") for row in rows)  # the LangGraph worker answered
