"""Checking a composed config before anything starts: framework settings, and every key of every server block.

A server block may hold the keys its implementation's config class declares (read statically, see
:mod:`nemo_gym.config.schemas`) plus the keys the framework itself reads in any block (:data:`FRAMEWORK_KEYS`). Any
other key is a typo until proven otherwise, so it is an error with a "did you mean", unless the class is open (it
allows extra keys, or a base could not be read). Values are checked against the declared types and constraints, so
``max_steps: "lots"`` fails here, not in a server that has already started. Every problem names the key path and,
where it can be found, the file and line (or the command-line override) that set it; all of them go on one line.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic_core import ErrorDetails

from nemo_gym.config.datasets import Domain
from nemo_gym.config.keys import RESERVED_TOP_LEVEL_KEYS
from nemo_gym.config.overrides import Override
from nemo_gym.config.placement import DEFAULT_RAY_ADDRESS, DEFAULT_REPLICAS, REPLICAS_KEY
from nemo_gym.config.schemas import ServerSchema, find_server_schema, implementation_dir
from nemo_gym.config.secrets import mask_value
from nemo_gym.config.server_models import SERVER_TYPES
from nemo_gym.config.supervision import SupervisionConfig
from nemo_gym.errors import ConfigError

FRAMEWORK_KEYS = frozenset(
    {
        "entrypoint", "host", "port", "num_workers", "name", "domain", "datasets",  # read by the launcher and base
        "description", "verified", "verified_url", "value",  # catalog metadata (gym list, README table)
        "max_active_requests",  # the admission bound of this server (nemo_gym.transport.runtime)
        REPLICAS_KEY,  # copies of this instance on a Ray cluster (nemo_gym.config.placement)
    }
)  # fmt: skip
"""Keys any server block may hold, whatever its implementation declares."""

FILLED_BY_FRAMEWORK = frozenset({"name", "host", "port"})
"""Declared as required by every server config, but set by the framework: never required in a block."""


class ConfigValueError(ConfigError, ValueError):
    """A key of the config is unknown, or its value has the wrong type or is out of range."""


class _CommonKeys(BaseModel):
    """Types of the framework keys that the base server configs do not declare."""

    model_config = ConfigDict(extra="ignore")

    description: str | None = None
    verified: bool | None = None
    verified_url: str | None = None
    value: str | None = None
    max_active_requests: int | None = Field(default=None, ge=0)
    replicas: int = Field(default=DEFAULT_REPLICAS, ge=1)
    port: int | None = Field(default=None, ge=0, le=65535)  # 0 or unset: a free one is picked


class _HeadServer(BaseModel):
    model_config = ConfigDict(extra="allow")

    host: str
    port: int = Field(ge=0, le=65535)


class _Settings(BaseModel):
    """Types of the top-level framework settings that the launcher reads as numbers, switches or addresses."""

    model_config = ConfigDict(extra="ignore")

    head_server: _HeadServer
    default_host: str
    port_range_low: int | None = Field(default=None, ge=1, le=65535)
    port_range_high: int | None = Field(default=None, ge=1, le=65535)
    dry_run: bool | None = None
    skip_venv_if_present: bool | None = None
    error_on_almost_servers: bool | None = None
    allow_unsupported_pairing: bool | None = None
    use_absolute_ip: bool | None = None
    shared_venv: bool | None = None
    skip_verification: bool | None = None
    skip_verification_reward: float | None = None
    server_startup_timeout_seconds: float | None = Field(default=None, gt=0)
    server_call_timeout_seconds: float | None = Field(default=None, gt=0)
    server_supervision: SupervisionConfig | None = None
    global_aiohttp_connector_limit: int | None = Field(default=None, ge=1)
    global_aiohttp_connector_limit_per_host: int | None = Field(default=None, ge=1)
    server_max_active_requests: int | None = Field(default=None, ge=0)
    auth: bool | None = None
    server_max_body_bytes: int | None = Field(default=None, ge=0)
    ray_head_node_address: str | None = DEFAULT_RAY_ADDRESS


class SourceLocator:
    """Where a key of the composed config was set: a command-line override, or a file and line.

    Sources are searched from the highest precedence down (command line, env.yaml, the last included file, ...), so
    the answer is the place whose value won. A key that a directive (``_inherit_from``/``_copy``) brought in is found
    by the end of its path (``<server type>.<implementation>.<key>``) in whichever file wrote it.
    """

    def __init__(self, files: Iterable[Path], env_yaml: Path | None, overrides: list[Override]) -> None:
        self._files = [*([env_yaml] if env_yaml else []), *reversed(list(files))]
        self._overrides = overrides
        self._trees: dict[Path, yaml.Node | None] = {}

    def where(self, path: list[str]) -> str | None:
        dotted = ".".join(path)
        for override in reversed(self._overrides):
            if override.kind != "delete" and (dotted == override.key or dotted.startswith(f"{override.key}.")):
                return f"command line {override.token!r}"
        for tail in (path, path[-3:]) if len(path) > 3 else (path,):
            for file in self._files:
                line = _line_of(self._tree(file), tail, anywhere=tail is not path)
                if line is not None:
                    return f"{file}:{line}"
        return None

    def describe(self, path: list[str], message: str, at: list[str] | None = None) -> str:
        """``file:line: a.b.c: message``, or ``a.b.c: message (command line '+a.b.c=1')``; ``at``: the path whose
        place is shown, when ``path`` itself is written nowhere (a missing key: its block)."""
        dotted = ".".join(path)
        where = self.where(at or path)
        if where is None:
            return f"{dotted}: {message}"
        if where.startswith("command line"):
            return f"{dotted}: {message} (set on the {where})"
        return f"{where}: {dotted}: {message}"

    def _tree(self, file: Path) -> yaml.Node | None:
        if file not in self._trees:
            try:
                self._trees[file] = yaml.compose(file.read_text(encoding="utf-8"))
            except (OSError, yaml.YAMLError):
                self._trees[file] = None
        return self._trees[file]


def _line_of(node: yaml.Node | None, path: list[str], anywhere: bool) -> int | None:
    """1-based line of the key at ``path`` below ``node`` (with ``anywhere``: at any depth)."""
    if not isinstance(node, yaml.MappingNode):
        return None
    found = _walk(node, path)
    if found is not None or not anywhere:
        return found
    for _, value in node.value:
        found = _line_of(value, path, anywhere=True)
        if found is not None:
            return found
    return None


def _walk(node: yaml.Node, path: list[str]) -> int | None:
    for key, value in node.value if isinstance(node, yaml.MappingNode) else ():
        if isinstance(key, yaml.ScalarNode) and key.value == path[0]:
            return key.start_mark.line + 1 if len(path) == 1 else _walk(value, path[1:])
    return None


# ---------------------------------------------------------------------------------------------------------------------


def check_settings(config: dict[str, Any], locator: SourceLocator) -> None:
    """Top-level framework settings have the types the launcher needs (``head_server.port`` is a port number)."""
    try:
        _Settings.model_validate(config)
    except ValidationError as e:
        raise ConfigValueError("; ".join(_describe_errors(e, [], locator, {}))) from None


def check_server_blocks(
    config: dict[str, Any],
    locator: SourceLocator | None = None,
    skip: Iterable[str] = (),
    near_misses: bool = True,
    unset_marker: str | None = None,
    nulls_unset: bool = False,
) -> None:
    """Report every unknown key and every ill-typed value of every server block, all on one line.

    ``skip``: instance names not to check (invalid blocks that ``error_on_almost_servers=false`` drops).
    ``near_misses``: also check blocks with no ``entrypoint`` but a key that looks like a typo of it (otherwise such a
    block is silently not a server). ``unset_marker``: a placeholder standing for an unset value (``gym env resolve``),
    never type-checked. ``nulls_unset``: a ``null`` value counts as not set yet (a ``${oc.select:key,null}`` placeholder
    that a run fills in), so the server, not composition, refuses it if it is still null when it starts.
    """
    locator = locator or SourceLocator([], None, [])
    skipped = set(skip)
    problems: list[str] = []
    for name, value in config.items():
        shape = _server_shape(name, value)
        if shape is None or name in skipped:
            continue
        server_type, implementation, inner = shape
        if "entrypoint" not in inner and not (near_misses and _close(inner, ["entrypoint"])):
            continue  # not a server block (a template without an entrypoint, say)
        directory = implementation_dir(server_type, implementation)
        entrypoint = str(inner.get("entrypoint") or "app.py")
        schema = find_server_schema(directory, entrypoint) if directory else None
        problems.extend(
            _check_block([name, server_type, implementation], inner, schema, locator, unset_marker, nulls_unset)
        )
    if problems:
        raise ConfigValueError("; ".join(problems))


def _server_shape(name: str, value: Any) -> tuple[str, str, dict[str, Any]] | None:
    if name in RESERVED_TOP_LEVEL_KEYS or not isinstance(value, dict):
        return None
    present = [t for t in SERVER_TYPES if t in value]
    if len(present) != 1 or not isinstance(value[present[0]], dict) or len(value[present[0]]) != 1:
        return None
    implementation, inner = next(iter(value[present[0]].items()))
    return (present[0], str(implementation), inner) if isinstance(inner, dict) else None


def _check_block(
    prefix: list[str],
    inner: dict[str, Any],
    schema: ServerSchema | None,
    locator: SourceLocator,
    unset_marker: str | None,
    nulls_unset: bool = False,
) -> list[str]:
    declared = set(schema.fields) if schema else set()
    known = FRAMEWORK_KEYS | declared
    owner = f"{prefix[2]} ({schema.class_name})" if schema else prefix[2]
    problems = []
    suggested: set[str] = set()
    for key in inner:
        if key in known:
            continue
        if schema is None or schema.open:
            close = _close([str(key)], known - set(inner))
            if not close:
                continue  # what the class accepts is not known: only a near miss of an absent key counts
        else:
            close = _close([str(key)], known)
        if close:
            hint = f"Did you mean {close[0]!r}?"
            suggested.add(close[0])
        else:
            hint = f"Its keys: {', '.join(sorted(declared - FRAMEWORK_KEYS)) or 'only the common ones'}."
        problems.append(locator.describe([*prefix, str(key)], f"unknown key for {owner}. {hint}"))
    if prefix[1] == "resources_servers" and inner.get("domain") is None and "domain" not in suggested:
        allowed = ", ".join(d.value for d in Domain)
        message = f"a resources server needs a domain, one of: {allowed}"
        problems.append(locator.describe([*prefix, "domain"], message, at=prefix))
    unset = {k for k, v in inner.items() if k in known and (_holds(v, unset_marker) or (nulls_unset and v is None))}
    values = {k: v for k, v in inner.items() if k in known and k not in unset}
    models: list[type[BaseModel]] = [_CommonKeys]
    if schema is not None:
        try:
            models.append(schema.model(FILLED_BY_FRAMEWORK))
        except Exception:  # a type pydantic cannot build outside the server's own module: the server checks it
            pass
    for model in models:
        try:
            model.model_validate(values)
        except ValidationError as e:
            problems.extend(_describe_errors(e, prefix, locator, schema.fields if schema else {}, suggested | unset))
        except Exception:  # as above: the types of this block cannot be judged here
            continue
    return list(dict.fromkeys(problems))


def _close(words: Iterable[str], candidates: Iterable[str]) -> list[str]:
    """Candidates that look like a typo of one of ``words`` (best first)."""
    pool = sorted(str(c) for c in candidates)
    for word in words:
        match = difflib.get_close_matches(str(word), pool, n=1, cutoff=0.75)
        if match:
            return match
    return []


def _holds(value: Any, marker: Any) -> bool:
    if marker is None:
        return False
    if isinstance(value, dict):
        return any(_holds(v, marker) for v in value.values())
    if isinstance(value, list):
        return any(_holds(v, marker) for v in value)
    return isinstance(value, str) and marker in value


# ---------------------------------------------------------------------------------------------------------------------
# Turning pydantic errors into one readable clause each

_EXPECTED = {
    "int_type": "an integer", "int_parsing": "an integer", "int_from_float": "an integer",
    "float_type": "a number", "float_parsing": "a number", "bool_type": "true or false",
    "bool_parsing": "true or false", "string_type": "a string", "dict_type": "a mapping", "list_type": "a list",
    "model_type": "a mapping", "model_attributes_type": "a mapping",
}  # fmt: skip


def _describe_errors(
    error: ValidationError,
    prefix: list[str],
    locator: SourceLocator,
    fields: dict[str, Any],
    skip_missing: Iterable[str] = (),
) -> list[str]:
    """One clause per key; the failures of each member of a union (``str | list[str]``) count as one. A key in
    ``skip_missing`` (already suggested for a typo, or left unset for ``gym env resolve``) is never "missing"."""
    by_key: dict[tuple[str, ...], list[ErrorDetails]] = {}
    for item in error.errors():
        location = tuple(str(p) for p in item["loc"])
        if item["type"] == "missing" and location[:1] and location[0] in skip_missing:
            continue
        if len(location) > 1 and _names_a_type(location[1]):
            location = location[:1]
        by_key.setdefault(location, []).append(item)
    return [
        locator.describe(
            [*prefix, *location],
            _clause(items, fields.get(location[0]) if location else None, location[-1] if location else ""),
        )
        for location, items in by_key.items()
    ]


def _names_a_type(part: str) -> bool:
    """pydantic puts the union member that failed after the key: ``('base_url', 'list[str]')``."""
    return "[" in part or part in _TYPE_NAMES or part[:1].isupper()


_TYPE_NAMES = {"str", "int", "float", "bool", "none", "dict", "list", "literal"}


def _clause(items: list[ErrorDetails], spec: Any, key: str) -> str:
    first = items[0]
    kind = first["type"]
    given = mask_value(key, first.get("input"))
    if kind == "missing":
        return "is required but not set"
    if len(items) > 1 and spec is not None:
        return f"expected {_type_text(spec.annotation)}, got {given!r}"
    if kind in ("literal_error", "enum"):
        expected = str(first.get("ctx", {}).get("expected", ""))
        close = _close([str(given)], re.findall(r"'([^']*)'", expected))
        hint = f". Did you mean {close[0]!r}?" if close else ""
        return f"expected one of {expected}, got {given!r}{hint}"
    if kind in _EXPECTED:
        return f"expected {_EXPECTED[kind]}, got {given!r}"
    message = first["msg"].removeprefix("Value error, ").removeprefix("Input should be ")
    if kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal", "too_short", "too_long"):
        return f"must be {message}, got {given!r}"
    return f"{message} (got {given!r})"


def _type_text(annotation: Any) -> str:
    text = annotation.__name__ if isinstance(annotation, type) else str(annotation)
    return text.replace("typing.", "").replace("NoneType", "None")
