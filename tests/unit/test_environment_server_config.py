"""environment_servers, NeMo Gym 0.7's fourth server kind, in a config: typed instances, refs, and who fronts whom."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from nemo_gym import config_types, global_config
from nemo_gym.checkout import SERVER_FOLDERS, working_checkout
from nemo_gym.config.server_models import (
    SERVER_TYPES,
    EnvironmentServerInstanceConfig,
    EnvironmentServerRef,
    environment_server_agent_names,
    environment_servers_by_agent,
    is_almost_server,
    is_server_ref,
    maybe_get_server_instance_config,
)
from nemo_gym.errors import AlmostServerError, ServerRefNotFoundError
from nemo_gym.global_config import parse_global_config_dict as parse
from tests.helpers import write

RESOURCES = """
weather:
  resources_servers:
    example_weather:
      entrypoint: app.py
      domain: agent
weather_simple_agent:
  responses_api_agents:
    simple_agent:
      entrypoint: app.py
      resources_server: {type: resources_servers, name: weather}
      model_server: {type: responses_api_models, name: policy_model}
policy_model:
  responses_api_models:
    openai_model:
      entrypoint: app.py
      openai_base_url: http://127.0.0.1:1/v1
      openai_api_key: k
      openai_model: m
"""
ENVIRONMENT = """
my_env:
  environment_servers:
    single_agent_turn:
      entrypoint: app.py
      resources_server: {type: resources_servers, name: weather}
      agent_server: {type: responses_api_agents, name: weather_simple_agent}
      default_episode_timeout_seconds: 600
      cleanup_timeout_seconds: 30
"""
RELAY = """
weather_relay:
  environment_servers:
    legacy_agent:
      entrypoint: app.py
      agent_server:
        type: responses_api_agents
        name: weather_simple_agent
      max_concurrent_episodes: null
      queue_timeout_seconds: null
      default_episode_timeout_seconds: 21600
      cleanup_timeout_seconds: 180
