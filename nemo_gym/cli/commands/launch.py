"""``gym env start`` and ``gym env status``: run the servers of a config, and see what is running."""

from __future__ import annotations

import json
from typing import Any

from rich.markup import escape
from rich.table import Table

from nemo_gym.cli.command import Command, Invocation
from nemo_gym.cli.flags import AUTH_FLAG, CONFIG_FLAGS, JSON_FLAG, MODEL_FLAGS, RAY_FLAG
from nemo_gym.cli.output import console, print_error


def start(invocation: Invocation) -> int:
    """Start every server of the config, print where they listen, and run until Ctrl-C / SIGTERM."""
    # imported here: fastapi/uvicorn would slow every `gym` call
    from nemo_gym.launcher.preflight import compose_to_start
    from nemo_gym.launcher.runner import new_launcher
    from nemo_gym.launcher.signals import sigterm_as_interrupt

    composed = compose_to_start(invocation.overrides)  # the checks of `gym env validate`
    launcher = new_launcher(composed, echo=True)
    with sigterm_as_interrupt():
        try:
            if composed.config.get("dry_run"):
                launcher.prepare_only()
                console.print("Dry run: every server's environment is ready; nothing was started.")
                return 0
            launcher.start()
            console.print(launcher.banner(), markup=False)
            launcher.wait()
        except KeyboardInterrupt:
            console.print("Stopping NeMo Gym servers...", markup=False)
        finally:
            launcher.stop()
    console.print("NeMo Gym servers stopped.", markup=False)
    return 0


def status(invocation: Invocation) -> int:
    """List the servers a running ``gym env start`` reports, with a live health probe of each."""
    from nemo_gym.config.compose import ComposeOptions, compose
    from nemo_gym.launcher.status import HeadServerUnreachable, query_status

    config = compose(ComposeOptions(overrides=invocation.overrides)).config
    head = config.get("head_server") or {}
    host = str(head.get("host") or "127.0.0.1")
    port = int(head.get("port") or 11000)
    connect_host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
    try:
        instances = query_status(connect_host, port)
    except HeadServerUnreachable:
        if invocation.get("json"):
            print(json.dumps({"head_server": f"{host}:{port}", "running": False, "servers": []}))
        print_error(f"No NeMo Gym servers are running (no head server at {host}:{port})")
        return 1
    healthy = sum(1 for i in instances if i["healthy"])
    if invocation.get("json"):
        print(json.dumps({"head_server": f"{host}:{port}", "running": True, "servers": instances}, indent=2))
        return 0 if healthy == len(instances) else 1
    console.print(_table(instances))  # piped: plain lines, every URL whole
    console.print(f"{healthy} / {len(instances)} servers healthy (head server {host}:{port})", markup=False)
    return 0 if healthy == len(instances) else 1


def _table(instances: list[dict[str, Any]]) -> Table:
    table = Table(show_edge=False, pad_edge=False, box=None, header_style="bold")
    on_ray = any(instance.get("node") for instance in instances)
    for column in ("name", "type/impl", "url", "pid", *(("node",) if on_ray else ()), "health"):
        table.add_column(column, overflow="fold")
    for instance in instances:
        health = "[green]healthy[/green]" if instance["healthy"] else "[red]unhealthy[/red]"
        table.add_row(
            escape(str(instance.get("name"))),
            escape(f"{instance.get('server_type')}/{instance.get('implementation')}"),
            escape(str(instance.get("url"))),
            str(instance.get("pid") or "-"),
            *((escape(str(instance.get("node") or "-")),) if on_ray else ()),
            health,
        )
    return table


COMMANDS = (
    Command(
        "env",
        "start",
        "start every server of a config and keep them running until Ctrl-C",
        start,
        CONFIG_FLAGS + MODEL_FLAGS + (AUTH_FLAG, RAY_FLAG),
        description=(
            "Start every server instance of the composed config (one process each, in its own uv venv unless "
            "+shared_venv=true), wait until all answer, and run until Ctrl-C or SIGTERM. Logs go to "
            "<results_dir>/logs/<instance>.log; the head server (+head_server.port=..., default 11000) lists them."
        ),
        examples=(
            "example: gym env start --environment my_env --model gpt-4.1 --model-url https://api.openai.com/v1",
            "example: gym env start --config my.yaml +shared_venv=true   # reuse this environment, no venv builds",
        ),
    ),
    Command(
        "env",
        "status",
        "list the servers of a running `gym env start` and probe their health",
        status,
        CONFIG_FLAGS + (JSON_FLAG,),
        examples=("example: gym env status --json   # a head server on another port: +head_server.port=11001",),
    ),
)
