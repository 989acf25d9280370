"""Values a composed config leaves unset: ``???`` and ``${...}`` interpolations of keys that no source sets.

Every one is reported at once, naming where it was written and how to set it. When a source sets a key whose name is
close to the one needed (``polcy_model_name`` in env.yaml beside ``${policy_model_name}``), the line names that key,
its file and line, and says to rename it: a misspelling is the usual cause, and "set policy_model_name" alone sends
the user looking for a key they believe they set.
"""

from __future__ import annotations

import difflib
import re
from typing import Any

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from nemo_gym.config.secrets import mask_value
from nemo_gym.config.tree import MISSING, iter_leaves, plain_dict, split_path
from nemo_gym.config.validation import SourceLocator
from nemo_gym.errors import ConfigInterpolationError, ConfigMissingValuesError

UNSET_PLACEHOLDER = "<unset value>"
"""Stands for an unset value while an ``allow_unset`` config is composed: OmegaConf refuses to read ``???`` and
server validation expects strings; it is turned back into ``???`` (with whatever was built from it) at the end."""

_MISSING_KEY = re.compile(r"key '([^']+)'")
_CLOSE_ENOUGH = 0.8
"""difflib ratio above which a given key counts as a misspelling of the one needed (``polcy_`` for ``policy_``)."""


def raise_for_missing_values(config: dict[str, Any], locator: SourceLocator) -> None:
    """Report every ``???`` left after merging, on one line."""
    missing = [path for path, value in iter_leaves(config) if value == MISSING]
    if len(missing) == 1:
        path = missing[0]
        where = _place(locator, path)
        raise ConfigMissingValuesError(
            f"{where}required config value {path!r} is not set (???)."
            + (did_you_mean(path, config, locator) or f" Set it in env.yaml or pass ++{path}=<value>")
        )
    if missing:
        hints = " ".join(f"++{path}=<value>" for path in missing)
        misspelt = "".join(did_you_mean(path, config, locator) for path in missing)
        raise ConfigMissingValuesError(
            f"{len(missing)} required config values are not set (???): {', '.join(missing)}. "
            f"Set them in env.yaml or on the command line: {hints}.{misspelt}"
        )


def resolve_interpolations(
    config: dict[str, Any], locator: SourceLocator, unset: list[str] | None = None
) -> dict[str, Any]:
    """Resolve every ``${...}``; report each value that cannot be resolved, naming it and the key it needs.

    With an ``unset`` list, such a value becomes unset and its line goes to the list instead of an error.
    """
    dict_config = OmegaConf.create(config)
    problems = []
    for path, value in iter_leaves(config):
        if not (isinstance(value, str) and "${" in value):
            continue
        try:
            OmegaConf.select(dict_config, path, throw_on_resolution_failure=True)
        except OmegaConfBaseException as e:
            match = _MISSING_KEY.search(str(e))
            needed = match.group(1) if match else None
            shown = mask_value(path.rsplit(".", 1)[-1], value)  # echoed below: never a secret's literal part
            misspelt = did_you_mean(needed, config, locator) if needed else ""
            if unset is not None:
                key = needed or path
                what = f"{key!r} is not set (needed by {path} = {shown})"
                unset.append(f"{what}.{misspelt}" if misspelt else set_hint(key, what))
                OmegaConf.update(dict_config, path, UNSET_PLACEHOLDER, merge=False)
                continue
            hint = misspelt or (f" Set {needed!r} in env.yaml or pass ++{needed}=<value>." if needed else "")
            problems.append(
                f"{_place(locator, path)}config value {path!r} = {shown!r} cannot be resolved: {first_line(e)}.{hint}"
            )
    if problems:
        raise ConfigInterpolationError("; ".join(problems))
    return plain_dict(dict_config)


def did_you_mean(needed: str, config: dict[str, Any], locator: SourceLocator) -> str:
    """`` <file>:<line> sets 'polcy_model_name': did you mean 'policy_model_name'? Rename it there.``, for the given
    key closest to ``needed``, or ``""``. Only keys a source actually wrote count (not defaults or stand-ins)."""
    given = [path for path, value in iter_leaves(config) if value != MISSING and path != needed]
    for candidate in difflib.get_close_matches(needed, given, n=3, cutoff=_CLOSE_ENOUGH):
        where = locator.where(split_path(candidate))
        if where is not None:
            source = f"the {where}" if where.startswith("command line") else where
            return f" {source} sets {candidate!r}: did you mean {needed!r}? Rename it there."
    return ""


def swap_unset(node: Any, old: str, new: str) -> Any:
    """A copy of ``node`` with every string holding ``old`` replaced by ``new`` (``old`` -> ``???`` whole)."""
    if isinstance(node, dict):
        return {key: swap_unset(value, old, new) for key, value in node.items()}
    if isinstance(node, list):
        return [swap_unset(value, old, new) for value in node]
    if isinstance(node, str) and old in node:
        return new if new == MISSING or node == old else node.replace(old, new)
    return node


def set_hint(key: str, what: str) -> str:
    return f"{what}: set it in env.yaml or pass ++{key}=<value>"


def first_line(error: Exception) -> str:
    """The first line of an OmegaConf error, without its final full stop (the caller's sentence goes on)."""
    return str(error).strip().splitlines()[0].rstrip(".") if str(error).strip() else type(error).__name__


def _place(locator: SourceLocator, path: str) -> str:
    """``file:line: `` where ``path`` was written, or ``""`` (a command-line value names itself in the message)."""
    where = locator.where(split_path(path))
    return f"{where}: " if where and not where.startswith("command line") else ""
