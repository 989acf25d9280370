"""The declarative shape of a CLI command: where it sits in the tree, its flags, and the function that runs it."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel

from nemo_gym.cli.flags import Flag

if TYPE_CHECKING:
    from omegaconf import DictConfig

SettingsT = TypeVar("SettingsT", bound=BaseModel)


@dataclass(frozen=True)
class Positional:
    name: str
    help: str
    nargs: str | None = None
    choices: tuple[str, ...] | None = None


@dataclass(frozen=True)
class Invocation:
    """What a handler receives: parsed flags, the overrides to compose the config with, and the typed settings
    fields that flags set (see :func:`nemo_gym.cli.flags.flag_fields`)."""

    args: argparse.Namespace
    overrides: list[str]
    fields: dict[str, Any] = field(default_factory=dict)

    def get(self, name: str, default: Any = None) -> Any:
        return getattr(self.args, name, default)

    def entrypoint(self) -> str | None:
        """``+entrypoint=<type>/<impl>``, NeMo Gym's legacy way to name one server folder (``ng_pip_list``,
        ``ng_test``), as that label."""
        for token in self.overrides:
            if token.lstrip("+").startswith("entrypoint="):
                return token.split("=", 1)[1].strip("'\"").rstrip("/")
        return None

    def settings(self, model: type[SettingsT], config: DictConfig) -> SettingsT:
        """The command's typed settings: the composed config's keys, with the flags' fields set on top."""
        from nemo_gym.config.tree import plain_dict, set_path

        data = plain_dict(config)
        for path, value in self.fields.items():
            set_path(data, path, value)
        return model.model_validate(data)


Handler = Callable[[Invocation], "int | None"]


@dataclass(frozen=True)
class Command:
    group: str | None
    action: str
    help: str
    handler: Handler
    flags: tuple[Flag, ...] = ()
    positionals: tuple[Positional, ...] = ()
    description: str | None = None
    examples: tuple[str, ...] = field(default_factory=tuple)

    @property
    def words(self) -> tuple[str, ...]:
        return (self.group, self.action) if self.group else (self.action,)
