"""``gym env init``, ``gym env test`` and ``gym dev test``: creating environments and testing them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from rich.markup import escape
from rich.table import Table

from nemo_gym import INSTALL_DIR
from nemo_gym.cli.command import Command, Invocation, Positional
from nemo_gym.cli.flags import Flag
from nemo_gym.cli.output import console, print_warning
from nemo_gym.errors import ConfigError

SEARCH_DIR = Flag(("--search-dir",), "extra root searched for servers before cwd (repeatable)", repeatable=True,
                  metavar="DIR")  # fmt: skip


CHECKOUT = Flag(("--checkout",), "test the server folders of this NeMo Gym checkout (or unpacked nemo_gym wheel) "
               "against our nemo_gym instead", metavar="PATH")  # fmt: skip
CHECKOUT_ONLY = (
    Flag(("--folder",), "with --checkout: only folders matching this name or glob (repeatable)", repeatable=True,
         metavar="GLOB"),
    Flag(("--jobs",), "with --checkout: folders tested at once", value_type=int, minimum=1, metavar="N"),
    Flag(("--timeout",), "with --checkout: seconds allowed for each folder's venv build, and for its tests "
         "(default 900)", value_type=float, minimum=1, metavar="SECONDS"),
    Flag(("--nemo-gym",), "with --checkout: install this nemo_gym source tree or unpacked wheel instead of ours "
         "(a control run)", metavar="PATH"),
    Flag(("--dry-run",), "with --checkout: list the folders it would test, build and run nothing", switch=True),
    Flag(("--python",), "with --checkout: the venvs' Python (a version such as 3.13, or a path)", metavar="PYTHON"),
    Flag(("--json",), "with --checkout: also write the results as JSON here", metavar="PATH"),
    Flag(("--control",), "with --checkout: a control run's --json report, shown beside ours with the parity gaps",
         metavar="JSON"),
    Flag(("--markdown",), "with --checkout and --control: also write the comparison as Markdown here",
         metavar="PATH"),
)  # fmt: skip


def init(invocation: Invocation) -> int:
    from nemo_gym.authoring.scaffold import scaffold_environment_server, scaffold_resources_server

    chosen = [flag for flag in ("resources_server", "environment_server", "environment") if invocation.get(flag)]
    if len(chosen) > 1:
        raise ConfigError("gym env init creates one thing: --resources-server, --environment-server or --environment")
    if invocation.get("profile") is not None and invocation.get("environment") is None:
        raise ConfigError("--profile goes with --environment NAME (the profile of a new environment)")
    if (environment := invocation.get("environment")) is not None:
        return _init_environment(environment, invocation.get("profile"))
    if (environment_server := invocation.get("environment_server")) is not None:
        if invocation.get("resources_server") is not None:
            raise ConfigError("gym env init creates one server: --resources-server NAME or --environment-server NAME")
        target = scaffold_environment_server(environment_server, Path.cwd())
        console.print(f"Created {target}\n  next: gym env test --environment-server {environment_server}",
                      markup=False)  # fmt: skip
        return 0
    name = invocation.get("resources_server")
    if name is None and (entry := invocation.entrypoint()):
        name = entry.split("/")[-1]
    if not name:
        raise ConfigError(
            "say which server to create: gym env init --resources-server NAME (or --environment-server NAME)"
        )
    target = scaffold_resources_server(name, Path.cwd())
    console.print(
        f"Created {target}\n  next: gym env test --resources-server {name}\n"
        f"        gym eval run --resources-server {name} --agent {name}_simple_agent "
        f"--input {target.relative_to(Path.cwd())}/data/example.jsonl --output results/{name}.jsonl",
        markup=False,
    )
    return 0


def _init_environment(name: str, profile: str | None) -> int:
    from nemo_gym.authoring.environment_scaffold import DEFAULT_PROFILE, scaffold_environment

    root = Path.cwd()
    for created in scaffold_environment(name, profile or DEFAULT_PROFILE, root):
        console.print(f"Created {created.relative_to(root)}", markup=False)
    console.print(f"  next: fill in environments/{name}/manifest.yaml (description, authors, licensing), then\n"
                  f"        gym env start --environment {name}", markup=False)  # fmt: skip
    return 0


def add(invocation: Invocation) -> int:
    """Copy one environment of a NeMo Gym release (its entry and the server folders we do not ship) into cwd."""
    from nemo_gym.authoring.release_import import copy_environment, fetch_release, plan_environment_import

    name, version = invocation.get("name"), invocation.get("from_nemo_gym")
    if not version:
        raise ConfigError(f"say where {name} comes from: gym env add {name} --from-nemo-gym VERSION (e.g. 0.7.0)")
    workspace = Path.cwd()
    release = fetch_release(version, say=lambda line: console.print(line, markup=False))
    plan = plan_environment_import(release, name, INSTALL_DIR)
    written = copy_environment(plan, workspace, overwrite=bool(invocation.get("overwrite")))
    console.print(f"Added NeMo Gym {release.version}'s environment {name} to {workspace}:", markup=False)
    for path in written:
        console.print(f"  copied   {path.relative_to(workspace)}", markup=False)
    for folder in plan.ours:
        console.print(f"  ours     {folder} (shipped with this install, not copied)", markup=False)
    console.print(f"Licence: {plan.licence_name} (NVIDIA NeMo Gym {release.version}"
                  + (f"; its text is in environments/{name}/NEMO_GYM_LICENSE)" if plan.licence else ")"),
                  markup=False)  # fmt: skip
    data = sorted((workspace / "environments" / name / "data").glob("example*.jsonl"))
    example = f" --input {data[0].relative_to(workspace)}" if data else ""
    console.print(f"  next: gym eval run --environment {name}{example} --output results/{name}.jsonl", markup=False)
    return 0


def test(invocation: Invocation) -> int:
    from nemo_gym.authoring.server_tests import find_server_dirs, run_server_tests, validate_server_data
    from nemo_gym.global_config import parse_global_config_dict

    only = invocation.get("resources_server") or invocation.entrypoint()
    if invocation.get("environment_server"):
        only = f"environment_servers/{invocation.get('environment_server')}"
    config = parse_global_config_dict([t for t in invocation.overrides if not t.lstrip("+").startswith("entrypoint=")],
                                      dummy_model=True)  # fmt: skip
    if invocation.get("checkout"):
        return _test_checkout(invocation, Path(config.cache_dir))
    if misplaced := [f for f in CHECKOUT_ONLY if invocation.get(f.dest) not in (None, [], False)]:
        raise ConfigError(f"{misplaced[0].names[0]} goes with --checkout PATH (a NeMo Gym checkout to test)")
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


def _test_checkout(invocation: Invocation, cache_dir: Path) -> int:
    """The migration check: every server folder of another checkout, tested against our nemo_gym (or --nemo-gym)."""
    import threading

    from nemo_gym.authoring.compat_report import compare, load_check_report, render_markdown, summary_lines
    from nemo_gym.authoring.migration_check import (
        DEFAULT_TIMEOUT_S,
        CheckOptions,
        report_header,
        resolve_interpreter,
        run_check,
        write_report,
    )
    from nemo_gym.jsonl import check_writable_output, write_text_atomic

    checkout = Path(invocation.get("checkout")).expanduser().resolve()
    framework = invocation.get("nemo_gym")
    if invocation.get("dry_run"):
        from nemo_gym.authoring.migration_check import dry_run_lines

        lines = dry_run_lines(CheckOptions(checkout=checkout, cache_dir=cache_dir,
                                           patterns=tuple(invocation.get("folder") or ())))  # fmt: skip
        for line in lines:
            console.print(line, markup=False)
        console.print(f"{len(lines)} folders of {checkout} would be tested", markup=False)
        return 0
    options = CheckOptions(
        checkout=checkout,
        cache_dir=cache_dir,
        patterns=tuple(invocation.get("folder") or ()),
        jobs=invocation.get("jobs") or 1,
        timeout_s=invocation.get("timeout") or DEFAULT_TIMEOUT_S,
        framework_dir=Path(framework).expanduser().resolve() if framework else None,
        python=invocation.get("python"),
    )
    json_path = check_writable_output(invocation.get("json"), "--json") if invocation.get("json") else None
    control = load_check_report(Path(invocation.get("control")).expanduser()) if invocation.get("control") else None
    if invocation.get("markdown") and control is None:
        raise ConfigError("--markdown writes ours beside a control: add --control JSON (a control run's --json file)")
    markdown_path = (
        check_writable_output(invocation.get("markdown"), "--markdown") if invocation.get("markdown") else None
    )
    interpreter = resolve_interpreter(options.python, options.framework_dir, checkout)
    if interpreter.note:
        print_warning(interpreter.note)
    against = f"the nemo_gym of {options.framework_dir}" if options.framework_dir else "our nemo_gym"
    console.print(f"testing the server folders of {checkout} with {against}, Python {interpreter.version}",
                  markup=False)  # fmt: skip
    lock = threading.Lock()

    def progress(result) -> None:
        with lock:
            console.print(f"  {result.result:<11} {result.folder} ({result.passed} passed, {result.failed} failed, "
                          f"{result.skipped} skipped, {result.seconds:.0f} s)", markup=False)  # fmt: skip

    results = run_check(options, interpreter, progress)
    comparison = compare(results, control) if control is not None else None
    table = Table(title="Server folders", title_justify="left")
    columns = [("Folder", "left"), ("Result", "left"), ("Passed", "right"), ("Failed", "right"), ("Skipped", "right"),
               *([("Control", "left")] if comparison else []), ("Cause", "left"), ("First error", "left")]  # fmt: skip
    for column, justify in columns:
        table.add_column(column, justify=justify)  # type: ignore[arg-type]
    for r, control_result in comparison.rows if comparison else ((r, None) for r in results):
        beside = [control_result.result if control_result else "not run"] if comparison else []
        table.add_row(escape(r.folder), r.result, str(r.passed), str(r.failed), str(r.skipped), *beside,
                      r.cause or "", escape(r.first_error[:200]))  # fmt: skip
    console.print(table)
    if json_path is not None:
        write_report(json_path, options, interpreter, results)
    failed = [r for r in results if not r.ok]
    console.print(f"{len(results) - len(failed)} passed, {len(failed)} failed")
    if comparison is not None and control is not None:
        for line in summary_lines(comparison):
            console.print(line, markup=False)
        if markdown_path is not None:
            header = report_header(options, interpreter)
            write_text_atomic(markdown_path, render_markdown(comparison, header, control))
            console.print(f"comparison written to {markdown_path}", markup=False)
    return 1 if failed else 0


def dev_test(invocation: Invocation) -> int:
    """The core test suite (tests/), as a contributor runs it."""
    command = [sys.executable, "-m", "pytest", "tests", "--durations=10", *invocation.overrides]
    return subprocess.call(command, cwd=INSTALL_DIR)


def env_table(invocation: Invocation) -> int:
    """Regenerate the README's environment table (``--check``: fail if it is out of date)."""
    from nemo_gym.authoring.env_table import update_readme

    readme = INSTALL_DIR / "README.md"
    current = update_readme(readme, check=bool(invocation.get("check")))
    if invocation.get("check") and not current:
        raise ConfigError(f"the environment table in {readme} is out of date: run `gym dev env-table`")
    console.print(f"{readme}: environment table {'is current' if current else 'updated'}", markup=False)
    return 0


