"""Finding the components a checkout (or extra roots) ship: server implementations, their configs, environments.

Used by ``gym list`` / ``gym search`` and by the CLI's asset selectors (``--resources-server NAME``,
``--model-type NAME``, ``--environment NAME``), which turn a short name into a config path. Roots are searched in
order (``--search-dir`` roots, cwd, install root) and an earlier root shadows a later one.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml

from nemo_gym.config.roots import search_roots
from nemo_gym.config_types import ConfigError
from nemo_gym.registry import ENVIRONMENT_CONFIG_FILENAME, EnvironmentEntry, discover_environments

ComponentType = Literal["resources_servers", "responses_api_models", "responses_api_agents"]


@dataclass
class ComponentConfig:
    """One config file of a server implementation: ``<type>/<impl>/configs/<flavor>.yaml``."""

    server_type: ComponentType
    implementation: str
    flavor: str
    config_path: Path
    raw: dict[str, Any]

    @property
    def name(self) -> str:
        """The selector value: ``impl`` when the flavor is the implementation's own name, else ``impl/flavor``."""
        return self.implementation if self.flavor == self.implementation else f"{self.implementation}/{self.flavor}"

    def inner_blocks(self, server_type: str | None = None) -> list[tuple[str, str, dict[str, Any]]]:
        """``(instance, implementation, settings)`` for every server block of a type declared in this file."""
        server_type = server_type or self.server_type
        blocks = []
        for instance, value in self.raw.items():
            implementations = value.get(server_type) if isinstance(value, dict) else None
            if isinstance(implementations, dict):
                blocks.extend(
                    (instance, impl, inner) for impl, inner in implementations.items() if isinstance(inner, dict)
                )
        return blocks

    def metadata(self, key: str) -> str | None:
        for _, _, inner in self.inner_blocks():
            if inner.get(key) is not None:
                return str(inner[key])
        return None


def read_raw_yaml(path: Path) -> dict[str, Any]:
    """Raw YAML, interpolations untouched; unreadable files read as empty (listing never fails on one bad file)."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return {}
    return data if isinstance(data, dict) else {}


def list_component_configs(server_type: ComponentType) -> list[ComponentConfig]:
    found: dict[str, ComponentConfig] = {}
    for root in search_roots():
        for config_path in sorted((root / server_type).glob("*/configs/*.yaml")):
            implementation = config_path.parent.parent.name
            component = ComponentConfig(
                server_type, implementation, config_path.stem, config_path, read_raw_yaml(config_path)
            )
            found.setdefault(component.name, component)
    return sorted(found.values(), key=lambda c: c.name)


def list_implementations(server_type: ComponentType) -> list[Path]:
    """Implementation directories (those with an ``app.py``), earlier roots shadowing later ones."""
    found: dict[str, Path] = {}
    for root in search_roots():
        for app in sorted((root / server_type).glob("*/app.py")):
            found.setdefault(app.parent.name, app.parent)
    return [found[name] for name in sorted(found)]


def list_environments() -> list[EnvironmentEntry]:
    found: dict[str, EnvironmentEntry] = {}
    for root in search_roots():
        for name, entry in discover_environments(root / "environments").items():
            found.setdefault(name, entry)
    return [found[name] for name in sorted(found)]


SelectorKind = Literal["resources-server", "model-type", "environment"]
_SELECTOR_TYPES: dict[str, ComponentType] = {
    "resources-server": "resources_servers",
    "model-type": "responses_api_models",
}


def resolve_selector(kind: SelectorKind, value: str) -> Path:
    """The config path a selector names, or a ConfigError with a did-you-mean and the directories searched."""
    if kind == "environment":
        for root in search_roots():
            path = root / "environments" / value / ENVIRONMENT_CONFIG_FILENAME
            if path.is_file():
                return path
        available = [entry.name for entry in list_environments()]
        where = "environments/<name>/config.yaml"
    else:
        server_type = _SELECTOR_TYPES[kind]
        implementation, _, flavor = value.partition("/")
        for root in search_roots():
            path = root / server_type / implementation / "configs" / f"{flavor or implementation}.yaml"
            if path.is_file():
                return path
        available = [c.name for c in list_component_configs(server_type)]
        where = f"{server_type}/<name>/configs/<flavor>.yaml"
    close = difflib.get_close_matches(value, available, n=3, cutoff=0.5)
    hint = (
        f" Did you mean: {', '.join(close)}?"
        if close
        else (f" Available: {', '.join(available)}." if available else "")
    )
    roots = ", ".join(str(r) for r in search_roots())
    raise ConfigError(f"--{kind} {value!r}: no {where} found under {roots}.{hint}")
