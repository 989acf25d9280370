"""A new user's mistakes in configs and flags: each one is a single error line, before anything starts.

Every test checks the exit code, that stderr holds exactly one ``error:`` line and no traceback, and that the line
names the key path or flag (with the file and line, and a "did you mean", where there is one).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import nemo_gym.launcher
import nemo_gym.launcher.runner
from nemo_gym import INSTALL_DIR
from nemo_gym.cli.main import main
from nemo_gym.global_config import parse_global_config_dict
from tests.helpers import write

WEATHER_DATA = INSTALL_DIR / "resources_servers" / "example_single_tool_call" / "data" / "example.jsonl"

WEATHER = """\
weather2:
  resources_servers:
    example_single_tool_call:
      entrypoint: app.py
      domain: agent
weather2_agent:
  responses_api_agents:
    simple_agent:
      entrypoint: app.py
      resources_server: {type: resources_servers, name: weather2}
      model_server: {type: responses_api_models, name: policy_model}
      max_steps: 2
"""


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def one_error_line(code: int, err: str) -> str:
    """The single ``error:`` line of a failed command (and nothing else on stderr)."""
    assert code != 0
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


@pytest.fixture
def servers_never_start(monkeypatch: pytest.MonkeyPatch) -> None:
    """``gym eval run`` fails the test instead of starting servers."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("servers were started")

    monkeypatch.setattr(nemo_gym.launcher, "running_servers", refuse)
    monkeypatch.setattr(nemo_gym.launcher.runner, "Launcher", refuse)


# ---------------------------------------------------------------------------------------------------------------------
# Keys of server blocks


@pytest.mark.parametrize(
    ("typo", "line", "path", "meant"),
    [
        ("      max_steps: 2", "      max_stepss: 2", "weather2_agent.responses_api_agents.simple_agent.max_stepss",
         "max_steps"),
        ("      entrypoint: app.py\n      resources_server", "      entrypont: app.py\n      resources_server",
         "weather2_agent.responses_api_agents.simple_agent.entrypont", "entrypoint"),
        ("      domain: agent", "      domian: agent", "weather2.resources_servers.example_single_tool_call.domian",
         "domain"),
    ],
)  # fmt: skip
def test_a_typo_in_a_server_block_is_one_line_with_file_line_and_did_you_mean(
    workdir: Path, capsys: pytest.CaptureFixture[str], typo: str, line: str, path: str, meant: str
) -> None:
    config = write(workdir / "weather.yaml", WEATHER.replace(typo, line))
    line_number = config.read_text().splitlines().index(line.splitlines()[0]) + 1
    code, out, err = run(capsys, "env", "validate", "--config", str(config))
    message = one_error_line(code, err)
    assert f"{config}:{line_number}: {path}: unknown key" in message
    assert f"Did you mean {meant!r}?" in message
    assert "weather2.:" not in message and "Config is valid" not in out


