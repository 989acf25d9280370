"""``gym env init``, ``gym env test`` and ``gym dev test``: creating environments and testing them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from rich.markup import escape
from rich.table import Table

from nemo_gym import PARENT_DIR
from nemo_gym.cli.command import Command, Invocation
from nemo_gym.cli.flags import Flag
from nemo_gym.cli.output import console
from nemo_gym.errors import ConfigError

SEARCH_DIR = Flag(("--search-dir",), "extra root searched for servers before cwd (repeatable)", repeatable=True,
                  metavar="DIR")  # fmt: skip


def _entrypoint_override(invocation: Invocation) -> str | None:
    """``+entrypoint=resources_servers/NAME`` (the legacy spelling) as a server label."""
    for token in invocation.overrides:
        if token.lstrip("+").startswith("entrypoint="):
            return token.split("=", 1)[1].strip("'\"").rstrip("/")
    return None


def init(invocation: Invocation) -> int:
    from nemo_gym.authoring.scaffold import scaffold_resources_server

    name = invocation.get("resources_server")
    if name is None and (entry := _entrypoint_override(invocation)):
        name = entry.split("/")[-1]
    if not name:
        raise ConfigError("say which server to create: gym env init --resources-server NAME")
    target = scaffold_resources_server(name, Path.cwd())
    console.print(
        f"Created {target}\n  next: gym env test --resources-server {name}\n"
        f"        gym eval run --resources-server {name} --agent {name}_simple_agent "
        f"--input {target.relative_to(Path.cwd())}/data/example.jsonl --output results/{name}.jsonl",
        markup=False,
    )
    return 0


def test(invocation: Invocation) -> int:
    from nemo_gym.authoring.server_tests import find_server_dirs, run_server_tests, validate_server_data
    from nemo_gym.global_config import parse_global_config_dict

    only = invocation.get("resources_server") or _entrypoint_override(invocation)
    config = parse_global_config_dict([t for t in invocation.overrides if not t.lstrip("+").startswith("entrypoint=")],
                                      dummy_model=True)  # fmt: skip
    shared = bool(invocation.get("shared_venv") or config.get("shared_venv"))
    validate_data = only is None or bool(config.get("should_validate_data"))
    results = []
    for server_dir in find_server_dirs(only):
        label = f"{server_dir.parent.name}/{server_dir.name}"
        console.print(f"[bold]testing {escape(label)}[/bold]")
        result = run_server_tests(server_dir, Path(config.cache_dir), shared_venv=shared)
        if validate_data and server_dir.parent.name == "resources_servers":
            result.data_problems = validate_server_data(server_dir)
        console.print(f"  {result.outcome}: {result.summary}", markup=False)
        for problem in result.data_problems:
            console.print(f"  [red]data: {escape(problem)}[/red]")
        results.append(result)
    table = Table(title="Server tests", title_justify="left")
    for column in ("Server", "Tests", "Data", "Seconds", "Summary"):
        table.add_column(column)
    for r in results:
        data = (
            "-"
            if not validate_data or not r.label.startswith("resources_servers/")
            else ("ok" if not r.data_problems else f"{len(r.data_problems)} problem(s)")
        )
        table.add_row(escape(r.label), r.outcome, data, f"{r.seconds:.1f}", escape(r.summary))
    console.print(table)
    failed = [r for r in results if not r.ok]
    console.print(f"{len(results) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


def dev_test(invocation: Invocation) -> int:
    """The core test suite (tests/), as a contributor runs it."""
    command = [sys.executable, "-m", "pytest", "tests", "--durations=10", *invocation.overrides]
    return subprocess.call(command, cwd=PARENT_DIR)


def env_table(invocation: Invocation) -> int:
    """Regenerate the README's environment table (``--check``: fail if it is out of date)."""
    from nemo_gym.authoring.env_table import update_readme

    readme = PARENT_DIR / "README.md"
    current = update_readme(readme, check=bool(invocation.get("check")))
    if invocation.get("check") and not current:
        raise ConfigError(f"the environment table in {readme} is out of date: run `gym dev env-table`")
    console.print(f"{readme}: environment table {'is current' if current else 'updated'}", markup=False)
    return 0


COMMANDS = (
    Command(
        "env", "init", "create a new resources server that runs and passes its tests", init,
        (Flag(("--resources-server",), "name of the new server (a Python identifier)", metavar="NAME"),),
        examples=("example: gym env init --resources-server my_env",),
    ),
    Command(
        "env", "test", "run a server's tests in its own venv (all servers, with data checks, when none is named)",
        test,
        (
            Flag(("--resources-server",), "only this resources server", metavar="NAME"),
            Flag(("--shared-venv",), "run in this Python environment instead of each server's venv", switch=True),
            SEARCH_DIR,
        ),
        examples=("example: gym env test --resources-server my_env", "example: gym env test   # every server"),
    ),
    Command("dev", "test", "run the core test suite (tests/)", dev_test),
    Command(
        "dev", "env-table", "regenerate the environment table in README.md from the servers", env_table,
        (Flag(("--check",), "only check that the table is current", switch=True),),
    ),
)  # fmt: skip