COMMANDS = (
    Command(
        "env", "init", "create a new resources or environment server that runs and passes its tests", init,
        (
            Flag(("--resources-server",), "name of the new server (a Python identifier)", metavar="NAME"),
            Flag(("--environment-server",), "name of a new environment server (environment_servers/NAME/)",
                 metavar="NAME"),
            Flag(("--environment",), "name of a new environment with a manifest (environments/NAME/ and its "
                 "servers)", metavar="NAME"),
            Flag(("--profile",), "with --environment: custom-gym-verifier (default), custom-gym-agent-loop, "
                 "external-agent-loop or external-rollout-driver (NeMo Gym 0.7's profiles)", metavar="PROFILE"),
        ),
        examples=("example: gym env init --resources-server my_env",
                  "example: gym env init --environment-server my_episode",
                  "example: gym env init --environment my_loop_env --profile custom-gym-agent-loop"),
    ),
    Command(
        "env", "add", "copy an environment of a NeMo Gym release (from its PyPI wheel) into this directory", add,
        (
            Flag(("--from-nemo-gym",), "the NeMo Gym release to take it from (a version, e.g. 0.7.0)",
                 metavar="VERSION"),
            Flag(("--overwrite",), "replace folders of the same name already in this directory", switch=True),
        ),
        positionals=(Positional("name", "the environment's name (environments/NAME/ in that release)"),),
        examples=("example: gym env add wordle --from-nemo-gym 0.7.0",),
    ),
    Command(
        "env", "test", "run a server's tests in its own venv (all servers, with data checks, when none is named)",
        test,
        (
            Flag(("--resources-server",), "only this resources server", metavar="NAME"),
            Flag(("--environment-server",), "only this environment server", metavar="NAME"),
            Flag(("--shared-venv",), "run in this Python environment instead of each server's venv", switch=True),
            SEARCH_DIR,
            CHECKOUT,
            *CHECKOUT_ONLY,
        ),
        examples=(
            "example: gym env test --resources-server my_env", "example: gym env test   # every server",
            "example: gym env test --checkout . --folder example_single_tool_call   # any checkout with NeMo Gym's layout",
        ),
    ),
    Command("dev", "test", "run the core test suite (tests/)", dev_test),
    Command(
        "dev", "env-table", "regenerate the environment table in README.md from the servers", env_table,
        (Flag(("--check",), "only check that the table is current", switch=True),),
    ),
)  # fmt: skip
