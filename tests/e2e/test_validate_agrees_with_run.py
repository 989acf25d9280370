"""``gym env validate`` refuses what ``gym eval run`` refuses, with the same line: both call
``launcher/preflight.py:compose_to_start``.

Each case is a config mistake a run used to find only once it had started (or never: URL credentials beside an API
key made every model call fail with HTTP 500). Both commands run as real ``gym`` processes on the scripted model;
each must exit 1 with one ``error:`` line naming the file, line or key and the fix, before any server starts.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from nemo_gym import INSTALL_DIR
from nemo_gym.cli.main import main
from nemo_gym.config import ports
from tests.helpers import write

GYM = str(Path(sys.executable).parent / "gym")
WEATHER = "example_single_tool_call"
WEATHER_DATA = INSTALL_DIR / "resources_servers" / WEATHER / "data" / "example.jsonl"
SCRIPTED = ("--resources-server", WEATHER, "--model-type", "scripted_model")
URL_PASSWORD = "pw-never-echoed"


@dataclass
class Case:
    """Files to write (``env.yaml`` is used as the run's env.yaml), the config flags, and what the line must hold."""

    files: dict[str, str]
    args: tuple[str, ...]
    expected: tuple[str, ...]
    holds_port: bool = False
    """``{port}`` in files, args and expected is a port this test holds open."""

    def fill(self, text: str, port: int) -> str:
        return text.replace("{port}", str(port)) if self.holds_port else text


def block(*lines: str) -> str:
    """The weather resources server's block with ``lines`` added."""
    return f"{WEATHER}:\n  resources_servers:\n    {WEATHER}:\n" + "".join(f"      {line}\n" for line in lines)


CASES = {
    "implementation directory missing": Case(
        {"c.yaml": "ghost:\n  resources_servers:\n    no_such_impl:\n      entrypoint: app.py\n      domain: other\n"},
        (*SCRIPTED, "--config", "c.yaml"),
        ("c.yaml:3: ghost.resources_servers.no_such_impl: implementation directory", "--search-dir DIR"),
    ),
    "entrypoint missing": Case(
        {"c.yaml": block("entrypoint: main.py")},
        (*SCRIPTED, "--config", "c.yaml"),
        (f"c.yaml:4: {WEATHER}.resources_servers.{WEATHER}.entrypoint: 'main.py' not found in", "name a file there"),
    ),
    "interpolated key misspelt in env.yaml": Case(
        {"env.yaml": "polcy_model_name: gpt-x\n", "c.yaml": block("description: ${policy_model_name}")},
        (*SCRIPTED, "--config", "c.yaml"),
        (
            "c.yaml:4: config value",
            "env.yaml:1 sets 'polcy_model_name': did you mean 'policy_model_name'?",
            "Rename it there",
        ),
    ),  # fmt: skip
    "interpolated key never set": Case(
        {"c.yaml": block("description: ${judge_model_name}")},
        (*SCRIPTED, "--config", "c.yaml"),
        ("c.yaml:4: config value", "'judge_model_name'", "++judge_model_name=<value>"),
    ),
    "??? with its key misspelt on the command line": Case(
        {"c.yaml": "judge_model_name: ???\n"},
        (*SCRIPTED, "--config", "c.yaml", "+judge_modle_name=x"),
        (
            "c.yaml:1: required config value 'judge_model_name' is not set (???)",
            "the command line '+judge_modle_name=x' sets 'judge_modle_name': did you mean 'judge_model_name'?",
        ),
    ),  # fmt: skip
    "URL credentials beside an API key": Case(
        {
            "env.yaml": f"policy_base_url: https://user:{URL_PASSWORD}@example.invalid/v1\npolicy_api_key: sk-test\n"
            "policy_model_name: gpt-x\n"
        },
        ("--resources-server", WEATHER, "--model-type", "openai_model"),
        (
            "env.yaml:1: policy_base_url: the URL carries user:password@ credentials and policy_api_key is set too",
            "remove the user:password@ part",
        ),
    ),  # fmt: skip
    "configured port taken": Case(
        {"c.yaml": block("port: {port}")},
        (*SCRIPTED, "--config", "c.yaml"),
        (
            f"c.yaml:4: {WEATHER}.resources_servers.{WEATHER}.port:",
            "cannot listen on 127.0.0.1:{port}",
            "pick another port",
        ),
        holds_port=True,
    ),  # fmt: skip
    "port out of range": Case(
        {"c.yaml": block("port: 99999")},
        (*SCRIPTED, "--config", "c.yaml"),
        (f"c.yaml:4: {WEATHER}.resources_servers.{WEATHER}.port: must be less than or equal to 65535",),
    ),
    "head server port taken": Case(
        {},
        (*SCRIPTED, "+head_server.port={port}"),
        ("the head server cannot listen on 127.0.0.1:{port}", "+head_server.port=<port>"),
        holds_port=True,
    ),
    "replicas without a Ray cluster": Case(
        {"c.yaml": block("replicas: 2")},
        (*SCRIPTED, "--config", "c.yaml"),
        (f"c.yaml:4: {WEATHER}.resources_servers.{WEATHER}.replicas:", "pass --ray-address ADDRESS"),
    ),
    "no server instances": Case(
        {"c.yaml": "just_a_setting: 1\n"},
        ("--config", "c.yaml"),
        ("the config defines no server instances to start",),
    ),
}


@pytest.fixture
def held_port() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def gym(cwd: Path, env_yaml: Path | None, *args: str) -> subprocess.CompletedProcess[str]:
    env = os.environ | {"NEMO_GYM_ENV_YAML": str(env_yaml or ""), "PYTHONUNBUFFERED": "1"}
    return subprocess.run([GYM, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def error_line(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


@pytest.mark.parametrize("name", list(CASES))
def test_validate_and_eval_run_refuse_with_the_same_line(name: str, tmp_path: Path, held_port: int) -> None:
    case = CASES[name]
    for file, text in case.files.items():
        write(tmp_path / file, case.fill(text, held_port))
    env_yaml = tmp_path / "env.yaml" if "env.yaml" in case.files else None
    args = [case.fill(arg, held_port) for arg in case.args]
    if not any(arg.startswith("+head_server") for arg in args):
        args.append("+head_server.port=0")  # another run on this machine may hold 11000

    validated = error_line(gym(tmp_path, env_yaml, "env", "validate", *args))
    output = tmp_path / "out.jsonl"
    run = gym(tmp_path, env_yaml, "eval", "run", *args, "--input", str(WEATHER_DATA), "--output", str(output))
    assert error_line(run) == validated
    for expected in case.expected:
        assert case.fill(expected, held_port) in validated, validated
    assert URL_PASSWORD not in validated
    assert not list(tmp_path.glob("out*")) and not (tmp_path / "results" / "logs").exists()  # nothing started


def test_a_good_config_validates_and_gives_back_the_ports_it_checked(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    write(workdir / "c.yaml", block(f"port: {port}"))
    assert main(["env", "validate", *SCRIPTED, "--config", "c.yaml", "+head_server.port=0"]) == 0
    assert "Config is valid: 3 server instance(s)." in capsys.readouterr().out
    assert ports.get_reservation(WEATHER) is None
    with socket.socket() as again:
        again.bind(("127.0.0.1", port))  # validate bound it only to show it free, and let it go
