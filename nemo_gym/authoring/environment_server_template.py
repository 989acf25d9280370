"""The files of a new environment server (``gym env init --environment-server NAME``), as templates.

An environment server (NeMo Gym 0.7) owns one episode end to end: the collector posts a typed episode request to its
``/run`` and gets back either a result or a failure. The skeleton's episode is the smallest complete one: the task's
prompt goes to the policy model once and the answer is scored on the spot. It subclasses
``nemo_gym.base_environment_server.BaseEnvironmentServer``, which admits the episode, applies its deadline, runs the
registered cleanups and turns errors into failures; the skeleton only writes ``run`` and ``aggregate_metrics``.
"""

from __future__ import annotations

import json

APP = '''"""{name}: an environment server; describe what its episodes train here.

One episode: the task's prompt goes to the policy model once, and the answer is scored here: reward 1.0 when it
equals the task's ``expected_answer`` (whitespace and case ignored), else 0.0. Grow ``run`` into your protocol (seed a
resources server, drive an agent, verify), and register whatever must be released with ``cleanup.register_cleanup``:
the base runs those callbacks even when the episode fails or times out.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, PositiveFloat

from nemo_gym.base_environment_server import BaseEnvironmentServer, BaseEnvironmentServerConfig, CleanupContext
from nemo_gym.base_resources_server import aggregate_verify_responses
from nemo_gym.config_types import AggregateMetrics, AggregateMetricsRequest, ModelServerRef
from nemo_gym.episode_types import BaseEpisodeRequest, BaseEpisodeResponse
from nemo_gym.openai_utils import NeMoGymResponse, NeMoGymResponseCreateParamsNonStreaming
from nemo_gym.server_utils import get_response_json, raise_for_status


class {cls}TaskInput(BaseModel):
    responses_create_params: NeMoGymResponseCreateParamsNonStreaming
    expected_answer: str


class {cls}Result(BaseModel):
    reward: float
    extracted_answer: str
    response: NeMoGymResponse


class {cls}Request(BaseEpisodeRequest[{cls}TaskInput]):
    pass


class {cls}Response(BaseEpisodeResponse[{cls}Result]):
    pass


class {cls}EnvironmentServerConfig(BaseEnvironmentServerConfig):
    model_server: ModelServerRef
    cleanup_timeout_seconds: PositiveFloat = 30


class {cls}EnvironmentServer(BaseEnvironmentServer[{cls}Request, {cls}Response]):
    config: {cls}EnvironmentServerConfig
    request_model = {cls}Request
    response_model = {cls}Response

    async def run(self, request: {cls}Request, cleanup: CleanupContext) -> {cls}Response:
        task = request.task.task_input
        response = await self.ask_model(task.responses_create_params)
        answer = response.output_text.strip()
        reward = 1.0 if answer.lower() == task.expected_answer.strip().lower() else 0.0
        result = {cls}Result(reward=reward, extracted_answer=answer, response=response)
        return {cls}Response(episode_id=request.episode_id, task_id=request.task.task_id, result=result)

    async def ask_model(self, params: NeMoGymResponseCreateParamsNonStreaming) -> NeMoGymResponse:
        """One call to the policy model's ``/v1/responses``."""
        http_response = await self.server_client.post(
            server_name=self.config.model_server.name, url_path="/v1/responses", json=params
        )
        await raise_for_status(http_response)
        return NeMoGymResponse.model_validate(await get_response_json(http_response))

    async def aggregate_metrics(self, body: AggregateMetricsRequest) -> AggregateMetrics:
        """The default statistics over the episodes' rewards (a row's ``result`` fields count as its own)."""
        rows: list[dict[str, Any]] = [
            {{**row, **(row["result"] if isinstance(row.get("result"), dict) else {{}})}} for row in body.verify_responses
        ]
        return aggregate_verify_responses(rows, answer_key="extracted_answer")


if __name__ == "__main__":
    {cls}EnvironmentServer.run_webserver()
'''

CONFIG = """# {name}: an environment server that owns each episode, and the model it asks.
{name}:
  environment_servers:
    {name}:
      entrypoint: app.py
      description: "{name}: exact-answer episodes (edit me)"
      model_server:
        type: responses_api_models
        name: policy_model
      max_concurrent_episodes: null
      queue_timeout_seconds: null
      default_episode_timeout_seconds: 600
      cleanup_timeout_seconds: 30
"""

