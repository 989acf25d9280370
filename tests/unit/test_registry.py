"""nemo_gym.registry: discovery of environments/<name>/config.yaml, never resolving anything."""

from __future__ import annotations

from nemo_gym import registry
from tests.helpers import write

ENV_CONFIG = """
my_env_resources:
  resources_servers:
    my_impl:
      entrypoint: app.py
      domain: math
      description: Adds numbers
      judge_api_key: ${policy_api_key}
      required_thing: ???
my_env_agent:
  responses_api_agents:
    simple_agent:
      entrypoint: app.py
"""


def test_discovers_an_environment_whose_config_references_unset_secrets(tmp_path):
    write(tmp_path / "my_env" / "config.yaml", ENV_CONFIG)
    entries = registry.discover_environments(tmp_path)
    assert list(entries) == ["my_env"]
    entry = entries["my_env"]
    assert entry == registry.EnvironmentEntry(
        name="my_env",
        config_path=tmp_path / "my_env" / "config.yaml",
        path=tmp_path / "my_env",
        description="Adds numbers",
        domain="math",
    )


def test_missing_directory_gives_an_empty_mapping(tmp_path):
    assert registry.discover_environments(tmp_path / "nope") == {}


def test_directories_without_config_are_ignored_and_metadata_is_optional(tmp_path):
    (tmp_path / "empty").mkdir()
    write(tmp_path / "bare" / "config.yaml", "x: 1\n")
    write(tmp_path / "broken" / "config.yaml", "x: [\n")
    entries = registry.discover_environments(tmp_path)
    assert sorted(entries) == ["bare", "broken"]
    assert (entries["bare"].description, entries["bare"].domain) == (None, None)
    assert registry._read_metadata(tmp_path / "broken" / "config.yaml") == (None, None)


def test_module_constants():
    assert registry.ENVIRONMENT_CONFIG_FILENAME == "config.yaml"
    assert registry.ENVIRONMENTS_DIR.name == "environments"
