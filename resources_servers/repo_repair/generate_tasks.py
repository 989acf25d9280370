"""Generate repo_repair's tasks: 40 tiny Python repositories, each with one bug that makes a test fail.

Every task is a package (``<package>/<module>.py``) of 2-3 small functions and a pytest file; one function carries a
bug of one of four kinds (``off_by_one``, ``wrong_operator``, ``swapped_arguments``, ``string_case``), 10 tasks each.
Beside each repository go a ``gold_patch`` (a ``git diff`` that fixes the bug) and a ``wrong_patch`` (one that applies
but leaves the bug), so the environment's reward (do the repository's tests pass?) can be checked both ways without
a model. Templates, names, constants and data are drawn by one seeded ``random.Random``: the output is identical on
every run. Before writing anything, every task is verified in a temporary directory: its tests fail, pass after
``git apply`` of the gold patch, and still fail after the wrong patch. Run from the repository root::

    python resources_servers/repo_repair/generate_tasks.py [--out DIR] [--no-verify]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if not __package__:  # run as a script (python resources_servers/repo_repair/generate_tasks.py): the repo's root
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from resources_servers.repo_repair.bug_templates import COMPANIONS, TEMPLATES, Blueprint, Draw

SEED = 20250607
TASKS_PER_KIND = 10
EXAMPLE_COUNT = 5
DATA_DIR = Path(__file__).resolve().parent / "data"
TEST_COMMAND = "python3 -m pytest -q -p no:cacheprovider tests"
TIMEOUT_S = 60
MAX_FILE_BYTES = 2048
PACKAGES = ("toolkit", "mylib", "appkit", "corelib")
# Git ignores the user's settings (diff prefixes, colours) and any repository above the working directory; pytest
# skips the plugins installed beside it (the repos need none, and loading them is most of its start-up time).
SUBPROCESS_ENV = {
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_CONFIG_NOSYSTEM": "1",
    "LC_ALL": "C",
    "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
}

SYSTEM_PROMPT = (
    "You are fixing a bug in a small Python repository; the working directory is the repository root. "
    "Use the tools to read files, run the tests and fix the code (not the tests). "
    "Stop and reply with one short sentence once the tests pass."
)


def _tool(name: str, description: str, **properties: str) -> dict[str, Any]:
    """A strict Responses-API function tool whose parameters are all required strings."""
    schema = {key: {"type": "string", "description": text} for key, text in properties.items()}
    return {
        "type": "function",
        "name": name,
        "description": description,
        "parameters": {
            "type": "object",
            "properties": schema,
            "required": list(properties),
            "additionalProperties": False,
        },
        "strict": True,
    }


TOOLS = [
    _tool("read_file", "Read a file of the repository.", path="File path relative to the repository root."),
    _tool(
        "write_file",
        "Replace a file's whole content (the file is created if missing).",
        path="File path relative to the repository root.",
        content="The new, complete content of the file.",
    ),
    _tool(
        "run_command",
        "Run a shell command in the repository root (for example the tests) and get its exit code and output.",
        command="The shell command to run.",
    ),
    _tool("apply_patch", "Apply a unified diff (git apply) at the repository root.", patch="The unified diff."),
]


@dataclass
class Task:
    task_id: str
    kind: str
    repo: dict[str, str]
    failing: tuple[str, ...]
    gold_patch: str
    wrong_patch: str


def build_repo(blueprint: Blueprint, package: str, companion: tuple[str, str, str]) -> tuple[dict[str, str], ...]:
    """The buggy, gold-fixed and wrong-fixed repositories (path -> content) of a blueprint."""
    name, helper_code, helper_test = companion
    imports = ", ".join(sorted((*blueprint.functions, name)))
    test_path = f"tests/test_{blueprint.module}.py"
    tests = f"from {package}.{blueprint.module} import {imports}\n\n\n{blueprint.tests.strip()}\n\n\n{helper_test}\n"
    repos = []
    for version in ("buggy", "gold", "wrong"):
        module = f'"""{blueprint.doc}"""\n\n\n{blueprint.source(version)}\n\n\n{helper_code}\n'
        repos.append(
            {f"{package}/__init__.py": "", f"{package}/{blueprint.module}.py": module.lstrip("\n"), test_path: tests}
        )
    return tuple(repos)


def _run(command: list[str], cwd: Path, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    env = os.environ | SUBPROCESS_ENV | {"GIT_CEILING_DIRECTORIES": str(cwd.parent)}
    return subprocess.run(command, cwd=cwd, input=stdin, capture_output=True, text=True, timeout=TIMEOUT_S, env=env)


def write_repo(root: Path, files: dict[str, str]) -> None:
    for path, content in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(content, encoding="utf-8")


def make_patch(before: dict[str, str], after: dict[str, str]) -> str:
    """``git diff`` (``a/`` and ``b/`` prefixes) turning the ``before`` repository into ``after``."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        _run(["git", "init", "-q"], root).check_returncode()
        write_repo(root, before)
        _run(["git", "add", "-A"], root).check_returncode()
        write_repo(root, after)
        diff = _run(["git", "diff", "--no-color", "--no-ext-diff", "--src-prefix=a/", "--dst-prefix=b/"], root)
        diff.check_returncode()
        return diff.stdout


