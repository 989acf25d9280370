"""`gym eval run` on repo_repair with real containers (podman, from `make containers`) and real processes: the gold
patches score 1.0 on every row, the wrong ones 0.0, the embedded model completes with no failure, and a run killed
with SIGKILL leaves none of its containers behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nemo_gym.sandbox.providers.docker.provider import SANDBOX_LABEL
from nemo_gym.sandbox.providers.docker.runtime import (
    ContainerRuntime,
    ContainerRuntimeError,
    base_image_tag,
    find_runtime,
    image_exists,
)

REPO = Path(__file__).resolve().parents[2]
FOLDER = REPO / "resources_servers" / "repo_repair"
EXAMPLES = FOLDER / "data" / "example.jsonl"

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def runtime() -> ContainerRuntime:
    try:
        found = find_runtime()
    except ContainerRuntimeError:
        pytest.skip("no container runtime: `make test` installs podman (`make containers`)")
    if not image_exists(found, base_image_tag()):
        pytest.skip(f"the base image {base_image_tag()} is not built: `make containers` builds it")
    return found


def eval_run(workdir: Path, output: Path, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "nemo_gym.cli.main", "eval", "run", "--resources-server", "repo_repair",
        "--agent", "repo_repair_simple_agent", "--input", str(EXAMPLES), "--output", str(output), "--overwrite",
        "+shared_venv=true", "+head_server={port: 0}", f"+cache_dir={workdir / 'cache'}", *extra,
    ]  # fmt: skip


def scripted(scripts: str, *extra: str) -> tuple[str, ...]:
    key = "++policy_model.responses_api_models.scripted_model"
    return ("--model-type", "scripted_model", f"{key}.scripts_file={FOLDER / 'data' / scripts}", *extra)


def run(argv: list[str], workdir: Path) -> subprocess.CompletedProcess[str]:
    env = os.environ | {"NEMO_GYM_ENV_YAML": "", "OPENAI_API_KEY": ""}
    done = subprocess.run(argv, cwd=workdir, env=env, capture_output=True, text=True, timeout=540)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def rewards(output: Path) -> dict[str, float]:
    return {row["task_id"]: row["reward"] for row in map(json.loads, output.read_text().splitlines())}


def test_gold_patches_score_one_and_wrong_patches_zero(runtime: ContainerRuntime, workdir: Path) -> None:
    tasks = [json.loads(line)["task_id"] for line in EXAMPLES.read_text().splitlines()]
    gold, wrong = workdir / "gold.jsonl", workdir / "wrong.jsonl"
    run(eval_run(workdir, gold, *scripted("gold_scripts.jsonl")), workdir)
    assert rewards(gold) == dict.fromkeys(tasks, 1.0)
    run(eval_run(workdir, wrong, *scripted("wrong_scripts.jsonl")), workdir)
    assert rewards(wrong) == dict.fromkeys(tasks, 0.0)
    for output in (gold, wrong):
        failures = output.with_name(f"{output.stem}_failures.jsonl")
        assert not failures.exists() or not failures.read_text().strip()


@pytest.mark.model
def test_the_embedded_model_completes_its_rollouts(runtime: ContainerRuntime, workdir: Path) -> None:
    pytest.importorskip("xllamacpp")
    output = workdir / "smollm.jsonl"
    steps = "++repo_repair_simple_agent.responses_api_agents.simple_agent.max_steps=3"  # ~1 min on 2 cores
    limits = ("--limit", "1", "--temperature", "0.2", "--max-output-tokens", "96", steps)
    done = run(eval_run(workdir, output, *limits), workdir)
    [row] = [json.loads(line) for line in output.read_text().splitlines()]
    assert row["reward"] in (0.0, 1.0) and row["response"]["model"].startswith("SmolLM2")
    assert "1 rollouts scored, 0 failed" in " ".join((done.stdout + done.stderr).split())


def test_sigkill_of_the_run_leaves_no_container_within_15_s(runtime: ContainerRuntime, workdir: Path) -> None:
    def ours() -> set[str]:
        return set(runtime.run("ps", "-aq", "--filter", f"label={SANDBOX_LABEL}=1").stdout.split())

    before = ours()
    argv = eval_run(
        workdir,
        workdir / "killed.jsonl",
        *scripted("gold_scripts.jsonl", "++policy_model.responses_api_models.scripted_model.reply_delay_s=30"),
    )
    env = os.environ | {"NEMO_GYM_ENV_YAML": "", "OPENAI_API_KEY": ""}
    process = subprocess.Popen(argv, cwd=workdir, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 240
        while len(ours() - before) < 2 and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        started = ours() - before
        assert len(started) >= 2 and process.poll() is None, "the run never held its containers"
        os.kill(process.pid, signal.SIGKILL)
        process.wait()
        killed_at = time.monotonic()
        while ours() & started and time.monotonic() - killed_at < 15:
            time.sleep(0.5)
        assert ours() & started == set()
    finally:
        if process.poll() is None:
            process.kill()
