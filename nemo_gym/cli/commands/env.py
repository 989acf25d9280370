"""``gym env ...``: commands about the composed config of a set of servers."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.table import Table

from nemo_gym.cli.command import Command, Invocation, Positional
from nemo_gym.cli.flags import CONFIG_FLAGS, JSON_FLAG, MODEL_FLAGS, RAY_FLAG, Flag
from nemo_gym.cli.output import console, err_console, print_warning

if TYPE_CHECKING:
    from nemo_gym.config.compose import ComposedConfig
    from nemo_gym.launcher.venv_plan import PlannedVenv


def resolve(invocation: Invocation) -> int:
    """Print the merged, resolved config with secrets masked. It is for looking at a config, so a value still to be
    set (``???``, or an interpolation of a key no source sets, e.g. a secret kept in env.yaml) is printed as ``???``
    with one warning line each saying what to set, rather than hiding the whole config behind the first error."""
    from nemo_gym.config.compose import ComposeOptions, compose
    from nemo_gym.global_config import masked_config_yaml

    composed = compose(ComposeOptions(overrides=list(invocation.overrides), allow_unset=True))
    print(masked_config_yaml(composed.config, composed.secrets), end="")
    for line in composed.unset:
        print_warning(line)
    return 0


def validate(invocation: Invocation) -> int:
    """Without names: run every check ``gym eval run`` and ``gym env start`` make before starting anything, through
    the same function (``launcher/preflight.py``), so validate cannot pass a config they refuse; start nothing.
    With environment names: those checks, the environments' static checks (data, manifest) and their verifier
    fixtures against the real resources servers, all started in one launch (``environment/validation.py``)."""
    from nemo_gym.config import ports
    from nemo_gym.launcher.preflight import compose_to_start

    names, overrides = _names_and_overrides(invocation)
    if names:
        return _validate_environments(invocation, names, overrides)
    try:
        composed = compose_to_start(overrides)
    finally:
        ports.release_all()  # the ports it bound only to show they are free
    console.print(f"Config is valid: {len(composed.instances)} server instance(s).")
    for instance in composed.instances:
        console.print(f"  {instance.name:<32} {instance.SERVER_TYPE}/{instance.implementation}")
    return 0


def _names_and_overrides(invocation: Invocation) -> tuple[list[str], list[str]]:
    """argparse hands a list positional the ``key=value`` overrides after it too: those are overrides, not names."""
    tokens = list(invocation.get("names") or ())
    names = [token for token in tokens if "=" not in token and not token.startswith("~")]
    return names, [*invocation.overrides, *(token for token in tokens if token not in names)]


def _validate_environments(invocation: Invocation, names: list[str], overrides: list[str]) -> int:
    from nemo_gym.environment.validation import validate_environments

    checks = validate_environments(names, overrides)
    if invocation.get("json"):
        print(json.dumps([check.as_json() for check in checks], indent=2))
    else:
        for check in checks:
            for line in check.problems + [result.line() for result in check.results if not result.ok]:
                err_console.print(line, markup=False)
            for note in check.notes:
                console.print(f"  note: {note}", markup=False)
            state = "valid" if check.ok else "INVALID"
            passed = sum(result.ok for result in check.results)
            console.print(f"{check.name}: {state} ({passed}/{len(check.results)} verifier fixture(s) passed)")
    return 0 if all(check.ok for check in checks) else 1


def schema(invocation: Invocation) -> int:
    """The JSON Schema of an environment manifest; with ``--resources-server NAME`` (NeMo Gym 0.7's form), that
    server's task-data schema (its ``task_data.py``) instead."""
    from nemo_gym.environment.manifest import manifest_json_schema

    server = invocation.get("resources_server")
    if not server:
        print(json.dumps(manifest_json_schema(), indent=2))
        return 0
    from nemo_gym.errors import UserError
    from nemo_gym.roots import find_path
    from nemo_gym.task_data import load_task_data_schema

    name = str(server[0] if isinstance(server, list) else server).partition("/")[0]
    directory = find_path(Path("resources_servers") / name)
    if directory is None:
        raise UserError(f"resources server {name!r} not found under resources_servers/ in any search root")
    adapter = load_task_data_schema(directory)
    if adapter is None:
        raise UserError(f"resources server {name!r} ships no task_data.py schema ({directory / 'task_data.py'})")
    print(json.dumps(adapter.json_schema(), indent=2))
    return 0


def _servers_config(invocation: Invocation) -> ComposedConfig:
    """The config whose venvs are asked about. Values still to be set (a model's URL, a key) change no venv, so they
    may stay unset here. With ``+entrypoint=`` (one folder, NeMo Gym's spelling) it needs no server instance."""
    from nemo_gym.config.compose import ComposeOptions, compose

    needs_servers = invocation.entrypoint() is None
    return compose(
        ComposeOptions(overrides=list(invocation.overrides), require_server_instances=needs_servers, allow_unset=True)
    )


def _planned(invocation: Invocation, composed: ComposedConfig) -> list[PlannedVenv]:
    """Every venv of the config's servers, or with ``+entrypoint=<type>/<impl>`` that folder's alone."""
    from nemo_gym.launcher.venv_plan import plan_implementation, plan_venvs

    entrypoint = invocation.entrypoint()
    return [plan_implementation(composed, entrypoint)] if entrypoint else plan_venvs(composed)


def _shared_python(composed: ComposedConfig) -> str | None:
    """This interpreter when the config runs every server in it (``shared_venv``): then no venv is built."""
    from nemo_gym.launcher.venvs import shared_venv_enabled

    return sys.executable if shared_venv_enabled(composed.config.get("shared_venv")) else None


def packages(invocation: Invocation) -> int:
    """List the Python packages each server of a config runs with (``uv pip list`` of its venv), or, for a venv not
    built yet, the requirements it will install."""
    from nemo_gym.launcher.venv_plan import declared_requirements, installed_packages

    outdated = bool(invocation.get("outdated"))
    composed = _servers_config(invocation)
    report: list[dict[str, Any]] = []
    if (shared := _shared_python(composed)) is not None:
        instances = [instance.name for instance in composed.instances]
        packages = installed_packages(Path(shared), outdated=outdated)
        report.append({"implementation": "shared_venv", "instances": instances, "venv": str(Path(shared).parent.parent),
                       "built": True, "packages": packages, "requirements": []})  # fmt: skip
    else:
        for venv in _planned(invocation, composed):
            built = venv.spec.is_ready
            report.append(
                {
                    "implementation": venv.label,
                    "instances": list(venv.instances),
                    "venv": str(venv.spec.path),
                    "built": built,
                    "packages": installed_packages(venv.spec.python, outdated=outdated) if built else None,
                    "requirements": declared_requirements(venv.spec),
                }
            )
    if invocation.get("json"):
        print(json.dumps(report, indent=2))
        return 0
    for entry in report:
        serving = f" (instances: {', '.join(entry['instances'])})" if entry["instances"] else ""
        console.print(f"{entry['implementation']}{serving}")
        console.print(f"  venv: {entry['venv']}")
        if entry["packages"] is None:
            console.print("  not built yet (`gym env prefetch` builds it); it will install:")
            for line in entry["requirements"]:
                console.print(f"    {line}", markup=False)
            continue
        table = Table()
        for column in ("Package", "Version", *(["Latest"] if outdated else [])):
            table.add_column(column)
        for row in entry["packages"]:
            table.add_row(row["name"], row["version"], *([row.get("latest_version", "")] if outdated else []))
        console.print(table)
    return 0


def prefetch(invocation: Invocation) -> int:
    """Build every server venv of a config ahead of a run, one at a time and starting no server, so the run (a
    container, an offline node) reuses them from ``cache_dir`` without a package index."""
    from nemo_gym.launcher.venv_plan import prefetch as build_all

    composed = _servers_config(invocation)
    if (shared := _shared_python(composed)) is not None:
        console.print(f"shared_venv is on: every server runs with {shared}, so there is no venv to build.")
        return 0
    verbose = bool(invocation.get("verbose"))
    uv_cache = composed.config.get("uv_cache_dir")
    outcomes = build_all(
        _planned(invocation, composed),
        report=err_console.print,
        uv_cache_dir=str(uv_cache) if uv_cache else None,
        verbose=verbose,
        echo=(lambda line: err_console.file.write(line.decode(errors="replace"))) if verbose else None,
    )
    built = sum(outcome.action == "built" for outcome in outcomes)
    console.print(f"Prefetch complete: {built} venv(s) built, {len(outcomes) - built} already built.")
    return 0


def containers(invocation: Invocation) -> int:
    """Make the container runtime ready for the ``docker`` sandbox provider: podman's settings and the base image
    built from Debian packages. Idempotent: seconds when everything is there."""
    from nemo_gym.sandbox.providers.docker.runtime import base_image_tag, ensure_base_image, find_runtime, image_exists

    runtime = find_runtime()
    settings = f", settings {runtime.env['CONTAINERS_CONF']}" if "CONTAINERS_CONF" in runtime.env else ""
    console.print(f"Container runtime: {runtime.kind} ({runtime.binary}){settings}")
    tag = base_image_tag()
    if not image_exists(runtime, tag):
        console.print(f"Building the base image {tag} from Debian packages (about a minute) ...")
    console.print(f"Base image: {ensure_base_image(runtime)}")
    return 0


RESOURCES_SERVER_FLAG = Flag(
    ("--resources-server",), "print this resources server's task-data schema instead", metavar="NAME"
)
OUTDATED_FLAG = Flag(("--outdated",), "only packages with a newer release (asks the package index)", switch=True)

COMMANDS = (
    Command(
        "env",
        "resolve",
        "print the merged, resolved config (secrets masked)",
        resolve,
        CONFIG_FLAGS + MODEL_FLAGS,
        examples=("example: gym env resolve --config my.yaml +policy_model_name=gpt-4.1",),
    ),
    Command(
        "env",
        "validate",
        "run every check `gym eval run` makes before it starts servers; with environment NAMEs, also their data, "
        "manifest and verifier fixtures against the real resources servers (one launch)",
        validate,
        CONFIG_FLAGS + MODEL_FLAGS + (RAY_FLAG, JSON_FLAG),
        positionals=(
            Positional("names", "environments to validate with their fixtures (environments/NAME/)", nargs="*"),
        ),
        examples=("example: gym env validate --environment my_env", "example: gym env validate string_match"),
    ),
    Command(
        "env",
        "schema",
        "print the JSON Schema of an environment manifest (with --resources-server NAME: that server's task-data schema)",
        schema,
        (RESOURCES_SERVER_FLAG,),
        examples=("example: gym env schema",),
    ),
    Command(
        "env",
        "packages",
        "list the Python packages in each server venv of a config (or what a venv not built yet will install)",
        packages,
        CONFIG_FLAGS + MODEL_FLAGS + (OUTDATED_FLAG, JSON_FLAG),
        examples=("example: gym env packages --resources-server example_single_tool_call",),
    ),
    Command(
        "env",
        "prefetch",
        "build every server venv of a config ahead of a run, starting no server (for container images, offline nodes)",
        prefetch,
        CONFIG_FLAGS + MODEL_FLAGS,
        examples=("example: gym env prefetch --environment my_env ++cache_dir=/opt/gym-cache",),
    ),
    Command(
        "env",
        "containers",
        "make the container runtime ready for the docker sandbox provider (settings, base image)",
        containers,
        examples=("example: gym env containers",),
    ),
)
