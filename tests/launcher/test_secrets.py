"""Secrets and the launcher, with real server processes: children get the real values, everything shown is masked,
and the run's config file (the only copy on disk) is gone however the run ends."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from nemo_gym.launcher import ServerLaunchError, running_servers
from tests.helpers import run_headers, write
from tests.launcher.conftest import base_overrides

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

API_KEY = "sk-launcher-key-0123456789"
URL_PASSWORD = "sk-url-pass-0123456789"
HEADER_TOKEN = "sk-header-tok-0123456789"
ENV_ONLY = "team-blob-0123456789"
SECRETS = (API_KEY, URL_PASSWORD, HEADER_TOKEN, ENV_ONLY)

REPORTER_APP = """
import os
import sys

import uvicorn
from fastapi import FastAPI
from omegaconf import OmegaConf

name = os.environ["NEMO_GYM_CONFIG_PATH"]
config = OmegaConf.to_container(OmegaConf.load(os.environ["NEMO_GYM_CONFIG_FILE"]), resolve=True)
inner = next(iter(next(iter(config[name].values())).values()))
print(f"{name} starting with {inner}", flush=True)  # a server that logs its config, secrets and all
app = FastAPI()


@app.get("/")
def health():
    return {"status": "ok"}


@app.get("/config")
def whole_config():
    return inner


if inner.get("crash"):
    print(f"boom, my key was {inner['api_key']}", file=sys.stderr, flush=True)
    sys.exit(3)
uvicorn.run(app, fd=int(os.environ["NEMO_GYM_LISTEN_FD"]), log_level="warning")
"""


def get(url: str) -> Any:
    with urllib.request.urlopen(urllib.request.Request(url, headers=run_headers(url)), timeout=60) as response:
        return json.loads(response.read())


@pytest.fixture
def secret_config(server_root: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """A server block whose values come from env.yaml: a key, a URL with credentials, a bearer header under an
    unusual key, and a value under an unusual key that only env.yaml says is secret."""
    write(server_root / "resources_servers" / "reporter" / "app.py", REPORTER_APP)
    env_yaml = write(
        server_root / "env.yaml",
        f"policy_api_key: {API_KEY}\n"
        f"policy_base_url: http://u:{URL_PASSWORD}@127.0.0.1:9/v1\n"
        f"custom_auth_header: Bearer {HEADER_TOKEN}\n"
        f"team_blob: {ENV_ONLY}\n",
    )
    monkeypatch.setenv("NEMO_GYM_ENV_YAML", str(env_yaml))
    config = write(
        server_root / "config.yaml",
        "reporter:\n  resources_servers:\n    reporter:\n      entrypoint: app.py\n      domain: other\n"
        "      api_key: ${policy_api_key}\n      base_url: ${policy_base_url}\n"
        "      headers: {X-Custom: '${custom_auth_header}', X-Team: '${team_blob}'}\n",
    )
    return base_overrides(server_root, config)


def assert_no_secret(text: str, where: str) -> None:
    for secret in SECRETS:
        assert secret not in text, f"{secret} in {where}:\n{text}"


def files_holding_secrets(root: Path) -> list[Path]:
    found = []
    for path in root.rglob("*"):
        if path.is_file() and any(s.encode() in path.read_bytes() for s in SECRETS):
            found.append(path)
    return found


def test_children_get_real_values_the_head_server_and_logs_show_none(
    server_root: Path, secret_config: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with running_servers(secret_config, echo=True) as run:
        real = get(run.urls["reporter"] + "/config")
        assert real["api_key"] == API_KEY and real["base_url"] == f"http://u:{URL_PASSWORD}@127.0.0.1:9/v1"
        assert real["headers"] == {"X-Custom": f"Bearer {HEADER_TOKEN}", "X-Team": ENV_ONLY}

        for route in ("/", "/global_config_dict_yaml", "/server_instances"):
            assert_no_secret(json.dumps(get(run.head_url + route)), f"head server {route}")
        shown = yaml.safe_load(get(run.head_url + "/global_config_dict_yaml"))["reporter"]["resources_servers"]
        assert shown["reporter"]["base_url"] == "http://****@127.0.0.1:9/v1"  # where it points stays visible
        assert shown["reporter"]["headers"] == {"X-Custom": "****", "X-Team": "****"}  # both whole env.yaml values

        assert run.config_path is not None and API_KEY in run.config_path.read_text()
        config_path = run.config_path
    assert not config_path.exists() and not config_path.parent.exists()
    log = (server_root / "results" / "logs" / "reporter.log").read_text()
    assert "reporter starting with" in log
    assert_no_secret(log, "the server's log")
    assert_no_secret(capsys.readouterr().out, "the launcher's echo of the log")
    assert files_holding_secrets(server_root / "results") == []


def test_the_config_file_goes_on_ctrl_c(server_root: Path, secret_config: list[str]) -> None:
    with pytest.raises(KeyboardInterrupt), running_servers(secret_config) as run:
        config_path = run.config_path
        raise KeyboardInterrupt
    assert config_path is not None and not config_path.exists()
    assert files_holding_secrets(server_root / "results") == []


SIGTERM_SCRIPT = """
import os, signal, sys
from nemo_gym.launcher import running_servers
try:
    with running_servers(sys.argv[1:]) as run:
        print(run.config_path, run.server_instances()[0]["pid"], flush=True)
        os.kill(os.getpid(), signal.SIGTERM)
except KeyboardInterrupt:
    print("stopped in order", flush=True)
"""


def test_sigterm_stops_the_servers_in_order_and_removes_the_config_file(
    server_root: Path, secret_config: list[str]
) -> None:
    """In a process of its own: without the orderly path, SIGTERM would end that process, not a test run."""
    done = subprocess.run(
        [sys.executable, "-c", SIGTERM_SCRIPT, *secret_config], capture_output=True, text=True, timeout=240
    )
    lines = done.stdout.splitlines()
    assert done.returncode == 0 and lines[-1] == "stopped in order", done.stdout + done.stderr
    config_path, pid = lines[0].split()
    assert not Path(config_path).exists()
    with pytest.raises(ProcessLookupError):
        os.kill(int(pid), 0)
    assert files_holding_secrets(server_root / "results") == []


def test_a_failed_start_removes_the_config_file_and_its_error_shows_no_secret(
    server_root: Path, secret_config: list[str]
) -> None:
    with pytest.raises(ServerLaunchError) as failure:
        with running_servers([*secret_config, "++reporter.resources_servers.reporter.crash=true"]):
            pass
    message = str(failure.value)
    assert "boom, my key was ****" in message
    assert_no_secret(message, "the launch error")
    assert list((server_root / "results" / "run").iterdir()) == []
    assert files_holding_secrets(server_root / "results") == []
