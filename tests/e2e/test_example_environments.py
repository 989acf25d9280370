"""End to end, with real processes: `gym env start` on each example environment, then `/run` on its agent.

The model is either the scripted model server (a real HTTP server replaying a tool call and an answer, so the
expected reward is known) or the embedded SmolLM2 model (any reward, but a well-formed rollout). These tests use
shared-venv mode for speed; isolated per-server venvs are tested in tests/launcher/test_venvs.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from nemo_gym import INSTALL_DIR
from nemo_gym.config.ports import probe_free_port
from nemo_gym.launcher import running_servers
from nemo_gym.transport import access
from tests.helpers import run_headers, write

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


def first_row(resources_server: str) -> dict[str, Any]:
    path = INSTALL_DIR / "resources_servers" / resources_server / "data" / "example.jsonl"
    return json.loads(path.read_text().splitlines()[0])


def call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function_call", "name": name, "arguments": json.dumps(arguments)}


ANSWER = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Done."}]}

SCRIPTS: dict[str, list[list[dict[str, Any]]]] = {
    "example_single_tool_call": [  # its verifier wants the tool's weather in the answer
        [call("get_weather", {"city": "Paris"})],
        [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "It is cold."}]}],
    ],
    "example_session_state_mgmt": [
        [call("increment_counter", {"count": 1})],
        [call("increment_counter", {"count": 2})],
        [ANSWER],
    ],
    "example_multi_step": [
        [call("get_synonym_value", {"synonym": "Scorching"})],
        [call("extract_synonym_values", {"synonym_values": [928, 407]})],
        [ANSWER],
    ],
}


def overrides(workdir: Path, resources_server: str, model: str, *extra_configs: Path) -> list[str]:
    configs = [
        INSTALL_DIR / "resources_servers" / resources_server / "configs" / f"{resources_server}.yaml",
        INSTALL_DIR / "responses_api_models" / model / "configs" / f"{model}.yaml",
        *extra_configs,
    ]
    return [
        "+config_paths=[" + ",".join(str(c) for c in configs) + "]",
        "+shared_venv=true",
        "+head_server={port: 0}",
        f"+results_dir={workdir / 'results'}",
        f"+cache_dir={workdir / 'cache'}",
    ]


def script_config(workdir: Path, script: list[list[dict[str, Any]]]) -> Path:
    body = {"policy_model": {"responses_api_models": {"scripted_model": {"script": script}}}}
    return write(workdir / "script.yaml", json.dumps(body))  # JSON is YAML


@pytest.mark.parametrize("resources_server", sorted(SCRIPTS))
def test_scripted_rollout_reaches_the_expected_reward(workdir, resources_server):
    script = script_config(workdir, SCRIPTS[resources_server])
    with running_servers(overrides(workdir, resources_server, "scripted_model", script)) as run:
        agent_url = run.urls[f"{resources_server}_simple_agent"]
        answer = httpx.post(
            f"{agent_url}/run", json=first_row(resources_server), headers=run_headers(agent_url), timeout=60
        )
    assert answer.status_code == 200, answer.text
    row = answer.json()
    types = [item["type"] for item in row["response"]["output"]]
    assert "function_call" in types and "function_call_output" in types and types[-1] == "message"
    assert row["reward"] == 1.0


def test_gym_env_start_cli_serves_a_rollout_and_stops_on_sigterm(workdir):
    """The real command, as a user runs it: start, query through the head server, SIGTERM, nothing left behind."""
    import psutil

    resources_server = "example_single_tool_call"
    script = script_config(workdir, SCRIPTS[resources_server])
    env = os.environ | {"NEMO_GYM_ENV_YAML": "", "PYTHONUNBUFFERED": "1"}
    head_port = _free_port()
    args = [sys.executable, "-m", "nemo_gym.cli.main", "env", "start", *overrides(workdir, resources_server,
            "scripted_model", script)[:-3], f"++head_server={{port: {head_port}}}", f"+results_dir={workdir / 'results'}",
            f"+cache_dir={workdir / 'cache'}"]  # fmt: skip
    launcher = subprocess.Popen(args, cwd=workdir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        instances = _wait_for_instances(head_port, launcher)
        agent = next(i for i in instances if i["name"] == f"{resources_server}_simple_agent")
        answer = httpx.post(
            f"{agent['url']}/run", json=first_row(resources_server), headers=run_headers("", head_port), timeout=60
        )
        assert answer.status_code == 200 and answer.json()["reward"] == 1.0
        children = [i["pid"] for i in instances]
        assert all(psutil.pid_exists(pid) for pid in children)
    finally:
        launcher.send_signal(signal.SIGTERM)
        output, _ = launcher.communicate(timeout=60)
    assert launcher.returncode == 0, output
    assert "(example_single_tool_call)" in output  # child logs are prefixed with the instance name
    assert not [pid for pid in children if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"]
    assert (workdir / "results" / "logs" / f"{resources_server}.log").exists()


def _free_port() -> int:
    return probe_free_port()  # outside the ephemeral range, which outgoing connections take ports from


def _wait_for_instances(head_port: int, launcher: subprocess.Popen) -> list[dict[str, Any]]:
    deadline = time.monotonic() + 240  # a hang guard: the loop ends as soon as every server is ready
    while time.monotonic() < deadline:
        assert launcher.poll() is None, launcher.stdout.read()
        try:
            head = f"http://127.0.0.1:{head_port}"
            got = httpx.get(f"{head}/server_instances", headers=run_headers(head, head_port), timeout=2)
            # A 401 while the run starts: the token was read before the launcher wrote its token file (the head
            # socket already accepts connections then); the next poll reads the new file.
            instances = got.json() if got.status_code == 200 else []
            if instances and all(i.get("ready") for i in instances):
                return instances
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise AssertionError("servers did not become ready")


@pytest.mark.model
def test_embedded_model_rollout_is_well_formed(workdir):
    """No model configured at all: the embedded SmolLM2 model is the policy, and it can call the weather tool."""
    pytest.importorskip("xllamacpp")
    resources_server = "example_single_tool_call"
    config = INSTALL_DIR / "resources_servers" / resources_server / "configs" / f"{resources_server}.yaml"
    with running_servers(
        [f"+config_paths=[{config}]", "+shared_venv=true", "+head_server={port: 0}",
         f"+results_dir={workdir / 'results'}", f"+cache_dir={workdir / 'cache'}"]
    ) as run:  # fmt: skip
        assert list(run.config.policy_model.responses_api_models) == ["llamacpp_model"]
        row = first_row(resources_server)
        row["responses_create_params"]["max_output_tokens"] = 64
        agent_url = run.urls[f"{resources_server}_simple_agent"]
        answer = httpx.post(f"{agent_url}/run", json=row, headers=run_headers(agent_url), timeout=240)
        assert answer.status_code == 200, answer.text
        rollout = answer.json()
        assert rollout["reward"] in (0.0, 1.0)
        assert rollout["response"]["output"] and rollout["response"]["usage"]["output_tokens"] > 0
        for item in rollout["response"]["output"]:
            assert item["type"] in {"message", "function_call", "function_call_output", "reasoning"}

        import openai

        token = access.registered_token(run.urls["policy_model"])  # the run's token is the SDK's api_key
        model = openai.OpenAI(base_url=f"{run.urls['policy_model']}/v1", api_key=token, max_retries=0)
        weather = json.loads(json.dumps(row["responses_create_params"]["tools"][0]))
        response = model.responses.create(
            model="smollm2", input="What is the weather in Paris?", tools=[weather], max_output_tokens=48,
            tool_choice="required",
        )  # fmt: skip
        assert response.output[0].type == "function_call" and response.output[0].name == "get_weather"
        chat = model.chat.completions.create(
            model="smollm2", messages=[{"role": "user", "content": "Say hello."}], max_tokens=16, temperature=0
        )
        assert chat.choices[0].message.content
