"""``gym eval export --format atif`` and ``gym eval reverify --atif-manifest``: NeMo Gym 0.7's ATIF command lines."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from nemo_gym.atif import DEFAULT_AGENT_VERSION
from nemo_gym.cli.command import Command, Invocation
from nemo_gym.cli.flags import Flag
from nemo_gym.cli.output import console, err_console
from nemo_gym.errors import ConfigError

EXIT_REWARD_MISMATCH = 4
"""Exit code of a re-verified ATIF export where some reward differs from the exported one (each named on stderr)."""

EXPORT_FLAGS = (
    Flag(("--format",), "what to write: atif (ATIF v1.7, the only format)", metavar="atif"),
    Flag(("--rollouts",), "scored rollouts of a run (gym eval run's --output)", metavar="PATH"),
    Flag(("--inputs",), "the run's materialized inputs (default: <rollouts stem>_materialized_inputs.jsonl)",
         metavar="PATH"),
    Flag(("--output-dir", "-o"), "new folder for the trajectories and manifest.jsonl", metavar="DIR"),
    Flag(("--session-id",), "the run's id in every trajectory (default: the rollouts file's name without .jsonl)",
         metavar="ID"),
    Flag(("--agent-version",), "version of the agent that made the rollouts (ATIF requires one; default "
         f"{DEFAULT_AGENT_VERSION!r})", metavar="VERSION"),
)  # fmt: skip


def export(invocation: Invocation) -> int:
    from nemo_gym.atif.export import export_atif

    fmt = invocation.get("format") or "atif"
    if fmt != "atif":
        raise ConfigError(f"--format {fmt!r}: the only export format is atif")
    rollouts, output_dir = invocation.get("rollouts"), invocation.get("output_dir")
    if not rollouts or not output_dir:
        raise ConfigError("gym eval export needs --rollouts PATH and --output-dir DIR")
    inputs = invocation.get("inputs")
    result = export_atif(
        Path(rollouts).expanduser(),
        Path(output_dir).expanduser(),
        inputs=Path(inputs).expanduser() if inputs else None,
        session_id=invocation.get("session_id"),
        agent_version=invocation.get("agent_version") or DEFAULT_AGENT_VERSION,
    )
    console.print(f"Exported {result.trajectories} ATIF v1.7 trajectories to {result.output_dir}", markup=False)
    console.print(f"  manifest: {result.manifest_path}", markup=False)
    return 0


def reverify_atif(invocation: Invocation) -> int:
    """Rebuild the stored rollouts from the export, re-verify them as ``gym eval reverify`` does, compare rewards."""
    import tempfile

    from nemo_gym.atif.export import task_rows
    from nemo_gym.atif.reverify import load_export, manifest_file, reward_mismatches, write_stored_rollouts
    from nemo_gym.cli.commands.eval import report_reverify, reverify_summary

    fmt, manifest = invocation.get("input_format") or "atif", invocation.get("atif_manifest")
    if fmt != "atif":
        raise ConfigError(f"--input-format {fmt!r}: use gym (with --rollouts) or atif (with --atif-manifest)")
    if not manifest:
        raise ConfigError("--input-format atif needs --atif-manifest DIR (the folder gym eval export wrote)")
    if invocation.fields.get("rollouts_jsonl_fpath"):
        raise ConfigError("give --rollouts or --atif-manifest, not both")
    export_dir = manifest_file(Path(manifest).expanduser()).parent
    exported = load_export(export_dir)
    fields = dict(invocation.fields)
    fields.setdefault("output_jsonl_fpath", str(export_dir.parent / f"{export_dir.name}_reverified.jsonl"))
    given_inputs = fields.get("materialized_inputs_jsonl_fpath")
    tasks = task_rows(Path(given_inputs).expanduser()) if given_inputs else None
    with tempfile.TemporaryDirectory(prefix="gym-atif-") as folder:
        rollouts, inputs = Path(folder) / "rollouts.jsonl", Path(folder) / "inputs.jsonl"
        write_stored_rollouts(exported, rollouts, inputs, tasks)
        fields |= {"rollouts_jsonl_fpath": str(rollouts), "materialized_inputs_jsonl_fpath": str(inputs)}
        summary = reverify_summary(replace(invocation, fields=fields))
    code = report_reverify(summary, err_console)
    mismatches, compared = reward_mismatches(exported, summary.output_path) if summary.output_path.exists() else ([], 0)
    for line in mismatches:
        err_console.print(line, markup=False)
    if mismatches:
        return EXIT_REWARD_MISMATCH
    if compared < summary.verified:
        err_console.print(
            f"{summary.verified - compared} trajectories carry no exported reward (another exporter's): not compared"
        )
    if code == 0 and compared:
        err_console.print(f"All {compared} re-verified rewards equal the exported ones.")
    return code


COMMANDS: tuple[Command, ...] = (
    Command(
        "eval",
        "export",
        "write a run's rollouts as ATIF v1.7 trajectories (one file each, and a manifest with their sha256)",
        export,
        EXPORT_FLAGS,
        examples=(
            "example: gym eval export --format atif --rollouts results/weather.jsonl --output-dir results/weather_atif",
        ),
    ),
)
