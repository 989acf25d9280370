"""The process-wide global config: composed once from the command line, or handed down to a child server.

In the CLI process, :func:`get_global_config_dict` composes the config from ``sys.argv`` overrides (see
:mod:`nemo_gym.config.compose` for the rules). A server process started by the launcher instead reads the already
resolved config from the file named by ``NEMO_GYM_CONFIG_FILE`` and never re-resolves it, so every process sees the
same topology.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, cast

from omegaconf import DictConfig, ListConfig, OmegaConf

from nemo_gym.config.compose import (
    DEFAULT_HEAD_SERVER_PORT,
    DEFAULT_HOST,
    DUMMY_MODEL_CONFIG,
    ComposeOptions,
    compose,
)
from nemo_gym.config.datasets import AGENT_REF_KEY as AGENT_REF_KEY_NAME
from nemo_gym.config.parser_face import GlobalConfigDictParser, GlobalConfigDictParserConfig
from nemo_gym.config.ports import DEFAULT_PORT_RANGE as _DEFAULT_PORT_RANGE
from nemo_gym.config.ports import probe_free_port as _probe_free_port
from nemo_gym.config.secrets import mask_secrets
from nemo_gym.config.server_models import (
    ServerInstanceConfig,
    environment_server_agent_names,
    environment_servers_by_agent,
)
from nemo_gym.config.servers import find_server_instances
from nemo_gym.config.tree import plain_dict as _plain_dict
from nemo_gym.errors import ConfigError
from nemo_gym.metrics import ROLLOUT_INDEX_KEY_NAME, TASK_INDEX_KEY_NAME
from nemo_gym.row_fields import ATTEMPT_INDEX_KEY as ATTEMPT_INDEX_KEY_NAME
from nemo_gym.row_fields import ROLLOUT_ID_KEY as ROLLOUT_ID_KEY_NAME

NEMO_GYM_CONFIG_FILE_ENV_VAR_NAME = "NEMO_GYM_CONFIG_FILE"
"""Path of the resolved config YAML written by the launcher for its children."""
NEMO_GYM_CONFIG_DICT_ENV_VAR_NAME = "NEMO_GYM_CONFIG_DICT"
"""Legacy: the resolved config YAML itself (kept for compatibility; the file is preferred, it has no size limit)."""
NEMO_GYM_CONFIG_PATH_ENV_VAR_NAME = "NEMO_GYM_CONFIG_PATH"
"""The instance name of the server running in this process."""

# NeMo Gym's names for the framework's top-level config keys (the settings that are never server instances).
CONFIG_PATHS_KEY_NAME = "config_paths"
ENTRYPOINT_KEY_NAME = "entrypoint"
DEFAULT_HOST_KEY_NAME = "default_host"
HEAD_SERVER_KEY_NAME = "head_server"
DISALLOWED_PORTS_KEY_NAME = "disallowed_ports"
"""Ports the composed config's servers use (the head server's included): a process picking a port of its own
(:func:`find_open_port`) must avoid them."""
HEAD_SERVER_DEPS_KEY_NAME = "head_server_deps"
PYTHON_VERSION_KEY_NAME = "python_version"
PIP_INSTALL_VERBOSE_KEY_NAME = "pip_install_verbose"
UV_PIP_SET_PYTHON_KEY_NAME = "uv_pip_set_python"
SKIP_VENV_IF_PRESENT_KEY_NAME = "skip_venv_if_present"
HF_TOKEN_KEY_NAME = "hf_token"
RAY_HEAD_NODE_ADDRESS_KEY_NAME = "ray_head_node_address"
PORT_RANGE_LOW_KEY_NAME = "port_range_low"
PORT_RANGE_HIGH_KEY_NAME = "port_range_high"
DRY_RUN_KEY_NAME = "dry_run"
MODEL_ENDPOINT_READINESS_TIMEOUT_KEY_NAME = "model_endpoint_readiness_timeout_seconds"
ALLOW_OPENAI_VERSION_SKEW_KEY_NAME = "allow_openai_version_skew"
UV_CACHE_DIR_KEY_NAME = "uv_cache_dir"
UV_VENV_DIR_KEY_NAME = "uv_venv_dir"
RESULTS_DIR_KEY_NAME = "results_dir"
"""Run outputs (logs, run configs); an absolute path once composed, ``nemo_gym.RESULTS_DIR`` by default."""
CACHE_DIR_KEY_NAME = "cache_dir"
"""Cached venvs and downloads; an absolute path once composed, ``nemo_gym.CACHE_DIR`` by default."""
INHERIT_FROM_KEY_NAME = "_inherit_from"
COPY_KEY_NAME = "_copy"
DELETE_KEY_KEY_NAME = "_delete_key"
NEMO_GYM_LOG_DIR_KEY_NAME = "nemo_gym_log_dir"
VERBOSE_KEY_NAME = "verbose"
JSON_OUTPUT_KEY_NAME = "json"
QUERY_KEY_NAME = "query"
OBSERVABILITY_ENABLED_KEY_NAME = "observability_enabled"
MODEL_CALL_CAPTURE_DIR_KEY_NAME = "model_call_capture_dir"
TOKEN_ID_CAPTURE_BLOCK = "token_id_capture"
"""The run-wide block of training-token capture settings (NeMo Gym 0.6)."""
COMPONENT_NAME_KEY_NAME = "component_name"
SKIP_VERIFICATION_KEY_NAME = "skip_verification"
SKIP_VERIFICATION_REWARD_KEY_NAME = "skip_verification_reward"
POLICY_BASE_URL_KEY_NAME = "policy_base_url"
POLICY_API_KEY_KEY_NAME = "policy_api_key"
POLICY_MODEL_NAME_KEY_NAME = "policy_model_name"
POLICY_MODEL_KEY_NAME = "policy_model"

# The four server kinds (a server instance's middle key) and the environment server settings of NeMo Gym 0.7.
MODEL_SERVER_TYPE_KEY_NAME = "responses_api_models"
RESOURCES_SERVER_TYPE_KEY_NAME = "resources_servers"
AGENT_SERVER_TYPE_KEY_NAME = "responses_api_agents"
ENVIRONMENT_SERVER_TYPE_KEY_NAME = "environment_servers"
AGENT_SERVER_REF_KEY_NAME = "agent_server"
"""The field of an environment server's block that names the agent it fronts."""
ENVIRONMENT_SERVER_NAME_KEY_NAME = "environment_server_name"
"""Collection: the environment server instance every row goes to."""
ENVIRONMENT_SERVER_ROUTES_KEY_NAME = "environment_server_routes"
"""Collection: task set -> environment server instance, for materialized tasks."""
ENVIRONMENT_ROUTING_MODE_KEY_NAME = "environment_routing_mode"
"""Collection: how rows find their environment server (``agent``, ``legacy`` or ``taskset``)."""
ERROR_ON_AGENT_WITHOUT_ENVIRONMENT_SERVER_KEY_NAME = "error_on_agent_without_environment_server"
"""When true, an agent no environment server fronts is a config error instead of getting a ``legacy_agent`` relay."""

