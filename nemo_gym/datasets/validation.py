"""Checking dataset rows: each line must be a JSON object whose ``responses_create_params`` are valid create params.

Data preparation wants every bad line of a file, not just the first, so :func:`iter_checked_lines` never raises on a
bad line: it hands back the line number and the reason, and the caller decides. :func:`create_params_problem` is the
single place that says what makes create params invalid, so every command rejects the same rows with the same words.
:func:`check_params_ahead` reaches its verdicts on a file before the run that needs them has started.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from stat import S_ISREG
from typing import Any

import orjson
from pydantic import ValidationError

from nemo_gym.errors import ConfigPathNotFoundError
from nemo_gym.openai_responses import NeMoGymResponseCreateParamsNonStreaming

CREATE_PARAMS_KEY = "responses_create_params"


@dataclass(frozen=True)
class CheckedLine:
    """One non-blank line of a JSONL file: the row if it parsed as an object, else why not."""

    number: int
    row: dict[str, Any] | None
    problem: str | None = None


def iter_checked_lines(path: Path) -> Iterator[CheckedLine]:
    """Every non-blank line of ``path`` in order, parsed; unparseable lines carry a problem instead of a row."""
    if not path.is_file():
        raise ConfigPathNotFoundError(f"dataset file {path} does not exist")
    with path.open("rb") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = orjson.loads(line)
            except orjson.JSONDecodeError as e:
                yield CheckedLine(number, None, f"not valid JSON ({e})")
                continue
            if not isinstance(row, dict):
                yield CheckedLine(number, None, f"each line must be a JSON object, got {type(row).__name__}")
                continue
            yield CheckedLine(number, row)


def create_params_problem(params: Any, overrides: dict[str, Any] | None = None) -> str | None:
    """Why ``params`` (with ``overrides`` merged over them) are not valid Responses create params, or None if valid."""
    if not isinstance(params, dict):
        return f"missing {CREATE_PARAMS_KEY} (a mapping of Responses API create params)"
    try:
        NeMoGymResponseCreateParamsNonStreaming.model_validate(params | (overrides or {}))
    except ValidationError as e:
        errors = e.errors()
        first = errors[0]
        location = ".".join(str(p) for p in first["loc"])
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        return f"{CREATE_PARAMS_KEY}.{location}: {first['msg']}{more}"
    return None


def row_problem(row: dict[str, Any]) -> str | None:
    """Why a dataset row cannot be sent to an agent, or None if it can."""
    return create_params_problem(row.get(CREATE_PARAMS_KEY))


FileVersion = tuple[int, int, int, int]
"""A file's device, inode, size and modification time (ns): it changes whenever the file is replaced or written."""


def file_version(path: Path) -> FileVersion | None:
    """None for anything but a regular file: reading a pipe ahead would take the rows from the run that needs them."""
    try:
        stat = path.stat()
    except OSError:
        return None
    if not S_ISREG(stat.st_mode):
        return None
    return stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns


@dataclass
class CheckedParams:
    """What :func:`create_params_problem` said, with no overrides, about the create params of a file's first lines,
    checked ahead of the run that reads the file (``rollouts/forked_check.py``). The verdicts hold only for that
    file while its :func:`file_version` is the one that was read."""

    path: Path
    """Resolved."""
    version: FileVersion
    problems: list[str | None] = field(default_factory=list)
    """By line number - 1; a blank line's entry is None (it is never asked about)."""

    def problems_for(self, path: Path, overrides: dict[str, Any]) -> list[str | None]:
        """The verdicts a run reading ``path`` can use, with ``overrides`` merged over each row's create params: all
        of them when it is the same file, unchanged, and there are no overrides; else none."""
        if overrides or file_version(path) != self.version or path.resolve() != self.path:
            return []
        return self.problems


def check_params_ahead(path: Path, stop: Callable[[], bool], every: int = 256) -> CheckedParams | None:
    """Check the create params of ``path``'s lines in order until the file ends, a line is not a JSON object (the run
    itself reports it), or ``stop()`` is true (asked every ``every`` lines); None if the file changed meanwhile."""
    version = file_version(path)
    if version is None:
        return None
    checked = CheckedParams(path.resolve(), version)
    problems = checked.problems
    for index, line in enumerate(iter_checked_lines(path)):
        if line.row is None or (index % every == 0 and stop()):
            break
        problems.extend([None] * (line.number - 1 - len(problems)))  # the blank lines before it
        problems.append(create_params_problem(line.row.get(CREATE_PARAMS_KEY)))
    return checked if file_version(path) == version else None
