"""The config pipeline: from command-line overrides to one resolved, validated config.

Sources, lowest precedence first:

1. an initial mapping from the caller (e.g. the dummy policy model of data-only commands);
2. the YAML files of ``config_paths``, in include order (see :mod:`nemo_gym.config.includes`);
3. ``env.yaml`` (secrets and local settings, found in the search roots);
4. the command-line overrides.

Then directives run (:mod:`nemo_gym.config.directives`), unset ``???`` values are reported all at once, ``${...}``
interpolations are resolved, defaults are filled in, and server instances and their references are validated: every
key and value type of every server block against its implementation's config class (:mod:`nemo_gym.config.validation`),
so a typo or a wrong type stops the command before anything starts.
"""

from __future__ import annotations

import copy
import os
import platform
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from nemo_gym.config.directives import apply_directives
from nemo_gym.config.includes import expand_config_paths, normalize_config_paths
from nemo_gym.config.overrides import apply_overrides, overrides_as_dict, parse_overrides
from nemo_gym.config.ports import DEFAULT_PORT_RANGE, reserve_port
from nemo_gym.config.roots import find_path
from nemo_gym.config.secrets import env_yaml_secrets
from nemo_gym.config.server_models import ServerInstanceConfig
from nemo_gym.config.servers import (
    check_pairings,
    check_server_refs,
    find_server_instances,
    raise_for_almost_servers,
)
from nemo_gym.config.tree import MISSING, deep_merge, iter_leaves, plain_dict
from nemo_gym.config.unset_values import (
    UNSET_PLACEHOLDER,
    first_line,
    raise_for_missing_values,
    resolve_interpolations,
    set_hint,
    swap_unset,
)
from nemo_gym.config.validation import SourceLocator, check_server_blocks, check_settings
from nemo_gym.config.yaml_files import load_yaml_file
from nemo_gym.errors import ConfigError, ConfigInterpolationError, NoServerInstancesError

DEFAULT_HOST = "127.0.0.1"
DEFAULT_HEAD_SERVER_PORT = 11000
ENV_YAML_FILENAME = "env.yaml"
ENV_YAML_ENV_VAR = "NEMO_GYM_ENV_YAML"
"""Path of the env.yaml to use instead of searching the roots; empty string = use none."""

DUMMY_MODEL_CONFIG: dict[str, Any] = {
    "policy_base_url": "",
    "policy_api_key": "",
    "policy_model_name": "",
    "policy_model": {"responses_api_models": {"dummy_model": {"entrypoint": "app.py"}}},
}
"""For data-only commands: the policy keys, so ``${policy_*}`` interpolations resolve without a model, and a stand-in
``policy_model`` used only where neither the config nor the embedded default (:func:`_default_policy_model`, the one
place that picks the default policy) gives one, so such commands see the same servers ``gym eval run`` starts."""


@dataclass
class ComposeOptions:
    overrides: list[str] = field(default_factory=list)
    initial: dict[str, Any] | None = None
    dummy_model: bool = False
    reserve_ports: bool = False
    require_server_instances: bool = False
    allow_unset: bool = False
    """For showing a config (``gym env resolve``): unset ``???`` values and interpolations that cannot be resolved
    are ``???`` in the result and listed in ``ComposedConfig.unset`` instead of being errors."""
    nulls_unset: bool = False
    """A server key left ``null`` is not type-checked (0.7's ``GlobalConfigDictParser.parse`` reads shipped configs
    whose required keys are ``null`` until a run sets them; the server refuses one still null when it starts)."""


@dataclass
class ComposedConfig:
    """The result of composition, passed whole to the commands, the launcher and the collector: the config and the
    server instances found in it once, so no caller converts the config and searches it again."""

    config: DictConfig
    instances: list[ServerInstanceConfig]
    env_yaml_path: Path | None = None
    unset: list[str] = field(default_factory=list)
    """With ``allow_unset``: one line per value left ``???``, saying what to set."""
    secrets: frozenset[str] = frozenset()
    """The values env.yaml set, masked wherever the config is shown (rule 4 of :mod:`nemo_gym.config.secrets`)."""
    sources: SourceLocator | None = None
    """Where each key was set (file and line, or the command line), for checks made after composition to name it;
    None for a config from elsewhere (``of``)."""

    @classmethod
    def of(cls, config: DictConfig | ComposedConfig) -> ComposedConfig:
        """``config`` as composed here, or a resolved config from elsewhere (the launcher's file, a head server) with
        its instances found."""
        if isinstance(config, ComposedConfig):
            return config
        instances, _ = find_server_instances(plain_dict(config))
        return cls(config, instances)

    def instances_of(self, server_type: str) -> list[ServerInstanceConfig]:
        return [instance for instance in self.instances if instance.SERVER_TYPE == server_type]


