"""Registry of co-located environments under ``environments/<name>/``.

An environment is a directory ``environments/<name>/`` whose ``config.yaml`` wires together a resources server, an
agent and datasets (and references a model server). This module maps an environment's short name to its config so
environments can be enumerated (``gym list environments``). Turning a name into config paths for a run is the job of
the CLI's ``--environment`` selector, so this module is discovery-only.

Discovery only reads config files: it never resolves interpolations or starts servers, so it works even when a config
references secrets (``${policy_api_key}``) that are not set.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from nemo_gym import INSTALL_DIR as _INSTALL_DIR
from nemo_gym import PARENT_DIR
from nemo_gym.errors import ConfigError as _ConfigError

__all__ = [
    "ENVIRONMENTS_DIR",
    "ENVIRONMENT_CONFIG_FILENAME",
    "ENVIRONMENT_TOMBSTONE_FILENAME",
    "PARENT_DIR",
    "EnvironmentEntry",
    "discover_environments",
    "read_tombstone",
]

ENVIRONMENTS_DIR = _INSTALL_DIR / "environments"
ENVIRONMENT_CONFIG_FILENAME = "config.yaml"
ENVIRONMENT_TOMBSTONE_FILENAME = ".nemo_gym_tombstone"
"""NeMo Gym 0.7's mark of a renamed environment: ``environments/<old>/.nemo_gym_tombstone`` holds the new name."""
_ENVIRONMENT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


@dataclass
class EnvironmentEntry:
    """A discovered environment: its name, where it lives, and lightweight metadata."""

    name: str
    config_path: Path
    path: Path
    description: str | None = None
    domain: str | None = None


def _read_metadata(config_path: Path) -> tuple[str | None, str | None]:
    """Best-effort (description, domain) from the config's ``resources_servers`` entry.

    Reads raw YAML, so unset keys (``???``) and interpolations (``${policy_api_key}``) are left alone instead of
    raising. An unreadable file yields ``(None, None)``.
    """
    try:
        data = yaml.safe_load(config_path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return None, None
    if not isinstance(data, dict):
        return None, None
    description = domain = None
    for value in data.values():
        implementations = value.get("resources_servers") if isinstance(value, dict) else None
        if not isinstance(implementations, dict):
            continue
        for inner in implementations.values():
            if not isinstance(inner, dict):
                continue
            if description is None and inner.get("description") is not None:
                description = str(inner["description"])
            if domain is None and inner.get("domain") is not None:
                domain = str(inner["domain"])
        if description is not None and domain is not None:
            break
    return description, domain


def discover_environments(environments_dir: Path = ENVIRONMENTS_DIR) -> dict[str, EnvironmentEntry]:
    """Map environment name -> :class:`EnvironmentEntry` for every ``<name>/config.yaml``.

    The name is the directory name. Returns an empty dict if the directory is missing.
    """
    environments_dir = Path(environments_dir)
    if not environments_dir.is_dir():
        return {}
    entries: dict[str, EnvironmentEntry] = {}
    for config_path in sorted(environments_dir.glob(f"*/{ENVIRONMENT_CONFIG_FILENAME}")):
        if (config_path.parent / ENVIRONMENT_TOMBSTONE_FILENAME).is_file():
            continue  # renamed: listed under its new name
        description, domain = _read_metadata(config_path)
        name = config_path.parent.name
        entries[name] = EnvironmentEntry(name, config_path, config_path.parent, description, domain)
    return entries


def read_tombstone(environment_dir: Path) -> str | None:
    """The name an environment was renamed to, or None when ``environment_dir`` has no tombstone.

    A tombstone holds exactly one name, another environment's: anything else (empty, two names, its own name) is a
    ConfigError naming the file, since following it could only guess."""
    path = environment_dir / ENVIRONMENT_TOMBSTONE_FILENAME
    if not path.is_file():
        return None
    words = path.read_text(encoding="utf-8").split()
    if len(words) != 1 or not _ENVIRONMENT_NAME.fullmatch(words[0]) or words[0] == environment_dir.name:
        found = ", ".join(repr(w) for w in words[:3]) or "nothing"
        raise _ConfigError(
            f"{path} must hold exactly one name, the environment {environment_dir.name!r} was renamed to; found {found}"
        )
    return words[0]
