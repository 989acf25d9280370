"""Expanding ``config_paths`` into the ordered list of YAML files to merge.

Each file may list more files in its own ``config_paths``. The merge order is a post-order walk of that include tree:
a file comes after everything it pulls in (so it overrides its includes), and a later sibling, with its whole subtree,
comes after an earlier one. A file reached twice is loaded once, at its first position.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nemo_gym.config.roots import candidate_paths, find_path
from nemo_gym.config.yaml_files import load_yaml_file
from nemo_gym.errors import ConfigPathNotFoundError, MalformedConfigPathsError

logger = logging.getLogger(__name__)


@dataclass
class LoadedConfig:
    path: Path
    data: dict[str, Any]


@dataclass
class IncludeResult:
    files: list[LoadedConfig] = field(default_factory=list)
    repeated: list[Path] = field(default_factory=list)


def normalize_config_paths(value: Any, source: str) -> list[str]:
    """Validate a ``config_paths`` value as a list of paths (nested lists from interpolations are flattened)."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise MalformedConfigPathsError(
            f"{source}: config_paths must be a list of paths, got {type(value).__name__} {value!r}. "
            "On the command line write +config_paths=[a.yaml,b.yaml]"
        )
    paths: list[str] = []
    for item in value:
        if isinstance(item, list):
            paths.extend(normalize_config_paths(item, source))
        elif isinstance(item, (str, Path)) and str(item).strip():
            paths.extend(part.strip() for part in str(item).split(",") if part.strip())
        else:
            raise MalformedConfigPathsError(f"{source}: config_paths entries must be paths, got {item!r}")
    return paths


def expand_config_paths(paths: list[str]) -> IncludeResult:
    result = IncludeResult()
    seen: set[Path] = set()

    def visit(path: str, included_from: Path | None) -> None:
        found = find_path(path, also_relative_to=included_from.parent if included_from else None)
        if found is None or not found.is_file():
            tried = "\n  ".join(str(c) for c in candidate_paths(path, included_from.parent if included_from else None))
            origin = f" (listed in {included_from})" if included_from else ""
            raise ConfigPathNotFoundError(f"config file {path!r}{origin} not found; looked in:\n  {tried}")
        if found in seen:
            result.repeated.append(found)
            return
        seen.add(found)
        data = load_yaml_file(found)
        children = normalize_config_paths(data.pop("config_paths", None), str(found))
        for child in children:
            visit(child, found)
        result.files.append(LoadedConfig(found, data))

    for path in paths:
        visit(path, None)
    for repeated in result.repeated:
        logger.info("config %s is referenced more than once; it was loaded once (consider _inherit_from)", repeated)
    return result
