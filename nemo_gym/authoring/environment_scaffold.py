"""``gym env init --environment NAME --profile P``: an environment with a manifest, in NeMo Gym 0.7's four profiles.

Every profile starts from the resources server skeleton of :mod:`nemo_gym.authoring.scaffold` (an exact-answer
verifier that works as written), adds its verifier fixture (``tests/verifier_cases.jsonl``: a right answer, a wrong
one, a malformed request), and writes ``environments/NAME/`` with a ``config.yaml`` and a ``manifest.yaml`` that
agree, so the new environment validates before anything in it is edited. The profiles differ in what runs the loop:

* ``custom-gym-verifier``: the framework's ``simple_agent`` with the new verifier;
* ``custom-gym-agent-loop``: a new agent, ``responses_api_agents/NAME_agent``, a ``SimpleAgent`` whose ``responses``
  is the place to change the loop;
* ``external-agent-loop``: the same folder, whose ``run`` is the place to hand the episode to an outside harness;
* ``external-rollout-driver``: ``environments/NAME/rollout_driver.py``, an outside callable that drives collection
  (named in the manifest's ``rollout_driver``), over the ``simple_agent`` wiring.

A new agent imports ``responses_api_agents.simple_agent`` from the framework's install root, which the launcher puts
on every server's ``PYTHONPATH`` after the server's own root.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import get_args

from nemo_gym.authoring.scaffold import scaffold_resources_server
from nemo_gym.environment.manifest import EnvironmentManifest, IntegrationProfile, dump_manifest
from nemo_gym.environment.validation import CASES_FILE
from nemo_gym.errors import ConfigError

PROFILES: tuple[str, ...] = get_args(IntegrationProfile)
DEFAULT_PROFILE = "custom-gym-verifier"

__all__ = ["DEFAULT_PROFILE", "PROFILES", "scaffold_environment"]

AGENT_APP = '''"""{name}_agent: the agent of the {name} environment ({profile}).

It is ``simple_agent`` until you change it: {where}.
"""

from __future__ import annotations

from fastapi import Request, Response

from nemo_gym.base_resources_server import BaseRunRequest
from nemo_gym.openai_utils import NeMoGymResponse, NeMoGymResponseCreateParamsNonStreaming
from responses_api_agents.simple_agent.app import SimpleAgent


class {cls}Agent(SimpleAgent):
    async def responses(
        self, request: Request, response: Response, body: NeMoGymResponseCreateParamsNonStreaming
    ) -> NeMoGymResponse:
        return await super().responses(request, response, body)

    async def run(self, request: Request, body: BaseRunRequest) -> Response:
        return await super().run(request, body)


if __name__ == "__main__":
    {cls}Agent.run_webserver()
'''
AGENT_PLACES = {
    "custom-gym-agent-loop": "`responses` is one episode's model/tool loop; change it to change how the agent acts",
    "external-agent-loop": "`run` is one whole episode; hand it to your outside harness there and return its "
    "verified result",
}
ROLLOUT_DRIVER = '''"""How the {name} environment's rollouts are collected (its manifest's ``rollout_driver``).

As written it collects them as ``gym eval run`` does; replace the body to drive collection from outside.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


async def run_rollout_collection(rollout_collection_config: Any, global_config_dict: Mapping[str, Any]) -> None:
    from nemo_gym.rollout_collection import RolloutCollectionHelper

    await RolloutCollectionHelper().run_from_config(rollout_collection_config)
