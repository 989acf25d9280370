"""Post-merge directives that build config subtrees out of other subtrees.

=====================================================  ====================================================
``node: {_inherit_from: a.b, k: v}``                   ``node`` = subtree ``a.b`` with ``k: v`` merged on top;
``node: "${inherit_from:a.b}"``                        ``a.b`` is then removed from where it was (moved)
``node: {_copy: a.b, k: v}`` / ``"${copy:a.b}"``       same, but ``a.b`` stays in place
``node: {_delete_key: "k1, k2", ...}``                 remove keys ``k1``, ``k2`` from ``node`` (after merging)
=====================================================  ====================================================

Sources are read from the config as it was before any directive ran, and directives inside an inherited subtree are
processed too, so chains (A inherits B, B inherits C) work. A cycle is an error.
"""

from __future__ import annotations

import copy
import re
from typing import Any

from nemo_gym.config.tree import MISSING, deep_merge, delete_path, get_path, has_path, split_path
from nemo_gym.errors import ConfigError, InheritPathNotFoundError

INHERIT_KEY = "_inherit_from"
COPY_KEY = "_copy"
DELETE_KEY = "_delete_key"
_STRING_FORM = re.compile(r"^\$\{(inherit_from|copy):\s*([^}]+?)\s*\}$")


def apply_directives(config: dict[str, Any]) -> dict[str, Any]:
    """Return a new config with every directive applied."""
    frozen = copy.deepcopy(config)
    moved: list[str] = []
    result = _process(copy.deepcopy(config), frozen, moved, location="", chain=())
    for source in moved:
        if has_path(result, source):
            delete_path(result, source)
    return result


def _process(node: Any, frozen: dict[str, Any], moved: list[str], location: str, chain: tuple[str, ...]) -> Any:
    if isinstance(node, str):
        match = _STRING_FORM.match(node)
        if match:
            kind, source = match.group(1), match.group(2)
            inherited = _source_value(frozen, source, location, chain)
            if kind == "inherit_from":
                moved.append(source)
            return _process(inherited, frozen, moved, location, (*chain, source))
        return node
    if isinstance(node, list):
        return [_process(item, frozen, moved, f"{location}.{i}", chain) for i, item in enumerate(node)]
    if not isinstance(node, dict):
        return node

    source_key = INHERIT_KEY if INHERIT_KEY in node else COPY_KEY if COPY_KEY in node else None
    if INHERIT_KEY in node and COPY_KEY in node:
        raise ConfigError(f"{location or '<root>'}: use either {INHERIT_KEY} or {COPY_KEY}, not both")
    to_delete = _keys_to_delete(node.pop(DELETE_KEY, None), location)
    own = {k: v for k, v in node.items() if k not in to_delete}
    if source_key is not None:
        source = str(own.pop(source_key))
        inherited = _source_value(frozen, source, location, chain)
        if source_key == INHERIT_KEY:
            moved.append(source)
        chain = (*chain, source)
        if inherited == MISSING:
            return MISSING
        if not isinstance(inherited, dict):
            raise ConfigError(
                f"{location or '<root>'}: {source_key}: {source} points at a {type(inherited).__name__}, "
                "but only a mapping can be merged with keys"
            )
        own = deep_merge(inherited, own)
        if INHERIT_KEY in own or COPY_KEY in own or DELETE_KEY in own:
            # The source has directives of its own (a copy of a node that inherits): resolve them first, so the keys
            # deleted here are deleted from what they bring in too, instead of coming back with it.
            own = _process(own, frozen, moved, location, chain)
            if not isinstance(own, dict):
                return own
            _delete_keys(own, to_delete, node, location)
            return own
        _delete_keys(own, to_delete, node, location)
    else:
        for key in to_delete:
            if key not in node:
                raise ConfigError(f"{location or '<root>'}: {DELETE_KEY} names {key!r}, which does not exist there")
    return {
        key: _process(value, frozen, moved, f"{location}.{key}" if location else str(key), chain)
        for key, value in own.items()
    }


def _source_value(frozen: dict[str, Any], source: str, location: str, chain: tuple[str, ...]) -> Any:
    if source in chain:
        raise ConfigError(f"{location or '<root>'}: inheritance cycle: {' -> '.join([*chain, source])}")
    parts = split_path(source)
    for depth in range(1, len(parts) + 1):
        if get_path(frozen, parts[:depth], None) == MISSING:
            return MISSING
    if not has_path(frozen, source):
        raise InheritPathNotFoundError(
            f"{location or '<root>'}: cannot inherit/copy from {source!r}: no such path in the config"
        )
    return copy.deepcopy(get_path(frozen, source))


def _delete_keys(merged: dict[str, Any], keys: list[str], node: dict[str, Any], location: str) -> None:
    for key in keys:
        if key not in merged and key not in node:
            raise ConfigError(f"{location or '<root>'}: {DELETE_KEY} names {key!r}, which does not exist there")
        merged.pop(key, None)


def _keys_to_delete(value: Any, location: str) -> list[str]:
    if value is None:
        return []
    if isinstance(value, list):
        return [str(v).strip() for v in value]
    if isinstance(value, str):
        return [k.strip() for k in value.split(",") if k.strip()]
    raise ConfigError(f"{location or '<root>'}: {DELETE_KEY} must be a comma-separated string or a list of keys")
