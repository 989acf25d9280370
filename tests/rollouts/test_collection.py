"""Rollout collection against real server processes: exactly-once output, failure routing, resume, interruption."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from nemo_gym.launcher import running_servers
from nemo_gym.rollouts.breaker import ServersDownError
from nemo_gym.rollouts.config import RolloutCollectionConfig
from nemo_gym.rollouts.run import run_collection
from tests.rollouts.conftest import CONFIG, ROOT, reward_of, stack_overrides, write_dataset

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

HANG_GUARD_S = 240.0
"""The longest a wait below may take: reached only when something hangs (each wait ends when its condition holds)."""
ENV = "++rollout_test_env.resources_servers.rollout_test_env"


def read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def finished_lines(*paths: Path) -> int:
    """Complete lines in files that are being written right now (a line is counted once its newline is there)."""
    return sum(path.read_bytes().count(b"\n") for path in paths if path.exists())


def wait_for_lines(count: int, *paths: Path, running: subprocess.Popen | threading.Thread | None = None) -> None:
    deadline = time.monotonic() + HANG_GUARD_S
    while finished_lines(*paths) < count:
        alive = running is None or (
            running.is_alive() if isinstance(running, threading.Thread) else running.poll() is None
        )
        assert alive, "the run ended before the point the test waits for"
        assert time.monotonic() < deadline, f"fewer than {count} rows after {HANG_GUARD_S} s"
        time.sleep(0.05)


def keys(rows: list[dict]) -> list[tuple[int, int]]:
    return [(row["_ng_task_index"], row["_ng_rollout_index"]) for row in rows]


def settings(workdir: Path, data: Path, **kwargs) -> RolloutCollectionConfig:
    return RolloutCollectionConfig(
        output_jsonl_fpath=str(workdir / "out" / "rollouts.jsonl"), input_jsonl_fpath=str(data),
        agent_name="rollout_test_agent", **kwargs,
    )  # fmt: skip


def test_thousand_rows_four_repeats_exactly_once_with_hand_computed_metrics(workdir, extra_root):
    data = write_dataset(workdir / "data.jsonl", 1000)
    with running_servers(stack_overrides(workdir)) as run:
        result = run_collection(settings(workdir, data, num_repeats=4, num_samples_in_parallel=128), run.config,
                                show_progress=False)  # fmt: skip
    rows = read(result.summary.output_path)
    assert len(rows) == 4000 and result.summary.failed == 0
    assert set(keys(rows)) == {(t, r) for t in range(1000) for r in range(4)} and len(set(keys(rows))) == 4000
    assert all(row["reward"] == reward_of(row["_ng_task_index"]) for row in rows)
    assert all(row["agent_ref"]["name"] == "rollout_test_agent" for row in rows)

    (metrics,) = result.metrics
    agent = metrics["agent_metrics"]
    ones = len([t for t in range(1000) if t % 3 == 0])
    assert agent["mean/reward"] == pytest.approx((ones * 1.0 + (1000 - ones) * 0.25) / 1000)
    assert agent["max/reward"] == 1.0 and agent["min/reward"] == 0.25
    assert agent["pass@1"] == pytest.approx(ones / 1000) and agent["pass@4"] == pytest.approx(ones / 1000)
    assert agent["num_rollouts"] == 4000 and agent["num_tasks"] == 1000
    assert len(metrics["group_level_metrics"]) == 1000
    assert json.loads(result.metrics_path.read_text())[0]["agent_ref"]["name"] == "rollout_test_agent"
    materialized = read(result.materialized.path)
    assert keys(materialized) == [(t, r) for t in range(1000) for r in range(4)]


def test_failures_go_to_the_sidecar_and_resume_completes_the_rest(workdir, extra_root, monkeypatch):
    """10% of verifies fail, then the model server is killed mid-run; --resume on a fresh stack finishes the job.

    The dead model server stops the run once its deadline passes, without charging the rollouts it failed (issue 13:
    those are left untried, not written as ``model_failed``). Mid-run is a fact, not a moment: verifies after the 100th
    are held until the model server is dead."""
    monkeypatch.setenv("NEMO_GYM_MAX_ROLLOUT_ATTEMPTS", "10")
    data = write_dataset(workdir / "data.jsonl", 150)
    config = settings(workdir, data, num_repeats=2, num_samples_in_parallel=16, server_down_deadline_seconds=1)
    flaky = f"{ENV}.fail_every=10"
    release = workdir / "release"
    held = [f"{ENV}.hold_verifies_after=100", f"{ENV}.release_file={release}"]
    output = Path(config.output_jsonl_fpath)
    # The model server stays dead (no supervisor restart, test_supervision.py has those): the run must stop.
    with running_servers(stack_overrides(workdir, flaky, *held, "+server_supervision={enabled: false}")) as run:
        model = next(server for server in run.servers if server.name == "policy_model")
        outcome: dict = {}

        def collect() -> None:
            try:
                outcome["result"] = run_collection(config, run.config, False)
            except ServersDownError as e:
                outcome["stopped"] = e

        worker = threading.Thread(target=collect)
        worker.start()
        wait_for_lines(100, output, output.with_name("rollouts_failures.jsonl"), running=worker)  # 90 + 10 failed
        os.killpg(model.popen.pid, signal.SIGKILL)
        release.touch()  # the held rollouts finish; every one not yet past the model now fails there
        worker.join(timeout=HANG_GUARD_S)
        assert not worker.is_alive()
    assert "model server 'policy_model'" in str(outcome["stopped"]) and "--resume" in str(outcome["stopped"])
    failures = read(output.with_name("rollouts_failures.jsonl"))
    classes = Counter(row["_ng_failure_class"] for row in failures)
    assert len(read(output)) + len(failures) < 300, "the rollouts the dead server failed are left untried"
    assert classes["verify_failed"] > 0 and not classes["model_failed"], classes
    assert all(row["_ng_failure_message"] for row in failures)

    for _ in range(5):  # each resume retries what failed; verifies keep failing 10% of the time
        with running_servers(stack_overrides(workdir, flaky)) as run:
            resumed = run_collection(config.model_copy(update={"resume_from_cache": True}), run.config, False)
        if resumed.summary.failed == 0:
            break
    rows = read(output)
    assert sorted(keys(rows)) == [(t, r) for t in range(150) for r in range(2)]
    assert not output.with_name("rollouts_failures.jsonl").exists()
    assert resumed.summary.skipped_done > 0
    assert all(row["reward"] == reward_of(row["_ng_task_index"]) for row in rows)


def test_judge_failures_are_failures_not_zero_rewards(workdir, extra_root):
    data = write_dataset(workdir / "data.jsonl", 20)
    judge = "++rollout_test_env.resources_servers.rollout_test_env.judge_fail_every=4"
    with running_servers(stack_overrides(workdir, judge)) as run:
        result = run_collection(settings(workdir, data, num_samples_in_parallel=1), run.config, show_progress=False)
    failures = read(result.summary.failures_path)
    assert result.summary.failed == 5 and {row["_ng_failure_class"] for row in failures} == {"judge_failed"}
    assert all(row["reward"] == reward_of(row["_ng_task_index"]) for row in read(result.summary.output_path))
    assert result.metrics[0]["agent_metrics"]["num_rollouts"] == 15


def test_malformed_input_is_reported_with_file_and_line_before_anything_runs(workdir, extra_root):
    data = workdir / "bad.jsonl"
    data.write_text('{"responses_create_params": {"input": "ok"}}\n{not json\n')
    with pytest.raises(Exception, match=r"bad\.jsonl:2: not valid JSON"):
        run_collection(settings(workdir, data), _unstarted_config(workdir), show_progress=False)
    assert not (workdir / "out" / "rollouts.jsonl").exists()
    data.write_text('{"responses_create_params": {"input": "ok", "temperature": "hot"}}\n{"x": 1}\n')
    with pytest.raises(Exception) as error:
        run_collection(settings(workdir, data), _unstarted_config(workdir), show_progress=False)
    assert "bad.jsonl:1: responses_create_params.temperature" in str(error.value)
    assert "bad.jsonl:2: missing responses_create_params" in str(error.value)


def _unstarted_config(workdir: Path):
    from nemo_gym.global_config import parse_global_config_dict

    return parse_global_config_dict(stack_overrides(workdir))


def _gym_eval_run(workdir: Path, data: Path, *extra: str) -> subprocess.Popen:
    env = os.environ | {"NEMO_GYM_ENV_YAML": "", "NEMO_GYM_EXTRA_ROOTS": str(ROOT)}
    args = [
        sys.executable, "-m", "nemo_gym.cli.main", "eval", "run", "--config", str(CONFIG), "--input", str(data),
        "--agent", "rollout_test_agent", "--output", str(workdir / "out" / "rollouts.jsonl"), "--concurrency", "8",
        "--num-repeats", "2", "+shared_venv=true", "+head_server={port: 0}", f"+results_dir={workdir / 'results'}",
        f"+cache_dir={workdir / 'cache'}", *extra,
    ]  # fmt: skip
    return subprocess.Popen(args, cwd=workdir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_sigint_then_resume_gives_the_same_rows_as_an_uninterrupted_run(workdir):
    data = write_dataset(workdir / "data.jsonl", 60)
    release = workdir / "release"
    held = (f"{ENV}.hold_verifies_after=20", f"{ENV}.release_file={release}")  # the run stops at 20 rows of 120
    output = workdir / "out" / "rollouts.jsonl"
    interrupted = _gym_eval_run(workdir, data, *held)
    wait_for_lines(20, output, running=interrupted)
    interrupted.send_signal(signal.SIGINT)
    # The held verifies are not released: the interrupted collector hangs up, which ends each held wait (releasing
    # them here would race the interrupt on a loaded machine, letting the whole run finish first).
    log, _ = interrupted.communicate(timeout=HANG_GUARD_S)
    assert interrupted.returncode == 130, log
    assert "--resume" in log
    partial = read(output)
    assert 20 <= len(partial) < 120

    resumed = _gym_eval_run(workdir, data, "--resume")
    log, _ = resumed.communicate(timeout=HANG_GUARD_S)
    assert resumed.returncode == 0, log
    final = read(output)
    assert sorted(keys(final)) == [(t, r) for t in range(60) for r in range(2)]
    assert keys(final)[: len(partial)] == keys(partial)  # nothing already written was touched

    uninterrupted_dir = workdir / "uninterrupted"
    uninterrupted_dir.mkdir()
    straight = _gym_eval_run(uninterrupted_dir, data)
    log, _ = straight.communicate(timeout=HANG_GUARD_S)
    assert straight.returncode == 0, log
    reference = read(uninterrupted_dir / "out" / "rollouts.jsonl")
    as_set = lambda rows: sorted((k, row["reward"]) for k, row in zip(keys(rows), rows, strict=True))  # noqa: E731
    assert as_set(final) == as_set(reference)


async def test_rollout_collection_helper_for_rl_frameworks(workdir, extra_root):
    from nemo_gym.config_types import BaseServerConfig
    from nemo_gym.rollout_collection import RolloutCollectionHelper
    from nemo_gym.server_utils import ServerClient
    from nemo_gym.transport.http_client import close_session

    rows = [
        {
            "responses_create_params": {"input": f"q{i}"},
            "expected_reward": reward_of(i),
            "agent_ref": {"name": "rollout_test_agent"},
        }
        for i in range(12)
    ] + [{"responses_create_params": {"input": "x", "temperature": "hot"}, "agent_ref": {"name": "rollout_test_agent"}}]
    with running_servers(stack_overrides(workdir)) as run:
        client = ServerClient(head_server_config=BaseServerConfig(host="127.0.0.1", port=1),
                              global_config_dict=run.config)  # fmt: skip
        results = [pair async for pair in RolloutCollectionHelper(client).run_examples(rows)]
        await close_session()
    assert len(results) == 13
    good = [(row, result) for row, result in results if "reward" in result]
    assert sorted(result["reward"] for _, result in good) == sorted(reward_of(i) for i in range(12))
    (bad,) = [result for _, result in results if "_ng_failure_class" in result]
    assert bad["_ng_failure_class"] == "invalid_row"  # the collector's class for a 422, as in gym eval run
