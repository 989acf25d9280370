"""Every shell example of README.md and of `gym ... --help` runs as written, in a fresh copy of the repository.

- **The copy**: every file git tracks or would track (``git ls-files -co --exclude-standard``), i.e. a fresh clone
  with the working tree's edits. The code under test is the copy's (``PYTHONPATH``); the interpreter and ``gym`` are
  this virtualenv's (its ``bin`` first on ``PATH``).
- **Settings**: an ``env.yaml`` (``NEMO_GYM_ENV_YAML``) with ``shared_venv: true`` (servers run in this environment
  instead of building one venv each) and a free head server port, so that copies of this test can run side by side.
  A README block marked ``<!-- readme-test: scripted-model -->`` also gets the scripted model server as
  ``policy_model``: it answers at once and the same every time, where the embedded SmolLM2 model would take minutes
  for the 800 rollouts of the arithmetic benchmark. The ``--help`` examples all run with it.
- **Skips**: a README block marked ``<!-- readme-test: skip REASON -->`` (``make test``: this test itself), and the
  ``--help`` examples in :data:`HELP_SKIPS` (a hub, a registry server or an API key). A skip entry that matches no
  example fails, so the list cannot go stale.
- **Running**: each command through ``bash`` in the copy's root, in document order; one exiting non-zero fails with
  its output. ``gym env start`` runs in the background from its ``Press Ctrl-C to stop.`` line until the end of its
  README block (for ``--help`` examples: of its command group), then gets SIGTERM and must exit 0.
- **Inputs a user brings** (``raw.jsonl``, ``my.yaml``, rollout shards, ...) are :func:`write_fixtures`' files. The
  README says what a reader must bring in a ``**You bring:**`` paragraph just above each block that uses one of them
  or is skipped because it ``needs`` something (a key, a checkout, running servers); a test checks that it does.

Each README block and each ``--help`` example is one test; asking for one runs the ones before it first (once per
session), since later examples read what earlier ones wrote.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from nemo_gym import INSTALL_DIR
from nemo_gym.cli.commands import ALL_COMMANDS
from nemo_gym.config.ports import probe_free_port

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(600)]

README = INSTALL_DIR / "README.md"
MARKER = re.compile(r"<!--\s*readme-test:\s*(skip|scripted-model)\b\s*(.*?)\s*-->")
COMMAND_TIMEOUT_S = 300
HELP_SKIPS = {
    "gym env start --environment my_env --model gpt-4.1 --model-url https://api.openai.com/v1": (
        "needs an OpenAI API key and the network"
    ),
    "gym env test": "runs every server's test suite in its own venv (minutes); `make test` runs it",
    "gym train grpo --environment my_env --steps 20": (
        "trains for minutes on CPU; tests/training/test_trl_rollouts.py runs one GRPO step"
    ),
    "gym dataset upload --storage gitlab --name multineedle --revision 0.0.1 -i data/train.jsonl": (
        "needs a gitlab (MLflow) registry server and its token"
    ),
    "gym dataset upload --storage hf -i data/train.jsonl --resource-config resources_servers/my_env/configs/my_env.yaml": (
        "needs the Hugging Face Hub and a token"
    ),
    "gym dataset download --storage gitlab --name multineedle --revision 0.0.1 --artifact train.jsonl -o data/train.jsonl": (
        "needs a gitlab (MLflow) registry server and its token"
    ),
    "gym dataset download --repo-id org/Nemotron-RL-math-my_env --split train -o data/train.jsonl": (
        "needs the Hugging Face Hub"
    ),
    "gym dataset rm --name old_dataset --yes": "needs a gitlab (MLflow) registry server and its token",
    "gym env publish my_env --repo-id my-org/my_env": "needs the Hugging Face Hub and a token",
    "gym env fetch my-org/my_env --output-dir envs": "needs the Hugging Face Hub",
    "gym dataset migrate -i data/train.jsonl --resource-config resources_servers/my_env/configs/my_env.yaml": (
        "needs the Hugging Face Hub and a gitlab (MLflow) registry server"
    ),
}  # fmt: skip
BRING_NOTE = "**You bring:**"
BROUGHT = ("my.yaml", "my_env", "raw.jsonl", "prompt.yaml", "data/train.jsonl", "results/shard_")
"""What README commands name that a reader must bring: :func:`write_fixtures` writes each for this test."""
SCRIPTED_POLICY = {"policy_model": {"responses_api_models": {"scripted_model": {"entrypoint": "app.py"}}}}


@dataclass(frozen=True)
class Example:
    """One thing to run: a README block's commands, or one ``--help`` example."""

    name: str
    group: str
    """Background servers live until the last example of their group has run."""
    commands: tuple[str, ...]
    skip: str | None = None
    scripted_model: bool = False


