"""Environment servers in the catalog: `gym list environment-servers`, `--environment-server NAME`, `gym search`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nemo_gym.assets import list_component_configs, list_implementations, resolve_selector
from nemo_gym.cli.main import main
from nemo_gym.errors import ConfigError
from tests.helpers import write

RELAY = """
my_relay:
  environment_servers:
    my_relay:
      entrypoint: app.py
      description: Relays one agent's /run
      agent_server:
        type: responses_api_agents
        name: ???
      cleanup_timeout_seconds: 30
"""
RESOURCES = """
weather:
  resources_servers:
    weather_impl:
      entrypoint: app.py
      domain: agent
      description: Tells the weather
weather_agent:
  responses_api_agents:
    simple_agent:
      entrypoint: app.py
      resources_server: {type: resources_servers, name: weather}
      model_server: {type: responses_api_models, name: policy_model}
weather_environment_server:
  environment_servers:
    my_relay:
      entrypoint: app.py
      agent_server: {type: responses_api_agents, name: weather_agent}
"""


@pytest.fixture
def tree(workdir: Path) -> Path:
    write(workdir / "environment_servers" / "my_relay" / "configs" / "my_relay.yaml", RELAY)
    write(workdir / "environment_servers" / "my_relay" / "configs" / "fronting_weather.yaml", RESOURCES)
    write(workdir / "environment_servers" / "my_relay" / "app.py", "")
    write(workdir / "resources_servers" / "weather_impl" / "configs" / "weather_impl.yaml", RESOURCES)
    write(workdir / "resources_servers" / "weather_impl" / "app.py", "")
    return workdir


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_assets_find_environment_server_implementations_and_configs(tree: Path) -> None:
    assert tree / "environment_servers" / "my_relay" in list_implementations("environment_servers")
    names = {c.name for c in list_component_configs("environment_servers")}
    assert {"my_relay", "my_relay/fronting_weather"} <= names
    assert (
        resolve_selector("environment-server", "my_relay")
        == tree / "environment_servers/my_relay/configs/my_relay.yaml"
    )
    flavored = resolve_selector("environment-server", "my_relay/fronting_weather")
    assert flavored.name == "fronting_weather.yaml"
    with pytest.raises(ConfigError, match="Did you mean: my_relay"):
        resolve_selector("environment-server", "my_rely")


def test_gym_list_environment_servers(tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "list", "environment-servers", "--json")
    assert code == 0
    rows = {row["name"]: row for row in json.loads(out)}
    relay = rows["my_relay"]
    assert relay["kind"] == "environment-server" and relay["description"] == "Relays one agent's /run"
    assert relay["needs"] == ["agent_server"] and relay["agents"] == []  # its agent is left to the user (???)
    assert relay["instances"] == ["my_relay (my_relay)"]
    assert "--environment-server my_relay" in relay["usage"]
    wired = rows["my_relay/fronting_weather"]
    assert wired["agents"] == ["weather_agent"] and wired["needs"] == []

    code, out, _ = run(capsys, "list", "environment-servers")
    assert code == 0 and "Environment servers" in out and "my_relay" in out
    code, out, _ = run(capsys, "list", "environment-servers", "my_relay")
    assert code == 0 and "(environment-server)" in out and "agent_server" in out
    code, _, err = run(capsys, "list", "environment-servers", "my_rely")
    assert code == 1 and "Did you mean: my_relay" in err


def test_resources_server_rows_show_the_environment_servers_their_configs_declare(
    tree: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, out, _ = run(capsys, "list", "resources-servers", "--json")
    row = next(row for row in json.loads(out) if row["name"] == "weather_impl")
    assert row["environment_servers"] == ["weather_environment_server (my_relay)"]


def test_search_finds_environment_servers(tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = run(capsys, "search", "environment-servers", "relays", "--json")
    assert "my_relay" in [row["name"] for row in json.loads(out)]
    _, out, _ = run(capsys, "search", "relays", "--json")
    assert "environment-server" in {row["kind"] for row in json.loads(out)}


def test_the_environment_server_selector_adds_its_config(tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    wiring = write(tree / "wiring.yaml", "my_relay:\n  environment_servers:\n    my_relay:\n      agent_server:\n"
                   "        name: weather_agent\n")  # fmt: skip
    code, out, err = run(
        capsys, "env", "resolve", "--environment-server", "my_relay", "--resources-server", "weather_impl",
        "--config", str(wiring),
    )  # fmt: skip
    assert code == 0, err
    assert "environment_servers:" in out and "name: weather_agent" in out
