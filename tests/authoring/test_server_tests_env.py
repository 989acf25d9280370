"""``gym env test --search-dir DIR``: the server's pytest process searches DIR too, as the launcher's children do."""

from __future__ import annotations

import subprocess
from typing import Any

from nemo_gym.authoring import server_tests
from nemo_gym.config.roots import EXTRA_ROOTS_ENV_VAR, searching


def test_server_test_process_gets_the_commands_search_roots(tmp_path, monkeypatch):
    server_dir = tmp_path / "resources_servers" / "probe"
    (server_dir / "tests").mkdir(parents=True)
    extra = tmp_path / "more_envs"
    extra.mkdir()
    monkeypatch.delenv(EXTRA_ROOTS_ENV_VAR, raising=False)
    seen: dict[str, Any] = {}

    def fake_run(command: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        seen.update(kwargs)
        return subprocess.CompletedProcess(command, 0, "1 passed\n", "")

    monkeypatch.setattr(server_tests.subprocess, "run", fake_run)
    with searching([extra]):
        result = server_tests.run_server_tests(server_dir, tmp_path / "cache", shared_venv=True)
    assert result.outcome == "passed"
    assert seen["env"][EXTRA_ROOTS_ENV_VAR] == str(extra.resolve())
    assert str(server_dir) in seen["env"]["PYTHONPATH"].split(":")
    without = server_tests.run_server_tests(server_dir, tmp_path / "cache", shared_venv=True)
    assert without.outcome == "passed" and EXTRA_ROOTS_ENV_VAR not in seen["env"]
