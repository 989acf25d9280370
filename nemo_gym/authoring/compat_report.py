"""Ours beside a control: the migration check's results next to the same folders run on another ``nemo_gym``.

A folder that fails on both is the folder's own problem (a GPU, a key, a network, its own bug); a folder that passes
on the control and not on ours is a gap in our core, which is what a user migrating from NeMo Gym needs to see
first. ``gym env test --checkout PATH --control control.json`` prints this comparison and can write it as Markdown
(``docs/compatibility.md`` is made this way).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from nemo_gym.authoring.migration_check import FolderResult
from nemo_gym.errors import ConfigError


@dataclass(frozen=True)
class CheckReport:
    """One ``--json`` file of the migration check."""

    checkout: str
    commit: str | None
    nemo_gym: str
    python: str
    folders: tuple[FolderResult, ...]

    def by_folder(self) -> dict[str, FolderResult]:
        return {result.folder: result for result in self.folders}


def load_check_report(path: Path) -> CheckReport:
    """A report written by ``gym env test --checkout ... --json PATH``; a clear error for anything else."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        known = {f.name for f in fields(FolderResult)}
        folders = tuple(FolderResult(**{k: v for k, v in row.items() if k in known}) for row in data["folders"])
        return CheckReport(data["checkout"], data.get("commit"), data["nemo_gym"], data["python"], folders)
    except OSError as error:
        raise ConfigError(f"{path}: cannot read the control report ({error.strerror or error})") from None
    except (ValueError, KeyError, TypeError) as error:
        raise ConfigError(
            f"{path}: not a report of `gym env test --checkout ... --json PATH` ({type(error).__name__}: {error})"
        ) from None


@dataclass(frozen=True)
class Comparison:
    """Every folder of ours with the control's result for it (None where the control did not run it)."""

    rows: tuple[tuple[FolderResult, FolderResult | None], ...]

    @property
    def gaps(self) -> list[tuple[FolderResult, FolderResult]]:
        """Folders that pass on the control and not on ours: the exceptions to parity."""
        return [(ours, control) for ours, control in self.rows if control is not None and control.ok and not ours.ok]

    @property
    def gains(self) -> list[tuple[FolderResult, FolderResult]]:
        """Folders that pass on ours and not on the control."""
        return [(ours, control) for ours, control in self.rows if control is not None and ours.ok and not control.ok]


def compare(ours: list[FolderResult] | tuple[FolderResult, ...], control: CheckReport) -> Comparison:
    by_folder = control.by_folder()
    return Comparison(tuple((result, by_folder.get(result.folder)) for result in ours))


def summary_lines(comparison: Comparison) -> list[str]:
    """The counts a reader wants first, as plain sentences."""
    rows = comparison.rows
    ours_ok = sum(ours.ok for ours, _ in rows)
    compared = [(ours, control) for ours, control in rows if control is not None]
    control_ok = sum(control.ok for _, control in compared)
    lines = [
        f"{ours_ok} of {len(rows)} folders pass on ours; {control_ok} of {len(compared)} on the control.",
        f"Parity: {control_ok - len(comparison.gaps)} of the {control_ok} folders that pass on the control pass on "
        f"ours; {len(comparison.gaps)} do not; {len(comparison.gains)} pass only on ours.",
    ]
    kinds: dict[str, list[int]] = {}
    for ours, _ in rows:
        counts = kinds.setdefault(ours.folder.split("/", 1)[0], [0, 0])
        counts[0] += ours.ok
        counts[1] += 1
    if len(kinds) > 1:
        lines.append("On ours by folder kind: " + ", ".join(f"{k} {ok} of {n}" for k, (ok, n) in kinds.items()) + ".")
    causes = Counter(ours.cause or ours.result for ours, _ in rows if not ours.ok)
    if causes:
        lines.append("Failures on ours by cause: " + ", ".join(f"{c} {n}" for c, n in causes.most_common()) + ".")
    return lines


def render_markdown(comparison: Comparison, ours: dict[str, Any], control: CheckReport) -> str:
    """The comparison as a Markdown section: what ran against what, the counts, the gaps, then every folder."""

    def cell(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", " ")[:160]

    def counts(result: FolderResult | None) -> str:
        if result is None:
            return "not run"
        return f"{result.result} ({result.passed}/{result.failed}/{result.skipped})"

    where = f"at commit `{ours['commit']}`" if ours.get("commit") else "at commit `unknown`"
    if not ours.get("commit") and ours.get("version"):
        where = f"(nemo_gym {ours['version']})"
    out = [
        f"Checkout: `{ours.get('checkout', '')}` {where}; Python "
        f"{ours.get('python', '')} for both runs. Control: NeMo Gym's own `nemo_gym` from `{control.nemo_gym}`.",
        "",
        *[f"- {line}" for line in summary_lines(comparison)],
        "",
    ]
    if comparison.gaps:
        out += ["Folders that pass on the control and not on ours:", ""]
        out += [f"- `{o.folder}`: {o.cause or o.result}: {cell(o.first_error)}" for o, _ in comparison.gaps]
        out.append("")
    out += [
        "| Folder | Ours (passed/failed/skipped) | Control | Cause on ours | First error on ours |",
        "|---|---|---|---|---|",
    ]
    for result, control_result in comparison.rows:
        cause = "" if result.ok else (result.cause or "")
        error = "" if result.ok else cell(result.first_error)
        out.append(f"| `{result.folder}` | {counts(result)} | {counts(control_result)} | {cause} | {error} |")
    return "\n".join(out) + "\n"


__all__ = ["CheckReport", "Comparison", "compare", "load_check_report", "render_markdown", "summary_lines"]