TESTS = '''"""{name}: one episode end to end through the base lifecycle, with the model call replaced."""

from __future__ import annotations

from unittest.mock import MagicMock

import pytest
from fastapi.testclient import TestClient

from environment_servers.{name}.app import (
    {cls}EnvironmentServer,
    {cls}EnvironmentServerConfig,
    {cls}Request,
)
from nemo_gym.config_types import AggregateMetricsRequest
from nemo_gym.openai_utils import NeMoGymResponse
from nemo_gym.server_utils import ServerClient


def server() -> {cls}EnvironmentServer:
    config = {cls}EnvironmentServerConfig(
        host="127.0.0.1", port=8080, entrypoint="", name="{name}",
        model_server={{"type": "responses_api_models", "name": "policy_model"}},
    )
    return {cls}EnvironmentServer(config=config, server_client=MagicMock(spec=ServerClient))


def answer(text: str) -> NeMoGymResponse:
    return NeMoGymResponse.model_validate(
        {{"id": "r", "created_at": 0, "model": "m", "object": "response", "parallel_tool_calls": True,
         "tool_choice": "auto", "tools": [],
         "output": [{{"type": "message", "id": "m", "role": "assistant", "status": "completed",
                     "content": [{{"type": "output_text", "text": text, "annotations": []}}]}}]}}
    )


def episode(expected: str = "apple") -> dict:
    return {{
        "episode_id": {{"rollout_id": "r1"}},
        "task": {{"task_id": {{"taskset": "example", "task_id": "0"}},
                 "task_input": {{"responses_create_params": {{"input": "Say apple."}}, "expected_answer": expected}}}},
    }}


@pytest.mark.parametrize(("text", "reward"), [("apple", 1.0), ("  Apple ", 1.0), ("banana", 0.0), ("", 0.0)])
async def test_an_episode_scores_the_model_answer(monkeypatch, text, reward):
    async def ask_model(self, params):
        return answer(text)

    monkeypatch.setattr({cls}EnvironmentServer, "ask_model", ask_model)
    response = await server().run_request({cls}Request.model_validate(episode()))
    assert response.failure is None and response.result is not None
    assert response.result.reward == reward
    assert response.episode_id.rollout_id == "r1" and response.task_id.task_id == "0"


async def test_a_model_error_is_the_episode_failure_not_a_crash(monkeypatch):
    async def ask_model(self, params):
        raise ConnectionError("model down")

    monkeypatch.setattr({cls}EnvironmentServer, "ask_model", ask_model)
    response = await server().run_request({cls}Request.model_validate(episode()))
    assert response.result is None and response.failure is not None
    assert "model down" in response.failure.failure_reason


def test_run_route(monkeypatch):
    async def ask_model(self, params):
        return answer("apple")

    monkeypatch.setattr({cls}EnvironmentServer, "ask_model", ask_model)
    with TestClient(server().setup_webserver()) as client:
        response = client.post("/run", json=episode())
    assert response.status_code == 200, response.text
    assert response.json()["result"]["reward"] == 1.0


async def test_aggregate_metrics():
    rows = [{{"_ng_task_index": i // 2, "_ng_rollout_index": i % 2, "result": {{"reward": float(i % 2),
             "extracted_answer": "x"}}}} for i in range(4)]
    metrics = await server().aggregate_metrics(AggregateMetricsRequest(verify_responses=rows))
    assert metrics.agent_metrics["mean/reward"] == 0.5
'''

README = """# {name}

An environment server: it owns each episode end to end. What its episodes train: (describe the task).

- **Episode**: the task's prompt goes to the policy model once (`model_server`).
- **Reward**: 1.0 when the model's answer equals the task's `expected_answer` (case and surrounding whitespace
  ignored), else 0.0.
- **Data**: `data/example.jsonl` (5 materialized tasks: `task_id` and `task_input`). Licence: state it here.

```bash
gym env test --environment-server {name}        # its tests, in its own venv
gym env start --environment-server {name} --model-type openai_model
```
"""


def environment_server_files(fields: dict[str, str]) -> dict[str, str]:
    """Every file of ``environment_servers/<name>/``, relative to it; ``fields``: ``name`` and ``cls``."""
    from nemo_gym.authoring.scaffold import EXAMPLES

    rows = [
        {
            "task_id": {"taskset": f"{fields['name']}_example", "task_id": str(index)},
            "task_input": {
                "responses_create_params": {"input": f"Reply with exactly one word: {word}"},
                "expected_answer": word,
            },
        }
        for index, word in enumerate(EXAMPLES)
    ]
    return {
        "__init__.py": "",
        "app.py": APP.format(**fields),
        f"configs/{fields['name']}.yaml": CONFIG.format(**fields),
        "requirements.txt": "-e nemo-gym[dev] @ ../../\n",
        "README.md": README.format(**fields),
        "tests/__init__.py": "",
        "tests/test_app.py": TESTS.format(**fields),
        "data/.gitignore": "*train.jsonl\n*validation.jsonl\n",
        "data/example.jsonl": "".join(json.dumps(row) + "\n" for row in rows),
    }
