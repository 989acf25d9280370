"""JSONL reading and writing with errors that point at the file and line, and writes that survive a crash.

Rows are read lazily (constant memory however large the file) and written one line at a time, flushed, so an
interrupted run leaves every finished row on disk and at most one partial last line, which :func:`repair_tail` drops.
A row written twice (the same key) is removed by :func:`drop_repeated_rows`, which never rewrites a file in place.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Hashable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import orjson

from nemo_gym.errors import ConfigError, ConfigPathNotFoundError

KeyT = TypeVar("KeyT", bound=Hashable)


class BadLineError(ConfigError):
    """A line of a JSONL file that is not a row, or not the row its reader needs: ``path:line: reason``. Its
    ``path`` and ``line`` let a caller say what to do about that file (e.g. the results ``--resume`` reads)."""

    def __init__(self, path: Path, line: int, reason: str) -> None:
        super().__init__(f"{path}:{line}: {reason}")
        self.path, self.line, self.reason = path, line, reason


def keyed_rows(path: Path, key: Callable[[dict[str, Any]], KeyT]) -> Iterator[tuple[int, int, KeyT, dict[str, Any]]]:
    """:func:`iter_jsonl_spans` with each row's ``key``: ``(offset, length, key, row)``; a row the key cannot be read
    from (a missing or mistyped field) is a :class:`BadLineError` naming its line."""
    for number, offset, length, row in iter_jsonl_spans(path):
        try:
            row_key = key(row)
        except (KeyError, TypeError, ValueError) as e:
            raise BadLineError(path, number, f"not a row of this kind ({type(e).__name__}: {e})") from e
        yield offset, length, row_key, row


def iter_jsonl(path: Path, limit: int | None = None) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield ``(line_number, row)`` for each non-blank line; a line that is not a JSON object is a ConfigError."""
    for number, _, _, row in iter_jsonl_spans(path, limit):
        yield number, row


def iter_jsonl_spans(path: Path, limit: int | None = None) -> Iterator[tuple[int, int, int, dict[str, Any]]]:
    """Like :func:`iter_jsonl`, with each line's byte offset and length: ``(line_number, offset, length, row)``.

    The span lets a caller re-read one row later (to write rows in another order) without keeping rows in memory.
    """
    for number, offset, line, row in _iter_lines(path, limit):
        yield number, offset, len(line), row


def iter_jsonl_lines(path: Path, limit: int | None = None) -> Iterator[tuple[int, bytes, dict[str, Any]]]:
    """Like :func:`iter_jsonl`, with each line as read (its line break included): ``(line_number, line, row)``.

    A caller that passes a row on unchanged can send or keep these bytes instead of the parsed row.
    """
    for number, _, line, row in _iter_lines(path, limit):
        yield number, line, row


def _iter_lines(path: Path, limit: int | None) -> Iterator[tuple[int, int, bytes, dict[str, Any]]]:
    if not path.is_file():
        raise ConfigPathNotFoundError(f"input file {path} does not exist")
    count = 0
    offset = 0
    with path.open("rb") as f:
        for number, line in enumerate(f, start=1):
            start = offset
            offset += len(line)
            if not line.strip():
                continue
            if limit is not None and count >= limit:
                return
            try:
                row = orjson.loads(line)
            except orjson.JSONDecodeError as e:
                raise BadLineError(path, number, f"not valid JSON ({e})") from e
            if not isinstance(row, dict):
                raise BadLineError(path, number, f"each line must be a JSON object, got {type(row).__name__}")
            count += 1
            yield number, start, line, row


class JsonlWriter:
    """Append rows to a JSONL file, one flushed line per row."""

    def __init__(self, path: Path, append: bool = True) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._file = path.open("ab" if append else "wb")

    def write(self, row: dict[str, Any]) -> None:
        self._file.write(orjson.dumps(row, option=orjson.OPT_APPEND_NEWLINE | orjson.OPT_SERIALIZE_NUMPY))
        self._file.flush()

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> JsonlWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def repair_tail(path: Path) -> bool:
    """Drop a partial last line left by a crash mid-write; True if something was dropped."""
    if not path.is_file() or path.stat().st_size == 0:
        return False
    with path.open("rb+") as f:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        chunk = min(size, 1 << 20)
        f.seek(size - chunk)
        tail = f.read(chunk)
        if tail.endswith(b"\n"):
            return False
        cut = tail.rfind(b"\n")
        f.truncate(size - chunk + cut + 1 if cut >= 0 else (0 if chunk == size else size))
        return True


def drop_repeated_rows(path: Path, key: Callable[[dict[str, Any]], KeyT]) -> tuple[set[KeyT], int]:
    """The keys of a JSONL file's rows, after removing every row whose key an earlier row already has.

    Returns ``(keys, rows dropped)``. The file is rewritten only when there is something to drop: every other line is
    copied byte for byte into a temporary file beside it, flushed to disk, which then replaces it, so a crash midway
    leaves the old file whole. Only the keys and the spans of the repeated lines are held in memory.
    """
    keys: set[KeyT] = set()
    repeated: list[tuple[int, int]] = []
    for offset, length, row_key, _ in keyed_rows(path, key):
        if row_key in keys:
            repeated.append((offset, length))
        else:
            keys.add(row_key)
    if repeated:
        temporary = path.with_name(f".{path.name}.tmp")
        with path.open("rb") as source, temporary.open("wb") as target:
            position = 0
            for offset, length in repeated:
                _copy_bytes(source, target, offset - position)
                position = source.seek(offset + length)
            shutil.copyfileobj(source, target)
            target.flush()
            os.fsync(target.fileno())
        shutil.copymode(path, temporary)
        os.replace(temporary, path)
    return keys, len(repeated)


def _copy_bytes(source: Any, target: Any, count: int) -> None:
    while count > 0:
        chunk = source.read(min(count, 1 << 20))
        if not chunk:
            return
        target.write(chunk)
        count -= len(chunk)


def write_json_atomic(path: Path, value: Any) -> None:
    """Write a JSON file via a temporary file and rename, so readers never see half a file."""
    write_bytes_atomic(path, orjson.dumps(value, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY))


def write_text_atomic(path: Path, text: str) -> None:
    """Write a text file (UTF-8) via a temporary file and rename."""
    write_bytes_atomic(path, text.encode("utf-8"))


def write_bytes_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_bytes(data)
    os.replace(temporary, path)


def check_writable_output(path: str | Path, flag: str = "--output") -> Path:
    """Make the directory of an output file and prove a file can be created in it, before any work starts.

    Testing permissions is not enough (root passes every check, ``/proc`` refuses anyway), so a probe file is created
    and removed. A path that cannot be written is one line naming the flag and the reason.
    """
    target = Path(path).expanduser()
    if target.is_dir():
        raise ConfigError(f"{flag} {target} is a directory; give a file path, e.g. {target / 'rollouts.jsonl'}")
    existing = next((p for p in target.parents if p.exists()), None)
    if existing is not None and not existing.is_dir():
        raise ConfigError(f"{flag} {target}: {existing} is a file, not a directory")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        probe = target.with_name(f".{target.name}.{os.getpid()}.probe")
        probe.touch()
        probe.unlink()
        if target.exists() and not os.access(target, os.W_OK):
            raise PermissionError(13, "Permission denied")
    except OSError as e:
        raise ConfigError(f"{flag} {target}: cannot write there ({e.strerror or e})") from None
    return target