def test_an_unknown_key_set_on_the_command_line_says_so(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = write(workdir / "weather.yaml", WEATHER)
    token = "+weather2_agent.responses_api_agents.simple_agent.exectue_tools=false"
    message = one_error_line(*run(capsys, "env", "validate", "--config", str(config), token)[::2])
    assert "simple_agent.exectue_tools: unknown key" in message and "Did you mean 'execute_tools'?" in message
    assert token in message


@pytest.mark.parametrize(
    ("setting", "expected"),
    [
        ("max_steps: lots", "max_steps: expected an integer, got 'lots'"),
        ("max_steps: 0", "max_steps: must be greater than or equal to 1, got 0"),
        ("execute_tools: maybe", "execute_tools: expected true or false, got 'maybe'"),
    ],
)
def test_a_wrong_value_type_is_caught_by_validate(
    workdir: Path, capsys: pytest.CaptureFixture[str], setting: str, expected: str
) -> None:
    config = write(workdir / "weather.yaml", WEATHER.replace("max_steps: 2", setting))
    message = one_error_line(*run(capsys, "env", "validate", "--config", str(config))[::2])
    assert f"{config}:12: weather2_agent.responses_api_agents.simple_agent.{expected}" in message


def test_a_resources_server_without_a_domain_names_the_key_and_the_line_of_its_block(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write(workdir / "weather.yaml", WEATHER.replace("      domain: agent\n", ""))
    message = one_error_line(*run(capsys, "env", "validate", "--config", str(config))[::2])
    assert (
        f"{config}:3: weather2.resources_servers.example_single_tool_call.domain: a resources server needs" in message
    )


def test_a_misspelled_domain_value_gets_a_did_you_mean(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = write(workdir / "weather.yaml", WEATHER.replace("domain: agent", "domain: maths"))
    message = one_error_line(*run(capsys, "env", "validate", "--config", str(config))[::2])
    assert f"{config}:5: weather2.resources_servers.example_single_tool_call.domain: expected one of" in message
    assert "got 'maths'. Did you mean 'math'?" in message


def test_a_wrong_value_type_stops_eval_run_before_any_server_starts(
    workdir: Path, capsys: pytest.CaptureFixture[str], servers_never_start: None
) -> None:
    config = write(workdir / "weather.yaml", WEATHER.replace("max_steps: 2", 'max_steps: "lots"'))
    code, _, err = run(capsys, "eval", "run", "--config", str(config), "--input", str(WEATHER_DATA),
                       "--output", str(workdir / "out.jsonl"))  # fmt: skip
    message = one_error_line(code, err)
    assert "simple_agent.max_steps: expected an integer, got 'lots'" in message
    assert "Starting servers" not in err and not (workdir / "out_materialized_inputs.jsonl").exists()


@pytest.mark.parametrize("where", ["file", "command line"])
def test_a_head_server_port_that_is_not_a_number_is_one_line(
    workdir: Path, capsys: pytest.CaptureFixture[str], servers_never_start: None, where: str
) -> None:
    if where == "file":
        config = write(workdir / "weather.yaml", WEATHER + "head_server:\n  port: notanumber\n")
        argv = ["env", "start", "--config", str(config)]
    else:
        config = write(workdir / "weather.yaml", WEATHER)
        argv = ["env", "start", "--config", str(config), "+head_server.port=notanumber"]
    message = one_error_line(*run(capsys, *argv)[::2])
    assert "head_server.port: expected an integer, got 'notanumber'" in message
    assert (f"{config}:14:" in message) if where == "file" else ("+head_server.port=notanumber" in message)


def test_a_block_whose_class_allows_extra_keys_or_cannot_be_read_is_not_judged(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A class that allows extras, or whose base lives in a package the CLI lacks, may read keys no one can see."""
    write(
        workdir / "resources_servers" / "open_impl" / "app.py",
        "from pydantic import ConfigDict\n"
        "from nemo_gym.base_resources_server import BaseResourcesServerConfig, SimpleResourcesServer\n"
        "class OpenConfig(BaseResourcesServerConfig):\n"
        "    model_config = ConfigDict(extra='allow')\n"
        "class OpenServer(SimpleResourcesServer):\n"
        "    config: OpenConfig\n",
    )
    write(
        workdir / "resources_servers" / "foreign_impl" / "app.py",
        "from some_private_package import PrivateBaseConfig\n"
        "from nemo_gym.base_resources_server import SimpleResourcesServer\n"
        "class ForeignConfig(PrivateBaseConfig):\n"
        "    retries: int = 3\n"
        "class ForeignServer(SimpleResourcesServer):\n"
        "    config: ForeignConfig\n"
        "if __name__ == '__main__':\n"
        "    ForeignServer.run_webserver()\n",
    )
    config = write(
        workdir / "servers.yaml",
        "a: {resources_servers: {open_impl: {entrypoint: app.py, domain: other, anything: 1}}}\n"
        "b: {resources_servers: {foreign_impl: {entrypoint: app.py, domain: other, private_key_of_base: 1}}}\n",
    )
    code, out, err = run(capsys, "env", "validate", "--config", str(config))
    assert code == 0, err
    assert "resources_servers/open_impl" in out and "resources_servers/foreign_impl" in out
    bad = write(workdir / "bad.yaml", "b: {resources_servers: {foreign_impl: {entrypoint: app.py, domain: other, "
                "retries: many}}}\n")  # fmt: skip
    message = one_error_line(*run(capsys, "env", "validate", "--config", str(bad))[::2])
    assert f"{bad}:1: b.resources_servers.foreign_impl.retries: expected an integer, got 'many'" in message


def test_types_read_from_source_follow_aliases_and_leave_what_they_cannot_resolve_unchecked(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write(
        workdir / "resources_servers" / "typed_impl" / "app.py",
        "from __future__ import annotations\n"
        "from typing import Annotated, Optional\n"
        "from pydantic import Field\n"
        "from nemo_gym.base_resources_server import BaseResourcesServerConfig, SimpleResourcesServer\n"
        "from elsewhere import Opaque\n"
        "Workers = Annotated[int, Field(ge=2)]\n"
        "class TypedConfig(BaseResourcesServerConfig):\n"
        "    workers: Workers = 2\n"
        "    sizes: list[int] = Field(default_factory=lambda: [1])\n"
        "    later: Optional['Defined'] = None\n"
        "    opaque: Opaque = None\n"
        "class Defined(BaseResourcesServerConfig):\n"
        "    pass\n"
        "class TypedServer(SimpleResourcesServer):\n"
        "    config: 'TypedConfig'\n",
    )
    block = "t: {resources_servers: {typed_impl: {entrypoint: app.py, domain: other, %s}}}\n"
    good = write(workdir / "good.yaml", block % "workers: 3, sizes: [1, 2], later: {x: 1}, opaque: [anything]")
    code, _, err = run(capsys, "env", "validate", "--config", str(good))
    assert code == 0, err
    bad = write(workdir / "bad.yaml", block % "workers: 1, sizes: [1, two], opaque: 1")
    message = one_error_line(*run(capsys, "env", "validate", "--config", str(bad))[::2])
    assert "t.resources_servers.typed_impl.workers: must be greater than or equal to 2, got 1" in message
    assert "t.resources_servers.typed_impl.sizes.1: expected an integer, got 'two'" in message
    assert "opaque" not in message


IN_REPO_CONFIGS = sorted(
    str(path.relative_to(INSTALL_DIR))
    for pattern in ("resources_servers/*/configs/*.yaml", "responses_api_models/*/configs/*.yaml",
                    "environments/*/config.yaml", "benchmarks/*/config.yaml")
    for path in INSTALL_DIR.glob(pattern)
)  # fmt: skip


POLICY_KEYS = ["+policy_base_url=http://127.0.0.1:9/v1", "+policy_api_key=k", "+policy_model_name=m"]


@pytest.mark.parametrize("config", IN_REPO_CONFIGS)
def test_every_config_in_the_repository_still_validates(
    config: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A model config that reads the policy keys (``${policy_base_url}``, ...) is given them, as env.yaml would: a run
    of it without them is refused, and so is its validation."""
    monkeypatch.chdir(INSTALL_DIR)
    policy = POLICY_KEYS if "${policy_" in (INSTALL_DIR / config).read_text() else []
    code, _, err = run(capsys, "env", "validate", "--config", config, *policy)
    assert code == 0, err


@pytest.mark.parametrize("agent", ["simple_agent", "gymnasium_agent"])
def test_the_agent_configs_validate_once_their_resources_server_is_named(
    agent: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The agent configs are templates (``resources_server.name: ???``) that an environment config completes."""
    monkeypatch.chdir(INSTALL_DIR)
    server = "blackjack" if agent == "gymnasium_agent" else "example_single_tool_call"
    code, _, err = run(
        capsys, "env", "validate", "--resources-server", server, "--config",
        f"responses_api_agents/{agent}/configs/{agent}.yaml",
        f"++{agent}.responses_api_agents.{agent}.resources_server.name={server}",
    )  # fmt: skip
    assert code == 0, err


# ---------------------------------------------------------------------------------------------------------------------
# Directives


def test_deleting_a_key_from_a_copy_of_an_inheriting_node_keeps_it_deleted(workdir: Path) -> None:
    """The README example: ``trimmed`` copies ``math_with_judge``, which inherits, and deletes ``resources_servers``."""
    write(
        workdir / "directives.yaml",
        "math_base: {resources_servers: {math: {entrypoint: app.py, domain: math, judge: false}}}\n"
        "math_with_judge:\n"
        "  _inherit_from: math_base\n"
        "  resources_servers: {math: {judge: true}}\n"
        "math_copy: ${copy:math_with_judge}\n"
        'trimmed: {_copy: math_with_judge, _delete_key: "resources_servers", note: kept}\n',
    )
    config = parse_global_config_dict(["+config_paths=[directives.yaml]"])
    assert dict(config.trimmed) == {"note": "kept"}
    assert config.math_copy.resources_servers.math.judge is True
    assert config.math_with_judge.resources_servers.math.judge is True and "math_base" not in config


# ---------------------------------------------------------------------------------------------------------------------
# Flags and output paths of gym eval run


@pytest.mark.parametrize(
    ("flag", "value", "expected"),
    [
        ("--concurrency", "0", "--concurrency must be at least 1, got 0"),
        ("--limit", "0", "--limit must be at least 1, got 0"),
        ("--num-repeats", "-2", "--num-repeats must be at least 1, got -2"),
        ("--top-p", "1.5", "--top-p must be between 0 and 1, got 1.5"),
        ("--temperature", "-0.5", "--temperature must be at least 0, got -0.5"),
    ],
)
def test_a_flag_out_of_its_bounds_is_refused_before_anything_starts(
    workdir: Path, capsys: pytest.CaptureFixture[str], servers_never_start: None, flag: str, value: str, expected: str
) -> None:
    code, _, err = run(capsys, "eval", "run", "--resources-server", "example_single_tool_call",
                       "--input", str(WEATHER_DATA), "--output", "out.jsonl", flag, value)  # fmt: skip
    assert one_error_line(code, err) == f"error: {expected}"


def test_concurrency_zero_as_an_override_is_refused_too(
    workdir: Path, capsys: pytest.CaptureFixture[str], servers_never_start: None
) -> None:
    code, _, err = run(capsys, "eval", "run", "--resources-server", "example_single_tool_call",
                       "--input", str(WEATHER_DATA), "--output", "out.jsonl", "+num_samples_in_parallel=0")  # fmt: skip
    assert "num_samples_in_parallel" in one_error_line(code, err)


@pytest.mark.parametrize("output", ["somefile.txt/out.jsonl", "/proc/nemo-gym-test/out.jsonl"])
def test_an_unwritable_output_path_is_one_line_before_anything_starts(
    workdir: Path, capsys: pytest.CaptureFixture[str], servers_never_start: None, output: str
) -> None:
    write(workdir / "somefile.txt", "a file, not a directory\n")
    code, _, err = run(capsys, "eval", "run", "--resources-server", "example_single_tool_call",
                       "--input", str(WEATHER_DATA), "--output", output)  # fmt: skip
    message = one_error_line(code, err)
    assert message.startswith(f"error: --output {output}")
    assert "Starting servers" not in err


def test_a_resume_with_changed_inputs_is_refused_before_servers_start(
    workdir: Path, capsys: pytest.CaptureFixture[str], servers_never_start: None
) -> None:
    output = workdir / "results" / "weather.jsonl"
    write(output, "")
    write(output.with_name("weather_run.json"), json.dumps({"fingerprint": "of another run"}))
    previous_inputs = write(output.with_name("weather_materialized_inputs.jsonl"), '{"the": "old run"}\n')
    code, _, err = run(capsys, "eval", "run", "--resources-server", "example_single_tool_call",
                       "--input", str(WEATHER_DATA), "--output", str(output), "--resume")  # fmt: skip
    message = one_error_line(code, err)
    assert f"cannot resume {output}: the materialized inputs differ" in message
    assert "Starting servers" not in err
    assert previous_inputs.read_text() == '{"the": "old run"}\n'  # the resumed run's inputs are left alone


# ---------------------------------------------------------------------------------------------------------------------
# ServerClient in a user's script

SCRIPT = """
import asyncio
from omegaconf import OmegaConf
from nemo_gym.config_types import BaseServerConfig
from nemo_gym.server_utils import ServerClient

config = OmegaConf.create({"srv": {"resources_servers": {"x": {"host": "127.0.0.1", "port": PORT}}}})
client = ServerClient(head_server_config=BaseServerConfig(host="127.0.0.1", port=PORT), global_config_dict=config)

async def main():
    try:
        await client.get("srv", "/", retry=False)
    except Exception as e:
        print(type(e).__name__)

asyncio.run(main())
"""


def test_a_script_using_server_client_leaves_no_unclosed_session_at_exit(tmp_path: Path) -> None:
    """The pooled session of a loop is closed when ``asyncio.run`` shuts the loop down, without the script asking."""
    import socket

    with socket.socket() as probe:  # a port nothing listens on: the call fails fast, but its session was opened
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    script = write(tmp_path / "script.py", SCRIPT.replace("PORT", str(port)))
    result = subprocess.run(
        [sys.executable, str(script)], cwd=INSTALL_DIR, capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ConnectionFailed"  # a ServerRequestError that is also aiohttp's kind
    assert "Unclosed" not in result.stderr and "Exception ignored" not in result.stderr
