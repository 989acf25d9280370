"""Nothing lost in a run's output: no silent overwrite, one writer at a time, duplicates repaired on resume.

The runs are real ``gym eval run`` processes against the scripted model (the helpers of ``test_collection.py``); a
run is kept "still running" by holding its verifies until a release file exists, never by timing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import nemo_gym.launcher
from nemo_gym.cli.main import main
from nemo_gym.errors import ConfigError
from nemo_gym.jsonl import drop_repeated_rows
from nemo_gym.rollouts.claim import OutputInUseError, claim_output, lock_path
from nemo_gym.rollouts.config import RolloutCollectionConfig
from nemo_gym.rollouts.materialize import rollout_key
from tests.helpers import write
from tests.rollouts.conftest import CONFIG, ROOT, reward_of, write_dataset
from tests.rollouts.test_collection import ENV, HANG_GUARD_S, _gym_eval_run, keys, read, wait_for_lines

OUTPUT = Path("out") / "rollouts.jsonl"
"""Where ``_gym_eval_run`` writes, relative to its workdir."""


def snapshot(directory: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(directory.iterdir()) if path.is_file()}


def finish(process: subprocess.Popen) -> tuple[int, str]:
    log, _ = process.communicate(timeout=HANG_GUARD_S)
    return process.returncode, log


def refusal(code: int, log: str) -> str:
    """The one error line of a refused run: non-zero exit, no traceback, nothing started."""
    assert code == 1, log
    assert "Traceback" not in log and "Starting servers" not in log, log
    (line,) = [line for line in log.splitlines() if line.startswith("error: ")]
    return line


# -- the file operations ----------------------------------------------------------------------------------------------


def row(task: int, rollout: int, reward: float) -> str:
    return json.dumps({"_ng_task_index": task, "_ng_rollout_index": rollout, "reward": reward}) + "\n"


def test_repeated_rows_are_dropped_keeping_the_first_and_every_other_line_byte_for_byte(tmp_path: Path) -> None:
    lines = [row(0, 0, 1.0), row(0, 1, 0.5), "\n", row(0, 0, 9.0), row(1, 0, 0.25), row(0, 1, 9.0), row(0, 0, 9.0)]
    path = write(tmp_path / "x.jsonl", "".join(lines))
    found, dropped = drop_repeated_rows(path, rollout_key)
    assert dropped == 3 and found == {(0, 0), (0, 1), (1, 0)}
    assert path.read_text() == row(0, 0, 1.0) + row(0, 1, 0.5) + "\n" + row(1, 0, 0.25)
    assert not list(tmp_path.glob(".*.tmp"))


def test_a_file_without_repeats_is_left_as_it_is(tmp_path: Path) -> None:
    path = write(tmp_path / "x.jsonl", row(0, 0, 1.0) + row(0, 1, 1.0))
    before = os.stat(path)
    assert drop_repeated_rows(path, rollout_key) == ({(0, 0), (0, 1)}, 0)
    assert os.path.samestat(before, os.stat(path)) and os.stat(path).st_mtime_ns == before.st_mtime_ns


# -- the lock ---------------------------------------------------------------------------------------------------------

HOLD = """
import sys
from nemo_gym.rollouts.claim import claim_output
from nemo_gym.rollouts.config import RolloutCollectionConfig

with claim_output(RolloutCollectionConfig(output_jsonl_fpath=sys.argv[1])):
    print("held", flush=True)
    sys.stdin.read()  # until the test kills this process