# Keys of a dataset row (the ``_ng_*`` ones are stamped by the collector; see ``nemo_gym.row_fields``).
RESPONSES_CREATE_PARAMS_KEY_NAME = "responses_create_params"
RESPONSE_KEY_NAME = "response"
SKILLS_REF_KEY_NAME = "skills_ref"
ENVIRONMENT_SERVER_STAMP_KEY_NAME = "_ng_environment_server"
"""Stamped on every collected row: the environment server instance that ran the rollout."""
TASK_SOURCE_KEY_NAME = "task_source"
"""The config instance that declares a row's dataset (stamped at collate / load time, resolved to an agent later)."""

_GLOBAL_CONFIG_DICT: DictConfig | None = None

__all__ = [
    "GlobalConfigDictParser",
    "GlobalConfigDictParserConfig",
    "AGENT_REF_KEY_NAME",
    "AGENT_SERVER_REF_KEY_NAME",
    "AGENT_SERVER_TYPE_KEY_NAME",
    "ALLOW_OPENAI_VERSION_SKEW_KEY_NAME",
    "ATTEMPT_INDEX_KEY_NAME",
    "CACHE_DIR_KEY_NAME",
    "COMPONENT_NAME_KEY_NAME",
    "CONFIG_PATHS_KEY_NAME",
    "COPY_KEY_NAME",
    "DEFAULT_HOST_KEY_NAME",
    "DELETE_KEY_KEY_NAME",
    "DISALLOWED_PORTS_KEY_NAME",
    "DRY_RUN_KEY_NAME",
    "ENTRYPOINT_KEY_NAME",
    "ENVIRONMENT_ROUTING_MODE_KEY_NAME",
    "ENVIRONMENT_SERVER_NAME_KEY_NAME",
    "ENVIRONMENT_SERVER_ROUTES_KEY_NAME",
    "ENVIRONMENT_SERVER_STAMP_KEY_NAME",
    "ENVIRONMENT_SERVER_TYPE_KEY_NAME",
    "ERROR_ON_AGENT_WITHOUT_ENVIRONMENT_SERVER_KEY_NAME",
    "HEAD_SERVER_DEPS_KEY_NAME",
    "HEAD_SERVER_KEY_NAME",
    "HF_TOKEN_KEY_NAME",
    "INHERIT_FROM_KEY_NAME",
    "JSON_OUTPUT_KEY_NAME",
    "MODEL_CALL_CAPTURE_DIR_KEY_NAME",
    "MODEL_ENDPOINT_READINESS_TIMEOUT_KEY_NAME",
    "MODEL_SERVER_TYPE_KEY_NAME",
    "NEMO_GYM_LOG_DIR_KEY_NAME",
    "OBSERVABILITY_ENABLED_KEY_NAME",
    "PIP_INSTALL_VERBOSE_KEY_NAME",
    "POLICY_API_KEY_KEY_NAME",
    "POLICY_BASE_URL_KEY_NAME",
    "POLICY_MODEL_KEY_NAME",
    "POLICY_MODEL_NAME_KEY_NAME",
    "PORT_RANGE_HIGH_KEY_NAME",
    "PORT_RANGE_LOW_KEY_NAME",
    "PYTHON_VERSION_KEY_NAME",
    "QUERY_KEY_NAME",
    "RAY_HEAD_NODE_ADDRESS_KEY_NAME",
    "RESOURCES_SERVER_TYPE_KEY_NAME",
    "RESPONSES_CREATE_PARAMS_KEY_NAME",
    "RESPONSE_KEY_NAME",
    "RESULTS_DIR_KEY_NAME",
    "ROLLOUT_ID_KEY_NAME",
    "ROLLOUT_INDEX_KEY_NAME",
    "SKILLS_REF_KEY_NAME",
    "SKIP_VENV_IF_PRESENT_KEY_NAME",
    "SKIP_VERIFICATION_KEY_NAME",
    "SKIP_VERIFICATION_REWARD_KEY_NAME",
    "TASK_INDEX_KEY_NAME",
    "TASK_SOURCE_KEY_NAME",
    "TOKEN_ID_CAPTURE_BLOCK",
    "UV_CACHE_DIR_KEY_NAME",
    "UV_PIP_SET_PYTHON_KEY_NAME",
    "UV_VENV_DIR_KEY_NAME",
    "VERBOSE_KEY_NAME",
    "DEFAULT_HEAD_SERVER_PORT",
    "DEFAULT_HOST",
    "DUMMY_MODEL_CONFIG",
    "NEMO_GYM_CONFIG_DICT_ENV_VAR_NAME",
    "NEMO_GYM_CONFIG_FILE_ENV_VAR_NAME",
    "NEMO_GYM_CONFIG_PATH_ENV_VAR_NAME",
    "ComposeOptions",
    "ConfigError",
    "ServerInstanceConfig",
    "compose",
    "environment_server_agent_names",
    "environment_servers_by_agent",
    "find_open_port",
    "find_server_instances",
    "get_first_server_config_dict",
    "get_global_config_dict",
    "get_hf_token",
    "get_server_instance_config",
    "get_server_instance_configs",
    "mask_secrets",
    "masked_config_yaml",
    "maybe_get_global_config_dict",
    "parse_global_config_dict",
    "reset_global_config_dict",
    "set_global_config_dict",
]