def compose(options: ComposeOptions) -> ComposedConfig:
    overrides = parse_overrides(options.overrides)
    env_yaml_path = find_env_yaml()
    env_yaml = load_yaml_file(env_yaml_path) if env_yaml_path else {}

    paths = _config_paths(env_yaml, overrides_as_dict(overrides))
    included = expand_config_paths(paths)

    initial = dict(options.initial or {})
    if options.dummy_model:
        initial = deep_merge({k: v for k, v in DUMMY_MODEL_CONFIG.items() if k != "policy_model"}, initial)
    merged = initial
    for loaded in included.files:
        merged = deep_merge(merged, loaded.data)
    merged = deep_merge(merged, {k: v for k, v in env_yaml.items() if k != "config_paths"})
    apply_overrides(merged, overrides)
    merged["config_paths"] = [str(f.path) for f in included.files]

    merged = apply_directives(merged)
    merged = _default_policy_model(merged)
    if options.dummy_model and "policy_model" not in merged:  # only where `gym eval run` would have no model either
        merged["policy_model"] = copy.deepcopy(DUMMY_MODEL_CONFIG["policy_model"])
    locator = SourceLocator([f.path for f in included.files], env_yaml_path, overrides)
    unset: list[str] = []
    if options.allow_unset:
        unset = [
            set_hint(path, f"{path!r} is not set (???)") for path, value in iter_leaves(merged) if value == MISSING
        ]
        merged = swap_unset(merged, MISSING, UNSET_PLACEHOLDER)
    else:
        raise_for_missing_values(merged, locator)
    resolved = resolve_interpolations(merged, locator, unset if options.allow_unset else None)

    _fill_defaults(resolved)
    check_settings(resolved, locator)
    instances, almost = find_server_instances(resolved)
    strict = bool(resolved.get("error_on_almost_servers", True))
    check_server_blocks(
        resolved,
        locator,
        skip=() if strict else [a.name for a in almost],
        near_misses=strict,
        unset_marker=UNSET_PLACEHOLDER if options.allow_unset else None,
        nulls_unset=options.nulls_unset,
    )
    if almost and strict:
        raise_for_almost_servers(almost)
    check_server_refs(instances)
    check_pairings(instances, allow_unsupported=bool(resolved.get("allow_unsupported_pairing")))
    if options.require_server_instances and not instances:
        raise NoServerInstancesError(
            "the config defines no server instances to start. Pass a config with --config PATH, "
            "--environment NAME or --resources-server NAME (see `gym list environments`)"
        )
    _fill_server_addresses(resolved, instances, options.reserve_ports, locator)
    _propagate_agent_settings(resolved, instances)
    final = swap_unset(resolved, UNSET_PLACEHOLDER, MISSING) if options.allow_unset else resolved
    instances, _ = find_server_instances(resolved)  # again: now with their addresses and agent settings
    secrets = env_yaml_secrets(env_yaml, final)
    return ComposedConfig(OmegaConf.create(final), instances, env_yaml_path, unset, secrets, locator)


def find_env_yaml() -> Path | None:
    explicit = os.environ.get(ENV_YAML_ENV_VAR)
    if explicit is not None:
        return Path(explicit) if explicit else None
    found = find_path(ENV_YAML_FILENAME)
    return found if found and found.is_file() else None


def _config_paths(env_yaml: dict[str, Any], cli: dict[str, Any]) -> list[str]:
    """``config_paths`` as env.yaml + command line give it, with interpolations among those two resolved."""
    small = deep_merge(env_yaml, cli)
    if "config_paths" not in small:
        return []
    try:
        value = OmegaConf.to_container(OmegaConf.create(small).get("config_paths"), resolve=True)
    except OmegaConfBaseException as e:
        raise ConfigInterpolationError(f"config_paths cannot be resolved: {first_line(e)}") from e
    except ValueError:
        value = small["config_paths"]
    return normalize_config_paths(value, "config_paths")


