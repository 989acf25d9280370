"""Containers benchmark: start latency, rollouts/s and peak memory of repo_repair at 1, 8 and 32 containers at once.

Two measurements per concurrency ``c``, on the real runtime (podman, ``make containers``):

* **start latency**: ``c`` sandboxes of a task image started at once through the ``docker`` provider, each timed
  from ``create`` to a first command answered (the time a rollout waits for its container), then removed;
* **rollouts**: a real ``gym eval run`` on repo_repair with the scripted model replaying each task's gold patch,
  ``--concurrency c`` and ``max_containers: c``; rollouts/s from the run's wall time (servers up to exit, so it
  includes start-up), every reward checked to be 1.0, and the machine's used memory sampled every 0.2 s: the peak
  above what was used before the run (containers, servers, the collector: everything the run costs).

    .venv/bin/python benchmarks/performance/containers/run.py --concurrency 1,8,32 --json results/containers.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO))

from nemo_gym.sandbox import AsyncSandbox, SandboxSpec  # noqa: E402
from nemo_gym.sandbox.providers.docker import DockerProvider  # noqa: E402
from nemo_gym.sandbox.providers.docker.runtime import find_runtime  # noqa: E402
from resources_servers.repo_repair.app import task_image  # noqa: E402

FOLDER = REPO / "resources_servers" / "repo_repair"
TASKS = FOLDER / "data" / "train.jsonl"


async def start_latencies(concurrency: int) -> list[float]:
    """Seconds from ``create`` to a first answered command, for ``concurrency`` containers started at once."""
    row = json.loads(TASKS.read_text().splitlines()[0])
    provider = DockerProvider()
    image = await task_image(provider.runtime, row["repo"])

    async def one() -> tuple[float, AsyncSandbox]:
        began = time.monotonic()
        box = AsyncSandbox(provider, owns_provider=False)
        await box.start(SandboxSpec(image=image, resources={"memory_mib": 512, "cpu": 1}))
        answered = await box.exec("true", timeout_s=60)
        assert answered.return_code == 0, answered
        return time.monotonic() - began, box

    started = await asyncio.gather(*(one() for _ in range(concurrency)))
    await asyncio.gather(*(box.stop() for _, box in started))
    await provider.aclose()
    return sorted(seconds for seconds, _ in started)


class MemoryPeak:
    """The machine's used memory, sampled on a thread: the peak above the level at start."""

    def __init__(self) -> None:
        self.baseline = psutil.virtual_memory().used
        self.peak = self.baseline
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.wait(0.2):
            self.peak = max(self.peak, psutil.virtual_memory().used)

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return (self.peak - self.baseline) / 2**20


def collect(concurrency: int, rows: int, workdir: Path) -> dict[str, Any]:
    """One ``gym eval run`` of ``rows`` gold-patch rollouts at ``concurrency``; its figures."""
    output = workdir / f"c{concurrency}.jsonl"
    tasks = len(TASKS.read_text().splitlines())
    amount = ["--limit", str(rows)] if rows <= tasks else ["--num-repeats", str(-(-rows // tasks))]
    argv = [
        sys.executable, "-m", "nemo_gym.cli.main", "eval", "run", "--resources-server", "repo_repair",
        "--agent", "repo_repair_simple_agent", "--model-type", "scripted_model", "--input", str(TASKS),
        *amount, "--output", str(output), "--overwrite", "--concurrency", str(concurrency),
        f"++policy_model.responses_api_models.scripted_model.scripts_file={FOLDER / 'data' / 'gold_scripts.jsonl'}",
        f"++repo_repair.resources_servers.repo_repair.max_containers={concurrency}",
        "+shared_venv=true", "+head_server={port: 0}", f"+cache_dir={workdir / 'cache'}",
    ]  # fmt: skip
    memory = MemoryPeak()
    began = time.monotonic()
    done = subprocess.run(argv, cwd=workdir, capture_output=True, text=True, timeout=3600, check=False)
    wall = time.monotonic() - began
    peak_mib = memory.stop()
    if done.returncode != 0:
        raise SystemExit(f"gym eval run failed at concurrency {concurrency}:\n{done.stderr[-3000:]}")
    scored = [json.loads(line) for line in output.read_text().splitlines()]
    if any(row["reward"] != 1.0 for row in scored):
        raise SystemExit(f"a gold patch scored below 1.0 at concurrency {concurrency}")
    return {"rollouts": len(scored), "wall_s": round(wall, 1), "rollouts_per_s": round(len(scored) / wall, 3),
            "peak_memory_mib": round(peak_mib)}  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", default="1,8,32", help="comma-separated containers at once")
    parser.add_argument("--rows", type=int, default=0, help="rollouts per step (default: 8 x concurrency, >= 16)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    runtime = find_runtime()
    print(f"runtime: {runtime.kind} ({runtime.binary}); {os.cpu_count()} CPUs")
    steps = []
    with tempfile.TemporaryDirectory(prefix="nemo-gym-containers-bench-") as scratch:
        for concurrency in (int(part) for part in args.concurrency.split(",")):
            latencies = asyncio.run(start_latencies(concurrency))
            figures = collect(concurrency, args.rows or max(16, 8 * concurrency), Path(scratch))
            step = {
                "concurrency": concurrency,
                "start_p50_s": round(statistics.median(latencies), 2),
                "start_max_s": round(latencies[-1], 2),
                **figures,
            }
            steps.append(step)
            print(
                f"c={concurrency:>3}  start p50 {step['start_p50_s']:.2f} s (max {step['start_max_s']:.2f} s)  "
                f"{step['rollouts']} rollouts in {step['wall_s']} s = {step['rollouts_per_s']} rollouts/s  "
                f"peak memory +{step['peak_memory_mib']} MiB"
            )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"runtime": runtime.kind, "steps": steps}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
