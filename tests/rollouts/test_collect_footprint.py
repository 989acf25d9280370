"""What the collect command (`gym eval run --no-serve`) loads before its first rollout: every module here is start-up
time the user waits for before the first model call, on every run.

The probe runs the real command in a fresh interpreter. The head server's answer is stood in for (one agent ``a``)
and the probe stops the command when its event loop would start the rollouts, after the whole start-up (imports,
config, flags, the rows checked and written), then reports what was loaded and whether the materialized inputs were
in place by then.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from nemo_gym.config.ports import probe_free_port

REPO = Path(__file__).resolve().parents[2]

COMMAND_PROBE = """
import asyncio, json, os, sys
from pathlib import Path
from omegaconf import OmegaConf
import nemo_gym.config.head_fetch as head_fetch

def head_answer(head, timeout_s=10.0):
    agent = {"entrypoint": "app.py", "host": "127.0.0.1", "port": 9}
    return OmegaConf.create({"a": {"responses_api_agents": {"simple_agent": agent}}})

def stop_before_the_rollouts(runner, coro, **kwargs):
    coro.close()
    inputs = Path(sys.argv[sys.argv.index("--output") + 1]).with_name("out_materialized_inputs.jsonl")
    report = {"reached": "rollouts", "materialized": inputs.is_file(), "loaded": sorted(sys.modules)}
    print(json.dumps(report), flush=True)
    os._exit(0)

head_fetch.fetch_config_from_head_server = head_answer
asyncio.Runner.run = stop_before_the_rollouts
from nemo_gym.cli.main import main
code = main(sys.argv[1:])
print(json.dumps({"code": code, "loaded": sorted(sys.modules)}))
"""

COMPOSE_PROBE = """
import json, sys
from nemo_gym.config.compose import ComposeOptions, compose
compose(ComposeOptions(overrides=[], dummy_model=True))
print(json.dumps({"loaded": sorted(sys.modules)}))
"""

NOT_FOR_THE_COLLECTOR = (
    "fastapi",
    "starlette",
    "uvicorn",
    "openai",
    "nemo_gym.server_utils",
    "nemo_gym.openai_utils",
    "nemo_gym.observability.records",
    "nemo_gym.observability.trajectory",
    "nemo_gym.launcher",
    "nemo_gym.authoring",
    "nemo_gym.datasets.storage",
    "nemo_gym.training.export",
    "nemo_gym.viewer",
    "hydra",
)
"""Server frameworks, the OpenAI SDK and the web-stack face, trajectory models (loaded only for a row with captured
model calls or agent observations), other commands' machinery, and Hydra (the probe's overrides are the common shapes
that ``config/override_literals.py`` reads)."""


def _free_port() -> int:
    return probe_free_port()  # outside the ephemeral range, which outgoing connections take ports from


def _probe(code: str, args: list[str], cwd: Path) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=cwd,
        env={"PATH": "/usr/bin:/bin", "NEMO_GYM_ENV_YAML": "", "HOME": str(cwd)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.stdout.strip(), out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_collect_command_starts_without_servers_sdks_or_trajectory_models(tmp_path: Path) -> None:
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"responses_create_params": {"input": "hi"}}\n')
    args = [
        "eval", "run", "--no-serve", "--agent", "a", "--input", str(rows), "--output", str(tmp_path / "out.jsonl"),
        f"+head_server={{host: 127.0.0.1, port: {_free_port()}}}", f"+results_dir={tmp_path / 'results'}",
    ]  # fmt: skip
    report = _probe(COMMAND_PROBE, args, tmp_path)
    assert report.get("reached") == "rollouts", report.get("code")  # the whole start-up ran, no rollout did
    assert report["materialized"]  # every row checked and written before any rollout starts
    loaded = set(report["loaded"])
    assert "nemo_gym.rollouts.collector" in loaded  # the probe did reach the collect path
    found = sorted(m for m in loaded if any(m == p or m.startswith(f"{p}.") for p in NOT_FOR_THE_COLLECTOR))
    assert found == []


def test_a_command_line_without_overrides_never_loads_hydra(tmp_path: Path) -> None:
    loaded = set(_probe(COMPOSE_PROBE, [], tmp_path)["loaded"])
    assert "omegaconf" in loaded
    assert not any(m == "hydra" or m.startswith("hydra.") for m in loaded)
