"""The trainer-facing face (``RolloutCollectionHelper``) and ``gym eval run`` judge a rollout by the same rules."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from nemo_gym.config.server_models import BaseServerConfig
from nemo_gym.launcher import running_servers
from nemo_gym.rollout_collection import RolloutCollectionHelper
from nemo_gym.rollouts.config import RolloutCollectionConfig
from nemo_gym.rollouts.run import run_collection
from nemo_gym.server_utils import ServerClient
from nemo_gym.transport.http_client import close_session
from tests.rollouts.conftest import stack_overrides, write_dataset

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

ENV = "++rollout_test_env.resources_servers.rollout_test_env"
ROWS = 12
"""Verify calls are numbered per server; each path makes 12 in a row, so each sees the same number of each failure:
every 3rd call answers HTTP 500 (4 of 12), every 4th that is not also a 3rd reports a judge failure (2 of 12)."""


def _classes(rows: list[dict[str, Any]]) -> Counter[str]:
    return Counter(row["_ng_failure_class"] for row in rows if "_ng_failure_class" in row)


async def _run_face(config: Any, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    client = ServerClient(head_server_config=BaseServerConfig(host="127.0.0.1", port=1), global_config_dict=config)
    try:
        return [result async for _, result in RolloutCollectionHelper(client).run_examples(rows)]
    finally:
        await close_session()


def test_the_face_and_gym_eval_run_classify_failures_alike(workdir: Path, extra_root: Path) -> None:
    data = write_dataset(workdir / "data.jsonl", ROWS)
    settings = RolloutCollectionConfig(
        output_jsonl_fpath=str(workdir / "out" / "rollouts.jsonl"), input_jsonl_fpath=str(data),
        agent_name="rollout_test_agent", num_samples_in_parallel=4,
    )  # fmt: skip
    rows = [{**json.loads(line), "agent_ref": {"name": "rollout_test_agent"}} for line in data.read_text().splitlines()]
    with running_servers(stack_overrides(workdir, f"{ENV}.fail_every=3", f"{ENV}.judge_fail_every=4")) as run:
        cli = run_collection(settings, run.config, show_progress=False)
        face = asyncio.run(_run_face(run.config, rows))  # the same stack, after the CLI path has finished

    cli_failures = [json.loads(line) for line in cli.summary.failures_path.read_text().splitlines()]
    expected = Counter({"verify_failed": 4, "judge_failed": 2})
    assert _classes(cli_failures) == expected
    assert _classes(face) == expected
    assert all(row["_ng_failure_message"] for row in [*cli_failures, *face] if "_ng_failure_class" in row)
    scored = [result for result in face if "_ng_failure_class" not in result]
    assert len(scored) == cli.summary.succeeded == ROWS - 6
    assert all(result["reward"] == result["expected_reward"] for result in scored)


def test_gym_eval_run_and_aggregate_count_the_failures_asked_for_as_zeros(workdir: Path, extra_root: Path) -> None:
    from nemo_gym.cli.main import main

    data = write_dataset(workdir / "data.jsonl", ROWS)
    output = workdir / "out" / "rollouts.jsonl"
    settings = RolloutCollectionConfig(
        output_jsonl_fpath=str(output), input_jsonl_fpath=str(data), agent_name="rollout_test_agent",
        num_samples_in_parallel=4, count_failure_classes_as_zero=["judge_failed", "verifier_error"],
    )  # fmt: skip
    with running_servers(stack_overrides(workdir, f"{ENV}.fail_every=3", f"{ENV}.judge_fail_every=4")) as run:
        result = run_collection(settings, run.config, show_progress=False)

    scored = [json.loads(line) for line in output.read_text().splitlines()]
    failures = [json.loads(line) for line in result.summary.failures_path.read_text().splitlines()]
    assert len(scored) == ROWS - 6 and len(failures) == 6 and result.counted_failures == 6  # the files: unchanged
    assert all(row["_ng_failure_http_status"] == 502 for row in failures if row["_ng_failure_class"] == "verify_failed")
    expected_mean = sum(row["reward"] for row in scored) / ROWS  # the six failures count as 0
    assert result.metrics is not None
    assert result.metrics[0]["agent_metrics"]["mean/reward"] == pytest.approx(expected_mean)
    assert result.metrics[0]["agent_metrics"]["num_rollouts"] == ROWS

    merged = workdir / "merged.jsonl"  # the same count from the files alone, by class this time
    argv = ["eval", "aggregate", "--input-glob", str(output), "-o", str(merged), "--count-failures-as-zero"]
    assert main([*argv, "judge_failed", "verify_failed"]) == 0
    offline = json.loads((workdir / "merged_aggregate_metrics.json").read_text())
    assert offline[0]["agent_metrics"]["mean/reward"] == pytest.approx(expected_mean)
    assert main([*argv[:-1]]) == 0  # without the setting: the scored rollouts only
    plain = json.loads((workdir / "merged_aggregate_metrics.json").read_text())
    assert plain[0]["agent_metrics"]["mean/reward"] == pytest.approx(sum(r["reward"] for r in scored) / len(scored))
