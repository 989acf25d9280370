"""Command-line flags: what each one sets, and how.

A flag does one of three things:

* it names a field of the command's typed settings (``field=``): ``--concurrency 7`` sets ``num_samples_in_parallel``
  to the int 7 on the settings object, on top of the composed config (:func:`flag_fields`);
* it names a key of the config itself (``override_key=``): ``--model gpt-x`` becomes the override
  ``+policy_model_name='gpt-x'``, because other config values interpolate it;
* it selects config files: ``--config``, ``--environment``, ``--benchmark``, ``--resources-server``,
  ``--model-type`` and ``--environment-server`` all add to one ``+config_paths=[...]`` override: the packaged configs
  the selectors name first, then the user's own ``--config`` files, so a user's file overrides what it names.

Either way ``--limit 5`` and ``+limit=5`` mean the same, and anything a flag cannot say can still be said as
``+key=value``. A typed flag behaves as if it were written before the user's own overrides: ``+key`` of the same key
again is an error, a later ``++key=...``, ``key=...`` or ``~key`` wins.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nemo_gym.assets import SelectorKind, resolve_selector
from nemo_gym.config.placement import RAY_ADDRESS_KEY
from nemo_gym.errors import ConfigError


@dataclass(frozen=True)
class Flag:
    names: tuple[str, ...]
    help: str
    override_key: str | None = None
    """``--flag VALUE`` becomes ``+override_key=VALUE`` (``true`` for switches): for keys of the config itself."""
    field: str | None = None
    """``--flag VALUE`` sets this field of the command's typed settings (a dotted path inside a mapping field)."""
    selector: SelectorKind | None = None
    """The value is a short name resolved to a config path."""
    config_path: bool = False
    """The value is a config path (``--config``)."""
    switch: bool = False
    switch_value: str = "true"
    """What a switch with ``override_key`` sets (``--no-auth`` sets ``auth`` to false)."""
    repeatable: bool = False
    many: bool = False
    """One flag takes one or more values (``--candidates B C``): its value is a list."""
    metavar: str | None = None
    value_type: type = str
    minimum: float | None = None
    """Smallest value accepted; checked before anything runs (``--concurrency 0`` is a mistake, not a request)."""
    maximum: float | None = None

    @property
    def dest(self) -> str:
        return self.names[0].lstrip("-").replace("-", "_")

    def register(self, parser: argparse.ArgumentParser) -> None:
        kwargs: dict[str, Any] = {"dest": self.dest, "help": self.help}
        if self.switch:
            kwargs["action"] = "store_true"
        else:
            kwargs["metavar"] = self.metavar or self.dest.upper()
            kwargs["type"] = self.value_type
            if self.repeatable:
                kwargs["action"] = "append"
            if self.many:
                kwargs["nargs"] = "+"
        parser.add_argument(*self.names, **kwargs)

    def check(self, value: Any) -> None:
        """Raise a one-line error naming the flag when ``value`` is outside the flag's bounds."""
        low, high = self.minimum, self.maximum
        if (low is None or value >= low) and (high is None or value <= high):
            return
        if low is not None and high is not None:
            wanted = f"between {_number(low)} and {_number(high)}"
        elif low is not None:
            wanted = f"at least {_number(low)}"
        elif high is not None:  # with neither bound, every value passed the test above
            wanted = f"at most {_number(high)}"
        raise ConfigError(f"{self.names[0]} must be {wanted}, got {_number(value)}")


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


CONFIG_FLAGS = (
    Flag(("--config", "-c"), "config YAML to load (repeatable)", config_path=True, repeatable=True, metavar="PATH"),
    Flag(("--environment", "-e"), "environment from environments/NAME/config.yaml", selector="environment",
         repeatable=True, metavar="NAME"),
    Flag(("--benchmark",), "evaluation benchmark from benchmarks/NAME/config.yaml (or benchmarks/NAME.yaml)",
         selector="benchmark", repeatable=True, metavar="NAME"),
    Flag(("--resources-server",), "resources server config: resources_servers/NAME/configs/(FLAVOR|NAME).yaml",
         selector="resources-server", repeatable=True, metavar="NAME[/FLAVOR]"),
    Flag(("--model-type",), "model server config: responses_api_models/NAME/configs/(FLAVOR|NAME).yaml",
         selector="model-type", repeatable=True, metavar="NAME[/FLAVOR]"),
    Flag(("--environment-server",), "environment server config: environment_servers/NAME/configs/(FLAVOR|NAME).yaml",
         selector="environment-server", repeatable=True, metavar="NAME[/FLAVOR]"),
    Flag(("--search-dir",), "extra root searched for configs and servers before cwd (repeatable)", repeatable=True,
         metavar="DIR"),
)  # fmt: skip

MODEL_FLAGS = (
    Flag(("--model", "-m"), "policy model name (policy_model_name)", override_key="policy_model_name"),
    Flag(("--model-url",), "policy model base URL (policy_base_url)", override_key="policy_base_url"),
    Flag(("--model-api-key",), "policy model API key (policy_api_key)", override_key="policy_api_key"),
)

