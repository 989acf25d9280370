"""Checking the rows in a child forked as the collect command starts (``ForkedRowCheck``) gives what
``prepare_inputs`` gives: the same result and file, the same error, and nothing left running, whatever happens to the
command or the child. A child forked by the entry point (``forked_early``) that checked the input ahead validates
each row once, and what it checked ahead counts only for the file as it still is.

Each case runs in a fresh interpreter (no test-runner threads, so the child is really forked there).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

SCRIPT = """
import json, os, signal, sys, threading, time
from pathlib import Path
from omegaconf import OmegaConf
from nemo_gym.datasets import validation
from nemo_gym.errors import ConfigError
from nemo_gym.rollouts import forked_check
from nemo_gym.rollouts.config import RolloutCollectionConfig
from nemo_gym.rollouts.forked_check import ForkedRowCheck, forked_early
from nemo_gym.rollouts.inputs import prepare_inputs

mode, rows, out = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
config = OmegaConf.create({"a": {"responses_api_agents": {"simple_agent": {"entrypoint": "app.py"}}}})
settings = RolloutCollectionConfig(agent_name="a", input_jsonl_fpath=str(rows), output_jsonl_fpath=str(out),
                                   num_repeats=2)
report = {"parent": os.getpid(), "forks": 0}
real_fork = os.fork

def fork():
    report["forks"] += 1
    return real_fork()

os.fork = fork

def writing():
    return any(p.name.endswith(".tmp") for p in out.parent.iterdir())

validated = out.parent.parent / "validated"  # one line per create params validated, by any process
real_problem = validation.create_params_problem

def counted_problem(params, overrides=None):
    with validated.open("a") as f:
        f.write(f"{os.getpid()} ")
    return real_problem(params, overrides)

validation.create_params_problem = counted_problem

def validated_by():
    lines = validated.read_text().split() if validated.exists() else []
    return {"parent" if int(pid) == report["parent"] else "child": lines.count(pid) for pid in set(lines)}

def wait_for_check_ahead(count):
    deadline = time.monotonic() + 30
    while validated_by().get("child", 0) < count and time.monotonic() < deadline:
        time.sleep(0.005)

def meanwhile():
    report["meanwhile_in"] = os.getpid()
    if mode == "interrupted":  # Ctrl-C once the child is writing the rows' temporary file
        deadline = time.monotonic() + 30
        while not writing() and time.monotonic() < deadline:
            time.sleep(0.001)
        report["child_was_writing"] = writing()
        raise KeyboardInterrupt

def early():
    with forked_early(True, str(rows)):
        if mode == "early_untaken":
            return prepare_inputs(settings, config)
        with ForkedRowCheck.early_or_new() as check:
            assert check._pid, "the entry point's child is the one taken"
            wait_for_check_ahead(rows_count)
            report["checked_ahead"] = validated_by()
            if mode == "early_changed":  # the file changes after the child checked it: its verdicts do not count
                rows.write_text(rows.read_text().replace('"q1"', '3', 1))
            return check.run(settings, config, meanwhile)

def forked():
    if mode.startswith("early"):
        return early()
    with ForkedRowCheck() as check:
        if mode == "child_killed":
            os.kill(check._pid, signal.SIGKILL)
        if mode == "command_failed":
            raise ConfigError("the config is wrong")
        if mode == "unpicklable":  # a value pickle cannot carry (the child never gets the run)
            forked_check.pickle = Unpicklable()
        return check.run(settings, config, meanwhile)

class Unpicklable:
    def dumps(self, value):
        raise TypeError("cannot pickle")

rows_count = sum(1 for line in rows.read_text().splitlines() if line.strip())

if mode == "threads":
    stop = threading.Event()
    threading.Thread(target=stop.wait, daemon=True).start()
for name, run in (("forked", forked), ("inline", lambda: prepare_inputs(settings, config))):
    validated.unlink(missing_ok=True)
    try:
        result = run()
        report[name] = [result.num_rows, result.num_tasks, result.rollouts_per_agent, result.fingerprint,
                        result.path.read_text()]
    except (ConfigError, KeyboardInterrupt) as e:
        report[name] = f"{type(e).__name__}: {e}"
    report[name + "_leftovers"] = sorted(p.name for p in out.parent.iterdir() if p.name.startswith("."))
    report[name + "_files"] = sorted(p.name for p in out.parent.iterdir())
    report[name + "_validated"] = validated_by()
    for p in out.parent.iterdir():
        p.unlink()
try:
    os.waitpid(-1, os.WNOHANG)
    report["children"] = "some"
