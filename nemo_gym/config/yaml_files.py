"""Reading YAML config files into plain Python containers, with errors that point at the file, line and column."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from nemo_gym.errors import ConfigError


def load_yaml_file(path: Path) -> dict[str, Any]:
    """Load one YAML mapping. An empty file is an empty mapping; anything but a mapping is an error."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"{path}: cannot read config file ({e.strerror})") from e
    return load_yaml_text(text, source=str(path))


def load_yaml_text(text: str, source: str) -> dict[str, Any]:
    try:
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark else source
        problem = " ".join(p for p in (e.context, e.problem) if p)
        raise ConfigError(f"{where}: invalid YAML: {problem}") from e
    except yaml.YAMLError as e:
        raise ConfigError(f"{source}: invalid YAML: {e}") from e
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: a config file must be a mapping of keys to values, got a {type(data).__name__}")
    return data
