"""NeMo Gym 0.7's ``GlobalConfigDictParser``: its config-parsing entry points, over our composition pipeline.

Code written for 0.7 builds a config this way in tests and fixtures: an initial mapping (often
``GlobalConfigDictParserConfig.NO_MODEL_GLOBAL_CONFIG_DICT`` plus ``config_paths``), no command line, no env.yaml. Each
method here is one step of :func:`nemo_gym.config.compose.compose` or the whole of it; nothing is composed a second
way. ``nemo_gym.global_config`` offers both names.

Differences from 0.7 a caller may meet: files named by the initial mapping's ``config_paths`` are merged under the
initial mapping (as in 0.7) but under files named on the command line too. Like 0.7, every server instance comes
back with a port, so that its config model (``port: int``) validates: a port free right now (probed, not held), or
``-1`` with ``offline`` (a placeholder, not a runnable address); nothing else reaches the network.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar

from omegaconf import DictConfig, OmegaConf, open_dict
from pydantic import BaseModel, ConfigDict

from nemo_gym.config.compose import DUMMY_MODEL_CONFIG, ENV_YAML_ENV_VAR, ComposeOptions, compose
from nemo_gym.config.directives import apply_directives
from nemo_gym.config.includes import expand_config_paths, normalize_config_paths
from nemo_gym.config.ports import probe_free_port
from nemo_gym.config.secrets import mask_secrets
from nemo_gym.config.server_models import ServerInstanceConfig
from nemo_gym.config.servers import find_server_instances
from nemo_gym.config.tree import deep_merge, plain_dict

__all__ = ["GlobalConfigDictParser", "GlobalConfigDictParserConfig"]


def _unresolved(config: DictConfig | dict[str, Any] | None) -> dict[str, Any]:
    """A plain copy with ``${...}`` left as written: directives (``${inherit_from:...}``) are not resolvers."""
    if config is None:
        return {}
    if isinstance(config, DictConfig):
        return dict(OmegaConf.to_container(config, resolve=False))  # type: ignore[arg-type]  # a DictConfig: a dict
    return dict(config)


@contextmanager
def _env_yaml(path: Path | None, skip: bool) -> Iterator[None]:
    """Point composition at ``path`` as its env.yaml, or at none with ``skip``, for the duration of the block."""
    if path is None and not skip:
        yield
        return
    previous = os.environ.get(ENV_YAML_ENV_VAR)
    os.environ[ENV_YAML_ENV_VAR] = "" if skip else str(path)
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(ENV_YAML_ENV_VAR, None)
        else:
            os.environ[ENV_YAML_ENV_VAR] = previous


class GlobalConfigDictParserConfig(BaseModel):
    """How :meth:`GlobalConfigDictParser.parse` composes: from what, and which sources it skips."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    dotenv_path: Path | None = None
    initial_global_config_dict: DictConfig | None = None
    skip_load_from_cli: bool = False
    skip_load_from_dotenv: bool = False
    hide_secrets: bool = False
    offline: bool = False

    NO_MODEL_GLOBAL_CONFIG_DICT: ClassVar[DictConfig] = OmegaConf.create(DUMMY_MODEL_CONFIG)
    """The policy keys and a stand-in policy model, for configs read without a model (data preparation, tests)."""


def _fill_ports(config: DictConfig, *, offline: bool) -> None:
    """A port for every server instance that has none: ``-1`` offline, else one free now (0.7's parse does both)."""
    instances, _ = find_server_instances(plain_dict(config))
    taken = {int(p) for p in config.get("disallowed_ports") or []}
    with open_dict(config):
        for instance in instances:
            inner = config[instance.name][instance.SERVER_TYPE][instance.implementation]
            if not inner.get("port"):
                inner["port"] = -1 if offline else probe_free_port(disallowed=taken)
                taken.add(int(inner["port"]))


class GlobalConfigDictParser(BaseModel):
    """Stateless; each call composes from scratch."""

    def parse(self, parse_config: GlobalConfigDictParserConfig | None = None) -> DictConfig:
        """The composed, validated config: the initial mapping, the files of every ``config_paths``, env.yaml (unless
        skipped) and the command line (``sys.argv[1:]``, unless skipped), with directives applied."""
        settings = parse_config or GlobalConfigDictParserConfig()
        initial = _unresolved(settings.initial_global_config_dict)
        dummy = initial.get("policy_model") == DUMMY_MODEL_CONFIG["policy_model"]
        if dummy:  # compose puts the stand-in model only where the config gives none, as 0.7 drops it
            initial.pop("policy_model")
        own_paths = normalize_config_paths(initial.pop("config_paths", None), "config_paths")
        files = expand_config_paths(own_paths).files if own_paths else []
        base: dict[str, Any] = {}
        for loaded in files:
            base = deep_merge(base, loaded.data)
        options = ComposeOptions(
            overrides=[] if settings.skip_load_from_cli else list(sys.argv[1:]),
            initial=deep_merge(base, initial),
            dummy_model=dummy,
            nulls_unset=True,
        )
        with _env_yaml(settings.dotenv_path, settings.skip_load_from_dotenv):
            config = compose(options).config
        _fill_ports(config, offline=settings.offline)
        if files:
            with open_dict(config):
                config["config_paths"] = [str(f.path) for f in files] + list(config.get("config_paths") or [])
        if settings.hide_secrets:
            config = OmegaConf.create(mask_secrets(plain_dict(config)))
        return config

    def parse_no_environment(self, initial_global_config_dict: DictConfig | None = None) -> DictConfig:
        """:meth:`parse` of ``initial_global_config_dict`` alone: no command line, no env.yaml."""
        return self.parse(
            GlobalConfigDictParserConfig(
                initial_global_config_dict=initial_global_config_dict,
                skip_load_from_cli=True,
                skip_load_from_dotenv=True,
            )
        )

    def load_extra_config_paths(self, config_paths: list[str]) -> tuple[list[str], list[DictConfig]]:
        """Every file ``config_paths`` pulls in and their contents, in merge order: a file after everything it
        includes, a later sibling (and its includes) after an earlier one. ``OmegaConf.merge(*configs)`` merges them
        as composition does (``config_paths`` keys removed)."""
        files = expand_config_paths(normalize_config_paths(config_paths, "config_paths")).files
        return [str(f.path) for f in files], [OmegaConf.create(f.data) for f in files]

    def _recursively_swap_keys(self, dict_config: DictConfig) -> None:
        """Apply the directives (``_inherit_from``, ``_copy``, ``_delete_key``) of ``dict_config`` in place."""
        applied = apply_directives(_unresolved(dict_config))
        with open_dict(dict_config):
            for key in [key for key in dict_config if key not in applied]:
                del dict_config[key]
            for key, value in applied.items():
                dict_config[key] = value

    def filter_for_server_instance_configs(self, global_config_dict: DictConfig) -> list[ServerInstanceConfig]:
        """The server instances of a composed config."""
        return find_server_instances(plain_dict(global_config_dict))[0]
