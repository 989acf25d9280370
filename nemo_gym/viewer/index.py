"""A line-offset index of a rollout JSONL file: rows are read from disk on demand, never held in memory.

A 1 GB file of 100,000 rollouts costs one ``array('q')`` of byte offsets plus a few small typed arrays of per-row
summaries (reward, task, agent, failure class, tool calls, output length, turns, tokens): about 60 bytes a row, so
6 MB, whatever the rows weigh. :meth:`LineIndex.refresh` indexes only the bytes appended since its last call (whole
lines only: a line still being written waits for its newline), which is how a file that a running ``gym eval run`` is
still writing is followed. A file that shrank (replaced by ``--overwrite``) is indexed again from the start.
"""

from __future__ import annotations

import threading
from array import array
from pathlib import Path
from typing import Any

import orjson

from nemo_gym.failure_kinds import kind_of_class
from nemo_gym.row_fields import FAILURE_CLASS_KEY

NO_REWARD = float("nan")
READ_CHUNK = 1 << 20


class Interned:
    """Small strings (agent names, failure classes) stored once; rows keep a 2-byte id."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self._ids: dict[str, int] = {}

    def id_of(self, name: str) -> int:
        found = self._ids.get(name)
        if found is None:
            found = self._ids[name] = len(self.names)
            self.names.append(name)
        return found


def mapping(value: Any) -> dict[str, Any]:
    """``value`` when it is a JSON object, else an empty one: rows are untrusted and may be any shape."""
    return value if isinstance(value, dict) else {}


def _summary(row: dict[str, Any]) -> tuple[float, int, int, str, str, int, int, int, int, int]:
    """(reward, task, rollout, agent, failure kind, tool calls, output chars, turns, input tokens, output tokens)."""
    reward = row.get("reward")
    response = mapping(row.get("response"))
    output = response.get("output")
    output = output if isinstance(output, list) else []
    tool_calls = turns = chars = 0
    previous = None
    for item in output:
        if not isinstance(item, dict):
            continue
        kind = item.get("type")
        if kind == "function_call":
            tool_calls += 1
            turns += previous != "function_call"  # one model turn may call several tools at once
        elif kind == "message":
            turns += 1
            for part in item.get("content") or []:
                if isinstance(part, dict) and isinstance(part.get("text"), str):
                    chars += len(part["text"])
        previous = kind
    usage = mapping(response.get("usage"))
    ref = row.get("agent_ref")
    agent = str(ref.get("name", "unknown")) if isinstance(ref, dict) else str(ref or "unknown")
    failure = _failure_kind(row)
    return (
        float(reward) if isinstance(reward, int | float) and not isinstance(reward, bool) else NO_REWARD,
        _int(row.get("_ng_task_index")),
        _int(row.get("_ng_rollout_index")),
        agent,
        str(failure) if failure else "",
        tool_calls,
        chars,
        turns,
        _int(usage.get("input_tokens")),
        _int(usage.get("output_tokens")),
    )


def _failure_kind(row: dict[str, Any]) -> str:
    """A failure row's kind (``nemo_gym.failure_kinds``), what the viewer groups failures by; "" for a scored row."""
    failure_class = row.get(FAILURE_CLASS_KEY)
    if not failure_class:
        return ""
    named = row.get("failure_kind")
    return named if isinstance(named, str) and named else kind_of_class(str(failure_class))


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else -1


class LineIndex:
    """Offsets and summaries of one JSONL file's complete lines, grown by :meth:`refresh`."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.agents = Interned()
        self.failure_classes = Interned()
        self._lock = threading.Lock()
        self._reset()

    def _reset(self) -> None:
        self.offsets = array("q")
        self.reward = array("d")
        self.task = array("q")
        self.rollout = array("q")
        self.agent = array("H")
        self.failure = array("H")
        self.tool_calls = array("I")
        self.output_chars = array("I")
        self.turns = array("I")
        self.input_tokens = array("q")
        self.output_tokens = array("q")
        self.bad_lines = 0
        self.end = 0  # bytes indexed so far: always just after a newline
        self.generation = getattr(self, "generation", 0) + 1

    def __len__(self) -> int:
        return len(self.offsets)

    def refresh(self) -> int:
        """Index the complete lines appended since the last call; the number of new rows."""
        with self._lock:
            try:
                size = self.path.stat().st_size
            except FileNotFoundError:
                return 0
            if size < self.end:
                self._reset()
            if size == self.end:
                return 0
            before = len(self.offsets)
            with self.path.open("rb") as f:
                f.seek(self.end)
                pending = b""
                position = self.end
                while chunk := f.read(READ_CHUNK):
                    data = pending + chunk
                    start = 0
                    while (newline := data.find(b"\n", start)) != -1:
                        self._add(position + start, data[start:newline])
                        start = newline + 1
                    position += start
                    pending = data[start:]
                self.end = position
            return len(self.offsets) - before

    def _add(self, offset: int, line: bytes) -> None:
        if not line.strip():
            return
        try:
            row = orjson.loads(line)
        except orjson.JSONDecodeError:
            self.bad_lines += 1
            return
        if not isinstance(row, dict):
            self.bad_lines += 1
            return
        reward, task, rollout, agent, failure, tools, chars, turns, tokens_in, tokens_out = _summary(row)
        # the summaries first and the offset last: a reader sizes itself by len(offsets)
        self.reward.append(reward)
        self.task.append(task)
        self.rollout.append(rollout)
        self.agent.append(self.agents.id_of(agent))
        self.failure.append(self.failure_classes.id_of(failure))
        self.tool_calls.append(min(tools, 2**32 - 1))
        self.output_chars.append(min(chars, 2**32 - 1))
        self.turns.append(min(turns, 2**32 - 1))
        self.input_tokens.append(tokens_in)
        self.output_tokens.append(tokens_out)
        self.offsets.append(offset)

    def raw(self, i: int) -> bytes:
        """The JSON text of row ``i``, read from disk."""
        with self.path.open("rb") as f:
            f.seek(self.offsets[i])
            return f.readline().rstrip(b"\r\n")

    def row(self, i: int) -> dict[str, Any]:
        return orjson.loads(self.raw(i))

    def matching(self, rows: list[int], needle: bytes) -> list[int]:
        """The rows among ``rows`` whose JSON text contains ``needle`` (lower case): text search, one file handle."""
        found: list[int] = []
        if not rows:  # also: a sidecar that was never written
            return found
        with self.path.open("rb") as f:
            for i in rows:
                f.seek(self.offsets[i])
                if needle in f.readline().lower():
                    found.append(i)
        return found

    def agent_name(self, i: int) -> str:
        return self.agents.names[self.agent[i]]

    def failure_class(self, i: int) -> str:
        return self.failure_classes.names[self.failure[i]]