def readme_blocks(text: str) -> list[Example]:
    """The README's ```bash blocks, named by their section, with the marker just above each (if any)."""
    examples: list[Example] = []
    lines = text.splitlines()
    section, i = "top", 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("## "):
            section = line[3:].strip()
        if line.strip() == "```bash":
            end = lines.index("```", i + 1)
            above = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
            marker = MARKER.search(above)
            name = f"{section} (README.md line {i + 1})"
            examples.append(
                Example(
                    name, name, tuple(shell_commands(lines[i + 1 : end])),
                    skip=(marker.group(2) or "marked skip") if marker and marker.group(1) == "skip" else None,
                    scripted_model=bool(marker and marker.group(1) == "scripted-model"),
                )
            )  # fmt: skip
            i = end
        i += 1
    return examples


def shell_commands(lines: list[str]) -> Iterator[str]:
    """Commands of a block: ``\\``-continued lines joined, blank and comment-only lines dropped."""
    pending = ""
    for line in lines:
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        command = (pending + line).strip()
        pending = ""
        if command and not command.startswith("#"):
            yield command


def help_examples() -> list[Example]:
    """Every ``example:`` line of every command's ``--help``, in the order ``gym --help`` lists the commands."""
    examples = []
    for command in ALL_COMMANDS:
        for line in command.examples:
            if not line.startswith("example:"):
                continue  # e.g. "options: ..." lines name settings, not commands
            text = line.removeprefix("example:").strip()
            shell = text.split("   #")[0].strip()
            examples.append(
                Example(f"{' '.join(command.words)}: {shell}", command.group or command.action, (text,),
                        skip=HELP_SKIPS.get(shell), scripted_model=True)
            )  # fmt: skip
    return examples


README_EXAMPLES = readme_blocks(README.read_text(encoding="utf-8"))
HELP_EXAMPLES = help_examples()


def write_fixtures(root: Path) -> None:
    """The inputs that examples name and a user would bring: a config, a prompt, raw rows, a dataset, two shards."""
    weather = "resources_servers/example_single_tool_call"
    config = f"config_paths:\n- {weather}/configs/example_single_tool_call.yaml\n"
    rollouts = (root / weather / "data" / "example_rollouts.jsonl").read_text().splitlines(keepends=True)
    files = {
        "my.yaml": config,
        "environments/my_env/config.yaml": config,
        "raw.jsonl": json.dumps({"question": "What is 6 times 7?", "expected_answer": "42"}) + "\n",
        "prompt.yaml": "system: Answer with a number only.\nuser: '{question}'\n",
        "data/train.jsonl": (root / weather / "data" / "example.jsonl").read_text(),
        "results/shard_0.jsonl": "".join(rollouts[:3]),
        "results/shard_1.jsonl": "".join(rollouts[3:]),
    }
    assert all(any(name in relative for name in BROUGHT) for relative in files), "a fixture BROUGHT does not name"
    for relative, text in files.items():
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_text(text, encoding="utf-8")


def copy_repository(target: Path) -> Path:
    listed = subprocess.run(
        ["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=INSTALL_DIR, capture_output=True, check=True
    ).stdout.decode()
    for relative in filter(None, listed.split("\0")):
        source = INSTALL_DIR / relative
        if source.is_file():  # a tracked file deleted in the working tree is not part of the copy
            (target / relative).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / relative)
    return target


