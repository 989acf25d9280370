"""JSON read the way an interchange file must be: RFC 8259 only, nothing silently dropped or bent.

Python's ``json`` accepts ``NaN`` and ``Infinity`` (not JSON, and other readers refuse them) and keeps the last of two
equal keys (so a file could say two things and be read as one). Both are refused here, with the file named.
"""

from __future__ import annotations

import json
from typing import Any

from nemo_gym.errors import ConfigError


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise ValueError(f"key {key!r} appears twice in one object")
        result[key] = value
    return result


def loads(data: str | bytes, where: str) -> Any:
    """Parse ``data``; anything that is not plain JSON is one ConfigError naming ``where``."""
    try:
        return json.loads(data, parse_constant=_no_constants, object_pairs_hook=_unique_keys)
    except UnicodeDecodeError as e:
        raise ConfigError(f"{where}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"{where}: not valid JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
    except ValueError as e:
        raise ConfigError(f"{where}: {e}") from None


def loads_object(data: str | bytes, where: str) -> dict[str, Any]:
    value = loads(data, where)
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: expected a JSON object, got {type(value).__name__}")
    return value