except ChildProcessError:
    report["children"] = "none"
if mode == "threads":
    stop.set()
print(json.dumps(report))
"""


def run_case(tmp_path: Path, mode: str, lines: list[str]) -> dict:
    rows = tmp_path / "rows.jsonl"
    rows.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out" / "o.jsonl"
    out.parent.mkdir(exist_ok=True)
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, mode, str(rows), str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.stdout.strip(), done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


GOOD = [json.dumps({"responses_create_params": {"input": f"q{i % 3}"}}) for i in range(50)]


@pytest.mark.parametrize("mode", ["fork", "threads"])
def test_the_same_rows_file_and_counts_as_prepare_inputs(tmp_path: Path, mode: str) -> None:
    report = run_case(tmp_path, mode, GOOD)
    assert report["forked"] == report["inline"]
    assert report["forked"][:3] == [100, 3, {"a": 100}]
    assert report["meanwhile_in"] == report["parent"]  # the imports happen in the command's own process
    assert report["forks"] == (1 if mode == "fork" else 0)  # other threads running: all of it here, in order
    assert report["forked_leftovers"] == [] and report["children"] == "none"


def test_a_bad_row_is_the_same_error_as_prepare_inputs(tmp_path: Path) -> None:
    report = run_case(tmp_path, "fork", [*GOOD, '{"responses_create_params": {"input": 3}}', "not json"])
    assert report["forked"].startswith("BadLineError: ") and report["forks"] == 1  # a ConfigError naming the line
    assert report["forked"] == report["inline"]
    assert report["forked_leftovers"] == [] and report["children"] == "none"


def test_an_interrupt_while_the_child_writes_stops_it_and_leaves_no_file(tmp_path: Path) -> None:
    report = run_case(tmp_path, "interrupted", GOOD * 200)
    assert report["forked"] == "KeyboardInterrupt: " and report["child_was_writing"]
    assert report["forked_files"] == []  # the child was stopped, not waited for: it never finished the file
    assert report["forked_leftovers"] == [] and report["children"] == "none"


def test_a_command_that_fails_before_its_rows_are_due_leaves_no_child_behind(tmp_path: Path) -> None:
    report = run_case(tmp_path, "command_failed", GOOD)
    assert report["forked"] == "ConfigError: the config is wrong" and report["forks"] == 1
    assert report["forked_leftovers"] == [] and report["children"] == "none"


@pytest.mark.parametrize("mode", ["child_killed", "unpicklable"])
def test_without_a_child_to_do_it_the_command_checks_the_rows_itself(tmp_path: Path, mode: str) -> None:
    report = run_case(tmp_path, mode, [*GOOD, '{"responses_create_params": {"input": 3}}'])
    assert report["forked"].startswith("ConfigError: ") and report["forked"] == report["inline"]
    report = run_case(tmp_path, mode, GOOD)
    assert report["forked"] == report["inline"] and report["forked"][:3] == [100, 3, {"a": 100}]
    assert report["meanwhile_in"] == report["parent"] and report["forks"] == 1
    assert report["forked_leftovers"] == [] and report["children"] == "none"


def test_the_entry_points_child_checks_ahead_and_each_row_is_validated_once(tmp_path: Path) -> None:
    report = run_case(tmp_path, "early", GOOD)
    assert report["forked"] == report["inline"] and report["forked"][:3] == [100, 3, {"a": 100}]
    assert report["checked_ahead"] == {"child": 50}  # all of it before the run was handed over
    assert report["forked_validated"] == {"child": 50}  # not again when the rows were checked and written
    assert report["inline_validated"] == {"parent": 50}
    assert report["forks"] == 1 and report["forked_leftovers"] == [] and report["children"] == "none"


def test_rows_checked_ahead_count_only_for_the_file_as_it_still_is(tmp_path: Path) -> None:
    report = run_case(tmp_path, "early_changed", GOOD)
    assert (
        report["forked"].startswith("ConfigError: ")
        and "rows.jsonl:2: responses_create_params.input" in report["forked"]
    )
    assert report["forked"] == report["inline"]  # the line changed after it was checked ahead: reported all the same
    assert report["forked_leftovers"] == [] and report["children"] == "none"


def test_a_child_the_entry_point_forked_for_a_command_that_never_took_it_is_stopped(tmp_path: Path) -> None:
    report = run_case(tmp_path, "early_untaken", GOOD)
    assert report["forked"] == report["inline"] and report["forks"] == 1
    assert report["forked_leftovers"] == [] and report["children"] == "none"