def free_port() -> int:
    return probe_free_port()  # outside the ephemeral range, which outgoing connections take ports from


@dataclass
class Background:
    """A ``gym env start`` left running: its process and everything it printed."""

    command: str
    process: subprocess.Popen
    output: list[str] = field(default_factory=list)

    def stop(self) -> str | None:
        """SIGTERM; the problem as text if it did not stop cleanly."""
        self.process.send_signal(signal.SIGTERM)
        code = self.process.wait(timeout=120)
        return None if code == 0 else f"`{self.command}` exited {code} on SIGTERM:\n" + "\n".join(self.output[-40:])


class Runner:
    """Runs a list of examples in one copy of the repository, in order, each at most once."""

    def __init__(self, root: Path, examples: list[Example]) -> None:
        self.root = copy_repository(root)
        write_fixtures(self.root)
        self.examples = examples
        self.done: dict[str, str | None] = {}
        """Example name -> None (passed or skipped) or the reason it failed."""
        self.background: list[Background] = []
        port = free_port()
        plain = {"shared_venv": True, "head_server": {"port": port}}
        self.env_yaml = {False: root / "env.yaml", True: root / "env_scripted.yaml"}
        self.env_yaml[False].write_text(json.dumps(plain))  # JSON is YAML
        self.env_yaml[True].write_text(json.dumps(plain | SCRIPTED_POLICY))
        self.env = {key: value for key, value in os.environ.items() if not key.startswith(("NEMO_GYM_", "PYTEST_"))} | {
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
            "PYTHONPATH": str(self.root),
            "PYTHONUNBUFFERED": "1",
        }

    def run_through(self, name: str) -> None:
        """Run every example up to and including ``name``; fail or skip as ``name`` did."""
        for example in self.examples:
            if example.name not in self.done:
                self.done[example.name] = self._run(example)
            if example.name == name:
                break
        if self.done[name] is not None:
            pytest.fail(self.done[name], pytrace=False)
        example = next(e for e in self.examples if e.name == name)
        if example.skip:
            pytest.skip(example.skip)

    def _run(self, example: Example) -> str | None:
        problem = None
        if example.skip is None:
            env = self.env | {"NEMO_GYM_ENV_YAML": str(self.env_yaml[example.scripted_model])}
            for command in example.commands:
                problem = self._start(command, env) if command.startswith("gym env start") else self._call(command, env)
                if problem:
                    break
        if self.background and self._group_ends_after(example):
            stopped = [server.stop() for server in self.background]
            self.background.clear()
            problem = problem or next((p for p in stopped if p), None)
        return problem

    def _group_ends_after(self, example: Example) -> bool:
        later = self.examples[self.examples.index(example) + 1 :]
        return not later or later[0].group != example.group

    def _call(self, command: str, env: dict[str, str]) -> str | None:
        done = subprocess.run(
            ["bash", "-c", command], cwd=self.root, env=env, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S
        )
        if done.returncode == 0:
            return None
        return f"`{command}` exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"

    def _start(self, command: str, env: dict[str, str]) -> str | None:
        process = subprocess.Popen(
            ["bash", "-c", f"exec {command}"], cwd=self.root, env=env,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        server = Background(command, process)
        for line in process.stdout:  # blocks until the launcher prints; ends when it exits
            server.output.append(line.rstrip("\n"))
            if line.startswith("Press Ctrl-C to stop."):
                break
        else:
            process.wait(timeout=60)
            return f"`{command}` exited {process.returncode} before its servers were ready:\n" + "\n".join(
                server.output[-40:]
            )
        threading.Thread(
            target=lambda: server.output.extend(line.rstrip("\n") for line in process.stdout), daemon=True
        ).start()
        self.background.append(server)
        return None

    def close(self) -> None:
        for server in self.background:
            if server.process.poll() is None:
                server.process.kill()
                server.process.wait()


@pytest.fixture(scope="module")
def readme_runner(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runner]:
    runner = Runner(tmp_path_factory.mktemp("readme"), README_EXAMPLES)
    yield runner
    runner.close()


@pytest.fixture(scope="module")
def help_runner(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runner]:
    runner = Runner(tmp_path_factory.mktemp("help"), HELP_EXAMPLES)
    yield runner
    runner.close()


@pytest.mark.parametrize("name", [e.name for e in README_EXAMPLES])
def test_readme_block_runs_as_written(readme_runner: Runner, name: str) -> None:
    readme_runner.run_through(name)


@pytest.mark.parametrize("name", [e.name for e in HELP_EXAMPLES])
def test_help_example_runs_as_written(help_runner: Runner, name: str) -> None:
    help_runner.run_through(name)


def test_the_help_examples_are_what_help_shows(capsys: pytest.CaptureFixture[str]) -> None:
    from nemo_gym.cli.main import main

    for command in ALL_COMMANDS:
        if not command.examples:
            continue
        with pytest.raises(SystemExit):
            main([*command.words, "--help"])
        shown = capsys.readouterr().out
        for line in command.examples:
            assert line in shown, f"`gym {' '.join(command.words)} --help` does not show {line!r}"


def test_the_examples_are_found_and_every_skip_names_one() -> None:
    """The extraction itself: a README without blocks, or a skip entry for an example that no longer exists, fails."""
    assert len(README_EXAMPLES) >= 6 and all(e.commands for e in README_EXAMPLES)
    assert any("gym env resolve" in c for e in README_EXAMPLES for c in e.commands)
    assert len(HELP_EXAMPLES) >= 15
    shown = {e.commands[0].split("   #")[0].strip() for e in HELP_EXAMPLES}
    assert not set(HELP_SKIPS) - shown, f"HELP_SKIPS entries no --help shows: {set(HELP_SKIPS) - shown}"
    assert [e.skip for e in README_EXAMPLES if e.skip] and all(len(e.skip) > 10 for e in README_EXAMPLES if e.skip)


def fenced_blocks(lines: list[str]) -> Iterator[tuple[int, str]]:
    """(line index of the opening fence, the block's text) of every fenced block, whatever its language."""
    start: int | None = None
    for i, line in enumerate(lines):
        if not line.startswith("```"):
            continue
        if start is None:
            start = i
        else:
            yield start, "\n".join(lines[start + 1 : i])
            start = None


def bring_note_above(lines: list[str], fence: int) -> bool:
    """Whether the paragraph above a block (above its readme-test marker, if it has one) is a ``You bring`` note."""
    j = fence - 1
    while j >= 0 and not lines[j].strip():
        j -= 1
    if j >= 0 and MARKER.search(lines[j]):
        j -= 1
        while j >= 0 and not lines[j].strip():
            j -= 1
    while j > 0 and lines[j - 1].strip():
        j -= 1  # the paragraph's first line
    return j >= 0 and lines[j].startswith(BRING_NOTE)


def test_every_block_that_needs_what_the_reader_brings_says_so_first() -> None:
    """A block skipped because it ``needs`` something, or naming a file a reader brings, has a note just above."""
    lines = README.read_text(encoding="utf-8").splitlines()
    needing, missing = 0, []
    for fence, body in fenced_blocks(lines):
        marker = next((MARKER.search(lines[j]) for j in range(fence - 1, -1, -1) if lines[j].strip()), None)
        skipped_for_a_need = bool(marker and marker.group(1) == "skip" and marker.group(2).startswith("needs"))
        if skipped_for_a_need or any(name in body for name in BROUGHT):
            needing += 1
            if not bring_note_above(lines, fence):
                missing.append(f"README.md line {fence + 1}: {lines[fence + 1].strip()[:60]}")
    assert needing >= 8, "the README's blocks that need something were not found"
    assert not missing, f"blocks without a {BRING_NOTE!r} paragraph above them: {missing}"
