"""Capacity curves of every shipped environment: ``gym env loadtest`` on each ``environments/NAME``, one after another.

Each run starts the environment's servers with the scripted model answering from the environment's data, climbs the
ladder, and leaves ``curves/NAME.json`` and ``curves/NAME.png`` here (the steps' rollouts stay in the work folder:
they are the run's evidence, too large to keep). The table between the markers of README.md is rewritten from the
JSON files. An environment whose command fails is listed with the last line it printed.

    .venv/bin/python benchmarks/performance/loadtest/run_all.py --concurrency 4,16,64 --duration 5
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
RESULTS = HERE / "curves"
README = HERE / "README.md"
BEGIN, END = "<!-- loadtest results: run_all.py rewrites this table -->", "<!-- /loadtest results -->"


def environments() -> list[str]:
    """The environments git tracks (shipped), not a folder someone is still writing."""
    listed = subprocess.run(["git", "ls-files", "environments/*/config.yaml"], cwd=ROOT, capture_output=True, text=True)
    return sorted(Path(line).parent.name for line in listed.stdout.splitlines() if line.strip())


def run_one(name: str, args: argparse.Namespace, work: Path) -> str | None:
    """Run the load test of one environment; None when it worked, else the reason it did not."""
    output = work / name / f"{name}.json"
    command = [sys.executable, "-m", "nemo_gym.cli.main", "env", "loadtest", "--environment", name,
               "--model-type", "scripted_model", "--concurrency", args.concurrency, "--duration", str(args.duration),
               "--output", str(output), "+shared_venv=true", f"+results_dir={work / name / 'results'}",
               "+head_server={port: 0}"]  # fmt: skip
    print(f"== {name}", flush=True)
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=args.timeout)
    print(done.stdout[-3000:], flush=True)
    if done.returncode != 0 or not output.exists():
        lines = [line for line in (done.stderr + done.stdout).splitlines() if line.strip()]
        return lines[-1] if lines else f"exit {done.returncode}"
    RESULTS.mkdir(exist_ok=True)
    shutil.copy(output, RESULTS / f"{name}.json")
    if output.with_suffix(".png").exists():
        shutil.copy(output.with_suffix(".png"), RESULTS / f"{name}.png")
    return None


def table(failed: dict[str, str]) -> str:
    reports = {path: json.loads(path.read_text()) for path in sorted(RESULTS.glob("*.json"))}
    settings = next(iter(reports.values()))["settings"] if reports else {}
    ladder = ",".join(str(c) for c in settings.get("concurrency", []))
    when = min((r["measured_at"] for r in reports.values()), default="-")
    rows = [f"Measured from {when} on: `--concurrency {ladder} --duration {settings.get('duration_seconds', 0):g}`, "
            f"one environment after another on a {os.cpu_count()}-core machine shared with other work (each step's "
            "JSON says how busy the CPUs were and how much of that was ours; a first limit of `machine CPU` names "
            "that).", "",
            "| environment | best rollouts/s (at concurrency) | p99 there (ms) | failed rollouts | first limit | curve |",
            "|---|---|---|---|---|---|"]  # fmt: skip
    for path, report in reports.items():
        steps = report["steps"]
        best = max(steps, key=lambda s: s["rollouts_per_s"])
        p99 = best["latency_ms"]["p99"]
        failures = sum(s["failed"] for s in steps)
        curve = f"![{path.stem}](curves/{path.stem}.png)" if path.with_suffix(".png").exists() else "-"
        rows.append(
            f"| {path.stem} | {best['rollouts_per_s']:.1f} ({best['concurrency']}) | "
            f"{'-' if p99 is None else f'{p99:.0f}'} | {failures} | {report['first_limit']} | {curve} |"
        )
    for name, reason in sorted(failed.items()):
        rows.append(f"| {name} | did not run | | | {reason.replace('|', '/')} | |")
    return "\n".join(rows)


def rewrite_readme(text: str) -> None:
    readme = README.read_text()
    start, end = readme.index(BEGIN) + len(BEGIN), readme.index(END)
    README.write_text(readme[:start] + "\n" + text + "\n" + readme[end:])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", default="4,16,64")
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds one environment may take")
    parser.add_argument("--only", nargs="*", help="these environments only (the table keeps the others' results)")
    args = parser.parse_args()
    failed: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="gym-loadtest-") as folder:
        for name in args.only or environments():
            try:
                reason = run_one(name, args, Path(folder))
            except subprocess.TimeoutExpired:
                reason = f"took longer than {args.timeout:g} s"
            if reason is not None:
                failed[name] = reason
                (RESULTS / f"{name}.json").unlink(missing_ok=True)
                (RESULTS / f"{name}.png").unlink(missing_ok=True)
    rewrite_readme(table(failed))
    print(table(failed))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
