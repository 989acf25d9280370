"""``gym eval aggregate``, ``gym eval profile`` and ``gym eval reverify``: files in, files out, servers only where
they are needed."""

from __future__ import annotations

import json
import random
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from nemo_gym.cli import legacy
from nemo_gym.cli.main import main
from nemo_gym.launcher import running_servers
from nemo_gym.rollouts.aggregate import compute_metrics_now, rows_by_agent
from nemo_gym.rollouts.config import RolloutCollectionConfig
from nemo_gym.rollouts.run import run_collection
from tests.rollouts.conftest import CONFIG, reward_of, stack_overrides, write_dataset

pytestmark = pytest.mark.timeout(120)


def read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def write(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def keys(rows: list[dict]) -> list[tuple[int, int]]:
    return [(row["_ng_task_index"], row["_ng_rollout_index"]) for row in rows]


def rollout(task: int, index: int, reward: float, agent: str = "agent_a", **extra) -> dict:
    return {
        "_ng_task_index": task, "_ng_rollout_index": index, "agent_ref": {"name": agent}, "reward": reward,
        "response": {"output": [], "usage": {"input_tokens": 10 + task, "output_tokens": index, "total_tokens": 10}},
        "responses_create_params": {"input": f"question {task}"}, **extra,
    }  # fmt: skip


# -- aggregate --------------------------------------------------------------------------------------------------------


def test_aggregate_merges_shards_from_files_alone(workdir, capsys):
    rows = [rollout(t, r, reward_of(t) * (r + 1) / 3, agent="agent_a" if t < 6 else "agent_b", correct=r % 2 == 0)
            for t in range(10) for r in range(3)]  # fmt: skip
    random.Random(0).shuffle(rows)
    write(workdir / "out" / "shard_0.jsonl", [r for r in rows if r["_ng_task_index"] < 4])
    write(workdir / "out" / "shard_1.jsonl", [r for r in rows if r["_ng_task_index"] >= 4])
    write(workdir / "out" / "shard_0_failures.jsonl", [{"_ng_task_index": 0, "_ng_rollout_index": 9}])  # a sidecar
    union = write(workdir / "union.jsonl", rows)

    merged = workdir / "merged" / "all.jsonl"
    # overlapping patterns: each file is read once
    assert main(["eval", "aggregate", "--input-glob", "out/shard_*.jsonl, out/shard_1.jsonl", "-o", str(merged)]) == 0
    printed = capsys.readouterr().out
    assert "30 rollouts from 2 shard file(s)" in printed and "all_aggregate_metrics.json" in printed
    assert "shard_0_failures.jsonl" in printed  # reported as skipped

    merged_rows = read(merged)
    assert keys(merged_rows) == sorted(keys(rows))
    by_key = {k: r for k, r in zip(keys(rows), rows, strict=True)}
    assert merged_rows == [by_key[k] for k in keys(merged_rows)]  # rows copied unchanged
    metrics = json.loads((workdir / "merged" / "all_aggregate_metrics.json").read_text())
    assert metrics == json.loads(json.dumps(compute_metrics_now(rows_by_agent([union]))))
    assert [m["agent_ref"]["name"] for m in metrics] == ["agent_a", "agent_b"]
    assert metrics[0]["agent_metrics"]["num_rollouts"] == 18

    merged.unlink()
    assert main(["eval", "aggregate", "--input-glob", "out/shard_*.jsonl", "-o", str(merged), "--no-merge"]) == 0
    assert not merged.exists() and (workdir / "merged" / "all_aggregate_metrics.json").exists()

    # the legacy entry point, with Hydra-style keys
    code = legacy.main(["ng_aggregate_rollouts", "+input_glob='out/shard_*.jsonl'", f"+output_jsonl_fpath={merged}"])
    assert code == 0 and keys(read(merged)) == sorted(keys(rows))


def test_aggregate_refuses_duplicates_and_globs_matching_nothing(workdir, capsys):
    write(workdir / "a.jsonl", [rollout(0, 0, 1.0), rollout(0, 1, 0.0)])
    write(workdir / "b.jsonl", [rollout(1, 0, 1.0), rollout(0, 1, 1.0)])
    assert main(["eval", "aggregate", "--input-glob", "a.jsonl,b.jsonl", "-o", "m.jsonl"]) == 1
    error = capsys.readouterr().err
    assert "(task 0, rollout 1) appears twice" in error and "a.jsonl:2" in error and "b.jsonl:2" in error
    assert not (workdir / "m.jsonl").exists() and not (workdir / "m_aggregate_metrics.json").exists()

    assert main(["eval", "aggregate", "--input-glob", "a.jsonl,missing_*.jsonl", "-o", "m.jsonl"]) == 1
    assert "no file matches 'missing_*.jsonl'" in capsys.readouterr().err

    write(workdir / "c.jsonl", [{"reward": 1.0}])
    assert main(["eval", "aggregate", "--input-glob", "c.jsonl", "-o", "m.jsonl"]) == 1
    assert "c.jsonl:1: a rollout row needs integer _ng_task_index" in capsys.readouterr().err


# -- profile ----------------------------------------------------------------------------------------------------------

REWARDS = {0: [1.0, 1.0, 1.0, 1.0], 1: [1.0, 0.0, 0.0, 0.0], 2: [0.0, 0.0, 0.5, 0.0]}


def materialized(task: int, index: int) -> dict:
    prompt = f"Task {task}: " + "x" * 300
    return {
        "responses_create_params": {"input": [{"role": "system", "content": "be brief"},
                                              {"role": "user", "content": [{"type": "input_text", "text": prompt}]}]},
        "category": f"c{task % 2}", "huge": list(range(500)), "agent_ref": {"name": "agent_a"},
        "_ng_task_index": task, "_ng_rollout_index": index,
    }  # fmt: skip


def profile_files(workdir: Path, drop: set[tuple[int, int]] = frozenset()) -> tuple[Path, Path]:
    inputs = write(
        workdir / "run" / "x_materialized_inputs.jsonl", [materialized(t, r) for t in REWARDS for r in range(4)]
    )
    rows = [rollout(t, r, reward) for t, rewards in REWARDS.items() for r, reward in enumerate(rewards)]
    random.Random(1).shuffle(rows)
    rollouts = write(workdir / "run" / "x.jsonl", [row for row in rows if tuple(keys([row])[0]) not in drop])
    return inputs, rollouts


def test_profile_pass_rates_pass_at_k_and_the_hardest_tasks_first(workdir, capsys):
    inputs, rollouts = profile_files(workdir)
    assert main(["eval", "profile", "--inputs", str(inputs), "--rollouts", str(rollouts)]) == 0
    printed = capsys.readouterr().out
    lines = read(workdir / "run" / "x_reward_profiling.jsonl")
    assert [line["_ng_task_index"] for line in lines] == [0, 1, 2]
    assert [line["pass_rate"] for line in lines] == [1.0, 0.25, 0.125]
    assert lines[1]["pass@1"] == pytest.approx(0.25) and lines[1]["pass@2"] == pytest.approx(0.5)  # 1 - C(3,2)/C(4,2)
    assert lines[1]["pass@4"] == 1.0 and lines[2]["pass@4"] == 0.0  # 0.5 is not a solve
    assert lines[2]["max/reward"] == 0.5 and lines[0]["num_rollouts"] == lines[0]["expected_num_rollouts"] == 4
    infos = lines[1]["rollout_infos"]
    assert [i["rollout_id"] for i in infos] == ["1:0", "1:1", "1:2", "1:3"]
    assert [i["reward"] for i in infos] == REWARDS[1] and infos[0]["usage/input_tokens"] == 11
    sample = lines[0]["sample"]
    assert sample["prompt"].startswith("Task 0: xxx") and len(sample["prompt"]) == 200
    assert sample["category"] == "c0" and isinstance(sample["huge"], str) and len(sample["huge"]) == 500
    assert "responses_create_params" not in sample and "_ng_rollout_index" not in sample

    (agent,) = json.loads((workdir / "run" / "x_agent_metrics.json").read_text())
    assert agent["agent_metrics"]["mean/reward"] == pytest.approx(5.5 / 12)
    assert agent["num_rollouts"] == agent["expected_num_rollouts"] == 12
    assert printed.index("Task 2") < printed.index("Task 1") < printed.index("Task 0")  # hardest first
    assert "12 of 12 expected (100.0%)" in printed and "3 complete, 0 partial, 0 missing" in printed

    assert main(["eval", "profile", "--rollouts", str(rollouts), "--max-rows", "1"]) == 0  # inputs found beside it
    printed = capsys.readouterr().out
    assert "hardest 1 of 3" in printed and "Task 0" not in printed


def test_profile_partial_runs_and_misaligned_files(workdir, capsys):
    inputs, rollouts = profile_files(workdir, drop={(2, 3), (1, 0)})
    assert main(["eval", "profile", "--inputs", str(inputs), "--rollouts", str(rollouts)]) == 1
    error = capsys.readouterr().err
    assert "2 of 12 rollouts are missing" in error and "(task 1, rollout 0)" in error and "--allow-partial" in error
    assert not (workdir / "run" / "x_reward_profiling.jsonl").exists()

    code = legacy.main(["ng_reward_profile", f"+rollouts_jsonl_fpath={rollouts}", "+allow_partial_rollouts=true"])
    assert code == 0
    printed = capsys.readouterr().out
    assert "10 of 12 expected" in printed and "1 complete, 2 partial, 0 missing" in printed and "1:0" in printed
    lines = read(workdir / "run" / "x_reward_profiling.jsonl")
    assert lines[1]["missing_rollout_indices"] == [0] and lines[1]["pass_rate"] == 0.0
    assert lines[2]["num_rollouts"] == 3 and lines[2]["completion_pct"] == 75.0

    write(rollouts, [rollout(0, 0, 1.0), rollout(7, 0, 1.0)])
    assert main(["eval", "profile", "--rollouts", str(rollouts), "--allow-partial"]) == 1
    assert "x.jsonl:2 (task 7, rollout 0)" in capsys.readouterr().err
    write(rollouts, [rollout(0, 0, 1.0), rollout(0, 0, 0.0)])
    assert main(["eval", "profile", "--rollouts", str(rollouts), "--allow-partial"]) == 1
    assert "x.jsonl:2: (task 0, rollout 0) already appears at line 1" in capsys.readouterr().err


# -- reverify ---------------------------------------------------------------------------------------------------------


@pytest.mark.e2e
def test_reverify_restores_tampered_rewards_and_refuses_verifiers_that_are_not_stateless(workdir, extra_root, capsys):
    data = write_dataset(workdir / "data.jsonl", 12)
    settings = RolloutCollectionConfig(
        output_jsonl_fpath=str(workdir / "out" / "rollouts.jsonl"), input_jsonl_fpath=str(data),
        agent_name="rollout_test_agent", num_repeats=2,
    )  # fmt: skip
    claims_unknown = "++rollout_test_env.resources_servers.rollout_test_env.reverify_mode=unknown"
    with running_servers(stack_overrides(workdir, claims_unknown)) as run:
        result = run_collection(settings, run.config, show_progress=False)
        stored = read(result.summary.output_path)
        assert len(stored) == 24
        tampered = [row | {"reward": 0.0 if row["_ng_task_index"] % 2 else 0.5} for row in stored]
        tampered_path = write(workdir / "out" / "tampered.jsonl", tampered)
        inputs = str(result.materialized.path)
        head = f"++head_server={{host: 127.0.0.1, port: {urlsplit(run.head_url).port}}}"
        common = ["--rollouts", str(tampered_path), "--inputs", inputs, head]

        refused = workdir / "out" / "refused.jsonl"
        assert main(["eval", "reverify", "--no-serve", *common, "--output", str(refused)]) == 1
        error = capsys.readouterr().err
        assert (
            "re-verification refused" in error and "'rollout_test_env' says 'unknown'" in error and "--force" in error
        )
        assert not refused.exists()

        forced = workdir / "out" / "forced.jsonl"
        assert (
            main(["eval", "reverify", "--no-serve", *common, "--output", str(forced), "--force", "--limit", "5"]) == 0
        )
        rows = read(forced)
        assert len(rows) == 5 and all(row["_ng_reverify_unsafe"] for row in rows)
        assert all(row["reward"] == reward_of(row["_ng_task_index"]) for row in rows)

        # aggregate with --servers asks the running agent for its metrics; the numbers match the files' own
        merged = workdir / "out" / "merged.jsonl"
        assert main(["eval", "aggregate", "--input-glob", str(result.summary.output_path), "-o", str(merged),
                     "--servers", head]) == 0  # fmt: skip
        from_servers = json.loads((workdir / "out" / "merged_aggregate_metrics.json").read_text())
        assert from_servers[0]["agent_metrics"]["mean/reward"] == result.metrics[0]["agent_metrics"]["mean/reward"]
    capsys.readouterr()

    # Without --no-serve the command starts only the verifying resources server (stateless by default) itself.
    output = workdir / "out" / "reverified.jsonl"
    args = ["eval", "reverify", "--config", str(CONFIG), "--rollouts", str(tampered_path), "--inputs", inputs,
            "--output", str(output), "--concurrency", "4", "+shared_venv=true", "+head_server={port: 0}",
            f"+results_dir={workdir / 'reverify_results'}", f"+cache_dir={workdir / 'cache'}"]  # fmt: skip
    assert main(args) == 0
    report = capsys.readouterr().err
    rows = read(output)
    assert keys(rows) == sorted(keys(stored))
    assert all(row["reward"] == reward_of(row["_ng_task_index"]) for row in rows)
    assert [row["_ng_previous_reward"] for row in rows] == [
        r["reward"] for r in sorted(tampered, key=lambda r: keys([r]))
    ]
    assert all(
        row["response"] == s["response"] for row, s in zip(rows, sorted(stored, key=lambda r: keys([r])), strict=True)
    )
    assert not any("_ng_reverify_unsafe" in row for row in rows)
    assert "Re-verified 24 rollouts" in report and "24 reward(s) changed" in report
    assert "Starting rollout_test_env " in report
    metrics = json.loads((workdir / "out" / "reverified_aggregate_metrics.json").read_text())
    assert metrics[0]["agent_metrics"]["mean/reward"] == pytest.approx(
        result.metrics[0]["agent_metrics"]["mean/reward"]
    )
    assert not (workdir / "out" / "reverified_failures.jsonl").exists()
    # no inference: neither the agent nor the policy model was started
    assert {p.name for p in (workdir / "reverify_results" / "logs").glob("*.log")} == {"rollout_test_env.log"}


def test_reverify_checks_the_files_before_starting_anything(workdir, capsys):
    inputs = write(workdir / "x_materialized_inputs.jsonl", [materialized(0, 0)])
    rollouts = write(workdir / "x.jsonl", [rollout(0, 0, 1.0), rollout(3, 1, 1.0)])
    args = ["eval", "reverify", "--config", str(CONFIG), "--rollouts", str(rollouts), "--output"]
    assert main([*args, str(rollouts)]) == 1
    assert "--output must be a new file" in capsys.readouterr().err
    assert main([*args, str(workdir / "new.jsonl")]) == 1
    assert "x.jsonl:2: (task 3, rollout 1) is not in" in capsys.readouterr().err
    assert inputs.exists() and not (workdir / "new.jsonl").exists()
