"""One point of ``--client collect``: the whole ``gym eval run --no-serve`` command, timed as a user runs it.

The benchmark's stack is already up; each point starts the collect command as a subprocess (the venv's ``gym``
console script, so interpreter start-up, imports and config composition are all in the time) with N input rows, and
times it from ``Popen`` to its exit. Around it:

* **Model requests, first and last.** A thread polls ``/proc/<model server pid>/io`` every 2 ms: ``rchar`` (bytes the
  process has read, sockets included) moves only when a request reaches the model server, so its first change after
  the collect command starts is the first model request and its last change the last one (±2 ms). The launcher's
  supervisor asks every server ``GET /`` once a second (123 bytes read); a change smaller than ``MIN_REQUEST_BYTES``
  is such a probe, not a model request (the smallest model request of this workload is ~830 bytes). Chosen over the
  alternatives because it changes nothing that is measured: uvicorn's access log (``+uvicorn_access_log=true``) is one
  switch for every server, so it would add a log line to each of the 6 requests of a rollout in all three servers and
  its lines carry no time stamp; a time-stamping proxy in front of the model adds a whole HTTP hop (two per rollout) to
  a 2-core box whose CPU is the thing measured; the scripted model's ``created_at`` has one-second resolution.
* **CPU per process**, collector included: psutil deltas for the servers and the launcher (this process, less the
  probe threads' own CPU), and for the collector the kernel's exact account at exit (``os.wait4``'s rusage, which
  includes any child it waited for; psutil cannot read a process once it has exited).
* **CPU before the first model request**: when the clock thread sees the first model request it reads the collect
  command's CPU so far from ``/proc`` (the command, its row checker whether still running or already reaped, and any
  other child): the work that has to fit into the start-up time. On 2 cores a start-up that used C seconds of CPU
  cannot take less than C / 2 seconds of wall-clock time, whatever runs beside what.
* **Memory**: the collector (and its children) join the stack's RSS/PSS sampler while it runs; its own exact peak is
  ``ru_maxrss`` from the same rusage.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import psutil
from stack_probe import start_py_spy

MODEL_CLOCK_POLL_S = 0.002
MIN_REQUEST_BYTES = 512
"""Fewer bytes read between two polls is a supervisor probe (``GET /``: 123 bytes), not a model request (≥ ~830)."""
COLLECTOR = "collector"
CLOCK_TICKS_PER_S = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def process_tree_cpu_s(pid: int) -> float:
    """CPU seconds of ``pid`` so far (user + system), its reaped children's and its live descendants', from ``/proc``
    (one read per process, cheap enough for the clock thread; 0.0 where it cannot be read)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rpartition(b")")[2].split()
        ticks = sum(int(x) for x in fields[11:15])  # utime, stime, cutime, cstime
        with open(f"/proc/{pid}/task/{pid}/children", "rb") as f:
            children = [int(c) for c in f.read().split()]
    except (OSError, ValueError):
        return 0.0
    return ticks / CLOCK_TICKS_PER_S + sum(process_tree_cpu_s(child) for child in children)


class ModelRequestClock:
    """When the model server first and last read bytes from a socket, from ``/proc/<pid>/io`` on a thread."""

    def __init__(self, pid: int) -> None:
        self._path = f"/proc/{pid}/io"
        self.first: float | None = None
        self.last: float | None = None
        self.thread_cpu_s = 0.0
        """CPU this thread used: taken off the launcher's account, it is the probe's, not the stack's."""
        self.command_pid = 0
        """The collect command, once started: its CPU is read when the first model request comes."""
        self.command_cpu_at_first_s: float | None = None
        self._window_open = self._window_closed = float("inf")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="model-clock", daemon=True)

    def _rchar(self) -> int:
        with open(self._path, "rb") as f:
            return int(f.readline().split()[1])  # first line: "rchar: N"

    def __enter__(self) -> ModelRequestClock:
        self._baseline = self._rchar()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def open_window(self) -> float:
        """Reads count from now on (the collect command starts): anything earlier is the previous point's."""
        self._window_open = time.perf_counter()
        return self._window_open

    def close_window(self) -> float:
        """Reads no longer count (the collect command has exited)."""
        self._window_closed = time.perf_counter()
        return self._window_closed

    def _loop(self) -> None:
        cpu_start = time.thread_time()
        seen = self._baseline
        while not self._stop.wait(MODEL_CLOCK_POLL_S):
            with contextlib.suppress(OSError, ValueError):
                now_bytes = self._rchar()
                read, seen = now_bytes - seen, now_bytes
                if read >= MIN_REQUEST_BYTES:
                    now = time.perf_counter()
                    if not self._window_open <= now <= self._window_closed:
                        continue
                    if self.first is None:
                        self.first = now
                        if self.command_pid:
                            self.command_cpu_at_first_s = process_tree_cpu_s(self.command_pid)
                    self.last = now
        self.thread_cpu_s = time.thread_time() - cpu_start


