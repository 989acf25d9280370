"""``gym eval health-check RUN_DIR``: the rollout health checks over a finished run (NeMo Gym 0.7's command line)."""

from __future__ import annotations

import sys
from pathlib import Path

import orjson

from nemo_gym.cli.command import Command, Invocation, Positional
from nemo_gym.cli.flags import JSON_FLAG, Flag
from nemo_gym.cli.output import console

HEALTH_CHECK_FLAGS = (
    Flag(("--rollouts-file",), "rollouts JSONL to check; a relative path is under RUN_DIR (default: rollouts.jsonl, "
         "else the one rollouts file there)", metavar="PATH"),
    Flag(("--ignore-checks", "--ignore"), "check ids to leave out of the checks and verdicts (comma-separated)",
         metavar="CHECK[,CHECK...]"),
    Flag(("--workers",), "processes for the checks (default: one for a small run, else one per CPU up to 8)",
         metavar="N", value_type=int, minimum=1),
    JSON_FLAG,
)  # fmt: skip


def health_check(invocation: Invocation) -> int:
    """Check every rollout, write quality_summary.json and rollout_verdicts.jsonl, print the verdicts."""
    from nemo_gym.health.report import format_health_report, health_check_run_dir

    result = health_check_run_dir(
        Path(invocation.get("run_dir")),
        rollout_file=invocation.get("rollouts_file"),
        workers=invocation.get("workers"),
        ignored_checks=invocation.get("ignore_checks") or (),
    )
    if invocation.get("json"):
        sys.stdout.write(orjson.dumps(result.summary).decode() + "\n")
    else:
        console.print(format_health_report(result), markup=False)
    return 0


COMMANDS: tuple[Command, ...] = (
    Command(
        "eval",
        "health-check",
        "check a finished run's rollouts for hollow turns, failed or empty model calls, cut-off generations, token "
        "and capture mismatches (also run at the end of every gym eval run)",
        health_check,
        HEALTH_CHECK_FLAGS,
        positionals=(Positional("run_dir", "a run's folder, or its rollouts file"),),
        examples=("example: gym eval health-check results --rollouts-file weather.jsonl",),
    ),
)
