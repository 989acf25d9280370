"""Output that goes to a file, a pipe or a CI log: every path and URL whole on one line, tables as plain text.

Real processes with their stdout and stderr sent to files, run from a directory whose path alone is longer than 80
columns, so a wrap at the old 80-column default of a non-terminal console would split every path printed.
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
import pytest

from nemo_gym import INSTALL_DIR
from tests.helpers import run_headers

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

WEATHER = "example_single_tool_call"
ENV = os.environ | {"NEMO_GYM_ENV_YAML": "", "PYTHONUNBUFFERED": "1", "COLUMNS": "80"}


@pytest.fixture
def deep_dir(tmp_path: Path) -> Path:
    path = tmp_path / ("a_directory_with_a_long_name_" * 3) / ("and_another_one_below_it_" * 3)
    path.mkdir(parents=True)
    assert len(str(path)) > 160
    return path


def gym(*args: str, cwd: Path) -> tuple[int, list[str], list[str]]:
    """Run ``gym`` with stdout and stderr going to files; returns the exit code and the lines of each."""
    out, err = cwd / "stdout.txt", cwd / "stderr.txt"
    with out.open("wb") as stdout, err.open("wb") as stderr:
        code = subprocess.run(
            [sys.executable, "-m", "nemo_gym.cli.main", *args], cwd=cwd, env=ENV, stdout=stdout, stderr=stderr
        ).returncode
    return code, out.read_text().splitlines(), err.read_text().splitlines()


def assert_plain(lines: list[str]) -> None:
    text = "\n".join(lines)
    assert "\x1b[" not in text and "\r" not in text, "colour codes or progress-bar redraws in piped output"
    assert not re.search(r"[┏┃━│─╇]", text), "a boxed Rich table in piped output"


def line_with(lines: list[str], *parts: str) -> str:
    """The one line holding every part; fails (showing the output) if none does."""
    found = [line for line in lines if all(part in line for part in parts)]
    assert found, f"no line holds all of {parts}:\n" + "\n".join(lines)
    return found[0]


def test_eval_run_and_profile_print_whole_paths_and_plain_tables(deep_dir: Path) -> None:
    output = deep_dir / "results" / "weather_rollouts.jsonl"
    code, out, err = gym(
        "eval", "run", "--resources-server", WEATHER, "--model-type", "scripted_model",
        "--agent", f"{WEATHER}_simple_agent", "--output", str(output),
        "--input", str(INSTALL_DIR / "resources_servers" / WEATHER / "data" / "example.jsonl"),
        "+shared_venv=true", "+head_server={port: 0}", f"+cache_dir={deep_dir / 'cache'}",
        cwd=deep_dir,
    )  # fmt: skip
    assert code == 0, "\n".join(out + err)
    assert_plain(out + err)
    line_with(err, "rollouts:", str(output))
    line_with(err, "materialized inputs:", str(output.with_name("weather_rollouts_materialized_inputs.jsonl")))
    line_with(err, "aggregate metrics:", str(output.with_name("weather_rollouts_aggregate_metrics.json")))
    line_with(err, "look at them:", f"gym view {output}")
    line_with(err, "Starting servers (logs in", str(deep_dir / "results" / "logs"))
    line_with(err, "Agent", "Metric", "Value")  # the key metrics table: a header line, then one line per metric
    line_with(err, f"{WEATHER}_simple_agent", "mean/reward", "1.0000")

    code, out, err = gym("eval", "profile", "--rollouts", str(output), cwd=deep_dir)
    assert code == 0, "\n".join(out + err)
    assert_plain(out + err)
    line_with(out, "Task", "Agent", "Rollouts", "Pass rate", "pass@n", "Prompt")  # no header shrunk to "T…"
    line_with(out, f"{WEATHER}_simple_agent", "1/1", "What is the weather in San Francisco right now?")
    line_with(out, "reward profiling:", str(output.with_name("weather_rollouts_reward_profiling.jsonl")))
    line_with(out, "agent metrics:", str(output.with_name("weather_rollouts_agent_metrics.json")))


def test_env_start_and_status_print_whole_urls_and_paths(deep_dir: Path) -> None:
    args = [
        sys.executable, "-m", "nemo_gym.cli.main", "env", "start", "--resources-server", WEATHER,
        "--model-type", "scripted_model", "+shared_venv=true", "+head_server={port: 0}",
        f"+cache_dir={deep_dir / 'cache'}",
    ]  # fmt: skip
    launcher = subprocess.Popen(
        args, cwd=deep_dir, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    start_lines: list[str] = []
    drain = threading.Thread(
        target=lambda: start_lines.extend(line.rstrip("\n") for line in launcher.stdout), daemon=True
    )
    try:
        for line in launcher.stdout:  # blocks until the launcher prints; ends if it exits
            start_lines.append(line.rstrip("\n"))
            if line.startswith("Press Ctrl-C to stop."):
                break
        assert start_lines and start_lines[-1].startswith("Press Ctrl-C"), "\n".join(start_lines)
        drain.start()  # keep reading, so the launcher never blocks on a full pipe
        head = re.search(r"Head server: http://127\.0\.0\.1:(\d+)", "\n".join(start_lines))
        assert head, "\n".join(start_lines)
        head_url = f"http://127.0.0.1:{head.group(1)}"
        instances = httpx.get(
            f"{head_url}/server_instances", headers=run_headers(head_url, int(head.group(1))), timeout=10
        ).json()
        assert len(instances) == 3

        code, out, err = gym("env", "status", f"+head_server.port={head.group(1)}", cwd=deep_dir)
        assert code == 0, "\n".join(out + err)
        assert_plain(out + err)
        line_with(out, "name", "type/impl", "url", "pid", "health")
        for instance in instances:
            row = line_with(out, instance["name"], instance["url"], str(instance["pid"]), "healthy")
            assert f"{instance['server_type']}/{instance['implementation']}" in row
            line_with(start_lines, instance["name"], instance["url"], str(deep_dir / "results" / "logs"))
        line_with(start_lines, "Head server:", str(deep_dir / "results" / "run"))
        assert_plain(start_lines)
    finally:
        launcher.send_signal(signal.SIGTERM)
        launcher.wait(timeout=60)
    assert launcher.returncode == 0
