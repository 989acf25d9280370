"""Config composition: sources and precedence, includes, overrides, directives, validation and defaults.

Each test pins one rule; changing the rule must break a test here.
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from nemo_gym import global_config
from nemo_gym.config import ports
from nemo_gym.errors import (
    AlmostServerError,
    ConfigError,
    ConfigInterpolationError,
    ConfigMissingValuesError,
    ConfigPathNotFoundError,
    InheritPathNotFoundError,
    MalformedConfigPathsError,
    NoServerInstancesError,
    ServerRefNotFoundError,
)
from nemo_gym.global_config import parse_global_config_dict as parse
from tests.helpers import write

RESOURCES = """
weather:
  resources_servers:
    example_weather:
      entrypoint: app.py
      domain: agent
"""
AGENT = """
weather_agent:
  responses_api_agents:
    simple_agent:
      entrypoint: app.py
      resources_server: {type: resources_servers, name: weather}
      model_server: {type: responses_api_models, name: policy_model}
"""
MODEL = """
policy_model:
  responses_api_models:
    openai_model:
      entrypoint: app.py
      openai_base_url: http://127.0.0.1:1/v1
      openai_api_key: ${policy_api_key}
      openai_model: test-model
"""


def paths_token(*paths: Path | str) -> str:
    return "+config_paths=[" + ",".join(str(p) for p in paths) + "]"


# --- sources and precedence -------------------------------------------------------------------------------------------


def test_later_paths_override_earlier_paths(workdir):
    write(workdir / "a.yaml", "x: a\ny: a\n")
    write(workdir / "b.yaml", "x: b\n")
    config = parse([paths_token("a.yaml", "b.yaml")])
    assert (config.x, config.y) == ("b", "a")


def test_env_yaml_overrides_config_files_and_the_command_line_overrides_env_yaml(workdir, monkeypatch):
    write(workdir / "a.yaml", "x: file\ny: file\nz: file\n")
    monkeypatch.setenv("NEMO_GYM_ENV_YAML", str(write(workdir / "env.yaml", "y: env\nz: env\n")))
    config = parse([paths_token("a.yaml"), "z=cli"])
    assert (config.x, config.y, config.z) == ("file", "env", "cli")


def test_env_yaml_is_found_in_the_working_directory(workdir, monkeypatch):
    monkeypatch.delenv("NEMO_GYM_ENV_YAML")
    write(workdir / "env.yaml", "policy_api_key: from-env-yaml\n")
    assert parse([]).policy_api_key == "from-env-yaml"


def test_initial_dict_has_the_lowest_precedence(workdir):
    write(workdir / "a.yaml", "x: file\n")
    config = parse([paths_token("a.yaml")], initial_global_config_dict={"x": "initial", "w": "initial"})
    assert (config.x, config.w) == ("file", "initial")


def test_env_yaml_can_name_config_paths_for_the_command_line(workdir, monkeypatch):
    write(workdir / "a.yaml", "x: a\n")
    write(workdir / "b.yaml", "y: b\n")
    monkeypatch.setenv("NEMO_GYM_ENV_YAML", str(write(workdir / "env.yaml", "my_paths: [a.yaml, b.yaml]\n")))
    config = parse(["+config_paths=${my_paths}"])
    assert (config.x, config.y) == ("a", "b")
    assert [Path(p).name for p in config.config_paths] == ["a.yaml", "b.yaml"]


def test_config_paths_in_env_yaml_are_loaded(workdir, monkeypatch):
    write(workdir / "a.yaml", "x: a\n")
    monkeypatch.setenv("NEMO_GYM_ENV_YAML", str(write(workdir / "env.yaml", "config_paths: [a.yaml]\n")))
    assert parse([]).x == "a"


# --- includes ---------------------------------------------------------------------------------------------------------


def test_a_config_overrides_what_it_includes(workdir):
    write(workdir / "child.yaml", "x: child\ny: child\n")
    write(workdir / "parent.yaml", "config_paths: [child.yaml]\nx: parent\n")
    config = parse([paths_token("parent.yaml")])
    assert (config.x, config.y) == ("parent", "child")


def test_a_later_sibling_and_its_subtree_override_an_earlier_sibling(workdir):
    write(workdir / "a_child.yaml", "x: a_child\ny: a_child\n")
    write(workdir / "a.yaml", "config_paths: [a_child.yaml]\n")
    write(workdir / "b_child.yaml", "x: b_child\n")
    write(workdir / "b.yaml", "config_paths: [b_child.yaml]\ny: b\n")
    config = parse([paths_token("a.yaml", "b.yaml")])
    assert (config.x, config.y) == ("b_child", "b")
    assert [Path(p).name for p in config.config_paths] == ["a_child.yaml", "a.yaml", "b_child.yaml", "b.yaml"]


def test_a_file_referenced_twice_is_loaded_once_at_its_first_position(workdir):
    write(workdir / "shared.yaml", "x: shared\n")
    write(workdir / "a.yaml", "config_paths: [shared.yaml]\nx: a\n")
    write(workdir / "b.yaml", "config_paths: [shared.yaml]\n")
    config = parse([paths_token("a.yaml", "b.yaml")])
    assert config.x == "a"
    assert [Path(p).name for p in config.config_paths] == ["shared.yaml", "a.yaml", "b.yaml"]


def test_include_cycles_terminate(workdir):
    write(workdir / "a.yaml", "config_paths: [b.yaml]\nx: a\n")
    write(workdir / "b.yaml", "config_paths: [a.yaml]\nx: b\n")
    assert parse([paths_token("a.yaml")]).x == "a"


def test_includes_resolve_relative_to_the_including_file_as_a_fallback(workdir):
    write(workdir / "sub" / "child.yaml", "x: child\n")
    write(workdir / "sub" / "parent.yaml", "config_paths: [child.yaml]\n")
    assert parse([paths_token("sub/parent.yaml")]).x == "child"


def test_a_missing_config_file_lists_every_location_tried(workdir):
    with pytest.raises(ConfigPathNotFoundError) as error:
        parse([paths_token("nope.yaml")])
    assert "nope.yaml" in str(error.value) and str(workdir) in str(error.value)


def test_a_missing_include_names_the_including_file(workdir):
    write(workdir / "a.yaml", "config_paths: [gone.yaml]\n")
    with pytest.raises(ConfigPathNotFoundError, match=r"gone.yaml.*listed in .*a.yaml"):
        parse([paths_token("a.yaml")])


def test_config_paths_must_be_a_list(workdir):
    write(workdir / "a.yaml", "config_paths: b.yaml\n")
    with pytest.raises(MalformedConfigPathsError, match="must be a list"):
        parse([paths_token("a.yaml")])
    with pytest.raises(MalformedConfigPathsError):
        parse(["+config_paths=3"])


def test_malformed_yaml_names_file_line_and_column(workdir):
    write(workdir / "bad.yaml", "a: 1\nb: [unclosed\nc: 3\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml:\d+:\d+: invalid YAML"):
        parse([paths_token("bad.yaml")])


def test_a_non_mapping_file_is_rejected(workdir):
    write(workdir / "list.yaml", "- a\n- b\n")
    with pytest.raises(ConfigError, match="must be a mapping"):
        parse([paths_token("list.yaml")])


def test_extra_search_roots_are_searched_before_cwd(workdir, monkeypatch, tmp_path_factory):
    extra = tmp_path_factory.mktemp("extra")
    write(extra / "c.yaml", "x: extra\n")
    write(workdir / "c.yaml", "x: cwd\n")
    monkeypatch.setenv("NEMO_GYM_EXTRA_ROOTS", str(extra))
    assert parse([paths_token("c.yaml")]).x == "extra"


# --- overrides --------------------------------------------------------------------------------------------------------


def test_plus_adds_lists_mappings_and_dotted_paths(workdir):
    config = parse(["+a.b.c=1", "+l=[1,2,three]", "+m={k: v}", "+s='quoted, string'", "+n=null"])
    assert config.a.b.c == 1 and list(config.l) == [1, 2, "three"] and config.m.k == "v"
    assert config.s == "quoted, string" and config.n is None


def test_plain_override_changes_an_existing_key(workdir):
    write(workdir / "a.yaml", "server:\n  port_hint: 1\n")
    assert parse([paths_token("a.yaml"), "server.port_hint=2"]).server.port_hint == 2


def test_plain_override_of_an_unknown_key_suggests_the_close_key_and_plus(workdir):
    write(workdir / "a.yaml", "server:\n  timeout: 1\n")
    with pytest.raises(ConfigError) as error:
        parse([paths_token("a.yaml"), "server.timeot=2"])
    assert "server.timeout" in str(error.value) and "+server.timeot=2" in str(error.value)


def test_plus_overrides_a_value_from_files(workdir):
    write(workdir / "a.yaml", "x: 1\n")
    assert parse([paths_token("a.yaml"), "+x=2"]).x == 2


def test_the_same_plus_key_twice_is_an_error_but_double_plus_replaces(workdir):
    with pytest.raises(ConfigError, match=r"already set.*\+\+x"):
        parse(["+x=1", "+x=2"])
    assert parse(["+x=1", "++x=2"]).x == 2


def test_tilde_deletes(workdir):
    write(workdir / "a.yaml", "x: 1\ny: 2\n")
    config = parse([paths_token("a.yaml"), "~x"])
    assert "x" not in config and config.y == 2
    with pytest.raises(ConfigError, match="no key 'zz' to delete"):
        parse([paths_token("a.yaml"), "~zz"])


def test_malformed_override_is_reported_with_the_token(workdir):
    with pytest.raises(ConfigError, match=r"cannot parse override '\+x=\[1,2'"):
        parse(["+x=[1,2"])


def test_sweeps_are_rejected_with_a_hint(workdir):
    with pytest.raises(ConfigError, match="sweep"):
        parse(["+x=a,b"])


# --- missing values and interpolations -------------------------------------------------------------------------------


def test_every_missing_value_is_listed_with_a_hint(workdir):
    write(workdir / "a.yaml", "a: ???\nb:\n  c: ???\nd: set\n")
    with pytest.raises(ConfigMissingValuesError) as error:
        parse([paths_token("a.yaml")])
    message = str(error.value)
    assert "a, b.c" in message and "++a=<value>" in message and "++b.c=<value>" in message
    assert "\n" not in message


def test_a_missing_value_filled_later_is_not_reported(workdir):
    write(workdir / "a.yaml", "a: ???\n")
    assert parse([paths_token("a.yaml"), "++a=1"]).a == 1


def test_missing_value_in_a_deleted_branch_is_not_reported(workdir):
    write(workdir / "a.yaml", "keep: 1\ndrop:\n  x: ???\n")
    assert "drop" not in parse([paths_token("a.yaml"), "~drop"])


def test_unset_value_never_replaces_a_set_one(workdir):
    write(workdir / "a.yaml", "a: 1\n")
    write(workdir / "b.yaml", "a: ???\n")
    assert parse([paths_token("a.yaml", "b.yaml")]).a == 1


def test_interpolations_are_resolved(workdir):
    write(workdir / "a.yaml", "base: http://x\nurl: ${base}/v1\n")
    assert parse([paths_token("a.yaml")]).url == "http://x/v1"


def test_an_unresolvable_interpolation_names_the_value_and_the_key(workdir):
    write(workdir / "a.yaml", "model:\n  api_key: ${policy_api_key}\n")
    with pytest.raises(ConfigInterpolationError) as error:
        parse([paths_token("a.yaml")])
    assert "'model.api_key'" in str(error.value) and "'policy_api_key'" in str(error.value)
    assert "++policy_api_key=<value>" in str(error.value)


def test_env_resolver_is_available(workdir, monkeypatch):
    monkeypatch.setenv("GYM_TEST_VALUE", "from-env")
    assert parse(["+x=${oc.env:GYM_TEST_VALUE}"]).x == "from-env"


# --- directives -------------------------------------------------------------------------------------------------------


def test_inherit_from_moves_the_source_and_merges_own_keys_on_top(workdir):
    write(workdir / "a.yaml", "base:\n  x: 1\n  y: 1\nchild:\n  _inherit_from: base\n  y: 2\n")
    config = parse([paths_token("a.yaml")])
    assert OmegaConf.to_container(config.child) == {"x": 1, "y": 2}
    assert "base" not in config


def test_copy_keeps_the_source(workdir):
    write(workdir / "a.yaml", "base:\n  x: 1\nchild:\n  _copy: base\n")
    config = parse([paths_token("a.yaml")])
    assert config.child.x == 1 and config.base.x == 1


def test_string_forms_of_inherit_and_copy(workdir):
    write(workdir / "a.yaml", "base: {x: 1}\nother: {y: 2}\na: ${inherit_from:base}\nb: ${copy:other}\n")
    config = parse([paths_token("a.yaml")])
    assert config.a.x == 1 and config.b.y == 2 and "base" not in config and config.other.y == 2


def test_several_inheritors_of_one_source(workdir):
    write(workdir / "a.yaml", "base: {x: 1}\na: {_inherit_from: base}\nb: {_inherit_from: base, x: 2}\n")
    config = parse([paths_token("a.yaml")])
    assert (config.a.x, config.b.x) == (1, 2) and "base" not in config


def test_delete_key_removes_own_and_inherited_keys(workdir):
    write(
        workdir / "a.yaml", "base: {x: 1, y: 1, z: 1}\nchild:\n  _inherit_from: base\n  _delete_key: 'x, w'\n  w: 3\n"
    )
    config = parse([paths_token("a.yaml")])
    assert OmegaConf.to_container(config.child) == {"y": 1, "z": 1}


def test_delete_key_of_a_key_that_does_not_exist_is_an_error(workdir):
    write(workdir / "a.yaml", "child:\n  _delete_key: nope\n  x: 1\n")
    with pytest.raises(ConfigError, match="'nope'"):
        parse([paths_token("a.yaml")])


def test_inheriting_from_a_missing_path_is_an_error(workdir):
    write(workdir / "a.yaml", "child:\n  _inherit_from: nowhere.at_all\n")
    with pytest.raises(InheritPathNotFoundError, match="nowhere.at_all"):
        parse([paths_token("a.yaml")])


def test_inheriting_from_an_unset_value_reports_the_target_as_missing(workdir):
    write(workdir / "a.yaml", "base: ???\nchild:\n  _inherit_from: base\n")
    with pytest.raises(ConfigMissingValuesError, match="child"):
        parse([paths_token("a.yaml")])


def test_directives_inside_inherited_subtrees_are_processed(workdir):
    write(workdir / "a.yaml", "c: {v: 1}\nb: {_copy: c, w: 2}\na: {_copy: b}\n")
    assert OmegaConf.to_container(parse([paths_token("a.yaml")]).a) == {"v": 1, "w": 2}


def test_inheritance_cycles_are_reported(workdir):
    write(workdir / "a.yaml", "a: {_copy: b}\nb: {_copy: a}\n")
    with pytest.raises(ConfigError, match="cycle"):
        parse([paths_token("a.yaml")])


def test_directives_apply_after_command_line_overrides(workdir):
    write(workdir / "a.yaml", "base: {x: 1}\nchild: {_copy: base}\n")
    assert parse([paths_token("a.yaml"), "base.x=5"]).child.x == 5


# --- servers ----------------------------------------------------------------------------------------------------------


def test_server_instances_get_host_and_defaults(workdir):
    write(workdir / "r.yaml", RESOURCES)
    config = parse([paths_token("r.yaml")])
    inner = config.weather.resources_servers.example_weather
    assert inner.host == "127.0.0.1" and inner.port is None
    assert OmegaConf.to_container(config.head_server) == {"host": "127.0.0.1", "port": 11000}
    assert config.results_dir == str(workdir / "results") and config.cache_dir == str(workdir / "cache")
    instances = global_config.get_server_instance_configs(config)
    assert [i.name for i in instances] == ["weather"]


def test_default_host_and_head_server_can_be_set(workdir):
    write(workdir / "r.yaml", RESOURCES)
    config = parse([paths_token("r.yaml"), "+default_host=127.0.0.2", "+head_server={port: 12000}"])
    assert config.weather.resources_servers.example_weather.host == "127.0.0.2"
    assert (config.head_server.host, config.head_server.port) == ("127.0.0.2", 12000)


def test_reserved_ports_are_held_open_so_nobody_else_can_take_them(workdir):
    write(workdir / "r.yaml", RESOURCES)
    config = parse([paths_token("r.yaml")], reserve_ports=True)
    port = config.weather.resources_servers.example_weather.port
    assert isinstance(port, int) and port > 0
    assert ports.get_reservation("weather").port == port
    intruder = socket.socket()
    with pytest.raises(OSError):
        intruder.bind(("127.0.0.1", port))
    intruder.close()


def test_an_explicit_port_that_is_taken_names_the_server(workdir):
    blocker = socket.socket()
    blocker.bind(("127.0.0.1", 0))
    blocker.listen()
    taken = blocker.getsockname()[1]
    write(workdir / "r.yaml", RESOURCES.replace("domain: agent", f"domain: agent\n      port: {taken}"))
    try:
        with pytest.raises(ConfigError, match=rf"'weather'.*{taken}"):
            parse([paths_token("r.yaml")], reserve_ports=True)
    finally:
        blocker.close()


def test_port_range_is_honoured(workdir):
    write(workdir / "r.yaml", RESOURCES)
    config = parse([paths_token("r.yaml"), "+port_range_low=23000", "+port_range_high=23999"], reserve_ports=True)
    assert 23000 <= config.weather.resources_servers.example_weather.port <= 23999


def test_almost_servers_abort_unless_allowed(workdir):
    write(
        workdir / "r.yaml", "broken:\n  resources_servers:\n    impl:\n      entrypoint: app.py\n      domain: nope\n"
    )
    with pytest.raises(AlmostServerError) as error:
        parse([paths_token("r.yaml")])
    assert "broken" in str(error.value) and "error_on_almost_servers=false" in str(error.value)
    config = parse([paths_token("r.yaml"), "+error_on_almost_servers=false"])
    assert global_config.get_server_instance_configs(config) == []


def test_server_refs_must_exist_and_suggest_close_names(workdir):
    write(workdir / "r.yaml", RESOURCES)
    write(workdir / "a.yaml", AGENT.replace("name: weather}", "name: wether}"))
    write(workdir / "m.yaml", MODEL)
    with pytest.raises(ServerRefNotFoundError) as error:
        parse([paths_token("r.yaml", "a.yaml", "m.yaml"), "+policy_api_key=k"])
    assert "'wether'" in str(error.value) and "Did you mean: weather?" in str(error.value)


def test_server_ref_to_an_undefined_type_lists_what_to_do(workdir):
    write(workdir / "r.yaml", RESOURCES)
    write(workdir / "a.yaml", AGENT.replace("name: policy_model", "name: judge_model"))
    with pytest.raises(ServerRefNotFoundError, match="judge_model"):
        parse([paths_token("r.yaml", "a.yaml")])


def test_valid_refs_pass(workdir):
    write(workdir / "r.yaml", RESOURCES)
    write(workdir / "a.yaml", AGENT)
    write(workdir / "m.yaml", MODEL)
    config = parse([paths_token("r.yaml", "a.yaml", "m.yaml"), "+policy_api_key=k"])
    assert len(global_config.get_server_instance_configs(config)) == 3


def test_no_server_instances_for_a_run(workdir):
    with pytest.raises(NoServerInstancesError, match="--config"):
        parse(["+x=1"], require_server_instances=True)


def test_data_only_commands_see_the_embedded_default_policy_model_that_a_run_starts(workdir):
    write(workdir / "r.yaml", RESOURCES)
    write(workdir / "a.yaml", AGENT)
    config = parse([paths_token("r.yaml", "a.yaml")], dummy_model=True)
    started = parse([paths_token("r.yaml", "a.yaml")])
    assert list(config.policy_model.responses_api_models) == ["llamacpp_model"]
    assert list(started.policy_model.responses_api_models) == ["llamacpp_model"]


def test_the_dummy_model_satisfies_policy_model_refs_where_no_default_applies(workdir):
    write(workdir / "r.yaml", RESOURCES)
    write(workdir / "a.yaml", AGENT)
    config = parse([paths_token("r.yaml", "a.yaml"), "+policy_base_url=http://127.0.0.1:1/v1"], dummy_model=True)
    assert list(config.policy_model.responses_api_models) == ["dummy_model"]


def test_a_real_policy_model_replaces_the_dummy(workdir):
    write(workdir / "m.yaml", MODEL)
    config = parse([paths_token("m.yaml"), "+policy_api_key=k"], dummy_model=True)
    assert list(config.policy_model.responses_api_models) == ["openai_model"]


def test_skip_verification_reaches_agents_that_do_not_set_it(workdir):
    write(workdir / "r.yaml", RESOURCES)
    write(workdir / "a.yaml", AGENT)
    config = parse([paths_token("r.yaml", "a.yaml"), "+skip_verification=true"], dummy_model=True)
    assert config.weather_agent.responses_api_agents.simple_agent.skip_verification is True


# --- lifecycle and masking --------------------------------------------------------------------------------------------


def test_global_config_is_cached(workdir):
    first = global_config.get_global_config_dict(["+x=1"])
    assert global_config.get_global_config_dict(["+x=2"]) is first
    assert global_config.maybe_get_global_config_dict() is first


def test_child_servers_read_the_launchers_config_file(workdir, monkeypatch):
    path = write(workdir / "resolved.yaml", "x: from-launcher\n")
    monkeypatch.setenv("NEMO_GYM_CONFIG_FILE", str(path))
    assert global_config.get_global_config_dict(["+x=ignored"]).x == "from-launcher"


def test_a_handed_down_config_that_is_a_list_is_a_config_error(workdir, monkeypatch):
    monkeypatch.setenv("NEMO_GYM_CONFIG_DICT", "[1, 2]")
    with pytest.raises(ConfigError, match="NEMO_GYM_CONFIG_DICT must hold a mapping"):
        global_config.maybe_get_global_config_dict()
    monkeypatch.delenv("NEMO_GYM_CONFIG_DICT")
    monkeypatch.setenv("NEMO_GYM_CONFIG_FILE", str(write(workdir / "resolved.yaml", "- a\n- b\n")))
    with pytest.raises(ConfigError, match="resolved.yaml must hold a mapping"):
        global_config.get_server_instance_configs()


def test_masking_hides_secret_keys_and_their_copies_but_not_token_counts(workdir):
    config = parse(["+policy_api_key=sk-123456", "+max_tokens=64", "+copied=${policy_api_key}", "+hf_token=hf_abcd"])
    text = global_config.masked_config_yaml(config)
    assert "sk-123456" not in text and "hf_abcd" not in text
    assert "max_tokens: 64" in text and "copied: '****'" in text


def test_the_embedded_model_is_the_policy_model_when_none_is_configured(workdir):
    write(workdir / "r.yaml", RESOURCES)
    write(workdir / "a.yaml", AGENT)
    config = parse([paths_token("r.yaml", "a.yaml")])
    assert list(config.policy_model.responses_api_models) == ["llamacpp_model"]


def test_a_policy_base_url_means_no_embedded_default(workdir):
    write(workdir / "r.yaml", RESOURCES)
    write(workdir / "a.yaml", AGENT)
    with pytest.raises(ServerRefNotFoundError, match="policy_model"):
        parse([paths_token("r.yaml", "a.yaml"), "+policy_base_url=http://127.0.0.1:9/v1"])
