"""Secrets through a whole run, with the real ``gym`` commands, head server and servers.

The policy model is ``openai_model`` reaching a scripted model through a URL with credentials in it
(``http://u:<password>@127.0.0.1:<port>/v1``), with a bearer header under an unusual key: the servers need the real
values to do their work, the run's rewards are those of the scripted model, and nothing a command prints, the head
server serves or the run leaves on disk holds a secret.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import orjson
import pytest

from nemo_gym import INSTALL_DIR
from nemo_gym.config.ports import probe_free_port
from tests.helpers import run_headers, write

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

WEATHER = "example_single_tool_call"
API_KEY = "sk-e2e-key-0123456789"
URL_PASSWORD = "sk-e2e-pass-0123456789"
HEADER_TOKEN = "sk-e2e-header-0123456789"
SECRETS = (API_KEY, URL_PASSWORD, HEADER_TOKEN)
HANG_GUARD_S = 120


def free_port() -> int:
    """A free port outside the kernel's ephemeral range, which the run's own outgoing connections draw from: one
    from that range (bind to port 0) was once taken by such a connection before the server listened on it."""
    return probe_free_port()


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    """env.yaml with the secrets, and a config whose policy model reaches a scripted model through them."""
    upstream_port = free_port()
    write(
        tmp_path / "env.yaml",
        f"policy_base_url: http://u:{URL_PASSWORD}@127.0.0.1:{upstream_port}/v1\n"
        f"policy_api_key: {API_KEY}\n"
        "policy_model_name: scripted\n"
        f"custom_auth_header: Bearer {HEADER_TOKEN}\n",
    )
    write(
        tmp_path / "policy.yaml",
        f"""
scripted_upstream:
  responses_api_models:
    scripted_model:
      entrypoint: app.py
      port: {upstream_port}
policy_model:
  responses_api_models:
    openai_model:
      entrypoint: app.py
      openai_base_url: ${{policy_base_url}}
      openai_api_key: ""  # the URL carries the credentials (HTTP basic auth)
      openai_model: ${{policy_model_name}}
      openai_default_headers:
        X-Custom-Auth: ${{custom_auth_header}}
        X-Key-Copy: Bearer ${{policy_api_key}}
""",
    )
    return tmp_path


def env_for(run_dir: Path) -> dict[str, str]:
    return os.environ | {"NEMO_GYM_ENV_YAML": str(run_dir / "env.yaml"), "PYTHONUNBUFFERED": "1"}


def config_args(run_dir: Path) -> list[str]:
    return ["--resources-server", WEATHER, "--config", str(run_dir / "policy.yaml"), "+shared_venv=true",
            f"+cache_dir={run_dir / 'cache'}"]  # fmt: skip


def gym(run_dir: Path, *args: str) -> tuple[int, str]:
    done = subprocess.run(
        [sys.executable, "-m", "nemo_gym.cli.main", *args], cwd=run_dir, env=env_for(run_dir),
        capture_output=True, text=True, timeout=HANG_GUARD_S * 2,
    )  # fmt: skip
    return done.returncode, done.stdout + done.stderr


def assert_no_secret(text: str, where: str) -> None:
    for secret in SECRETS:
        assert secret not in text, f"{secret} in {where}:\n{text}"


def left_behind(run_dir: Path) -> list[Path]:
    """Files the run wrote (everything but the two inputs) that hold a secret."""
    inputs = {run_dir / "env.yaml", run_dir / "policy.yaml"}
    return [
        path
        for path in run_dir.rglob("*")
        if path.is_file() and path not in inputs and any(s.encode() in path.read_bytes() for s in SECRETS)
    ]


def rewards(path: Path) -> list[float]:
    return [orjson.loads(line)["reward"] for line in path.read_bytes().splitlines()]


def test_env_start_serves_and_prints_no_secret_and_leaves_none(run_dir: Path) -> None:
    launcher = subprocess.Popen(
        [sys.executable, "-m", "nemo_gym.cli.main", "env", "start", *config_args(run_dir), "+head_server={port: 0}"],
        cwd=run_dir, env=env_for(run_dir), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    assert launcher.stdout is not None
    lines: list[str] = []
    try:
        for line in launcher.stdout:  # blocks until the launcher prints; ends if it exits
            lines.append(line)
            if line.startswith("Press Ctrl-C to stop."):
                break
        head = re.search(r"Head server: (http://127\.0\.0\.1:(\d+))", "".join(lines))
        assert head, "".join(lines)
        drain = threading.Thread(target=lambda: lines.extend(launcher.stdout or ()), daemon=True)
        drain.start()  # keep reading, so the launcher never blocks on a full pipe

        token = run_headers(head.group(1), int(head.group(2)))
        served = {route: httpx.get(head.group(1) + route, headers=token, timeout=HANG_GUARD_S).text
                  for route in ("/", "/global_config_dict_yaml", "/server_instances")}  # fmt: skip
        for route, body in served.items():
            assert_no_secret(body, f"the head server's {route}")
        assert "http://****@127.0.0.1:" in served["/global_config_dict_yaml"]

        code, out = gym(run_dir, "env", "status", f"+head_server.port={head.group(2)}")
        assert code == 0, out
        assert_no_secret(out, "gym env status")

        code, out = gym(run_dir, "env", "resolve", *config_args(run_dir))
        assert code == 0 and "openai_base_url: http://****@127.0.0.1:" in out, out
        assert_no_secret(out, "gym env resolve")

        output = run_dir / "results" / "no_serve.jsonl"
        code, out = gym(
            run_dir, "eval", "run", "--no-serve", "--agent", f"{WEATHER}_simple_agent", "--limit", "2",
            "--input", str(INSTALL_DIR / "resources_servers" / WEATHER / "data" / "example.jsonl"),
            "--output", str(output), f"+head_server.port={head.group(2)}",
        )  # fmt: skip
        assert code == 0, out
        assert rewards(output) == [1.0, 1.0]  # the model server reached its upstream with the real credentials
        assert_no_secret(out, "gym eval run --no-serve")
    finally:
        launcher.send_signal(signal.SIGINT)
        assert launcher.wait(timeout=HANG_GUARD_S) == 0
    drain.join(timeout=HANG_GUARD_S)
    assert "NeMo Gym servers stopped." in "".join(lines)
    assert_no_secret("".join(lines), "gym env start's output")
    assert list((run_dir / "results" / "run").iterdir()) == []
    assert left_behind(run_dir) == []


def test_eval_run_keeps_its_rewards_and_leaves_no_secret(run_dir: Path) -> None:
    output = run_dir / "results" / "served.jsonl"
    code, out = gym(
        run_dir, "eval", "run", *config_args(run_dir), "+head_server={port: 0}", "--agent", f"{WEATHER}_simple_agent",
        "--input", str(INSTALL_DIR / "resources_servers" / WEATHER / "data" / "example.jsonl"), "--output", str(output),
    )  # fmt: skip
    assert code == 0, out
    assert rewards(output) == [1.0] * 5
    assert_no_secret(out, "gym eval run")
    assert list((run_dir / "results" / "run").iterdir()) == []
    assert left_behind(run_dir) == []
