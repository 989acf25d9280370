"""Command-line overrides in Hydra syntax, applied to the composed config.

==============  =========================================================================================
``key=v``       change a value that the composed config already has (a typo is an error, with a hint)
``+key=v``      set a value, adding it if absent; the same ``+key`` twice on one command line is an error
``++key=v``     set a value, whatever is there
``~key``        delete a key that exists
==============  =========================================================================================

Keys are dotted paths (``a.b.0.c``); values use Hydra's grammar: ``[a,b]`` lists, ``{k: v}`` mappings, quoted strings,
``null``/``true``/numbers, and ``${...}`` interpolations kept verbatim until the whole config is resolved.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from nemo_gym.config.override_literals import OverrideKind, parse_common
from nemo_gym.config.tree import delete_path, has_path, iter_leaves, set_path
from nemo_gym.errors import ConfigError

if TYPE_CHECKING:
    from hydra.core.override_parser.overrides_parser import OverridesParser

# Hydra's parser is imported on first use: every server process imports this module (through the global config) but
# never parses a command line, and Hydra with its ANTLR runtime costs each of them ~8 MB of memory.
_KINDS = {"CHANGE": "change", "ADD": "add", "FORCE_ADD": "force", "DEL": "delete"}


@dataclass(frozen=True)
class Override:
    kind: OverrideKind
    key: str
    value: Any
    token: str


_parser: OverridesParser | None = None


def parse_overrides(tokens: list[str]) -> list[Override]:
    """Parse every token, reporting the first malformed one with the token itself.

    The common shapes are read without Hydra (:mod:`nemo_gym.config.override_literals`, same values): a command
    line made only of them never loads Hydra, ~0.12 s of a command's start-up."""
    parsed = []
    for token in tokens:
        common = parse_common(token)
        parsed.append(Override(*common, token) if common is not None else _parse_with_hydra(token))
    return parsed


def _parse_with_hydra(token: str) -> Override:
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import OverrideType
    from hydra.errors import HydraException

    global _parser
    if _parser is None:
        _parser = OverridesParser.create()
    try:
        override = _parser.parse_override(token)
    except HydraException as e:
        detail = str(e).splitlines()[0]
        raise ConfigError(
            f"cannot parse override {token!r}: {detail}. Overrides look like key=value, +key=value, ++key=value or ~key"
        ) from e
    if override.is_sweep_override():
        raise ConfigError(
            f"override {token!r} looks like a sweep (a,b): use a list [a,b], or quote the value to keep the comma"
        )
    if override.package is not None:
        raise ConfigError(f"override {token!r}: package overrides (@pkg) are not supported")
    value = None if override.type == OverrideType.DEL else override.value()
    kind: OverrideKind = _KINDS[override.type.name]  # type: ignore[assignment]
    return Override(kind, override.key_or_group, value, token)


def overrides_as_dict(overrides: list[Override]) -> dict[str, Any]:
    """The values the command line sets outright (``+``/``++``), as a mapping; used to find ``config_paths``."""
    result: dict[str, Any] = {}
    for override in overrides:
        if override.kind in ("add", "force"):
            set_path(result, override.key, override.value)
    return result


def apply_overrides(config: dict[str, Any], overrides: list[Override]) -> None:
    """Apply overrides in command-line order, in place."""
    added: set[str] = set()
    for override in overrides:
        if override.kind == "change":
            if not has_path(config, override.key):
                raise ConfigError(_unknown_key_message(config, override, "change"))
            set_path(config, override.key, override.value)
        elif override.kind == "add":
            if override.key in added:
                raise ConfigError(
                    f"override {override.token!r}: {override.key!r} is already set earlier on the command line; "
                    f"use ++{override.key}=... to replace it"
                )
            added.add(override.key)
            set_path(config, override.key, override.value)
        elif override.kind == "force":
            set_path(config, override.key, override.value)
        else:
            if not has_path(config, override.key):
                raise ConfigError(_unknown_key_message(config, override, "delete"))
            delete_path(config, override.key)


def _unknown_key_message(config: dict[str, Any], override: Override, verb: str) -> str:
    known = {path for path, _ in iter_leaves(config)}
    known |= {path.rsplit(".", 1)[0] for path in known if "." in path}
    close = difflib.get_close_matches(override.key, sorted(known), n=3, cutoff=0.6)
    hint = f" Did you mean: {', '.join(close)}?" if close else ""
    if verb == "change":
        return (
            f"override {override.token!r}: the config has no key {override.key!r} to change.{hint} "
            f"To add a new key write +{override.token}"
        )
    return f"override {override.token!r}: the config has no key {override.key!r} to delete.{hint}"
