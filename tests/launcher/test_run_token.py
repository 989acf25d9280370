"""The run's token through a launch: made at start, in the children's config file and a 0600 token file, required by
the head server, gone at stop; ``auth: false`` (``--no-auth``) makes none and requires none."""

from __future__ import annotations

import stat
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from nemo_gym.cli.flags import AUTH_FLAG
from nemo_gym.launcher import running_servers
from nemo_gym.transport import access
from tests.launcher.conftest import base_overrides, server_block

HANG_GUARD_S = 60


def status_of(url: str, headers: dict[str, str] | None = None) -> int:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=HANG_GUARD_S) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


@pytest.fixture
def config(server_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(access.TOKEN_DIR_ENV_VAR, str(tmp_path / "tokens"))
    monkeypatch.delenv(access.TOKEN_ENV_VAR, raising=False)
    path = server_root / "config.yaml"
    path.write_text(server_block("echo_a", "echo"))
    return path


def test_a_run_makes_a_token_the_head_server_requires_and_removes_it_at_stop(server_root: Path, config: Path) -> None:
    with running_servers(base_overrides(server_root, config)) as run:
        head_port = int(run.head_url.rsplit(":", 1)[1])
        token_path = access.token_file("127.0.0.1", head_port)
        assert stat.S_IMODE(token_path.stat().st_mode) == 0o600
        assert stat.S_IMODE(token_path.parent.stat().st_mode) == 0o700
        token = token_path.read_text()
        assert len(token) >= 32
        assert yaml.safe_load(run.config_path.read_text())[access.RUN_TOKEN_KEY] == token  # the children's copy
        assert access.RUN_TOKEN_KEY not in run.config  # what callers (and the collector) are handed: no token
        assert status_of(run.head_url + "/server_instances") == 401
        assert status_of(run.head_url + "/server_instances", {access.TOKEN_HEADER: token}) == 200
        # This process's own calls to the run's servers carry it; a call anywhere else never does.
        assert access.registered_token(run.urls["echo_a"]) == token
        assert access.registered_token("https://api.openai.com/v1") is None
        assert access.headers_for("https://api.openai.com:443", None) is None
        assert "Run token" in run.banner() and token not in run.banner()
    assert not token_path.exists()
    assert access.registered_token(run.urls["echo_a"]) is None


def test_auth_false_makes_no_token_and_requires_none(server_root: Path, config: Path, tmp_path: Path) -> None:
    assert AUTH_FLAG.override_key == access.AUTH_KEY and AUTH_FLAG.switch_value == "false"  # --no-auth is auth=false
    with running_servers([*base_overrides(server_root, config), "+auth=false"]) as run:
        assert status_of(run.head_url + "/server_instances") == 200
        assert access.RUN_TOKEN_KEY not in yaml.safe_load(run.config_path.read_text())
        assert not list((tmp_path / "tokens").glob("*.token"))
        assert "Run token" not in run.banner()
