"""Small helpers over plain nested dicts/lists: dotted-path access, deep merge, leaf walking, a DictConfig made plain.

The config is composed on plain containers (fast, no OmegaConf node overhead) and turned into a ``DictConfig`` once,
at the end.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping
from typing import Any, cast

from omegaconf import DictConfig, OmegaConf

from nemo_gym.config.keys import MISSING as MISSING  # re-exported: its name here since the start

_ABSENT = object()


def split_path(dotted: str) -> list[str]:
    return [part for part in dotted.split(".") if part != ""]


def get_path(tree: Any, dotted: str | list[str], default: Any = _ABSENT) -> Any:
    """Value at a dotted path (list indices allowed); ``default`` if absent, or KeyError without a default."""
    node = tree
    for part in split_path(dotted) if isinstance(dotted, str) else dotted:
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.lstrip("-").isdigit() and -len(node) <= int(part) < len(node):
            node = node[int(part)]
        else:
            if default is _ABSENT:
                raise KeyError(dotted)
            return default
    return node


_NOT_FOUND = object()


def has_path(tree: Any, dotted: str) -> bool:
    return get_path(tree, dotted, _NOT_FOUND) is not _NOT_FOUND


def set_path(tree: dict[str, Any], dotted: str, value: Any) -> None:
    """Set a value, creating intermediate mappings as needed."""
    parts = split_path(dotted)
    node: Any = tree
    for part in parts[:-1]:
        if isinstance(node, list) and part.isdigit():
            node = node[int(part)]
            continue
        child = node.get(part)
        if not isinstance(child, (dict, list)):
            child = node[part] = {}
        node = child
    last = parts[-1]
    if isinstance(node, list) and last.isdigit():
        node[int(last)] = value
    else:
        node[last] = value


def delete_path(tree: dict[str, Any], dotted: str) -> None:
    parts = split_path(dotted)
    parent = get_path(tree, parts[:-1])
    if isinstance(parent, list):
        del parent[int(parts[-1])]
    else:
        del parent[parts[-1]]


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Merge ``override`` into a copy of ``base``: mappings merge key by key, anything else is replaced.

    As in OmegaConf, an unset value (``???``) never replaces a value that is already set.
    """
    result = dict(base)
    for key, value in override.items():
        current = result.get(key, _ABSENT)
        if isinstance(value, dict) and isinstance(current, dict):
            result[key] = deep_merge(current, value)
        elif value == MISSING and current is not _ABSENT and current != MISSING:
            continue
        else:
            result[key] = copy.deepcopy(value)
    return result


def iter_leaves(tree: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Yield ``(dotted_path, value)`` for every non-container value."""
    if isinstance(tree, dict):
        for key, value in tree.items():
            yield from iter_leaves(value, f"{prefix}.{key}" if prefix else str(key))
    elif isinstance(tree, list):
        for index, value in enumerate(tree):
            yield from iter_leaves(value, f"{prefix}.{index}" if prefix else str(index))
    else:
        yield prefix, tree


def plain_dict(config: DictConfig | Mapping[str, Any]) -> dict[str, Any]:
    """A config as a plain dict, interpolations resolved (a mapping that is already plain is copied shallowly)."""
    if not isinstance(config, DictConfig):
        return dict(config)
    # A DictConfig always becomes a dict; OmegaConf's return type also covers lists and non-string keys.
    return cast(dict[str, Any], OmegaConf.to_container(config, resolve=True))