'''
README = """# {name}

A `{profile}` environment: `config.yaml` wires the resources server `resources_servers/{name}` to {agent}, and
`manifest.yaml` says what it is. Fill in the manifest's description, authors and licensing, then:

```bash
gym env validate {name}                     # config, data, manifest and the verifier fixtures
gym env start --environment {name}
```
"""


def _verifier_cases() -> str:
    """A right answer (reward 1), a wrong one (reward 0), a request without a response (refused), and a case scored
    twice (the manifest says the verifier is ``seeded``: it must give the same reward again)."""

    def request(text: str) -> dict[str, object]:
        message = {"type": "message", "id": "m", "role": "assistant", "status": "completed",
                   "content": [{"type": "output_text", "text": text, "annotations": []}]}  # fmt: skip
        response = {"id": "r", "created_at": 0, "model": "m", "object": "response", "output": [message],
                    "parallel_tool_calls": True, "tool_choice": "auto", "tools": []}  # fmt: skip
        return {"responses_create_params": {"input": "Reply with exactly one word: apple"}, "response": response,
                "expected_answer": "apple"}  # fmt: skip

    malformed = {"responses_create_params": {"input": "Reply with exactly one word: apple"}, "expected_answer": "apple"}
    cases = [
        {"name": "the right word", "kind": "full_reward", "request": request("Apple"), "expected_reward": 1.0},
        {"name": "another word", "kind": "zero_reward", "request": request("banana"), "expected_reward": 0.0},
        {"name": "no response", "kind": "malformed", "request": malformed, "expected_error": "response"},
        {"name": "scored the same twice", "kind": "determinism", "request": request("apple"), "expected_reward": 1.0},
    ]
    return "".join(json.dumps(case) + "\n" for case in cases)


def _config(name: str, profile: str, agent: str) -> str:
    """The environment's wiring: its resources server, the profile's agent, the policy model, the example data."""
    import yaml

    dataset = {"name": "example", "type": "example", "jsonl_fpath": f"resources_servers/{name}/data/example.jsonl",
               "license": "Apache 2.0"}  # fmt: skip
    config = {
        name: {"resources_servers": {name: {"entrypoint": "app.py", "domain": "other",
                                            "description": f"{name}: exact-answer tasks (edit me)"}}},
        f"{name}_agent": {"responses_api_agents": {agent: {
            "entrypoint": "app.py",
            "resources_server": {"type": "resources_servers", "name": name},
            "model_server": {"type": "responses_api_models", "name": "policy_model"},
            "max_steps": 4,
            "datasets": [dataset],
        }}},
    }  # fmt: skip
    return f"# {name} ({profile}): a resources server, {agent}, and the example data.\n" + yaml.safe_dump(
        config, sort_keys=False
    )


def scaffold_environment(name: str, profile: str, root: Path) -> list[Path]:
    """Create the environment ``name`` of ``profile`` under ``root``; the folders created, in order. Nothing is
    written when the name is not a Python identifier, the profile is unknown, or one of the folders exists."""
    if profile not in PROFILES:
        raise ConfigError(f"--profile must be one of {', '.join(PROFILES)}, got {profile!r}")
    folder = root / "environments" / name
    custom_agent = profile in AGENT_PLACES
    agent = f"{name}_agent" if custom_agent else "simple_agent"
    agent_dir = root / "responses_api_agents" / agent
    for existing in (folder, *([agent_dir] if custom_agent else [])):
        if existing.exists():
            raise ConfigError(f"{existing} already exists; pick another name or remove it first")
    server = scaffold_resources_server(name, root)  # checks the name, refuses an existing server folder
    (server / CASES_FILE).write_text(_verifier_cases(), encoding="utf-8")
    created = [server]
    if custom_agent:
        cls = "".join(part.capitalize() for part in name.split("_"))
        agent_dir.mkdir(parents=True)
        (agent_dir / "app.py").write_text(
            AGENT_APP.format(name=name, cls=cls, profile=profile, where=AGENT_PLACES[profile]), encoding="utf-8"
        )
        (agent_dir / "requirements.txt").write_text("nemo-gym\n", encoding="utf-8")
        created.append(agent_dir)
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text(_config(name, profile, agent), encoding="utf-8")
    if profile == "external-rollout-driver":
        (folder / "rollout_driver.py").write_text(ROLLOUT_DRIVER.format(name=name), encoding="utf-8")
    manifest = EnvironmentManifest.model_validate(
        {
            "name": name,
            "version": "0.1.0",
            "kind": "environment",
            "integration_profile": profile,
            "domain": "other",
            "description": f"{name}: exact-answer tasks (describe yours)",
            "modality": "text",
            "authors": ["TODO: your name"],
            "reward": {"range": [0.0, 1.0], "higher_is_better": True},
            "determinism": "seeded",
            "resources_server": name,
            "agent_server": f"{name}_agent",
            "model_server": "policy_model",
            "datasets": [
                {"name": "example", "type": "example", "jsonl_fpath": f"resources_servers/{name}/data/example.jsonl"}
            ],  # fmt: skip
            "rollout_driver": f"environments.{name}.rollout_driver:run_rollout_collection"
            if profile == "external-rollout-driver"
            else None,
        }
    )
    dump_manifest(manifest, folder / "manifest.yaml")
    described = f"its own agent `responses_api_agents/{agent}`" if custom_agent else "`simple_agent`"
    (folder / "README.md").write_text(README.format(name=name, profile=profile, agent=described), encoding="utf-8")
    created.append(folder)
    return created
