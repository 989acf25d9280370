"""Issue 18, acceptance 1 and 2: server replicas on two Ray nodes, 2,000 rollouts exactly once, a node lost mid-run.

The stack is the rollout tests' (``tests/rollouts/root``: the scripted model, a resources server, ``simple_agent``),
launched with ``ray_head_node_address`` on the real two-node cluster of ``conftest.py``, the agent and the resources
server in two replicas each (one per node), the model once (on the first node).
"""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from nemo_gym.cli.commands.launch import _table
from nemo_gym.config.compose import ComposeOptions, compose
from nemo_gym.launcher import running_servers
from nemo_gym.launcher.status import query_status
from nemo_gym.rollouts.run import RunResult, run_collection
from tests.ray.conftest import RayCluster
from tests.rollouts.conftest import ROOT, reward_of, stack_overrides, write_dataset
from tests.rollouts.test_collection import HANG_GUARD_S, keys, read, settings, wait_for_lines

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(420)]

TASKS, REPEATS = 500, 4
AGENT, ENV = "rollout_test_agent", "rollout_test_env"
REPLICATED = (
    f"++{AGENT}.responses_api_agents.simple_agent.replicas=2",
    f"++{ENV}.resources_servers.{ENV}.replicas=2",
)


@pytest.fixture
def stack(ray_env: RayCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Any]:
    """The composed config on the cluster, and the collection settings for TASKS x REPEATS rollouts."""
    monkeypatch.setenv("NEMO_GYM_EXTRA_ROOTS", str(ROOT))
    overrides = stack_overrides(tmp_path, f"+ray_head_node_address='{ray_env.address}'", *REPLICATED)
    composed = compose(ComposeOptions(overrides=overrides, reserve_ports=True, require_server_instances=True))
    data = write_dataset(tmp_path / "data.jsonl", TASKS)
    return composed, settings(tmp_path, data, num_repeats=REPEATS, num_samples_in_parallel=64)


def assert_exactly_once(output: Path) -> None:
    rows = read(output)
    counts = Counter(keys(rows))
    assert not [key for key, n in counts.items() if n > 1], "a rollout was written twice"
    assert set(counts) == {(task, rollout) for task in range(TASKS) for rollout in range(REPEATS)}
    assert all(row["reward"] == reward_of(row["_ng_task_index"]) for row in rows)


def test_replicas_on_both_nodes_collect_every_rollout_exactly_once(stack):
    composed, run_settings = stack
    with running_servers(config=composed) as launcher:
        placed = launcher.server_instances()
        status = query_status("127.0.0.1", launcher.head.port) if launcher.head else []  # what `gym env status` shows
        # as `gym eval run --ray-address` does: the replicas and their nodes are asked of the head server
        result = run_collection(run_settings, launcher.composed, show_progress=False)

    replicas = {p["name"]: p["node"] for p in placed if p["instance"] in (AGENT, ENV)}
    assert set(replicas) == {f"{AGENT}@0", f"{AGENT}@1", f"{ENV}@0", f"{ENV}@1"}
    assert replicas[f"{AGENT}@0"] != replicas[f"{AGENT}@1"], "the agent's replicas share a node"
    assert replicas[f"{AGENT}@1"] == replicas[f"{ENV}@1"], "a node holds a whole slice: agent and resources server"
    assert {s["name"]: s["node"] for s in status} == {p["name"]: p["node"] for p in placed}
    assert all(s["healthy"] for s in status)
    console = Console(width=200, record=True)
    console.print(_table(status))
    shown = console.export_text()
    assert "node" in shown.splitlines()[0] and replicas[f"{AGENT}@1"] in shown

    assert result.summary.succeeded == TASKS * REPEATS and result.summary.failed == 0
    assert_exactly_once(Path(run_settings.output_jsonl_fpath))
    served = result.summary.served_by
    print(f"\nserved by: {dict(served)}")
    assert served[f"{AGENT}@0"] > 0 and served[f"{AGENT}@1"] > 0, f"rollouts not served on both nodes: {served}"


def test_losing_a_node_mid_run_loses_and_duplicates_nothing(stack, ray_env: RayCluster):
    composed, run_settings = stack
    output = Path(run_settings.output_jsonl_fpath)
    results: list[RunResult] = []
    with running_servers(config=composed) as launcher:
        placed = launcher.server_instances()
        run = threading.Thread(
            target=lambda: results.append(run_collection(run_settings, launcher.composed, False, placed=placed))
        )
        run.start()
        wait_for_lines(TASKS * REPEATS // 5, output, running=run)
        ray_env.kill_node2()  # its agent and resources server replicas die with rollouts in flight on them
        run.join(HANG_GUARD_S)
        assert not run.is_alive(), f"the run did not finish within {HANG_GUARD_S} s of losing a node"
        assert results, "the run raised instead of finishing"
        summary = results[0].summary
        if summary.failed:  # a rollout charged before its server was found gone: --resume runs it again
            again = run_settings.model_copy(update={"resume_from_cache": True})
            resumed = run_collection(again, launcher.composed, False, placed=placed)
            assert resumed.summary.failed == 0
    print(
        f"\nnode lost mid-run: {summary.succeeded} scored, {summary.failed} failed (resumed), {dict(summary.served_by)}"
    )
    assert summary.served_by[f"{AGENT}@1"] > 0, "nothing ran on the lost node before it went"
    assert summary.served_by[f"{AGENT}@0"] > 0
    assert_exactly_once(output)
