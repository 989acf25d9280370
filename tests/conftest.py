"""Shared fixtures. Each one resets a piece of process-global state that would otherwise leak between tests."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from nemo_gym.config import ports
from nemo_gym.global_config import reset_global_config_dict

# A shell starts background jobs with SIGINT ignored, and children inherit an ignored signal: tests that interrupt a
# run or a launcher with SIGINT (as a user's Ctrl-C) would see it ignored. Children inherit a handler as the default.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(autouse=True)
def _isolated_config_state(monkeypatch: pytest.MonkeyPatch):
    """No env.yaml, extra roots or launcher hand-off from the developer's shell leaks into a test; the cached
    global config and held port sockets are dropped after each test."""
    monkeypatch.setenv("NEMO_GYM_ENV_YAML", "")
    for name in ("NEMO_GYM_EXTRA_ROOTS", "NEMO_GYM_CONFIG_FILE", "NEMO_GYM_CONFIG_DICT", "NEMO_GYM_CONFIG_PATH"):
        monkeypatch.delenv(name, raising=False)
    reset_global_config_dict()
    yield
    reset_global_config_dict()
    ports.release_all()


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A temporary working directory (relative config paths resolve against cwd)."""
    monkeypatch.chdir(tmp_path)
    return tmp_path