@dataclass
class CollectRun:
    """What one collect command did, as seen from outside it."""

    wall_s: float
    exit_code: int
    ok: int
    failed: int
    first_model_s: float | None
    """Collect command start -> first model request."""
    cpu_before_first_model_s: float | None
    """The collect command's CPU (its row checker's included) when the first model request came."""
    steady_s: float | None
    """First model request -> last model request."""
    cpu_s: float
    cpu_system_s: float
    peak_rss_mb: float
    reported_per_s: float | None
    """The rate the command prints itself (its own clock starts after its start-up)."""
    output_tail: str
    probe_cpu_s: float
    """CPU of the model-clock thread (in the launcher process): not the stack's."""


def first_run_env() -> dict[str, str]:
    """The environment of a user's first collect command: Python writes the bytecode of what it imports.

    Installers such as uv leave site-packages without ``.pyc`` files unless asked to compile them, and a shell with
    ``PYTHONDONTWRITEBYTECODE`` set never writes any: every start would then compile aiohttp, yarl, uvloop, tqdm and
    the framework from source (most of a second here), which no user sees after the first run. The warm-up runs with
    this, so the measured commands (and the floor's fresh interpreters) start as a user's every later run does."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    return env | {"NEMO_GYM_ENV_YAML": ""}  # a user's env.yaml in the checkout must not change the run


def write_rows(rows: list[dict[str, Any]], total: int, path: Path) -> Path:
    """``total`` input rows cycling over the environment's examples: rows = N, one rollout each."""
    with path.open("wb") as f:
        for i in range(total):
            f.write(orjson.dumps(rows[i % len(rows)]) + b"\n")
    return path


def collect_command(
    agent: str, input_path: Path, output_path: Path, concurrency: int, head: tuple[str, int], workdir: Path
) -> list[str]:
    """The command line a user types against servers started with ``gym env start`` (here: by the benchmark)."""
    gym = Path(sys.executable).parent / "gym"
    host, port = head
    return [
        str(gym), "eval", "run", "--no-serve", "--agent", agent, "--input", str(input_path),
        "--output", str(output_path), "--concurrency", str(concurrency), "--overwrite",
        f"+head_server={{host: {host}, port: {port}}}",
        f"+results_dir={workdir / 'results'}", f"+cache_dir={workdir / 'cache'}",
    ]  # fmt: skip


def count_scored(path: Path) -> tuple[int, int]:
    """(rows with reward 1.0, other rows) in the collector's output."""
    ok = failed = 0
    with contextlib.suppress(OSError), path.open("rb") as f:
        for line in f:
            if line.strip():
                if orjson.loads(line).get("reward") == 1.0:
                    ok += 1
                else:
                    failed += 1
    return ok, failed


_RATE = re.compile(r"rollouts scored, .* in [0-9.]+s \(([0-9.]+)/s\)")


async def run_collect(
    command: list[str],
    model_pid: int,
    stack_processes: dict[str, psutil.Process],
    output_path: Path,
    spy_path: Path | None = None,
) -> CollectRun:
    """Start the collect command, add it to ``stack_processes`` while it runs, wait for it with its rusage;
    with ``spy_path``, py-spy records it from its first milliseconds to its exit."""
    log_path = output_path.with_suffix(".log")
    env = os.environ | {"NEMO_GYM_ENV_YAML": ""}  # a user's env.yaml in the checkout must not change the run
    with ModelRequestClock(model_pid) as clock, log_path.open("wb") as log:
        started = clock.open_window()
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
        clock.command_pid = proc.pid
        with contextlib.suppress(psutil.Error):
            stack_processes[COLLECTOR] = psutil.Process(proc.pid)
        children_task = asyncio.create_task(_watch_children(proc.pid, stack_processes))
        spy = start_py_spy(proc.pid, spy_path) if spy_path else None
        _, status, usage = await asyncio.to_thread(os.wait4, proc.pid, 0)
        ended = clock.close_window()
        proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here, so Popen must not wait again
        children_task.cancel()
        for name in [n for n in stack_processes if n.startswith(COLLECTOR)]:
            del stack_processes[name]
    if spy is not None:  # it stops by itself when the collector exits
        with contextlib.suppress(subprocess.TimeoutExpired):
            await asyncio.to_thread(spy.wait, 30)
    ok, failed = count_scored(output_path)
    text = log_path.read_text(errors="replace")
    match = _RATE.search(text)
    first = clock.first - started if clock.first is not None else None
    steady = clock.last - clock.first if clock.first is not None and clock.last is not None else None
    return CollectRun(
        wall_s=ended - started,
        exit_code=proc.returncode,
        ok=ok,
        failed=failed,
        first_model_s=first,
        cpu_before_first_model_s=clock.command_cpu_at_first_s,
        steady_s=steady,
        cpu_s=usage.ru_utime + usage.ru_stime,
        cpu_system_s=usage.ru_stime,
        peak_rss_mb=usage.ru_maxrss / 1024,  # KiB on Linux
        reported_per_s=float(match.group(1)) if match else None,
        output_tail=text[-2000:],
        probe_cpu_s=clock.thread_cpu_s,
    )


async def _watch_children(pid: int, stack_processes: dict[str, psutil.Process]) -> None:
    """Children the collector starts (none today) join the memory sampler as ``collector/childN``."""
    with contextlib.suppress(psutil.Error):
        root = psutil.Process(pid)
        while True:
            for i, child in enumerate(root.children(recursive=True)):
                stack_processes.setdefault(f"{COLLECTOR}/child{i}", child)
            await asyncio.sleep(0.5)
