"""Measuring the stack under test: CPU and memory of every process, py-spy profiles, facts about the machine.

Used by ``run.py``; kept apart so the driver's logic reads on its own.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import platform
import resource
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil

RSS_SAMPLE_EVERY_S = 0.2
LIBRARIES = ("fastapi", "starlette", "uvicorn", "uvloop", "httptools", "pydantic", "pydantic-core", "aiohttp", "orjson")

# --------------------------------------------------------------------------------------------------------------------
# Processes: CPU and memory of the whole stack


class Stack:
    """This process (the driver, or only the launcher with ``--client collect``) and every server process, by a
    readable name. The collect command joins ``processes`` while it runs, so readers iterate over a copy."""

    def __init__(self, server_pids: dict[str, int], self_name: str = "driver") -> None:
        self.processes: dict[str, psutil.Process] = {self_name: psutil.Process(os.getpid())}
        for name, pid in server_pids.items():
            root = psutil.Process(pid)
            self.processes[name] = root
            # Servers that fork workers (uvicorn num_workers) count with their children.
            for i, child in enumerate(root.children(recursive=True)):
                self.processes[f"{name}/child{i}"] = child

    def cpu_seconds(self) -> dict[str, tuple[float, float]]:
        """(user, system) CPU seconds per process."""
        out = {}
        for name, proc in list(self.processes.items()):
            with contextlib.suppress(psutil.Error):
                times = proc.cpu_times()
                out[name] = (times.user, times.system)
        return out

    def rss_bytes(self) -> dict[str, int]:
        out = {}
        for name, proc in list(self.processes.items()):
            with contextlib.suppress(psutil.Error):
                out[name] = proc.memory_info().rss
        return out

    def pss_bytes(self) -> dict[str, int]:
        """Proportional set size per process: private pages plus a fair share of pages shared with others.

        Summed over the stack this counts the interpreter, libpython and each extension's code once, where a sum of
        RSS counts them once per process (~19 MB each here). Linux only; empty elsewhere.
        """
        out = {}
        for name, proc in list(self.processes.items()):
            with contextlib.suppress(OSError, ValueError):
                for line in Path(f"/proc/{proc.pid}/smaps_rollup").read_text().splitlines():
                    if line.startswith("Pss:"):
                        out[name] = int(line.split()[1]) * 1024
                        break
        return out

    def fds(self) -> int:
        total = 0
        for proc in list(self.processes.values()):
            with contextlib.suppress(psutil.Error):
                total += proc.num_fds()
        return total


class MemorySampler:
    """Samples the stack's total RSS every 0.2 s (PSS every 1 s) on its own thread, so a busy event loop cannot skip
    samples."""

    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        self.samples: list[tuple[float, float]] = []
        self.samples_by_process: dict[str, list[tuple[float, float]]] = {}
        self.peak_total = 0
        self.peak_by_process: dict[str, int] = {}
        self.pss_peak_total = 0
        self.pss_peak_by_process: dict[str, int] = {}
        self.fds_peak = 0
        self.thread_cpu_s = 0.0
        """CPU this sampling thread has used so far: the benchmark's, not the stack's."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="rss-sampler", daemon=True)
        self.t0 = time.monotonic()

    def __enter__(self) -> MemorySampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _loop(self) -> None:
        tick = 0
        cpu_start = time.thread_time()
        while True:
            by_process = self.stack.rss_bytes()
            total = sum(by_process.values())
            self.samples.append((round(time.monotonic() - self.t0, 2), total / 2**20))
            self.peak_total = max(self.peak_total, total)
            for name, rss in by_process.items():
                self.peak_by_process[name] = max(self.peak_by_process.get(name, 0), rss)
                self.samples_by_process.setdefault(name, []).append(self.samples[-1][0:1] + (rss / 2**20,))
            if tick % 5 == 0:  # reading smaps walks page tables: once a second is enough
                self.fds_peak = max(self.fds_peak, self.stack.fds())
                pss = self.stack.pss_bytes()
                self.pss_peak_total = max(self.pss_peak_total, sum(pss.values()))
                for name, value in pss.items():
                    self.pss_peak_by_process[name] = max(self.pss_peak_by_process.get(name, 0), value)
            tick += 1
            self.thread_cpu_s = time.thread_time() - cpu_start
            if self._stop.wait(RSS_SAMPLE_EVERY_S):
                return


