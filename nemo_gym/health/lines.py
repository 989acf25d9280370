"""Rollout files read in blocks of whole lines for the health checks' map, so a worker gets thousands of rows per
task instead of one open-seek-read per row, and each row still knows its file, line number and position.

A line longer than a block is carried into the next one; blank lines keep their line numbers but take no position
(the position is a row's task index when it names none, as it was when rows were counted one by one).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

BLOCK_BYTES = 4 << 20
"""Bytes read per block: large enough that a worker's task costs far more than sending it."""


@dataclass(frozen=True)
class Block:
    """Whole lines of one file: ``data`` starts at line ``first_line`` (1-based); ``first_position`` counts the
    non-blank lines before it across every file."""

    path: str
    first_line: int
    first_position: int
    data: bytes

    def rows(self) -> Iterator[tuple[int, int, bytes]]:
        """``(line number, position, text)`` of each non-blank line."""
        position = self.first_position
        for number, text in enumerate(self.data.split(b"\n"), start=self.first_line):
            if text.strip():
                yield number, position, text
                position += 1


def blocks(paths: Sequence[Path], block_bytes: int | None = None) -> Iterator[Block]:
    """The files' lines in order, a block (of :data:`BLOCK_BYTES` unless told) at a time; each file read once."""
    size = block_bytes or BLOCK_BYTES
    position = 0
    for path in paths:
        line, carry = 1, b""
        with path.open("rb") as handle:
            while True:
                read = handle.read(size)
                data = carry + read
                if read:
                    cut = data.rfind(b"\n") + 1
                    if cut == 0:  # one line longer than a block so far: keep reading it
                        carry = data
                        continue
                    data, carry = data[:cut], data[cut:]
                if not data:
                    break
                block = Block(str(path), line, position, data)
                line += data.count(b"\n")
                position += sum(1 for text in data.split(b"\n") if text.strip())
                yield block
                if not read:
                    break