def build_tasks(seed: int = SEED) -> list[Task]:
    """Forty tasks, the four kinds in turn (so any four consecutive ids hold one of each); no two repos alike."""
    rng = Draw(seed)
    kinds = list(TEMPLATES)
    tasks: list[Task] = []
    seen: set[str] = set()
    for index in range(TASKS_PER_KIND * len(kinds)):
        kind = kinds[index % len(kinds)]
        template = TEMPLATES[kind][(index // len(kinds)) % len(TEMPLATES[kind])]
        while True:  # redraw until this repository differs from every earlier one
            blueprint = template(rng)
            buggy, gold, wrong = build_repo(blueprint, rng.variant(PACKAGES), rng.variant(COMPANIONS))
            key = json.dumps(buggy, sort_keys=True)
            if key not in seen:
                break
        seen.add(key)
        test_path = f"tests/test_{blueprint.module}.py"
        failing = tuple(f"{test_path}::{name}" for name in blueprint.failing)
        tasks.append(
            Task(f"repo_repair-{index:03d}", kind, buggy, failing, make_patch(buggy, gold), make_patch(buggy, wrong))
        )
    return tasks


def run_tests(root: Path) -> tuple[int, set[str], int]:
    """Exit code, failed test ids and number of passed tests of the repository's tests."""
    result = _run([sys.executable, "-m", "pytest", "-q", "-rf", "-p", "no:cacheprovider", "tests"], root)
    failed = set(re.findall(r"^FAILED (\S+)", result.stdout, flags=re.MULTILINE))
    passed = re.search(r"(\d+) passed", result.stdout)
    return result.returncode, failed, int(passed.group(1)) if passed else 0


def apply_patch(root: Path, patch: str) -> bool:
    return _run(["git", "apply", "-"], root, stdin=patch).returncode == 0


def verify(task: Task) -> list[str]:
    """What is wrong with a task (empty if nothing): bug fails, gold passes, wrong fails, files are small."""
    problems = [
        f"{path} is {len(text.encode())} bytes"
        for path, text in task.repo.items()
        if len(text.encode()) >= MAX_FILE_BYTES
    ]
    for name, diff in (("gold_patch", task.gold_patch), ("wrong_patch", task.wrong_patch)):
        if not diff.startswith("diff --git a/"):
            problems.append(f"{name} is not a git diff")
    with tempfile.TemporaryDirectory() as tmp:
        stages: tuple[tuple[str, str | None, int], ...] = (
            ("unpatched", None, 1),
            ("gold", task.gold_patch, 0),
            ("wrong", task.wrong_patch, 1),
        )
        for stage, patch, want_rc in stages:
            root = Path(tmp) / stage
            root.mkdir()
            write_repo(root, task.repo)
            if patch is not None and not apply_patch(root, patch):
                problems.append(f"{stage} patch does not apply")
                continue
            rc, failed, passed = run_tests(root)
            if rc != want_rc:
                problems.append(f"tests exit {rc} {stage}, expected {want_rc}")
            if stage == "unpatched" and (failed != set(task.failing) or passed < 1):
                problems.append(f"unpatched: failed {sorted(failed)} ({passed} passed), expected {list(task.failing)}")
    return problems


def user_prompt(task: Task) -> str:
    tests = ", ".join(task.failing)
    which = "test fails" if len(task.failing) == 1 else "tests fail"
    return (
        f"Task {task.task_id}. In this repository the {which}: {tests}. Files: {', '.join(task.repo)}. "
        "Fix the bug in the code (not in the tests) so that `python3 -m pytest -q tests` passes."
    )


def task_row(task: Task) -> dict[str, Any]:
    return {
        "task_id": task.task_id,
        "bug_kind": task.kind,
        "responses_create_params": {
            "input": [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user_prompt(task)}],
            "tools": TOOLS,
        },
        "repo": task.repo,
        "test_command": TEST_COMMAND,
        "gold_patch": task.gold_patch,
        "wrong_patch": task.wrong_patch,
    }


def script_row(task: Task, patch: str) -> dict[str, Any]:
    """A scripted model's turns for the task: apply the patch, then say so."""
    call = {"type": "function_call", "name": "apply_patch", "arguments": json.dumps({"patch": patch})}
    done = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Applied the fix."}]}
    return {"match": task.task_id, "script": [[call], [done]]}


def check_matches(rows: list[dict[str, Any]]) -> None:
    """Each task id must occur in its own prompt and in no other (a scripted model picks a script by it)."""
    for row in rows:
        texts = [message["content"] for message in row["responses_create_params"]["input"]]
        hits = [other["task_id"] for other in rows if any(other["task_id"] in text for text in texts)]
        if hits != [row["task_id"]]:
            sys.exit(f"{row['task_id']}: its prompt contains the ids {hits}")


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=DATA_DIR, help="output directory (default: %(default)s)")
    parser.add_argument("--no-verify", action="store_true", help="skip running each task's tests (fast)")
    args = parser.parse_args(argv)
    tasks = build_tasks()
    if not args.no_verify:
        for task in tasks:
            if problems := verify(task):
                sys.exit(f"{task.task_id} ({task.kind}) failed verification: " + "; ".join(problems))
    rows = [task_row(task) for task in tasks]
    check_matches(rows)
    args.out.mkdir(parents=True, exist_ok=True)
    write_jsonl(args.out / "train.jsonl", rows)
    write_jsonl(args.out / "example.jsonl", rows[:EXAMPLE_COUNT])
    write_jsonl(args.out / "gold_scripts.jsonl", [script_row(task, task.gold_patch) for task in tasks])
    write_jsonl(args.out / "wrong_scripts.jsonl", [script_row(task, task.wrong_patch) for task in tasks])
    print(f"wrote {len(rows)} tasks to {args.out}" + ("" if args.no_verify else " (all verified)"))


if __name__ == "__main__":
    main()