def parse_global_config_dict(
    overrides: Sequence[str] | None = None,
    *,
    initial_global_config_dict: dict[str, Any] | None = None,
    dummy_model: bool = False,
    reserve_ports: bool = False,
    require_server_instances: bool = False,
) -> DictConfig:
    """Compose a config from overrides (default: ``sys.argv[1:]``) without touching the process-wide cache."""
    options = ComposeOptions(
        overrides=list(sys.argv[1:] if overrides is None else overrides),
        initial=initial_global_config_dict,
        dummy_model=dummy_model,
        reserve_ports=reserve_ports,
        require_server_instances=require_server_instances,
    )
    return compose(options).config


def get_global_config_dict(
    overrides: Sequence[str] | None = None,
    *,
    initial_global_config_dict: dict[str, Any] | None = None,
    dummy_model: bool = False,
    reserve_ports: bool = False,
    require_server_instances: bool = False,
) -> DictConfig:
    """The process-wide config; composed (or read from the launcher's file) on first use, cached after."""
    global _GLOBAL_CONFIG_DICT
    if _GLOBAL_CONFIG_DICT is None:
        _GLOBAL_CONFIG_DICT = maybe_get_global_config_dict()
    if _GLOBAL_CONFIG_DICT is None:
        _GLOBAL_CONFIG_DICT = parse_global_config_dict(
            overrides,
            initial_global_config_dict=initial_global_config_dict,
            dummy_model=dummy_model,
            reserve_ports=reserve_ports,
            require_server_instances=require_server_instances,
        )
    return _GLOBAL_CONFIG_DICT


