"""Checks of repo_repair's generated data: the rows are consistent with each other and with the scripted replays, the
example tasks really behave (tests fail, the gold patch fixes them, the wrong patch does not), and the generator
reproduces the committed files byte for byte."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent.parent
DATA = HERE / "data"
GENERATOR = HERE / "generate_tasks.py"
KINDS = {"off_by_one", "wrong_operator", "swapped_arguments", "string_case"}
TOOL_NAMES = ["read_file", "write_file", "run_command", "apply_patch"]
ROW_KEYS = ["task_id", "bug_kind", "responses_create_params", "repo", "test_command", "gold_patch", "wrong_patch"]
DATA_FILES = ["train.jsonl", "example.jsonl", "gold_scripts.jsonl", "wrong_scripts.jsonl"]
TIMEOUT_S = 120


def _read(name: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (DATA / name).read_text(encoding="utf-8").splitlines()]


TRAIN = _read("train.jsonl")
EXAMPLES = _read("example.jsonl")


def _texts(row: dict[str, Any]) -> list[str]:
    return [message["content"] for message in row["responses_create_params"]["input"]]


def test_forty_tasks_ten_of_each_kind_with_unique_ids() -> None:
    assert len(TRAIN) == 40
    assert Counter(row["bug_kind"] for row in TRAIN) == dict.fromkeys(KINDS, 10)
    assert [row["task_id"] for row in TRAIN] == [f"repo_repair-{i:03d}" for i in range(40)]
    assert all(list(row) == ROW_KEYS for row in TRAIN)


def test_each_prompt_names_its_own_id_and_no_other() -> None:
    ids = [row["task_id"] for row in TRAIN]
    for row in TRAIN:
        system, user = _texts(row)
        assert f"Task {row['task_id']}." in user
        assert [task_id for task_id in ids if task_id in system or task_id in user] == [row["task_id"]]


def test_tools_are_the_four_strict_functions() -> None:
    for row in TRAIN:
        tools = row["responses_create_params"]["tools"]
        assert [tool["name"] for tool in tools] == TOOL_NAMES
        assert tools == TRAIN[0]["responses_create_params"]["tools"]
    for tool in TRAIN[0]["responses_create_params"]["tools"]:
        assert tool["type"] == "function" and tool["strict"] is True and tool["description"]
        parameters = tool["parameters"]
        assert parameters["type"] == "object" and parameters["additionalProperties"] is False
        assert parameters["required"] == list(parameters["properties"])


def test_examples_are_train_rows_covering_every_kind() -> None:
    by_id = {row["task_id"]: row for row in TRAIN}
    assert len(EXAMPLES) == 5
    assert all(row == by_id[row["task_id"]] for row in EXAMPLES)
    assert {row["bug_kind"] for row in EXAMPLES} == KINDS


def test_repos_are_small_and_patches_touch_only_code() -> None:
    for row in TRAIN:
        assert all(len(text.encode()) < 2048 for text in row["repo"].values()), row["task_id"]
        assert any(path.startswith("tests/test_") for path in row["repo"])
        for patch in (row["gold_patch"], row["wrong_patch"]):
            assert patch.startswith("diff --git a/")
            touched = [line[6:] for line in patch.splitlines() if line.startswith("+++ b/")]
            assert touched and all(path in row["repo"] and not path.startswith("tests/") for path in touched)
        assert row["gold_patch"] != row["wrong_patch"]


@pytest.mark.parametrize("name, key", [("gold_scripts.jsonl", "gold_patch"), ("wrong_scripts.jsonl", "wrong_patch")])
def test_scripts_replay_each_tasks_patch(name: str, key: str) -> None:
    scripts = _read(name)
    assert [script["match"] for script in scripts] == [row["task_id"] for row in TRAIN]
    for script, row in zip(scripts, TRAIN, strict=True):
        (call,), (reply,) = script["script"]
        assert call["type"] == "function_call" and call["name"] == "apply_patch"
        assert json.loads(call["arguments"]) == {"patch": row[key]}
        assert reply["type"] == "message" and reply["content"][0]["type"] == "output_text"


def _run(command: list[str], cwd: Path, stdin: str | None = None) -> int:
    # No plugins (the repos need none, and they are most of pytest's start-up); no repository above cwd for git.
    env = os.environ | {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "GIT_CEILING_DIRECTORIES": str(cwd.parent)}
    return subprocess.run(
        command, cwd=cwd, input=stdin, capture_output=True, text=True, timeout=TIMEOUT_S, env=env
    ).returncode


def _tests_pass(tmp_path: Path, repo: dict[str, str], patch: str | None) -> bool:
    tmp_path.mkdir()
    for path, text in repo.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text, encoding="utf-8")
    if patch is not None:
        assert _run(["git", "apply", "-"], tmp_path, stdin=patch) == 0, "the patch does not apply"
    code = _run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"], tmp_path)
    assert code in (0, 1), f"pytest exited {code}: not a plain pass or fail"
    return code == 0


@pytest.mark.parametrize("row", EXAMPLES, ids=lambda row: row["task_id"])
def test_example_task_fails_until_the_gold_patch(row: dict[str, Any], tmp_path: Path) -> None:
    assert not _tests_pass(tmp_path / "bug", row["repo"], None)
    assert _tests_pass(tmp_path / "gold", row["repo"], row["gold_patch"])
    assert not _tests_pass(tmp_path / "wrong", row["repo"], row["wrong_patch"])


def test_generator_reproduces_the_committed_data(tmp_path: Path) -> None:
    command = [sys.executable, str(GENERATOR), "--out", str(tmp_path), "--no-verify"]
    subprocess.run(command, check=True, capture_output=True, timeout=TIMEOUT_S)
    for name in DATA_FILES:
        assert (tmp_path / name).read_bytes() == (DATA / name).read_bytes(), name
