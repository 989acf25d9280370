"""The process-wide global config: composed once from the command line, or handed down to a child server.

In the CLI process, :func:`get_global_config_dict` composes the config from ``sys.argv`` overrides (see
:mod:`nemo_gym.config.compose` for the rules). A server process started by the launcher instead reads the already
resolved config from the file named by ``NEMO_GYM_CONFIG_FILE`` and never re-resolves it, so every process sees the
same topology.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from nemo_gym.config.compose import (
    DEFAULT_HEAD_SERVER_PORT,
    DEFAULT_HOST,
    DUMMY_MODEL_CONFIG,
    ComposeOptions,
    compose,
)
from nemo_gym.config.secrets import mask_secrets
from nemo_gym.config.server_models import ServerInstanceConfig
from nemo_gym.config.servers import find_server_instances
from nemo_gym.errors import ConfigError

NEMO_GYM_CONFIG_FILE_ENV_VAR_NAME = "NEMO_GYM_CONFIG_FILE"
"""Path of the resolved config YAML written by the launcher for its children."""
NEMO_GYM_CONFIG_DICT_ENV_VAR_NAME = "NEMO_GYM_CONFIG_DICT"
"""Legacy: the resolved config YAML itself (kept for compatibility; the file is preferred, it has no size limit)."""
NEMO_GYM_CONFIG_PATH_ENV_VAR_NAME = "NEMO_GYM_CONFIG_PATH"
"""The instance name of the server running in this process."""

_GLOBAL_CONFIG_DICT: DictConfig | None = None

__all__ = [
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
    "find_server_instances",
    "get_global_config_dict",
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
            _GLOBAL_CONFIG_DICT = OmegaConf.load(Path(config_file))
        except OSError as e:
            raise ConfigError(f"cannot read the config file handed down by the launcher: {config_file} ({e})") from e
    elif os.environ.get(NEMO_GYM_CONFIG_DICT_ENV_VAR_NAME):
        _GLOBAL_CONFIG_DICT = OmegaConf.create(os.environ[NEMO_GYM_CONFIG_DICT_ENV_VAR_NAME])
    return _GLOBAL_CONFIG_DICT


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
    instances, _ = find_server_instances(OmegaConf.to_container(config, resolve=True))
    return instances


def get_server_instance_config(name: str, config: DictConfig | None = None) -> ServerInstanceConfig:
    for instance in get_server_instance_configs(config):
        if instance.name == name:
            return instance
    raise ConfigError(f"no server instance named {name!r} in the config")


def masked_config_yaml(config: DictConfig) -> str:
    """The config as YAML with every secret-like value replaced by ``****``."""
    return OmegaConf.to_yaml(OmegaConf.create(mask_secrets(OmegaConf.to_container(config, resolve=True))))