def maybe_get_global_config_dict() -> DictConfig | None:
    """The cached config, or the one handed down by the launcher; never parses the command line."""
    global _GLOBAL_CONFIG_DICT
    if _GLOBAL_CONFIG_DICT is not None:
        return _GLOBAL_CONFIG_DICT
    config_file = os.environ.get(NEMO_GYM_CONFIG_FILE_ENV_VAR_NAME)
    if config_file:
        try:
            loaded = OmegaConf.load(Path(config_file))
        except OSError as e:
            raise ConfigError(f"cannot read the config file handed down by the launcher: {config_file} ({e})") from e
        _GLOBAL_CONFIG_DICT = _config_mapping(loaded, f"the config file {config_file}")
    elif os.environ.get(NEMO_GYM_CONFIG_DICT_ENV_VAR_NAME):
        loaded = OmegaConf.create(os.environ[NEMO_GYM_CONFIG_DICT_ENV_VAR_NAME])
        _GLOBAL_CONFIG_DICT = _config_mapping(loaded, NEMO_GYM_CONFIG_DICT_ENV_VAR_NAME)
    return _GLOBAL_CONFIG_DICT


def _config_mapping(loaded: DictConfig | ListConfig, source: str) -> DictConfig:
    """A config must be a mapping: a list is a one-line error here, not an AttributeError in a later lookup."""
    if not isinstance(loaded, DictConfig):
        raise ConfigError(f"{source} must hold a mapping of config keys, got a list")
    return loaded


def set_global_config_dict(config: DictConfig | dict[str, Any]) -> None:
    global _GLOBAL_CONFIG_DICT
    _GLOBAL_CONFIG_DICT = config if isinstance(config, DictConfig) else OmegaConf.create(config)


def reset_global_config_dict() -> None:
    """Forget the cached config (tests, or a long-lived process that composes twice)."""
    global _GLOBAL_CONFIG_DICT
    _GLOBAL_CONFIG_DICT = None


def get_server_instance_configs(config: DictConfig | None = None) -> list[ServerInstanceConfig]:
    """Every server instance defined in a resolved config (default: the global one)."""
    config = get_global_config_dict() if config is None else config
    instances, _ = find_server_instances(_plain_dict(config))
    return instances


def get_server_instance_config(name: str, config: DictConfig | None = None) -> ServerInstanceConfig:
    for instance in get_server_instance_configs(config):
        if instance.name == name:
            return instance
    raise ConfigError(f"no server instance named {name!r} in the config")


def masked_config_yaml(config: DictConfig, secrets: Iterable[str] = ()) -> str:
    """The config as YAML with every secret replaced by ``****`` (the rule: :mod:`nemo_gym.config.secrets`);
    ``secrets``: more values to mask, such as a composed config's env.yaml values (``ComposedConfig.secrets``)."""
    return OmegaConf.to_yaml(OmegaConf.create(mask_secrets(OmegaConf.to_container(config, resolve=True), secrets)))


def get_first_server_config_dict(global_config_dict: DictConfig, top_level_path: str) -> DictConfig:
    """The settings block of instance ``top_level_path``: ``config[name][<server type>][<implementation>]``.

    A plain nested dict works too (agents' tests hand one over), and its block comes back as a dict."""
    block = global_config_dict.get(top_level_path)
    inner = next(iter(block.values()), None) if isinstance(block, Mapping) else None
    settings = next(iter(inner.values()), None) if isinstance(inner, Mapping) else None
    if not isinstance(settings, Mapping):
        raise ConfigError(
            f"no server instance named {top_level_path!r} in the config (expected "
            f"{top_level_path}.<server type>.<implementation>.<settings>)"
        )
    return cast(DictConfig, settings)  # a DictConfig's block is one; a plain dict's is a dict


def find_open_port(disallowed_ports: list[int] | None = None, max_retries: int = 50) -> int:
    """A free port in the config's ``port_range_low``..``port_range_high``, for a process a server starts itself
    (e.g. a model engine). Pass the config's ``disallowed_ports`` so it never takes a port a server was given."""
    config = get_global_config_dict()
    low, high = _DEFAULT_PORT_RANGE
    port_range = (int(config.get(PORT_RANGE_LOW_KEY_NAME, low)), int(config.get(PORT_RANGE_HIGH_KEY_NAME, high)))
    return _probe_free_port(port_range, set(disallowed_ports or ()), max_retries)


def get_hf_token() -> str | None:
    """The config's ``hf_token`` (Hugging Face access token), or None."""
    return get_global_config_dict().get(HF_TOKEN_KEY_NAME)