AUTH_FLAG = Flag(
    ("--no-auth",),
    "servers and the head server take requests without the run's token (for servers behind your own gateway; "
    "default: every request needs the token this run makes)",
    override_key="auth",
    switch=True,
    switch_value="false",
)

RAY_FLAG = Flag(
    ("--ray-address",),
    f"place the servers on this running Ray cluster (HOST:PORT of its head, or auto; config key {RAY_ADDRESS_KEY}; "
    "default: no Ray, every server on this machine)",
    override_key=RAY_ADDRESS_KEY,
    metavar="ADDRESS",
)

JSON_FLAG = Flag(("--json",), "print JSON instead of a table", switch=True)


def quote(value: Any) -> str:
    """A value as a Hydra override literal that parses back to exactly this string."""
    text = str(value)
    text = re.sub(r"(\\*)'", lambda m: m.group(1) * 2 + "\\'", text)
    text = re.sub(r"(\\+)$", lambda m: m.group(1) * 2, text)
    return f"'{text}'"


def flags_to_overrides(args: argparse.Namespace, flags: tuple[Flag, ...], passthrough: list[str]) -> list[str]:
    """Translate parsed flags into override tokens, merged with the user's own ``key=value`` tokens."""
    selected: list[str] = []  # packaged configs named by --environment, --resources-server, ...
    given: list[str] = []  # the user's own --config files, merged after them so that they win
    tokens: list[str] = []
    for flag in flags:
        values = _given(args, flag)
        if not values or flag.field is not None:
            continue
        if flag.config_path:
            given.extend(str(v) for v in values)
        elif flag.selector is not None:
            selected.extend(str(resolve_selector(flag.selector, v)) for v in values)
        elif flag.override_key is not None:
            tokens.append(
                f"+{flag.override_key}={flag.switch_value}"
                if flag.switch
                else f"+{flag.override_key}={quote(values[-1])}"
            )
    config_paths = selected + given
    remaining = []
    for token in passthrough:
        if re.match(r"^\+{1,2}config_paths=", token):
            config_paths.extend(_parse_config_paths_token(token))
        else:
            remaining.append(token)
    if config_paths:
        tokens.insert(0, "+config_paths=[" + ",".join(quote(p) for p in config_paths) + "]")
    if getattr(args, "verbose", False):
        tokens.append("++verbose=true")
    return tokens + remaining


def _parse_config_paths_token(token: str) -> list[str]:
    from nemo_gym.config.override_literals import parse_common

    common = parse_common(token)
    if common is not None:
        value = common[2]
    else:
        from hydra.core.override_parser.overrides_parser import OverridesParser  # ~0.12 s: only when needed

        try:
            value = OverridesParser.create().parse_override(token).value()
        except Exception as e:
            raise ConfigError(f"cannot parse {token!r}: write +config_paths=[a.yaml,b.yaml]") from e
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    if isinstance(value, list):
        return [str(v) for v in value]
    raise ConfigError(f"{token!r}: config_paths must be a list of paths, e.g. +config_paths=[a.yaml,b.yaml]")


def flag_fields(args: argparse.Namespace, flags: tuple[Flag, ...], passthrough: list[str]) -> dict[str, Any]:
    """The typed settings fields the flags set, by field path, with the values argparse typed (no override string).

    Precedence is that of a ``+field=value`` written before ``passthrough`` (the user's own overrides).
    """
    fields: dict[str, Any] = {}
    setters: dict[str, Flag] = {}
    for flag in flags:
        values = _given(args, flag)
        if values and flag.field is not None:
            fields[flag.field] = True if flag.switch else values if flag.many else values[-1]
            setters[flag.field] = flag
    if not fields or not passthrough:
        return fields
    from nemo_gym.config.overrides import parse_overrides

    for override in parse_overrides(passthrough):
        for path in [p for p in fields if p == override.key or p.startswith(f"{override.key}.")]:
            if override.kind == "add" and override.key == path:
                raise ConfigError(
                    f"override {override.token!r}: {path!r} is already set by {setters[path].names[0]}; "
                    f"pass one of them, or ++{path}=... to replace it"
                )
            del fields[path]  # the user's later ++key / key= / ~key wins, as it would over an override
    return fields


def _given(args: argparse.Namespace, flag: Flag) -> list[Any]:
    """The values given for ``flag`` (none when it is absent), each checked against the flag's bounds."""
    value = getattr(args, flag.dest, None)
    if value is None or value is False or value == []:
        return []
    values = value if isinstance(value, list) else [value]
    if flag.minimum is not None or flag.maximum is not None:
        for each in values:
            flag.check(each)
    return values


def search_dirs(args: argparse.Namespace) -> list[Path]:
    """The ``--search-dir`` roots of a command, checked to be directories."""
    dirs = [Path(d) for d in getattr(args, "search_dir", None) or []]
    missing = [d for d in dirs if not d.is_dir()]
    if missing:
        raise ConfigError(f"--search-dir {str(missing[0])!r} is not a directory")
    return dirs
