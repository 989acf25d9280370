"""gym env init --environment-server: a new environment server with the standard shape that passes gym env test."""

from __future__ import annotations

import json

import pytest

from nemo_gym.authoring.server_tests import SERVER_TYPES, find_server_dirs
from nemo_gym.cli.main import main
from nemo_gym.errors import ConfigError
from tests.helpers import write

pytestmark = pytest.mark.timeout(600)

MODEL = """
policy_model:
  responses_api_models:
    openai_model:
      entrypoint: app.py
      openai_base_url: http://127.0.0.1:1/v1
      openai_api_key: k
      openai_model: m
"""


def test_init_creates_the_standard_shape(workdir, capsys):
    assert main(["env", "init", "--environment-server", "my_episode"]) == 0
    assert "next: gym env test --environment-server my_episode" in capsys.readouterr().out
    server = workdir / "environment_servers" / "my_episode"
    shape = sorted(str(p.relative_to(server)) for p in server.rglob("*") if p.is_file())
    assert shape == [
        "README.md", "__init__.py", "app.py", "configs/my_episode.yaml", "data/.gitignore", "data/example.jsonl",
        "requirements.txt", "tests/__init__.py", "tests/test_app.py",
    ]  # fmt: skip
    app = (server / "app.py").read_text()
    assert "class MyEpisodeEnvironmentServer(BaseEnvironmentServer[MyEpisodeRequest, MyEpisodeResponse])" in app
    assert "async def run(self, request: MyEpisodeRequest, cleanup: CleanupContext)" in app
    assert "async def aggregate_metrics(" in app
    rows = [json.loads(line) for line in (server / "data" / "example.jsonl").read_text().splitlines()]
    assert len(rows) == 5 and set(rows[0]) == {"task_id", "task_input"}
    assert (server / "requirements.txt").read_text() == "-e nemo-gym[dev] @ ../../\n"

    assert main(["env", "init", "--environment-server", "my_episode"]) == 1
    assert "already exists" in capsys.readouterr().err
    assert main(["env", "init", "--environment-server", "not-a-name"]) == 1
    assert "not a valid environment server name" in capsys.readouterr().err
    assert main(["env", "init", "--environment-server", "a", "--resources-server", "b"]) == 1
    assert "creates one thing" in capsys.readouterr().err


def test_env_test_walks_environment_servers(workdir):
    assert "environment_servers" in SERVER_TYPES
    write(workdir / "environment_servers" / "walked" / "app.py", "")
    write(workdir / "resources_servers" / "walked" / "app.py", "")
    labels = {f"{p.parent.name}/{p.name}" for p in find_server_dirs()}
    assert {"environment_servers/walked", "resources_servers/walked"} <= labels
    assert find_server_dirs("environment_servers/walked") == [workdir / "environment_servers" / "walked"]
    with pytest.raises(ConfigError, match="Did you mean: environment_servers/walked"):
        find_server_dirs("environment_servers/walkd")


def test_the_scaffolded_config_validates_against_its_own_schema(workdir, capsys):
    assert main(["env", "init", "--environment-server", "my_episode"]) == 0
    write(workdir / "model.yaml", MODEL)
    capsys.readouterr()
    code = main(["env", "validate", "--environment-server", "my_episode", "--config", "model.yaml"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    config = workdir / "environment_servers" / "my_episode" / "configs" / "my_episode.yaml"
    config.write_text(config.read_text().replace("cleanup_timeout_seconds: 30", "cleanup_timeout_secs: 30"))
    assert main(["env", "validate", "--environment-server", "my_episode", "--config", "model.yaml"]) == 1
    assert "Did you mean 'cleanup_timeout_seconds'?" in capsys.readouterr().err


@pytest.mark.e2e
def test_init_then_env_test_passes(workdir, capsys):
    """Its tests drive one episode through nemo_gym.base_environment_server's lifecycle and its /run route."""
    assert main(["env", "init", "--environment-server", "my_episode"]) == 0
    code = main(["env", "test", "--environment-server", "my_episode", "--shared-venv"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "environment_servers/my_episode" in out and "7 passed" in out and "1 passed, 0 failed" in out


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_init_then_env_test_passes_in_its_own_venv(workdir, capsys):
    assert main(["env", "init", "--environment-server", "my_episode"]) == 0
    code = main(["env", "test", "--environment-server", "my_episode", f"+cache_dir={workdir / 'cache'}"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "environment_servers/my_episode" in out and "1 passed, 0 failed" in out
    assert list((workdir / "cache" / "venvs" / "environment_servers").glob("my_episode-*")), "tests ran in its venv"
