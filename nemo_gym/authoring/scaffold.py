"""``gym env init --resources-server NAME`` / ``--environment-server NAME``: a new server that passes its own tests at once.

The resources server skeleton is a complete exact-answer environment (the reward is 1 when the model's final text
equals the row's ``expected_answer``) with a config wiring it to a ``simple_agent`` and the policy model, five example
rows, tests and a README to fill in — a working starting point to edit, not a template to complete before anything
runs. The environment server skeleton (NeMo Gym 0.7's fourth kind, ``environment_servers/<name>/``) is the same task
as one episode it owns end to end: a :class:`~nemo_gym.base_environment_server.BaseEnvironmentServer` whose ``run``
asks the policy model once and scores the answer, with the same folder shape.
"""

from __future__ import annotations

import json
import keyword
from pathlib import Path

from nemo_gym.authoring.environment_server_template import environment_server_files
from nemo_gym.errors import ConfigError

APP = '''"""{name}: describe what this environment trains here.

Reward: 1.0 when the model's final answer equals the row's ``expected_answer`` (whitespace and case ignored), else 0.0.
"""

from __future__ import annotations

from nemo_gym.base_resources_server import (
    BaseResourcesServerConfig,
    BaseVerifyRequest,
    BaseVerifyResponse,
    SimpleResourcesServer,
)


class {cls}ResourcesServerConfig(BaseResourcesServerConfig):
    REVERIFY_MODE = "stateless"


class {cls}VerifyRequest(BaseVerifyRequest):
    expected_answer: str


class {cls}VerifyResponse(BaseVerifyResponse):
    expected_answer: str
    extracted_answer: str


class {cls}ResourcesServer(SimpleResourcesServer):
    config: {cls}ResourcesServerConfig

    # Add tools in setup_webserver(): app.post("/my_tool")(self.my_tool)

    async def verify(self, body: {cls}VerifyRequest) -> {cls}VerifyResponse:
        answer = body.response.output_text.strip()
        reward = 1.0 if answer.lower() == body.expected_answer.strip().lower() else 0.0
        return {cls}VerifyResponse(**body.model_dump(), extracted_answer=answer, reward=reward)


if __name__ == "__main__":
    {cls}ResourcesServer.run_webserver()
'''

CONFIG = """# {name}: a resources server, a simple_agent wired to it, and its datasets.
{name}:
  resources_servers:
    {name}:
      entrypoint: app.py
      domain: other
      description: "{name}: exact-answer tasks (edit me)"
{name}_simple_agent:
  responses_api_agents:
    simple_agent:
      entrypoint: app.py
      resources_server:
        type: resources_servers
        name: {name}
      model_server:
        type: responses_api_models
        name: policy_model
      max_steps: 4
      datasets:
      - name: example
        type: example
        jsonl_fpath: resources_servers/{name}/data/example.jsonl
        license: Apache 2.0
"""

TESTS = '''"""{name}: the verifier's reward rule, tested on hand-made responses."""

from __future__ import annotations

from unittest.mock import MagicMock

import pytest

from nemo_gym.openai_utils import NeMoGymResponse, NeMoGymResponseCreateParamsNonStreaming
from nemo_gym.server_utils import ServerClient
from resources_servers.{name}.app import (
    {cls}ResourcesServer,
    {cls}ResourcesServerConfig,
    {cls}VerifyRequest,
)


def server() -> {cls}ResourcesServer:
    config = {cls}ResourcesServerConfig(host="0.0.0.0", port=8080, entrypoint="", name="")
    return {cls}ResourcesServer(config=config, server_client=MagicMock(spec=ServerClient))


def request(text: str | None, expected: str = "apple") -> {cls}VerifyRequest:
    output = []
    if text is not None:
        output = [{{"type": "message", "id": "m", "role": "assistant", "status": "completed",
                   "content": [{{"type": "output_text", "text": text, "annotations": []}}]}}]
    response = NeMoGymResponse.model_validate(
        {{"id": "r", "created_at": 0, "model": "m", "object": "response", "output": output,
         "parallel_tool_calls": True, "tool_choice": "auto", "tools": []}}
    )
    params = NeMoGymResponseCreateParamsNonStreaming(input="Say apple.")
    return {cls}VerifyRequest(responses_create_params=params, response=response, expected_answer=expected)


@pytest.mark.parametrize(
    ("text", "reward"),
    [("apple", 1.0), ("  Apple ", 1.0), ("banana", 0.0), ("", 0.0), (None, 0.0)],
)
async def test_reward(text, reward):
    assert (await server().verify(request(text))).reward == reward
'''

README = """# {name}

What this environment trains: (describe the task).

- **Tools**: none yet (add routes in `setup_webserver()`).
- **Reward**: 1.0 when the model's final answer equals the row's `expected_answer` (case and surrounding whitespace
  ignored), else 0.0.
- **Data**: `data/example.jsonl` (5 rows). Licence: state the licence of your data here.

```bash
gym env test --resources-server {name}          # its tests, in its own venv
gym eval run --resources-server {name} --agent {name}_simple_agent \\
    --input resources_servers/{name}/data/example.jsonl --output results/{name}.jsonl
```
"""

EXAMPLES = ("apple", "blue", "seven", "Paris", "yes")


def _target(kind: str, name: str, root: Path) -> tuple[Path, dict[str, str]]:
    """``<root>/<kind>/<name>`` and the template fields; refuse a bad name or an existing directory."""
    if not name.isidentifier() or keyword.iskeyword(name):
        what = kind.removesuffix("s").replace("_", " ")
        raise ConfigError(f"{name!r} is not a valid {what} name: use a Python identifier like my_env")
    target = root / kind / name
    if target.exists():
        raise ConfigError(f"{target} already exists; pick another name or remove it first")
    return target, {"name": name, "cls": "".join(part.capitalize() for part in name.split("_"))}


def _write(target: Path, files: dict[str, str]) -> Path:
    for relative, text in files.items():
        path = target / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return target


def scaffold_resources_server(name: str, root: Path) -> Path:
    """Create ``<root>/resources_servers/<name>/``; refuse a bad name or an existing directory."""
    target, fields = _target("resources_servers", name, root)
    files = {
        "__init__.py": "",
        "app.py": APP.format(**fields),
        "configs/" + f"{name}.yaml": CONFIG.format(**fields),
        "requirements.txt": "-e nemo-gym[dev] @ ../../\n",
        "README.md": README.format(**fields),
        "tests/__init__.py": "",
        "tests/test_app.py": TESTS.format(**fields),
        "data/.gitignore": "*train.jsonl\n*validation.jsonl\n",
        "data/example.jsonl": "".join(
            json.dumps(
                {"responses_create_params": {"input": f"Reply with exactly one word: {word}"}, "expected_answer": word}
            )
            + "\n"
            for word in EXAMPLES
        ),
    }
    return _write(target, files)


def scaffold_environment_server(name: str, root: Path) -> Path:
    """Create ``<root>/environment_servers/<name>/``; refuse a bad name or an existing directory."""
    target, fields = _target("environment_servers", name, root)
    return _write(target, environment_server_files(fields))
