"""The health checks as a user meets them: after every ``gym eval run``, and as ``gym eval health-check RUN_DIR``.

Which rollouts file a run directory means, the few lines printed about the verdicts, and the check after a run, which
never fails the run: its rollouts are written whatever the checks find (or if the checks themselves break).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from nemo_gym.errors import ConfigError
from nemo_gym.health.checks import normalize_ignored_checks
from nemo_gym.health.run import ROLLOUT_VERDICTS_FILENAME, HealthCheckResult, run_health_checks

logger = logging.getLogger(__name__)

DEFAULT_ROLLOUTS_FILENAME = "rollouts.jsonl"
"""The rollouts file of a run directory when none is named (NeMo Gym 0.7's name)."""
_NOT_ROLLOUTS = ("_failures.jsonl", "_materialized_inputs.jsonl", "_reward_profiling.jsonl", ROLLOUT_VERDICTS_FILENAME)


def rollouts_of_run_dir(run_dir: Path, rollouts_file: Path | None = None) -> Path:
    """The rollouts file to check: ``rollouts_file`` (relative to ``run_dir``), ``run_dir`` itself when it is a file,
    ``run_dir/rollouts.jsonl``, else the one rollouts file in ``run_dir``; otherwise a one-line error that lists them."""
    if run_dir.is_file() and rollouts_file is None:
        return run_dir
    if not run_dir.is_dir():
        raise ConfigError(f"{run_dir}: no such run directory or rollouts file")
    if rollouts_file is not None:
        path = rollouts_file if rollouts_file.is_absolute() else run_dir / rollouts_file
        if not path.is_file():
            raise ConfigError(f"--rollouts-file {rollouts_file}: no such file in {run_dir}")
        return path
    if (run_dir / DEFAULT_ROLLOUTS_FILENAME).is_file():
        return run_dir / DEFAULT_ROLLOUTS_FILENAME
    candidates = sorted(p for p in run_dir.glob("*.jsonl") if not p.name.endswith(_NOT_ROLLOUTS))
    if len(candidates) == 1:
        return candidates[0]
    found = ", ".join(p.name for p in candidates) or "none"
    raise ConfigError(
        f"{run_dir}: no {DEFAULT_ROLLOUTS_FILENAME}, and not one rollouts file to choose (found: {found}); "
        "name it with --rollouts-file"
    )


def format_health_report(result: HealthCheckResult) -> str:
    """Verdict counts, then the checks that found something, then where the reports are."""
    run = result.summary["run"]
    verdicts = run["verdicts"]
    ignored = run.get("ignored_checks") or []
    lines = [
        f"Rollout health: {sum(verdicts.values())} checked, {verdicts['healthy']} healthy, "
        f"{verdicts['unhealthy']} unhealthy, {verdicts['unobserved']} unobserved"
        + (f" (ignored: {', '.join(ignored)})" if ignored else "")
    ]
    found = {check: n for check, n in run["issues"].items() if n}
    if found:
        lines.append("  findings: " + ", ".join(f"{check} {n}" for check, n in found.items()))
    if verdicts["unobserved"] and not run["artifacts"]["captures"]:
        lines.append(
            "  no rollout carries its model calls, so most checks could not look: "
            "run with +observability_enabled=true +model_call_capture_dir=/an/absolute/dir to record them"
        )
    lines.append(f"  quality summary: {result.summary_path}")
    lines.append(f"  verdicts:        {result.verdicts_path}")
    return "\n".join(lines)


def health_check_run_dir(
    run_dir: str | Path,
    *,
    rollout_file: str | Path | None = None,
    workers: int | None = None,
    ignored_checks: Sequence[str] = (),
) -> HealthCheckResult:
    """Check a finished run's rollouts; the reports go into the run directory (beside the file when given a file)."""
    directory = Path(run_dir).expanduser()
    path = rollouts_of_run_dir(directory, Path(rollout_file).expanduser() if rollout_file else None)
    try:
        ignored = normalize_ignored_checks(ignored_checks)
    except ValueError as error:
        raise ConfigError(f"--ignore-checks: {error}") from None
    return run_health_checks(path, output_dir=path.parent, workers=workers, ignored_checks=ignored)


def check_after_run(
    rollouts: Path, workers: int | None = None, ignored_checks: Sequence[str] = ()
) -> HealthCheckResult | None:
    """The checks at the end of a run, over its rollouts file; None when there is nothing to check or the checks
    broke (said in one warning: the run's results stand either way)."""
    if not rollouts.is_file() or rollouts.stat().st_size == 0:
        return None
    try:
        return run_health_checks(rollouts, workers=workers, ignored_checks=ignored_checks)
    except Exception as error:  # a bug in a check must not cost the run its exit code or its files
        logger.warning(
            "rollout health checks failed (%s: %s); the rollouts are unaffected", type(error).__name__, error
        )
        return None
