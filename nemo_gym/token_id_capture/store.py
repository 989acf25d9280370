"""Gym's own ``TokenSink`` and ``TokenSource``: one JSONL file of ``TokenEntry`` lines per rollout.

Why files: the model-server workers and the collector are separate processes on one node, and a directory with
``flock`` gives them durable, ordered, shared records with no service to run. Per rollout ``<id>``:
``<id>.tokens.jsonl`` (entries, each fsync-ed before ``put`` returns), ``<id>.tokens.state.json`` (version, freeze,
retirement; replaced atomically), ``<id>.tokens.intents`` (calls dispatched, so a call lost without a trace still
masks the rollout), ``<id>.tokens.incomplete`` (calls known lost) and ``<id>.tokens.lock``. Rollouts never share a lock.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from uuid import uuid4

import orjson

from nemo_gym.token_id_capture.protocols import TokenCaptureSnapshot
from nemo_gym.token_id_capture.records import TokenEntry

logger = logging.getLogger(__name__)


def validate_rollout_id(rollout_id: str) -> str:
    """A rollout id becomes a file name: ASCII letters, digits, '.', '_', '-' only, never empty or leading '.'."""
    allowed = all(char.isascii() and (char.isalnum() or char in "._-") for char in rollout_id or "")
    if not rollout_id or not allowed or rollout_id.startswith("."):
        raise ValueError(f"invalid rollout id {rollout_id!r}")
    return rollout_id


def _fsync_directory(directory: Path) -> None:
    handle = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(handle)
    finally:
        os.close(handle)


def _append_line(path: Path, line: bytes) -> None:
    with path.open("ab") as out:
        out.write(line)
        out.flush()
        os.fsync(out.fileno())


class TokenCaptureStore:
    """Durable per-rollout records with freeze, conditional retirement and loss markers."""

    def __init__(self, root: str | Path) -> None:
        self._root = Path(root)
        self._root.mkdir(parents=True, exist_ok=True)

    @property
    def root(self) -> Path:
        return self._root

    def _file(self, rollout_id: str, suffix: str) -> Path:
        return self._root / f"{validate_rollout_id(rollout_id)}.tokens{suffix}"

    def path_for(self, rollout_id: str) -> Path:
        return self._file(rollout_id, ".jsonl")

    def state_path_for(self, rollout_id: str) -> Path:
        return self._file(rollout_id, ".state.json")

    def intents_path_for(self, rollout_id: str) -> Path:
        return self._file(rollout_id, ".intents")

    def incomplete_path_for(self, rollout_id: str) -> Path:
        return self._file(rollout_id, ".incomplete")

    def lock_path_for(self, rollout_id: str) -> Path:
        return self._file(rollout_id, ".lock")

    @contextmanager
    def locked(self, rollout_id: str, *, shared: bool = False) -> Iterator[None]:
        """Hold the rollout's lock (shared for readers); every file of the rollout is read or written under it."""
        mode = fcntl.LOCK_SH if shared else fcntl.LOCK_EX
        with self.lock_path_for(rollout_id).open("a+b") as lock_file:
            descriptor = lock_file.fileno()
            fcntl.flock(descriptor, mode)
            try:
                yield
            finally:
                fcntl.flock(descriptor, fcntl.LOCK_UN)

    # -- state ----------------------------------------------------------------------------------------------------

    def _state(self, rollout_id: str) -> dict[str, Any]:
        path = self.state_path_for(rollout_id)
        state: dict[str, Any] = orjson.loads(path.read_bytes()) if path.exists() else {}
        state.setdefault("version", 0)
        return state

    def _save_state(self, rollout_id: str, state: Mapping[str, Any]) -> None:
        payload = orjson.dumps(dict(state), option=orjson.OPT_SORT_KEYS)
        with tempfile.NamedTemporaryFile(dir=self._root, prefix=".tokens-state-", delete=False) as out:
            out.write(payload)
            out.flush()
            os.fsync(out.fileno())
        os.replace(out.name, self.state_path_for(rollout_id))
        _fsync_directory(self._root)

    @staticmethod
    def _refuse_writes(rollout_id: str, state: Mapping[str, Any], *, after_freeze: bool = False) -> None:
        if state.get("retired"):
            raise RuntimeError(f"the token capture of rollout {rollout_id} is retired")
        if after_freeze and state.get("frozen"):
            raise RuntimeError(f"the token capture of rollout {rollout_id} is already frozen")

    # -- entries --------------------------------------------------------------------------------------------------

    def _lines(self, rollout_id: str, *, repair: bool = False) -> list[bytes]:
        """The committed lines; an unparsable last line was never acknowledged and is dropped (cut off if ``repair``)."""
        path = self.path_for(rollout_id)
        if not path.exists():
            return []
        content = path.read_bytes()
        lines = content.split(b"\n")
        if lines and lines[-1].strip():
            try:
                orjson.loads(lines[-1])
            except orjson.JSONDecodeError:
                logger.warning("dropping a torn last line of %s", path)
                if repair:
                    os.truncate(path, len(content) - len(lines[-1]))
                lines = lines[:-1]
        return [line.strip() for line in lines if line.strip()]

    def _read_entries(self, rollout_id: str) -> list[TokenEntry]:
        return [TokenEntry.model_validate(orjson.loads(line)) for line in self._lines(rollout_id)]

    def read_entries(self, rollout_id: str) -> list[TokenEntry]:
        with self.locked(rollout_id, shared=True):
            return self._read_entries(rollout_id)

    def append(self, entry: TokenEntry) -> None:
        """Write one entry and fsync it; the identical entry again is a no-op, a different one for its id an error."""
        rollout_id = entry.rollout_id
        line = orjson.dumps(entry.model_dump(mode="json"), option=orjson.OPT_SORT_KEYS)
        with self.locked(rollout_id):
            state = self._state(rollout_id)
            self._refuse_writes(rollout_id, state, after_freeze=True)
            for existing in self._lines(rollout_id, repair=True):
                if orjson.loads(existing).get("model_call_id") != entry.model_call_id:
                    continue
                if existing == line:
                    return
                state.update(incomplete=True, version=state["version"] + 1)
                self._save_state(rollout_id, state)
                raise ValueError(
                    f"model call {entry.model_call_id!r} of rollout {rollout_id!r} was recorded differently"
                )
            _append_line(self.path_for(rollout_id), line + b"\n")
            state["version"] += 1
            self._save_state(rollout_id, state)

    async def put(self, entry: TokenEntry) -> None:
        await asyncio.to_thread(self.append, entry)

    def begin_call_now(self, rollout_id: str, model_call_id: str) -> None:
        """Record that a call is about to be generated: if its entry never arrives, the rollout is masked."""
        with self.locked(rollout_id):
            self._refuse_writes(rollout_id, self._state(rollout_id), after_freeze=True)
            _append_line(self.intents_path_for(rollout_id), model_call_id.encode() + b"\n")

    async def begin_call(self, rollout_id: str, model_call_id: str) -> None:
        await asyncio.to_thread(self.begin_call_now, rollout_id, model_call_id)

    def mark_incomplete_now(self, rollout_id: str, model_call_id: str = "") -> None:
        """Flag the rollout as missing a call; allowed after freeze (it bumps the version, so a stale drop fails)."""
        with self.locked(rollout_id):
            state = self._state(rollout_id)
            self._refuse_writes(rollout_id, state)
            _append_line(self.incomplete_path_for(rollout_id), model_call_id.encode() + b"\n")
            state.update(incomplete=True, version=state["version"] + 1)
            self._save_state(rollout_id, state)

    async def mark_incomplete(self, rollout_id: str, model_call_id: str = "") -> None:
        await asyncio.to_thread(self.mark_incomplete_now, rollout_id, model_call_id)

    def is_incomplete(self, rollout_id: str) -> bool:
        with self.locked(rollout_id, shared=True):
            return bool(self._state(rollout_id).get("incomplete"))

    def _dangling_intents(self, rollout_id: str, entries: tuple[TokenEntry, ...]) -> list[str]:
        path = self.intents_path_for(rollout_id)
        if not path.exists():
            return []
        recorded = {entry.model_call_id for entry in entries}
        intents = [line.decode() for line in path.read_bytes().split() if line]
        return [call_id for call_id in intents if call_id not in recorded]

    # -- source ---------------------------------------------------------------------------------------------------

    def freeze_now(self, rollout_id: str) -> TokenCaptureSnapshot:
        """Stop further ``put`` calls and return the records; freezing again returns the same snapshot id."""
        with self.locked(rollout_id):
            state = self._state(rollout_id)
            self._refuse_writes(rollout_id, state)
            if not state.get("frozen"):
                state.update(frozen=True, snapshot_id=uuid4().hex, version=state["version"] + 1)
                self._save_state(rollout_id, state)
            entries = tuple(self._read_entries(rollout_id))
            lost = self._dangling_intents(rollout_id, entries)
            return TokenCaptureSnapshot(
                rollout_id=rollout_id,
                entries=entries,
                incomplete=bool(state.get("incomplete")) or bool(lost),
                snapshot_id=str(state["snapshot_id"]),
                version=int(state["version"]),
            )

    async def freeze(self, rollout_id: str) -> TokenCaptureSnapshot:
        return await asyncio.to_thread(self.freeze_now, rollout_id)

    def drop_now(self, rollout_id: str, snapshot_id: str, version: int) -> bool:
        """Delete the records of exactly this snapshot, keeping a retired tombstone so a late writer still fails."""
        with self.locked(rollout_id):
            state = self._state(rollout_id)
            if not state.get("frozen") or state.get("snapshot_id") != snapshot_id or state["version"] != version:
                return False
            for path in (self.path_for(rollout_id), self.intents_path_for(rollout_id)):
                path.unlink(missing_ok=True)
            self.incomplete_path_for(rollout_id).unlink(missing_ok=True)
            state["retired"] = True
            self._save_state(rollout_id, state)
            return True

    async def drop(self, rollout_id: str, *, snapshot_id: str, version: int) -> bool:
        return await asyncio.to_thread(self.drop_now, rollout_id, snapshot_id, version)

    def delete(self, rollout_id: str) -> None:
        """Forget a rollout entirely (before a rollout id is used again), tombstone included."""
        with self.locked(rollout_id):
            for suffix in (".jsonl", ".state.json", ".intents", ".incomplete"):
                self._file(rollout_id, suffix).unlink(missing_ok=True)

    async def close(self) -> None:
        """Nothing to release: every write was durable before it returned."""


def make_token_store(global_config_dict: Any) -> TokenCaptureStore | None:
    """The run's file store, or None when capture is off, has no directory, or a configured sink replaces it."""
    from nemo_gym.token_id_capture.config import token_id_capture_config

    config = token_id_capture_config(global_config_dict)
    directory = config.resolved_dir()
    if not config.enabled or config.token_id_capture.sink is not None or directory is None:
        return None
    return TokenCaptureStore(directory)