# --------------------------------------------------------------------------------------------------------------------
# Profiles and machine-wide numbers


@contextlib.contextmanager
def profiling(stack: Stack, directory: Path | None, label: str) -> Any:
    """Run ``py-spy record`` on every process of the stack while the block runs (nothing without a directory)."""
    if directory is None:
        yield
        return
    directory.mkdir(parents=True, exist_ok=True)
    spies = []
    for name, proc in stack.processes.items():
        spy = start_py_spy(proc.pid, directory / f"{label}-{name.replace('/', '_')}.txt")
        if spy is None:
            break
        spies.append(spy)
    try:
        yield
    finally:
        for spy in spies:
            spy.send_signal(signal.SIGINT)
        for spy in spies:
            try:
                spy.wait(timeout=30)
            except subprocess.TimeoutExpired:
                spy.kill()


def start_py_spy(pid: int, out: Path) -> subprocess.Popen[bytes] | None:
    """``py-spy record`` of one process into ``out`` (collapsed stacks, 200 Hz); it ends with the process or SIGINT."""
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    argv = [py_spy, "record", "--format", "raw", "--rate", "200", "-p", str(pid), "-o", str(out)]
    try:
        return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except OSError as e:
        print(f"py-spy not started ({e}); install it with pip", file=sys.stderr)
        return None


def rss_growth(samples: list[tuple[float, float]], start: float, wall: float) -> float:
    """MB the stack's RSS grew from the middle of a point to near its end (mean of the samples in 10% windows around
    50% and 90% of the wall time). Once every rollout slot has been used, a flat stack stays within a few MB."""

    def around(fraction: float) -> float | None:
        low, high = start + (fraction - 0.05) * wall, start + (fraction + 0.05) * wall
        window = [mb for t, mb in samples if low <= t <= high]
        return sum(window) / len(window) if window else None

    middle, late = around(0.5), around(0.9)
    return round(late - middle, 1) if middle is not None and late is not None else 0.0


def cpu_calibration_ms(iterations: int = 1_000_000, repeats: int = 3) -> float:
    """Best of three timings of a fixed pure-Python loop: how fast this box runs Python right now.

    On a shared virtual machine the same code runs up to ~25% slower at times (other tenants, frequency); a point
    measured while this number is high is slower for that reason, not because of the code under test.
    """
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        total = 0
        for i in range(iterations):
            total += i
        best = min(best, time.perf_counter() - started)
    return round(best * 1000, 1)


def machine_steal_s() -> float:
    """CPU time the hypervisor gave to other guests (0 where not reported)."""
    return float(getattr(psutil.cpu_times(), "steal", 0.0))


def machine_busy_s() -> float:
    """CPU seconds all processes spent in user and kernel mode (interrupt time left out: loopback packets count
    there, and the stack's processes are not charged for it either)."""
    times = psutil.cpu_times()
    return times.user + times.nice + times.system


def raise_open_file_limit() -> dict[str, int]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if soft < wanted:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return {"soft": soft, "hard": hard}


def machine_info(fd_limits: dict[str, int], repo: Path) -> dict[str, Any]:
    cpu_model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    versions: dict[str, str | None] = {}
    for name in LIBRARIES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return {
        "hostname": platform.node(),
        "platform": platform.platform(),
        "cpu_model": cpu_model,
        "cpus": os.cpu_count(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "python": platform.python_version(),
        "libraries": versions,
        "open_files": fd_limits,
        "git": git_info(repo),
    }


def git_info(repo: Path) -> dict[str, Any]:
    def git(*argv: str) -> str:
        try:
            return subprocess.run(["git", *argv], cwd=repo, capture_output=True, text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    return {"commit": git("rev-parse", "HEAD"), "dirty": bool(git("status", "--porcelain", "--untracked-files=no"))}
