"""Environment servers (NeMo Gym 0.7's fourth kind) start, list and stop like the other three.

The test implementation follows the launcher's child contract directly (``conftest.SERVER_APP``), so these tests
depend on neither the framework's environment server base class nor any shipped implementation.
"""

from __future__ import annotations

import json
import re
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from nemo_gym.cli.main import main
from nemo_gym.errors import ConfigError
from nemo_gym.launcher import running_servers
from nemo_gym.launcher.runner import spawn_order
from nemo_gym.launcher.server_process import ServerProcess
from tests.helpers import run_headers, write
from tests.launcher.conftest import SERVER_APP, base_overrides, server_block

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


def get_json(url: str) -> Any:
    request = urllib.request.Request(url, headers=run_headers(url, urllib.parse.urlsplit(url).port))
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())


def environment_block(instance: str, impl: str, agent: str = "echo_agent", **extra: object) -> str:
    lines = [
        f"{instance}:", "  environment_servers:", f"    {impl}:", "      entrypoint: app.py",
        f"      agent_server: {{type: responses_api_agents, name: {agent}}}",
        "      resources_server: {type: resources_servers, name: echo_resources}",
        "      default_episode_timeout_seconds: 600", "      cleanup_timeout_seconds: 30",
    ]  # fmt: skip
    lines += [f"      {key}: {value}" for key, value in extra.items()]
    return "\n".join(lines) + "\n"


AGENT = "echo_agent:\n  responses_api_agents:\n    echo:\n      entrypoint: app.py\n"


@pytest.fixture
def topology(server_root: Path) -> Path:
    """An environment server (listed first) fronting an agent and a resources server, all three real processes."""
    write(server_root / "environment_servers" / "episode" / "app.py", SERVER_APP)
    write(server_root / "responses_api_agents" / "echo" / "app.py", SERVER_APP)
    return write(
        server_root / "config.yaml",
        environment_block("my_env", "episode") + server_block("echo_resources", "echo") + AGENT,
    )


def test_an_environment_server_runs_beside_the_others_and_is_listed_with_its_kind(
    server_root: Path, topology: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with running_servers(base_overrides(server_root, topology)) as run:
        assert set(run.urls) == {"my_env", "echo_resources", "echo_agent"}
        info = get_json(run.urls["my_env"] + "/info")
        impl_dir = server_root / "environment_servers" / "episode"
        assert info["name"] == "my_env" and Path(info["cwd"]) == impl_dir
        assert info["pythonpath"].split(":")[:2] == [str(impl_dir), str(server_root)]

        instances = {i["name"]: i for i in get_json(run.head_url + "/server_instances")}
        assert instances["my_env"]["server_type"] == "environment_servers"
        assert instances["my_env"]["kind"] == "environment server"
        assert instances["my_env"]["implementation"] == "episode"
        assert instances["echo_agent"]["kind"] == "agent server"
        assert instances["my_env"]["pid"] == info["pid"]
        # environment servers are started after what they front
        assert [s.name for s in spawn_order(run.servers)][-1] == "my_env"

        port = run.config.head_server.port
        capsys.readouterr()
        assert main(["env", "status", f"+head_server.port={port}"]) == 0
        out = capsys.readouterr().out
        assert re.search(r"my_env\s+environment_servers/episode\s+http://127\.0\.0\.1:\d+\s+\d+\s+healthy", out), out
        assert "3 / 3 servers healthy" in out
        assert main(["env", "status", "--json", f"+head_server.port={port}"]) == 0
        servers = {s["name"]: s for s in json.loads(capsys.readouterr().out)["servers"]}
        assert servers["my_env"]["healthy"] and servers["my_env"]["server_type"] == "environment_servers"
    assert "my_env starting" in (server_root / "results" / "logs" / "my_env.log").read_text()


def test_an_environment_server_with_a_missing_folder_names_where_it_looked(server_root: Path) -> None:
    config = write(
        server_root / "config.yaml",
        environment_block("lost", "no_such_impl") + server_block("echo_resources", "echo") + AGENT,
    )
    write(server_root / "responses_api_agents" / "echo" / "app.py", SERVER_APP)
    with pytest.raises(ConfigError, match=r"implementation directory environment_servers/no_such_impl not found"):
        with running_servers(base_overrides(server_root, config)):
            pytest.fail("the launch should have failed")


def test_spawn_order_puts_environment_servers_last_and_keeps_the_rest_in_config_order(tmp_path: Path) -> None:
    def server(name: str, kind: str) -> ServerProcess:
        return ServerProcess(name, kind, "impl", "127.0.0.1", 1, tmp_path, tmp_path, tmp_path / "app.py", None)  # type: ignore[arg-type]

    servers = [
        server("env_a", "environment_servers"), server("model", "responses_api_models"),
        server("env_b", "environment_servers"), server("agent", "responses_api_agents"),
        server("res", "resources_servers"),
    ]  # fmt: skip
    assert [s.name for s in spawn_order(servers)] == ["model", "agent", "res", "env_a", "env_b"]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_an_environment_server_gets_its_own_venv_from_its_requirements(server_root: Path, topology: Path) -> None:
    """Not the shared interpreter: a venv under cache/venvs/environment_servers/, built from its requirements.txt."""
    for folder in ("environment_servers/episode", "resources_servers/echo", "responses_api_agents/echo"):
        write(server_root / folder / "requirements.txt", "math-verify==0.8.0\n")
    overrides = [*base_overrides(server_root, topology, shared=False), "++server_startup_timeout_seconds=800"]
    with running_servers(overrides) as run:
        info = get_json(run.urls["my_env"] + "/info")
        venv = next(s.venv for s in run.servers if s.name == "my_env")
    assert venv is not None and venv.path.parent == server_root / "cache" / "venvs" / "environment_servers"
    assert Path(info["python"]).parent.parent == venv.path
    assert info["math_verify"] == "0.8.0"
