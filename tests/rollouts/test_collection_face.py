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
