"""The declarative shape of a CLI command: where it sits in the tree, its flags, and the function that runs it."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from nemo_gym.cli.flags import Flag


@dataclass(frozen=True)
class Positional:
    name: str
    help: str
    nargs: str | None = None
    choices: tuple[str, ...] | None = None


@dataclass(frozen=True)
class Invocation:
    """What a handler receives: parsed flags and the Hydra overrides they (and the user's tokens) amount to."""

    args: argparse.Namespace
    overrides: list[str]

    def get(self, name: str, default: Any = None) -> Any:
        return getattr(self.args, name, default)


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
