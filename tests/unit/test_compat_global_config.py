"""NeMo Gym's ``global_config`` names: key constants that name the keys our code really uses, the server block
look-up, a free port for a process a server starts itself, the HF token, and the package's default directories."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from omegaconf import OmegaConf

import nemo_gym
from nemo_gym import global_config
from nemo_gym.config.server_models import SERVER_TYPES
from nemo_gym.config.servers import RESERVED_TOP_LEVEL_KEYS
from nemo_gym.errors import ConfigError
from nemo_gym.global_config import (
    find_open_port,
    get_first_server_config_dict,
    get_hf_token,
    reset_global_config_dict,
    set_global_config_dict,
)
from nemo_gym.rollouts import materialize

ROW_KEYS = {
    "TASK_INDEX_KEY_NAME",
    "ROLLOUT_INDEX_KEY_NAME",
    "ATTEMPT_INDEX_KEY_NAME",
    "ROLLOUT_ID_KEY_NAME",
    "RESPONSES_CREATE_PARAMS_KEY_NAME",
    "RESPONSE_KEY_NAME",
    "AGENT_REF_KEY_NAME",
    "SKILLS_REF_KEY_NAME",
    "TASK_SOURCE_KEY_NAME",  # NeMo Gym 0.7: routing fields of a row, and the collector's stamp
    "AGENT_SERVER_REF_KEY_NAME",
    "ENVIRONMENT_SERVER_STAMP_KEY_NAME",
}
SERVER_KINDS = {  # 0.7's names for the four server-kind keys of an instance block, not top-level settings
    "RESOURCES_SERVER_TYPE_KEY_NAME",
    "AGENT_SERVER_TYPE_KEY_NAME",
    "MODEL_SERVER_TYPE_KEY_NAME",
    "ENVIRONMENT_SERVER_TYPE_KEY_NAME",
}
DIRECTIVES_AND_POLICY = {"DELETE_KEY_KEY_NAME", "POLICY_BASE_URL_KEY_NAME", "POLICY_API_KEY_KEY_NAME"}
DIRECTIVES_AND_POLICY |= {"POLICY_MODEL_NAME_KEY_NAME", "POLICY_MODEL_KEY_NAME"}


@pytest.fixture
def config() -> Iterator[None]:
    set_global_config_dict(
        {
            "hf_token": "hf_abc",
            "port_range_low": 15000,
            "port_range_high": 15010,
            "model": {"responses_api_models": {"vllm_model": {"host": "h", "port": 1}}},
        }
    )
    yield
    reset_global_config_dict()


def test_every_setting_key_name_is_a_reserved_top_level_key_of_ours() -> None:
    names = [name for name in global_config.__all__ if name.endswith("_KEY_NAME")]
    settings = set(names) - ROW_KEYS - DIRECTIVES_AND_POLICY - SERVER_KINDS
    assert {getattr(global_config, name) for name in settings} <= RESERVED_TOP_LEVEL_KEYS
    assert {getattr(global_config, name) for name in SERVER_KINDS} == set(SERVER_TYPES)
    assert len(settings) >= 30


def test_row_keys_are_the_ones_the_collector_stamps() -> None:
    assert global_config.TASK_INDEX_KEY_NAME == materialize.TASK_INDEX_KEY == "_ng_task_index"
    assert global_config.ROLLOUT_INDEX_KEY_NAME == materialize.ROLLOUT_INDEX_KEY == "_ng_rollout_index"
    assert global_config.ATTEMPT_INDEX_KEY_NAME == "_ng_attempt_index"
    assert global_config.AGENT_REF_KEY_NAME == "agent_ref" and global_config.SKILLS_REF_KEY_NAME == "skills_ref"


def test_first_server_config_dict_is_the_implementation_block() -> None:
    cfg = OmegaConf.create({"m": {"responses_api_models": {"vllm_model": {"host": "h", "port": 9}}}, "x": 1})
    assert get_first_server_config_dict(cfg, "m") == {"host": "h", "port": 9}
    for name in ("x", "nope"):
        with pytest.raises(ConfigError, match=name):
            get_first_server_config_dict(cfg, name)


def test_find_open_port_stays_in_the_range_and_avoids_disallowed_and_busy_ports(config: None) -> None:
    with socket.socket() as busy:
        try:
            busy.bind(("", 15000))
        except OSError:
            pytest.skip("port 15000 is taken on this machine")
        busy.listen()
        ports = {find_open_port(disallowed_ports=[15001, 15002]) for _ in range(20)}
    assert ports <= set(range(15003, 15011))


def test_find_open_port_without_a_free_port_names_the_range(config: None) -> None:
    with pytest.raises(ConfigError, match="15000-15010"):
        find_open_port(disallowed_ports=list(range(15000, 15011)))


def test_hf_token(config: None) -> None:
    assert get_hf_token() == "hf_abc"


def test_default_directories_are_the_composed_defaults() -> None:
    from nemo_gym.config.compose import _fill_defaults

    config: dict = {}
    _fill_defaults(config)  # run from the directory the package was imported in
    assert config["cache_dir"] == str(nemo_gym.CACHE_DIR) and config["results_dir"] == str(nemo_gym.RESULTS_DIR)


def test_the_parser_face_leaves_a_null_placeholder_to_the_server(tmp_path: Path) -> None:
    """NeMo Gym 0.7's shipped configs hold required keys as `${oc.select:key,null}` until a run sets them: its
    parse reads them (finance_agent's tests do); `gym` commands still refuse them when composing a run."""
    from nemo_gym.config.compose import ComposeOptions, compose
    from nemo_gym.config.parser_face import GlobalConfigDictParser, GlobalConfigDictParserConfig
    from nemo_gym.config.validation import ConfigValueError

    server = tmp_path / "resources_servers" / "needs_mode"
    server.mkdir(parents=True)
    (server / "app.py").write_text(
        "from typing import Literal\n"
        "from nemo_gym.base_resources_server import BaseResourcesServerConfig, SimpleResourcesServer\n"
        "class NeedsModeConfig(BaseResourcesServerConfig):\n"
        "    mode: Literal['live', 'local']\n"
        "class NeedsMode(SimpleResourcesServer):\n"
        "    config: NeedsModeConfig\n"
        "if __name__ == '__main__':\n"
        "    NeedsMode.run_webserver()\n"
    )
    # An unpacked release keeps its own (older) `nemo_gym` beside its servers: the fields of our bases still count.
    (tmp_path / "nemo_gym").mkdir()
    (tmp_path / "nemo_gym" / "base_resources_server.py").write_text(
        "from pydantic import BaseModel\nclass BaseResourcesServerConfig(BaseModel):\n    name: str\n"
    )
    block = {"entrypoint": "app.py", "domain": "agent", "mode": None, "allowed_agents": ["simple_agent"]}
    initial = {"needs_mode_server": {"resources_servers": {"needs_mode": block}}}
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(tmp_path)
        parsed = GlobalConfigDictParser().parse(
            GlobalConfigDictParserConfig(
                initial_global_config_dict=OmegaConf.create(initial),
                skip_load_from_cli=True,
                skip_load_from_dotenv=True,
                offline=True,
            )
        )
        assert parsed.needs_mode_server.resources_servers.needs_mode.mode is None
        with pytest.raises(ConfigValueError, match="mode: expected one of 'live' or 'local', got None"):
            compose(ComposeOptions(initial=initial))