EMBEDDED_POLICY_MODEL_CONFIG = "responses_api_models/llamacpp_model/configs/llamacpp_model.yaml"
"""Where ``policy_model`` comes from when servers refer to it but no config defines it and no ``policy_base_url``
is set: the embedded SmolLM2 model, so a rollout works with no API key."""


def _default_policy_model(config: dict[str, Any]) -> dict[str, Any]:
    if "policy_model" in config or config.get("policy_base_url") or not _refers_to_policy_model(config):
        return config
    path = find_path(EMBEDDED_POLICY_MODEL_CONFIG)
    if path is None:
        return config
    return deep_merge(load_yaml_file(path), config)


def _refers_to_policy_model(node: Any) -> bool:
    if isinstance(node, dict):
        if node.get("type") == "responses_api_models" and node.get("name") == "policy_model":
            return True
        return any(_refers_to_policy_model(value) for value in node.values())
    if isinstance(node, list):
        return any(_refers_to_policy_model(value) for value in node)
    return False


def _fill_defaults(config: dict[str, Any]) -> None:
    if config.get("use_absolute_ip"):
        config.setdefault("default_host", socket.gethostbyname(socket.gethostname()))
    host = config.setdefault("default_host", DEFAULT_HOST)
    head = config.get("head_server") or {}
    if not isinstance(head, dict):
        raise ConfigError(f"head_server must be a mapping with host and port, got {head!r}")
    head.setdefault("host", host)
    head.setdefault("port", DEFAULT_HEAD_SERVER_PORT)
    config["head_server"] = head
    config.setdefault("python_version", platform.python_version())
    config.setdefault("dry_run", False)
    config.setdefault("skip_venv_if_present", False)
    config.setdefault("error_on_almost_servers", True)
    for key, default in (("results_dir", "results"), ("cache_dir", "cache")):
        value = config.setdefault(key, default)
        if not isinstance(value, str) or not value.strip():
            raise ConfigError(f"{key} must be a non-empty path, got {value!r}")
        config[key] = str(Path(value).expanduser().resolve())


def _fill_server_addresses(
    config: dict[str, Any], instances: list[ServerInstanceConfig], reserve_ports: bool, locator: SourceLocator
) -> None:
    """Give every instance a host, and with ``reserve_ports`` a port held open for it (see ``config/ports.py``); a
    configured port that cannot be bound is named with the file and line that set it."""
    explicit_ports = {config["head_server"]["port"]}
    for instance in instances:
        inner = config[instance.name][instance.SERVER_TYPE][instance.implementation]
        if inner.get("port"):
            explicit_ports.add(int(inner["port"]))
    port_range = None
    if "port_range_low" in config or "port_range_high" in config:
        low, high = DEFAULT_PORT_RANGE
        port_range = (int(config.get("port_range_low", low)), int(config.get("port_range_high", high)))
    for instance in instances:
        inner = config[instance.name][instance.SERVER_TYPE][instance.implementation]
        inner["host"] = inner.get("host") or config["default_host"]
        if reserve_ports:
            try:
                reservation = reserve_port(
                    instance.name, inner["host"], inner.get("port"), port_range, disallowed=explicit_ports
                )
            except ConfigError as e:
                if not inner.get("port"):
                    raise
                block = [instance.name, instance.SERVER_TYPE, instance.implementation, "port"]
                raise ConfigError(locator.describe(block, str(e))) from e
            inner["port"] = reservation.port
        else:
            inner.setdefault("port", None)
    config["disallowed_ports"] = sorted(explicit_ports)


def _propagate_agent_settings(config: dict[str, Any], instances: list[ServerInstanceConfig]) -> None:
    """Top-level ``skip_verification*`` reach every agent that does not set its own."""
    for instance in instances:
        if instance.SERVER_TYPE != "responses_api_agents":
            continue
        inner = config[instance.name][instance.SERVER_TYPE][instance.implementation]
        for key in ("skip_verification", "skip_verification_reward"):
            if key in config and key not in inner:
                inner[key] = config[key]
