"""Collection through an environment server (NeMo Gym 0.7's episode), with real processes: `gym eval run` on the
weather environment with `single_agent_turn_legacy` in front of its agent, against the direct path."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "resources_servers" / "example_single_tool_call" / "data" / "example.jsonl"
AGENT = "example_single_tool_call_simple_agent"
ENV_SERVER = "example_single_tool_call_environment_server"

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(1800),
]


def eval_run(workdir: Path, output: Path, *selectors: str, extra: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    argv = [
        sys.executable, "-m", "nemo_gym.cli.main", "eval", "run", *selectors, "--input", str(EXAMPLES),
        "--agent", AGENT, "--output", str(output), "--temperature", "0", "--max-output-tokens", "128",
        "+shared_venv=true", "+head_server={port: 0}", f"+cache_dir={workdir / 'cache'}", *extra,
    ]  # fmt: skip
    env = os.environ | {"NEMO_GYM_ENV_YAML": "", "OPENAI_API_KEY": ""}
    return subprocess.run(argv, cwd=workdir, env=env, capture_output=True, text=True, timeout=800)


def rows(path: Path) -> dict[tuple[int, int], dict[str, Any]]:
    found = [json.loads(line) for line in path.read_text().splitlines()]
    keyed = {(row["_ng_task_index"], row["_ng_rollout_index"]): row for row in found}
    assert len(keyed) == len(found), "a rollout written twice"
    return keyed


def outputs(row: dict[str, Any]) -> list[Any]:
    """What the agent produced, without ids (the model server makes new ones per call)."""
    kept = ("type", "name", "arguments", "output", "role", "content")
    items = []
    for item in row["response"]["output"]:
        item = {k: v for k, v in item.items() if k in kept}
        if isinstance(item.get("content"), list):
            item["content"] = [part.get("text") for part in item["content"]]
        items.append(item)
    return items


@pytest.mark.model
def test_eval_run_through_the_environment_server_gives_the_direct_paths_files_and_rewards(workdir: Path) -> None:
    pytest.importorskip("xllamacpp")
    direct = workdir / "direct" / "rollouts.jsonl"
    episode = workdir / "episode" / "rollouts.jsonl"
    done = eval_run(workdir, direct, "--resources-server", "example_single_tool_call")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    done = eval_run(workdir, episode, "--environment", "example_single_tool_call_episode")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    assert sorted(p.name for p in direct.parent.iterdir()) == sorted(p.name for p in episode.parent.iterdir())
    direct_rows, episode_rows = rows(direct), rows(episode)
    assert direct_rows.keys() == episode_rows.keys() and len(direct_rows) == len(EXAMPLES.read_text().splitlines())
    for key, row in episode_rows.items():
        assert row["_ng_environment_server"] == ENV_SERVER  # it went through the environment server
        assert "_ng_environment_server" not in direct_rows[key]
        assert row["reward"] == direct_rows[key]["reward"], key
        assert outputs(row) == outputs(direct_rows[key]), key  # greedy decoding: the same answers
    direct_metrics = json.loads((direct.parent / "rollouts_aggregate_metrics.json").read_text())
    episode_metrics = json.loads((episode.parent / "rollouts_aggregate_metrics.json").read_text())
    assert [m["key_metrics"] for m in direct_metrics] == [m["key_metrics"] for m in episode_metrics]


SCRIPTED = REPO / "responses_api_models" / "scripted_model" / "configs" / "scripted_model.yaml"
EPISODE_CONFIG = REPO / "environments" / "example_single_tool_call_episode" / "config.yaml"


def _stack_overrides(workdir: Path, reply_delay_s: float) -> list[str]:
    slow = workdir / "slow_model.yaml"
    slow.write_text(
        json.dumps({"policy_model": {"responses_api_models": {"scripted_model": {"reply_delay_s": reply_delay_s}}}})
    )  # fmt: skip  (JSON is YAML)
    return [
        f"+config_paths=[{EPISODE_CONFIG},{SCRIPTED},{slow}]", "+shared_venv=true", "+head_server={port: 0}",
        f"+results_dir={workdir / 'results'}", f"+cache_dir={workdir / 'cache'}", "+uvicorn_access_log=true",
    ]  # fmt: skip


def _collect(workdir: Path, head_port: int, output: Path, *extra: str) -> subprocess.Popen:
    argv = [
        sys.executable, "-m", "nemo_gym.cli.main", "eval", "run", "--no-serve", "--input", str(EXAMPLES),
        "--agent", AGENT, "--output", str(output), "--concurrency", "2", "--disable-aggregation",
        f"+head_server.port={head_port}", *extra,
    ]  # fmt: skip
    env = os.environ | {"NEMO_GYM_ENV_YAML": "", "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(argv, cwd=workdir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _log_count(log: Path, route: str) -> int:
    return log.read_text().count(f"POST {route} ") if log.exists() else 0


def test_an_agent_killed_mid_episode_is_a_typed_failure_its_sessions_are_closed_and_resume_loses_nothing(
    workdir: Path,
) -> None:
    import signal
    import time

    from nemo_gym.config import ports
    from nemo_gym.launcher import running_servers
    from nemo_gym.testing import _isolated_config_environment as isolated_config  # no env.yaml of the developer

    output = workdir / "results" / "killed.jsonl"
    resources_log = workdir / "results" / "logs" / "example_single_tool_call.log"
    tasks = len(EXAMPLES.read_text().splitlines())
    with isolated_config():
        try:
            # The agent stays dead (a supervisor restart would heal the run): the row is a typed failure.
            overrides = [*_stack_overrides(workdir, reply_delay_s=3.0), "+server_supervision={enabled: false}"]
            with running_servers(overrides) as run:
                agent = next(s for s in run.servers if s.name == AGENT)
                head_port = int(run.head_url.rsplit(":", 1)[1])
                collect = _collect(workdir, head_port, output)
                deadline = time.monotonic() + 600  # a generous bound: on a loaded machine the collector starts slowly
                while _log_count(resources_log, "/seed_session") == 0:  # an episode is in flight: the model waits
                    assert time.monotonic() < deadline and collect.poll() is None, "no episode started"
                    time.sleep(0.05)
                assert agent.popen is not None
                os.kill(agent.popen.pid, signal.SIGKILL)
                printed, _ = collect.communicate(timeout=300)
                seeded, closed = _log_count(resources_log, "/seed_session"), _log_count(resources_log, "/close_session")
        finally:
            ports.release_all()

        failures = [
            json.loads(line) for line in (workdir / "results" / "killed_failures.jsonl").read_text().splitlines()
        ]
        assert failures, printed
        for failure in failures:
            assert failure["_ng_failure_class"] == "environment_server_failed", failure
            assert failure["failure_kind"].startswith("transport_"), failure  # the agent could not be reached
            assert failure["_ng_failure_stage"] == "agent" and "_ng_failure_terminal" not in failure, failure
            assert failure["_ng_environment_server"] == ENV_SERVER
        assert seeded >= len(failures) and closed == seeded  # every episode's resources session was released
        done_before = rows(output) if output.exists() else {}
        assert len(done_before) + len({(f["_ng_task_index"], f["_ng_rollout_index"]) for f in failures}) == tasks

        try:  # the agent back (a new stack), and the run resumed
            with running_servers(_stack_overrides(workdir, reply_delay_s=0.0)) as run:
                head_port = int(run.head_url.rsplit(":", 1)[1])
                resumed = _collect(workdir, head_port, output, "--resume")
                printed, _ = resumed.communicate(timeout=300)
                assert resumed.returncode == 0, printed
        finally:
            ports.release_all()
    final = rows(output)  # asserts that no rollout is there twice
    assert sorted(final) == [(task, 0) for task in range(tasks)]
    assert all(row["reward"] == 1.0 for row in final.values())
    for key, row in done_before.items():
        assert final[key]["response"] == row["response"]  # what was finished before is kept, not run again
