"""``gym env init --environment NAME --profile P``: NeMo Gym 0.7's four profiles, each a manifest and config that agree,
a verifier fixture the generated verifier passes, and (for the profiles with an agent of their own) an agent that
imports the framework's ``simple_agent`` from a root of its own and serves a rollout."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
from pathlib import Path

import pytest

from nemo_gym import INSTALL_DIR
from nemo_gym.authoring.environment_scaffold import CASES_FILE, PROFILES
from nemo_gym.cli.main import main
from nemo_gym.config.compose import ComposeOptions, compose
from nemo_gym.environment.manifest import load_manifest
from nemo_gym.verifier_fixture import VerifierFixture, exercise_verifier_fixture
from tests.helpers import write

SCRIPTED = INSTALL_DIR / "responses_api_models" / "scripted_model" / "configs" / "scripted_model.yaml"


def init(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["env", "init", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize("profile", PROFILES)
def test_each_profile_writes_a_manifest_its_config_agrees_with(
    workdir: Path, capsys: pytest.CaptureFixture[str], profile: str
) -> None:
    code, out, err = init(capsys, "--environment", "my_env", "--profile", profile)
    assert code == 0, err
    folder = workdir / "environments" / "my_env"
    assert "Created environments/my_env" in out and "Created resources_servers/my_env" in out
    manifest = load_manifest(folder / "manifest.yaml")
    assert manifest.integration_profile == profile and manifest.kind == "environment"
    composed = compose(ComposeOptions(overrides=[f"+config_paths=[{folder / 'config.yaml'},{SCRIPTED}]"]))
    kinds = {instance.name: (instance.SERVER_TYPE, instance.implementation) for instance in composed.instances}
    agent = "my_env_agent" if profile in ("custom-gym-agent-loop", "external-agent-loop") else "simple_agent"
    assert kinds[manifest.agent_server] == ("responses_api_agents", agent)
    assert kinds[str(manifest.resources_server)] == ("resources_servers", "my_env")
    assert kinds[str(manifest.model_server)][0] == "responses_api_models"
    assert [d.jsonl_fpath for d in manifest.datasets] == ["resources_servers/my_env/data/example.jsonl"]
    assert (workdir / manifest.datasets[0].jsonl_fpath).is_file()
    assert (workdir / "responses_api_agents" / "my_env_agent" / "app.py").is_file() == (agent != "simple_agent")
    if profile == "external-rollout-driver":
        module, _, function = str(manifest.rollout_driver).partition(":")
        spec = importlib.util.spec_from_file_location(module, workdir / (module.replace(".", "/") + ".py"))
        assert spec is not None and spec.loader is not None
        driver = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(driver)
        assert asyncio.iscoroutinefunction(getattr(driver, function))


async def test_the_generated_verifier_passes_its_fixture(
    workdir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert init(capsys, "--environment", "graded")[0] == 0
    server_dir = workdir / "resources_servers" / "graded"
    spec = importlib.util.spec_from_file_location("graded_app", server_dir / "app.py")
    assert spec is not None and spec.loader is not None
    app = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "graded_app", app)  # its models' annotations resolve in its module
    spec.loader.exec_module(app)
    from unittest.mock import MagicMock

    from nemo_gym.server_utils import ServerClient

    def fresh() -> object:
        config = app.GradedResourcesServerConfig(host="0.0.0.0", port=8080, entrypoint="", name="")
        return app.GradedResourcesServer(config=config, server_client=MagicMock(spec=ServerClient))

    manifest = load_manifest(workdir / "environments" / "graded" / "manifest.yaml")
    # exact match has no randomness to seed: reseeding it is doing nothing, and the case is scored twice all the same
    fixture = VerifierFixture(fresh, app.GradedVerifyRequest, server_dir / CASES_FILE, reseed=lambda server, _: None)
    results = await exercise_verifier_fixture(
        fixture,
        reward_range=manifest.reward.range,
        higher_is_better=manifest.reward.higher_is_better,
        determinism=manifest.determinism,
    )
    assert [result.kind for result in results] == ["full_reward", "zero_reward", "malformed", "determinism"]


def test_refusals_leave_nothing_behind(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = init(capsys, "--environment", "my_env", "--profile", "custom-verifier")
    assert code == 1 and "--profile must be one of custom-gym-verifier, custom-gym-agent-loop" in err
    code, _, err = init(capsys, "--resources-server", "x", "--profile", "custom-gym-verifier")
    assert code == 1 and "--profile goes with --environment NAME" in err
    code, _, err = init(capsys, "--environment", "a", "--resources-server", "b")
    assert code == 1 and "creates one thing" in err
    write(workdir / "responses_api_agents" / "taken_agent" / "app.py", "")
    code, _, err = init(capsys, "--environment", "taken", "--profile", "external-agent-loop")
    assert code == 1 and "taken_agent already exists" in err
    assert not (workdir / "environments").exists() and not (workdir / "resources_servers").exists()


@pytest.mark.e2e
@pytest.mark.timeout(120)
def test_every_profile_validates_and_a_new_agent_in_a_root_of_its_own_runs_a_rollout(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """As generated, each profile's environment passes ``gym env validate NAME`` (its fixtures on the real server).
    The new agent subclasses ``responses_api_agents.simple_agent`` from the install root, which the launcher puts on
    its PYTHONPATH; the scripted model answers the first row's word, and the new verifier scores the rollout."""
    names = [profile.replace("-", "_") for profile in PROFILES]
    for name, profile in zip(names, PROFILES, strict=True):
        assert init(capsys, "--environment", name, "--profile", profile)[0] == 0
    code = main(["env", "validate", *names, "+shared_venv=true", "+head_server={port: 0}"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert all(f"{name}: valid (4/4 verifier fixture(s) passed)" in out for name in names), out

    looped = "custom_gym_agent_loop"
    data = workdir / "resources_servers" / looped / "data" / "example.jsonl"
    first = json.loads(data.read_text().splitlines()[0])
    script = write(workdir / "script.yaml", json.dumps(
        {"policy_model": {"responses_api_models": {"scripted_model": {"script": [[
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": first["expected_answer"]}]}
        ]]}}}}
    ))  # fmt: skip
    code = main([
        "eval", "run", "--environment", looped, "--config", str(SCRIPTED), "--config", str(script),
        "--agent", f"{looped}_agent", "--input", str(data), "--limit", "1",
        "--output", str(workdir / "results" / "looped.jsonl"), "+shared_venv=true",
        "+head_server={port: 0}", f"+results_dir={workdir / 'results'}", f"+cache_dir={workdir / 'cache'}",
    ])  # fmt: skip
    assert code == 0, capsys.readouterr()
    rows = [json.loads(line) for line in (workdir / "results" / "looped.jsonl").read_text().splitlines()]
    assert [row["reward"] for row in rows] == [1.0]