"""


def test_the_lock_names_its_holder_and_dies_with_it(tmp_path: Path) -> None:
    settings = RolloutCollectionConfig(output_jsonl_fpath=str(tmp_path / "x.jsonl"))
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, settings.output_jsonl_fpath], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        with pytest.raises(OutputInUseError) as refused, claim_output(settings):
            pass
        assert str(refused.value) == (
            f"{tmp_path / 'x.jsonl'} is being written by another run (pid {holder.pid}); wait for it to finish, "
            "or choose another --output"
        )
    finally:
        holder.kill()  # SIGKILL: no clean-up code runs, the lock file stays behind
        holder.wait(timeout=HANG_GUARD_S)
    assert lock_path(tmp_path / "x.jsonl").exists()
    with claim_output(settings):  # the kernel let the lock go with its holder
        assert lock_path(tmp_path / "x.jsonl").read_text().split()[0] == str(os.getpid())
    assert not lock_path(tmp_path / "x.jsonl").exists()  # a clean release removes the file


# -- refusals before anything starts ----------------------------------------------------------------------------------


@pytest.fixture
def servers_never_start(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("servers were started")

    monkeypatch.setattr(nemo_gym.launcher, "running_servers", refuse)


def eval_run(output: Path, *extra: str) -> list[str]:
    return [
        "eval", "run", "--config", str(CONFIG), "--input", str(write_dataset(output.parent / "data.jsonl", 2)),
        "--agent", "rollout_test_agent", "--output", str(output), *extra,
    ]  # fmt: skip


def test_resume_and_overwrite_together_are_one_error(workdir, extra_root, servers_never_start, capsys) -> None:
    assert main(eval_run(workdir / "x.jsonl", "--resume", "--overwrite")) == 1
    err = capsys.readouterr().err.strip()
    assert err == "error: --resume and --overwrite contradict each other: continue the run or replace it, not both"


def test_resuming_results_with_no_record_of_their_run_is_refused(
    workdir, extra_root, servers_never_start, capsys
) -> None:
    """Without ``<stem>_run.json`` there is no telling what the rows belong to; starting over would wipe them."""
    output = write(workdir / "x.jsonl", row(0, 0, 1.0))
    assert main(eval_run(output, "--resume")) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: cannot resume {output}: x_run.json, the record of the run that wrote it, is missing")
    assert "--overwrite" in err and output.read_text() == row(0, 0, 1.0)


def test_a_run_that_only_failed_is_kept_too(workdir, extra_root, servers_never_start, capsys) -> None:
    failures = write(workdir / "x_failures.jsonl", '{"_ng_task_index": 0, "_ng_rollout_index": 0}\n')
    write(workdir / "x.jsonl", "")
    assert main(eval_run(workdir / "x.jsonl")) == 1
    assert capsys.readouterr().err.startswith(f"error: {failures} already holds results of an earlier run")


@pytest.fixture
def servers_fail_to_start(monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(*args: object, **kwargs: object) -> None:
        raise ConfigError("server 'policy_model' failed to start")

    monkeypatch.setattr(nemo_gym.launcher, "running_servers", fail)


def test_a_run_that_fails_before_any_result_leaves_no_materialized_inputs_behind(
    workdir, extra_root, servers_fail_to_start, capsys
) -> None:
    assert main(eval_run(workdir / "x.jsonl")) == 1
    assert capsys.readouterr().err.strip().endswith("\nerror: server 'policy_model' failed to start")
    assert sorted(path.name for path in workdir.iterdir()) == ["data.jsonl"]  # no x_materialized_inputs.jsonl


def test_a_failed_resume_keeps_the_materialized_inputs_beside_earlier_results(
    workdir, extra_root, servers_fail_to_start, capsys
) -> None:
    output = write(workdir / "x.jsonl", row(0, 0, 1.0))
    write(workdir / "x_run.json", '{"fingerprint": "of another input"}')
    inputs = write(workdir / "x_materialized_inputs.jsonl", row(0, 0, 0.0))
    assert main(eval_run(output, "--resume")) == 1
    assert capsys.readouterr().err.startswith(f"error: cannot resume {output}: the materialized inputs differ")
    assert inputs.read_text() == row(0, 0, 0.0) and (workdir / "x_run.json").exists()


# -- real runs --------------------------------------------------------------------------------------------------------


def legacy_e2e_collect(workdir: Path, data: Path, *extra: str) -> subprocess.Popen:
    """``ng_e2e_collect_rollouts`` with NeMo Gym's ``+key=value`` spelling, as a real process."""
    env = os.environ | {"NEMO_GYM_ENV_YAML": "", "NEMO_GYM_EXTRA_ROOTS": str(ROOT)}
    args = [
        str(Path(sys.executable).parent / "ng_e2e_collect_rollouts"), f"+config_paths=[{CONFIG}]",
        f"+input_jsonl_fpath={data}", "+agent_name=rollout_test_agent", f"+output_jsonl_fpath={workdir / OUTPUT}",
        "+shared_venv=true", "+head_server={port: 0}", f"+results_dir={workdir / 'results'}",
        f"+cache_dir={workdir / 'cache'}", *extra,
    ]  # fmt: skip
    return subprocess.Popen(args, cwd=workdir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_an_existing_output_is_refused_and_left_byte_identical_until_overwrite_is_said(workdir: Path) -> None:
    data = write_dataset(workdir / "data.jsonl", 10)
    code, log = finish(_gym_eval_run(workdir, data))
    assert code == 0, log
    output = workdir / OUTPUT
    before = snapshot(output.parent)
    assert len(read(output)) == 20 and {"rollouts_materialized_inputs.jsonl", "rollouts_run.json"} <= set(before)
    assert "rollouts_aggregate_metrics.json" in before

    line = refusal(*finish(_gym_eval_run(workdir, data, "--limit", "2")))
    assert line == (
        f"error: {output} already holds results of an earlier run; pass --resume to continue that run or --overwrite "
        "to replace it (+resume_from_cache=true / +overwrite=true), or choose another --output"
    )
    assert snapshot(output.parent) == before  # every file of the run, sidecars included, byte for byte
    refusal(*finish(legacy_e2e_collect(workdir, data, "+limit=2")))  # the legacy spelling is held to the same rule
    assert snapshot(output.parent) == before

    code, log = finish(legacy_e2e_collect(workdir, data, "+limit=2", "+overwrite=true"))
    assert code == 0, log
    assert sorted(keys(read(output))) == [(0, 0), (1, 0)]  # the new run's rows only (one repeat each)
    metrics = json.loads(output.with_name("rollouts_aggregate_metrics.json").read_text())
    assert metrics[0]["agent_metrics"]["num_rollouts"] == 2
    assert not lock_path(output).exists()


def test_a_second_run_on_an_output_being_written_is_refused_naming_the_holder(workdir: Path) -> None:
    data = write_dataset(workdir / "data.jsonl", 30)
    release = workdir / "release"
    held = (f"{ENV}.hold_verifies_after=10", f"{ENV}.release_file={release}")  # the first run stays at 10 of 60 rows
    output = workdir / OUTPUT
    first = _gym_eval_run(workdir, data, *held)
    try:
        wait_for_lines(10, output, running=first)
        for extra in (["--resume"], []):
            line = refusal(*finish(_gym_eval_run(workdir, data, *extra)))
            assert line == (
                f"error: {output} is being written by another run (pid {first.pid}); wait for it to finish, or "
                "choose another --output"
            )
    finally:
        release.touch()
    code, log = finish(first)
    assert code == 0, log
    rows = read(output)
    assert sorted(keys(rows)) == [(t, r) for t in range(30) for r in range(2)]  # each once: no second writer
    metrics = json.loads(output.with_name("rollouts_aggregate_metrics.json").read_text())
    assert metrics[0]["agent_metrics"]["num_rollouts"] == 60


def test_resume_repairs_planted_duplicates_and_a_torn_line_and_counts_each_rollout_once(workdir: Path) -> None:
    data = write_dataset(workdir / "data.jsonl", 20)
    code, log = finish(_gym_eval_run(workdir, data))
    assert code == 0, log
    output = workdir / OUTPUT
    lines = output.read_text().splitlines(keepends=True)
    assert len(lines) == 40
    kept = lines[:30]  # the last 10 rollouts are missing: the resume runs them
    duplicates = [json.dumps(json.loads(line) | {"reward": 99.0}) + "\n" for line in lines[:5]]
    output.write_text("".join(kept + duplicates) + lines[5][:40])  # ... and the last write was torn

    code, log = finish(_gym_eval_run(workdir, data, "--resume"))
    assert code == 0, log
    printed = " ".join(log.split())
    assert f"note: dropped 5 duplicate rollout(s) from {output}" in printed
    assert "partial last line" in printed and "10 rollouts scored, 0 failed, 30 already done" in printed
    final = output.read_text().splitlines(keepends=True)
    assert final[:30] == kept  # every row that was not a duplicate is still there, byte for byte
    assert sorted(keys(read(output))) == [(t, r) for t in range(20) for r in range(2)]
    assert all(r["reward"] == reward_of(r["_ng_task_index"]) for r in read(output))
    (metrics,) = json.loads(output.with_name("rollouts_aggregate_metrics.json").read_text())
    assert metrics["agent_metrics"]["num_rollouts"] == 40
    expected = sum(reward_of(t) for t in range(20)) / 20
    assert metrics["agent_metrics"]["mean/reward"] == pytest.approx(expected)


@pytest.mark.parametrize(
    ("file", "damage", "reason"),
    [
        ("rollouts.jsonl", '{"reward": 1.0, "_ng_task_', "not valid JSON ("),
        ("rollouts_failures.jsonl", '{"reward": 1.0}', "not a row of this kind (KeyError: '_ng_task_index')"),
    ],
)
def test_a_damaged_line_in_the_results_stops_resume_naming_file_line_and_fix(
    workdir: Path, file: str, damage: str, reason: str
) -> None:
    data = write_dataset(workdir / "data.jsonl", 3)
    code, log = finish(_gym_eval_run(workdir, data))
    assert code == 0, log
    damaged = workdir / "out" / file
    lines = damaged.read_text().splitlines(keepends=True) if damaged.exists() else []
    damaged.write_text("".join([*lines[:1], damage + "\n", *lines[1:]]))  # a whole line, not a torn last write
    number = min(2, len(lines) + 1)  # the run had no failures: the damaged line is the file's first

    code, log = finish(_gym_eval_run(workdir, data, "--resume"))
    assert code == 1 and "Traceback" not in log, log
    (error,) = [line for line in log.splitlines() if line.startswith("error: ")]
    assert error.startswith(f"error: cannot resume: {damaged}:{number}: {reason}")
    assert error.endswith(f"Delete line {number} of {file} (that rollout runs again), or start over with --overwrite")
