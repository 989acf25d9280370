"""``gym view PATH [PATH ...]`` (legacy ``ng_viewer +jsonl_fpath=PATH``): the rollout viewer in the browser."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from nemo_gym.cli.command import Command, Invocation, Positional
from nemo_gym.cli.flags import Flag
from nemo_gym.errors import ConfigError

LEGACY_KEY = re.compile(r"^\+{0,2}jsonl_fpath=(.+)$")


def paths_of(invocation: Invocation) -> list[Path]:
    """The positional paths, then any NeMo Gym style ``+jsonl_fpath=PATH`` tokens (quotes stripped)."""
    paths = []
    for token in [*(invocation.get("paths") or []), *invocation.overrides]:  # argparse may take either as a path
        match = LEGACY_KEY.match(token)
        if match:
            paths.append(Path(match.group(1).strip("'\"")))
        elif token.startswith(("+", "~")) or ("=" in token and not Path(token).exists()):
            if token != "++verbose=true":
                raise ConfigError(
                    f"gym view: unknown argument {token!r}; pass rollout files as PATH or +jsonl_fpath=PATH"
                )
        else:
            paths.append(Path(token))
    return paths


def view(invocation: Invocation) -> int:
    from nemo_gym.viewer.serve import serve

    def announce(url: str) -> None:
        print(f"gym view: serving {len(paths)} run(s) at {url}  (Ctrl+C stops)", flush=True)

    paths = paths_of(invocation)
    try:
        serve(paths, invocation.get("host") or "127.0.0.1", int(invocation.get("port") or 0), announce)
    except KeyboardInterrupt:
        print("gym view: stopped", file=sys.stderr)
    return 0


COMMANDS = (
    Command(
        None,
        "view",
        "open rollout files (and their failures and metrics) in a local web viewer",
        view,
        description="Serve rollout files written by `gym eval run` (with their _failures.jsonl and "
        "_aggregate_metrics.json) as a local web app and print its URL. Give two runs of the same inputs to compare "
        "them. A file still being written is followed as rows arrive. Legacy form: ng_viewer +jsonl_fpath=PATH.",
        flags=(
            Flag(("--host",), "address to listen on (default 127.0.0.1: this machine only)", metavar="HOST"),
            Flag(
                ("--port", "-p"), "port to listen on (default 0: a free port)", value_type=int, minimum=0, maximum=65535
            ),
        ),  # fmt: skip
        positionals=(Positional("paths", "rollouts .jsonl written by `gym eval run`", nargs="*"),),
    ),
)
