"""Finding the components a checkout (or extra roots) ship: server implementations, their configs, environments.

Used by ``gym list`` / ``gym search`` and by the CLI's asset selectors (``--resources-server NAME``,
``--environment-server NAME``, ``--model-type NAME``, ``--environment NAME``, ``--benchmark NAME``), which turn a
short name into a config path.
Roots are searched in order (``--search-dir`` roots, cwd, install root) and an earlier root shadows a later one.
"""

from __future__ import annotations

import difflib
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml

from nemo_gym.config.roots import find_path, search_roots
from nemo_gym.errors import ConfigError
from nemo_gym.registry import (
    ENVIRONMENT_CONFIG_FILENAME,
    ENVIRONMENT_TOMBSTONE_FILENAME,
    EnvironmentEntry,
    discover_environments,
    read_tombstone,
)

ComponentType = Literal["resources_servers", "responses_api_models", "responses_api_agents", "environment_servers"]


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
        blocks: list[tuple[str, str, dict[str, Any]]] = []
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


BENCHMARKS_DIR = "benchmarks"


@dataclass
class BenchmarkEntry:
    """An evaluation benchmark: a config under ``benchmarks/`` whose agent declares a ``type: benchmark`` dataset.

    ``benchmarks/`` also holds other things (performance scripts, data), so only such configs count.
    """

    name: str
    config_path: Path
    agent: str
    dataset: dict[str, Any]
    """The raw ``type: benchmark`` dataset block (name, jsonl_fpath, prepare_script, prompt_config, num_repeats)."""
    domain: str | None = None
    description: str | None = None


def _benchmark_datasets(raw: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """``(agent instance, dataset block)`` for every ``type: benchmark`` dataset declared in a raw config."""
    found = []
    for instance, value in raw.items():
        agents = value.get("responses_api_agents") if isinstance(value, dict) else None
        for inner in agents.values() if isinstance(agents, dict) else ():
            datasets = inner.get("datasets") if isinstance(inner, dict) else None
            for dataset in datasets if isinstance(datasets, list) else ():
                if isinstance(dataset, dict) and dataset.get("type") == "benchmark":
                    found.append((instance, dataset))
    return found


def _resources_server_metadata(raw: dict[str, Any], key: str, follow_includes: bool = True) -> str | None:
    """``domain`` / ``description`` of the first resources server block that sets it, looking into the files the
    config includes when it only inherits its server (benchmarks usually do)."""
    for value in raw.values():
        servers = value.get("resources_servers") if isinstance(value, dict) else None
        for inner in servers.values() if isinstance(servers, dict) else ():
            if isinstance(inner, dict) and inner.get(key) is not None:
                return str(inner[key])
    includes = raw.get("config_paths") if follow_includes else None
    for include in includes if isinstance(includes, list) else ():
        path = find_path(str(include))
        value = _resources_server_metadata(read_raw_yaml(path), key, False) if path and path.is_file() else None
        if value is not None:
            return value
    return None


def benchmark_name(config_path: Path, benchmarks_dir: Path) -> str:
    """``benchmarks/aime/config.yaml`` → ``aime``; ``benchmarks/aime/v2/config.yaml`` or ``benchmarks/aime/v2.yaml``
    → ``aime/v2``."""
    parts = config_path.relative_to(benchmarks_dir).with_suffix("").parts
    if parts and parts[-1] == "config":
        parts = parts[:-1]
    return "/".join(parts)


def list_benchmarks() -> list[BenchmarkEntry]:
    """Every benchmark config across the search roots, earlier roots shadowing later ones."""
    found: dict[str, BenchmarkEntry] = {}
    for root in search_roots():
        base = root / BENCHMARKS_DIR
        if not base.is_dir():
            continue
        for path in sorted(base.rglob("*.yaml")):
            inner_dirs = path.relative_to(base).parts[:-1]
            if any(part.startswith(".") or part == "__pycache__" for part in inner_dirs):
                continue
            raw = read_raw_yaml(path)
            datasets = _benchmark_datasets(raw)
            name = benchmark_name(path, base)
            if not datasets or not name or name in found:
                continue
            agent, dataset = datasets[0]
            found[name] = BenchmarkEntry(
                name, path, agent, dataset,
                _resources_server_metadata(raw, "domain"), _resources_server_metadata(raw, "description"),
            )  # fmt: skip
    return [found[name] for name in sorted(found)]


SelectorKind = Literal["resources-server", "environment-server", "model-type", "environment", "benchmark"]
_SELECTOR_TYPES: dict[str, ComponentType] = {
    "resources-server": "resources_servers",
    "environment-server": "environment_servers",
    "model-type": "responses_api_models",
}


def _environment_config(name: str, followed: tuple[str, ...] = ()) -> Path | None:
    """``environments/<name>/config.yaml`` in the first root that has it or a tombstone for ``name`` (NeMo Gym 0.7's
    renames, followed and told in one line on stderr); None when no root has either."""
    for root in search_roots():
        folder = root / "environments" / name
        renamed_to = read_tombstone(folder)
        if renamed_to is None:
            if (folder / ENVIRONMENT_CONFIG_FILENAME).is_file():
                return folder / ENVIRONMENT_CONFIG_FILENAME
            continue
        if renamed_to in followed:
            chain = " -> ".join([*followed, name, renamed_to])
            raise ConfigError(f"environment renames loop ({chain}): fix their {ENVIRONMENT_TOMBSTONE_FILENAME} files")
        tombstone = folder / ENVIRONMENT_TOMBSTONE_FILENAME
        print(f"notice: environment {name!r} was renamed to {renamed_to!r} ({tombstone})", file=sys.stderr)
        found = _environment_config(renamed_to, (*followed, name))
        if found is None:
            raise ConfigError(f"environment {name!r} was renamed to {renamed_to!r} ({tombstone}), which is not found")
        return found
    return None


def resolve_selector(kind: SelectorKind, value: str) -> Path:
    """The config path a selector names, or a ConfigError with a did-you-mean and the directories searched."""
    if kind == "environment":
        found = _environment_config(value)
        if found is not None:
            return found
        available = [entry.name for entry in list_environments()]
        where = "environments/<name>/config.yaml"
    elif kind == "benchmark":
        for root in search_roots():
            for path in (
                root / BENCHMARKS_DIR / value / ENVIRONMENT_CONFIG_FILENAME,
                root / BENCHMARKS_DIR / f"{value}.yaml",
            ):
                if path.is_file():
                    return path
        available = [entry.name for entry in list_benchmarks()]
        where = "benchmarks/<name>/config.yaml (or benchmarks/<name>.yaml)"
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
