"""The replay of recorded Anthropic traffic (``replay_server.py``), one process per test module."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

HERE = Path(__file__).parent


@dataclass(frozen=True)
class Replay:
    url: str
    api_key: str = "sk-ant-api03-replay"  # pragma: allowlist secret
    model: str = "claude-haiku-4-5-20251001"
    """What the recordings were made with: the adapter must send both."""

    def report(self) -> dict[str, Any]:
        """``served`` (fixture name -> times) and ``mismatches`` (one line each) so far."""
        return httpx.get(f"{self.url}/_replay/report", timeout=10).json()


@pytest.fixture(scope="module")
def replay() -> Iterator[Replay]:
    """The replay server, started on 127.0.0.1; its mismatches also print on this test's stderr."""
    api_key = Replay(url="").api_key
    command = [sys.executable, str(HERE / "replay_server.py"), str(HERE / "fixtures"), "--api-key", api_key]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    try:
        line = process.stdout.readline() if process.stdout else ""
        assert line.startswith("replay listening on "), f"the replay server did not start: {line!r}"
        yield Replay(url=line.split()[-1])
    finally:
        process.terminate()
        process.wait(timeout=10)
