"""Health-check and compare benchmark: `gym eval health-check` over a 100,000-rollout file, and `gym eval compare` of
two such files, each against the time of reading the same files.

"Reading" is the least any command over the file must do: every line read and parsed with ``orjson.loads`` (the
parser the commands use), nothing kept. Both commands run in this process through the CLI's ``main`` (so without
the interpreter's start), interleaved with the reads over several rounds; the figures are the medians, and each
round's ratio is taken against the reads of the same round. A fixed CPU loop is timed before each round (the
calibration): on a shared machine its spread says how much the load moved.

    .venv/bin/python benchmarks/performance/health_check/run.py --rows 100000 --json results/health_bench.json
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import orjson

from nemo_gym.cli.main import main

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository, when run as a script
from benchmarks.performance.health_check.rollouts import write_rollouts


def read(*paths: Path) -> None:
    """Every line of every file parsed, nothing kept: the reading the commands are measured against."""
    for path in paths:
        with path.open("rb") as handle:
            for line in handle:
                orjson.loads(line)


def calibration() -> float:
    """Seconds for a fixed pure-Python loop: the machine's speed for this process right now."""
    started = time.perf_counter()
    total = 0
    for number in range(3_000_000):
        total += number & 7
    return time.perf_counter() - started


def timed(action: Callable[[], object]) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def quiet(argv: list[str]) -> None:
    """One ``gym`` command in this process, its output swallowed; a non-zero exit stops the benchmark."""
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        code = main(argv)
    if code != 0:
        raise SystemExit(f"gym {' '.join(argv)} exited {code}")


def main_benchmark() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=None, help="health-check processes (default: the command's)")
    parser.add_argument("--dir", type=Path, default=None, help="where the files go (default: a temporary folder)")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args()
    folder = args.dir or Path(tempfile.mkdtemp(prefix="health_bench_"))
    baseline, candidate = folder / "baseline" / "rollouts.jsonl", folder / "candidate" / "rollouts.jsonl"
    for path, salt in ((baseline, 0), (candidate, 3)):
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.is_file() or sum(1 for _ in path.open("rb")) != args.rows:
            write_rollouts(path, args.rows, salt=salt)
    size_mb = baseline.stat().st_size / 1e6
    health = ["eval", "health-check", str(baseline.parent)]
    if args.workers:
        health += ["--workers", str(args.workers)]
    compare = ["eval", "compare", "--baseline", str(baseline), "--candidates", str(candidate),
               "--output-dir", str(folder / "compare")]  # fmt: skip
    rounds = []
    for number in range(args.rounds):
        figures = {"calibration_s": calibration(), "load_1min": os.getloadavg()[0]}
        figures["read_s"] = timed(lambda: read(baseline))
        figures["health_check_s"] = timed(lambda: quiet(health))
        figures["read_again_s"] = timed(lambda: read(baseline))
        figures["read_both_s"] = timed(lambda: read(baseline, candidate))
        figures["compare_s"] = timed(lambda: quiet(compare))
        reading = (figures["read_s"] + figures["read_again_s"]) / 2
        figures["health_ratio"] = figures["health_check_s"] / reading
        figures["compare_ratio"] = figures["compare_s"] / figures["read_both_s"]
        rounds.append(figures)
        print(f"round {number + 1}: " + ", ".join(f"{k} {v:.3f}" for k, v in figures.items()), flush=True)
    median = {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}
    summary = json.loads((baseline.parent / "quality_summary.json").read_text())["run"]
    result = {
        "rows": args.rows,
        "file_mb": round(size_mb, 1),
        "cpus": os.cpu_count(),
        "workers": args.workers or "default",
        "median": median,
        "rounds": rounds,
        "verdicts": summary["verdicts"],
        "health_within_2x": median["health_ratio"] <= 2.0,
        "compare_within_2x": median["compare_ratio"] <= 2.0,
    }
    print(json.dumps({k: v for k, v in result.items() if k != "rounds"}, indent=2))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main_benchmark()