"""


def compose(workdir, *texts: str, extra: tuple[str, ...] = ()):
    paths = []
    for index, text in enumerate(texts):
        paths.append(str(write(workdir / f"c{index}.yaml", text)))
    return parse([f"+config_paths=[{','.join(paths)}]", *extra])


def test_environment_servers_is_the_fourth_server_kind():
    assert SERVER_FOLDERS == (
        "responses_api_models",
        "resources_servers",
        "responses_api_agents",
        "environment_servers",
    )
    assert SERVER_TYPES == SERVER_FOLDERS
    assert config_types.SERVER_TYPES == SERVER_FOLDERS


def test_an_environment_server_block_is_a_typed_instance():
    block = OmegaConf.create(ENVIRONMENT)["my_env"]
    instance, error = maybe_get_server_instance_config("my_env", block)
    assert error is None and isinstance(instance, EnvironmentServerInstanceConfig)
    assert instance.SERVER_TYPE == "environment_servers" and instance.implementation == "single_agent_turn"
    inner = instance.get_inner_run_server_config()
    assert inner.entrypoint == "app.py" and inner.model_extra["cleanup_timeout_seconds"] == 30
    assert instance.get_server_ref() == EnvironmentServerRef(type="environment_servers", name="my_env")


def test_environment_server_refs():
    ref = is_server_ref({"type": "environment_servers", "name": "my_env"})
    assert isinstance(ref, EnvironmentServerRef) and ref.name == "my_env"
    assert config_types.EnvironmentServerRef is EnvironmentServerRef
    assert is_server_ref({"type": "environment_server", "name": "x"}) is None


def test_an_environment_server_without_its_implementation_settings_is_almost_a_server():
    assert is_almost_server({"environment_servers": {"legacy_agent": {"entrypoint": "app.py"}}})
    assert not is_almost_server({"environment_servers": {"legacy_agent": {"agent_server": {}}}})
    instance, error = maybe_get_server_instance_config(
        "two", {"environment_servers": {"a": {"entrypoint": "app.py"}, "b": {"entrypoint": "app.py"}}}
    )
    assert instance is None and error is not None


def test_a_composed_config_holds_environment_servers_beside_the_others(workdir):
    config = compose(workdir, RESOURCES, ENVIRONMENT, RELAY)
    kinds = {i.name: i.SERVER_TYPE for i in global_config.get_server_instance_configs(config)}
    assert kinds == {
        "weather": "resources_servers",
        "weather_simple_agent": "responses_api_agents",
        "policy_model": "responses_api_models",
        "my_env": "environment_servers",
        "weather_relay": "environment_servers",
    }


def test_an_environment_server_ref_to_a_missing_agent_is_refused_with_a_suggestion(workdir):
    with pytest.raises(ServerRefNotFoundError) as error:
        compose(workdir, RESOURCES, ENVIRONMENT.replace("name: weather_simple_agent", "name: weather_simpel_agent"))
    message = str(error.value)
    assert "my_env.environment_servers.single_agent_turn.agent_server" in message
    assert "Did you mean: weather_simple_agent?" in message


def test_an_agent_server_whose_type_is_left_out_is_checked_as_an_agent(workdir):
    # an implementation with no folder here, so no schema of its own asks for the type
    untyped = (
        "x:\n  environment_servers:\n    my_relay:\n      entrypoint: app.py\n      agent_server: {name: nobody}\n"
    )
    with pytest.raises(ServerRefNotFoundError, match="responses_api_agents 'nobody'"):
        compose(workdir, RESOURCES, untyped)
    config = compose(workdir, RESOURCES, untyped.replace("nobody", "weather_simple_agent"))
    assert environment_servers_by_agent(config) == {"weather_simple_agent": ["x"]}


def test_refs_to_environment_servers_are_checked_too(workdir):
    referring = RESOURCES + "\nuser:\n  resources_servers:\n    u:\n      entrypoint: app.py\n      domain: agent\n"
    referring += "      environment_server: {type: environment_servers, name: my_enb}\n"
    with pytest.raises(ServerRefNotFoundError, match="Did you mean: my_env"):
        compose(workdir, referring, ENVIRONMENT)


def test_an_invalid_environment_server_block_is_an_almost_server(workdir):
    broken = "bad:\n  environment_servers:\n    my_relay:\n      entrypoint: app.py\n      host: [1, 2]\n"
    with pytest.raises(AlmostServerError, match="bad"):
        compose(workdir, RESOURCES, broken)


def test_environment_servers_by_agent(workdir):
    config = compose(workdir, RESOURCES, ENVIRONMENT, RELAY)
    assert environment_servers_by_agent(config) == {"weather_simple_agent": ["my_env", "weather_relay"]}
    assert global_config.environment_servers_by_agent is environment_servers_by_agent
    assert environment_servers_by_agent(OmegaConf.to_container(config)) == environment_servers_by_agent(config)
    assert environment_servers_by_agent(compose(workdir, RESOURCES)) == {}


def test_an_environment_server_may_front_several_agents():
    settings = {
        "entrypoint": "app.py",
        "user_agent": {"type": "responses_api_agents", "name": "user"},
        "assistant_agent": {"type": "responses_api_agents", "name": "assistant"},
        "resources_server": {"type": "resources_servers", "name": "weather"},
        "agent_server": {"name": "assistant"},
    }
    assert environment_server_agent_names(settings) == ["user", "assistant", "assistant"]
    config = {"duo": {"environment_servers": {"nemo_user_sim": settings}}, "other": {"x": 1}, "flag": True}
    assert environment_servers_by_agent(config) == {"user": ["duo"], "assistant": ["duo"]}


def test_routing_settings_are_framework_keys_not_servers(workdir):
    routes = "environment_server_routes:\n  weather_tasks: my_env\nenvironment_routing_mode: taskset\n"
    config = compose(workdir, RESOURCES, ENVIRONMENT, routes)
    assert config.environment_server_routes.weather_tasks == "my_env"
    assert "environment_server_routes" not in {i.name for i in global_config.get_server_instance_configs(config)}


def test_global_config_key_names_of_0_7():
    assert global_config.ENVIRONMENT_SERVER_TYPE_KEY_NAME == "environment_servers"
    assert global_config.ENVIRONMENT_SERVER_NAME_KEY_NAME == "environment_server_name"
    assert global_config.ENVIRONMENT_SERVER_ROUTES_KEY_NAME == "environment_server_routes"
    assert global_config.ENVIRONMENT_ROUTING_MODE_KEY_NAME == "environment_routing_mode"
    assert (
        global_config.ERROR_ON_AGENT_WITHOUT_ENVIRONMENT_SERVER_KEY_NAME == "error_on_agent_without_environment_server"
    )
    assert global_config.ENVIRONMENT_SERVER_STAMP_KEY_NAME == "_ng_environment_server"
    assert global_config.TASK_SOURCE_KEY_NAME == "task_source"
    assert global_config.TOKEN_ID_CAPTURE_BLOCK == "token_id_capture"
    assert global_config.AGENT_SERVER_REF_KEY_NAME == "agent_server"


def test_a_folder_under_environment_servers_is_in_a_checkout(tmp_path):
    folder = tmp_path / "environment_servers" / "my_env" / "tests"
    folder.mkdir(parents=True)
    assert working_checkout(folder) == tmp_path
    assert working_checkout(tmp_path) == tmp_path
