"""What the servers of a load-test step used: CPU, memory and open files of each server's processes (psutil over
the launcher's pids and their children), and each server's event-loop lag (``GET /?loop_lag=1``).

Sampling is bounded: one sample of every server every :data:`SAMPLE_EVERY_S`, at most one lag probe in flight per
server, each with a short deadline (one that gets no answer is counted, not guessed), so the probe adds a few requests per second however large the step.
"""

from __future__ import annotations

import asyncio
import bisect
import os
import time
from dataclasses import dataclass

import psutil

from nemo_gym.loadtest.limits import MachineUse, ServerUse
from nemo_gym.transport import http_client
from nemo_gym.transport.http_client import TransportConfig, TransportError
from nemo_gym.transport.types import LOOP_LAG_HEADER

SAMPLE_EVERY_S = 0.5
LAG_PROBE_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class Watched:
    """A server the launcher started here: its config name, type, local pid and base URL."""

    name: str
    kind: str
    pid: int
    url: str


def _tree(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def _cpu_s(processes: list[psutil.Process]) -> float:
    """CPU seconds of the processes and of the children they have reaped."""
    total = 0.0
    for process in processes:
        try:
            t = process.cpu_times()
        except psutil.Error:
            continue
        total += t.user + t.system + t.children_user + t.children_system
    return total


def _rss_and_fds(processes: list[psutil.Process]) -> tuple[int, int]:
    rss = fds = 0
    for process in processes:
        try:
            rss += process.memory_info().rss
            fds += process.num_fds()
        except psutil.Error:
            continue
    return rss, fds


def _fd_limit(pid: int) -> int | None:
    try:
        soft, _ = psutil.Process(pid).rlimit(psutil.RLIMIT_NOFILE)
    except (psutil.Error, AttributeError):
        return None
    return int(soft) if soft > 0 else None


class StepProbe:
    """Samples the watched servers from :meth:`start` to :meth:`stop` (run inside the step's event loop)."""

    def __init__(self, watched: list[Watched]) -> None:
        self._watched = watched
        self.use = {w.name: ServerUse(w.name, w.kind, fd_limit=_fd_limit(w.pid)) for w in watched}
        self._cpu_before: dict[str, float] = {}
        self._own = psutil.Process(os.getpid())
        self._own_before = 0.0
        self._peak_memory_share = 0.0
        self._task: asyncio.Task[None] | None = None
        self._started = 0.0

    def start(self) -> None:
        self._started = time.monotonic()
        self._cpu_before = {w.name: _cpu_s(_tree(w.pid)) for w in self._watched}
        self._own_before = _cpu_s([self._own])
        psutil.cpu_percent(interval=None)  # the system-wide figure counts from here
        self._task = asyncio.create_task(self._sample_until_cancelled())

    async def stop(self) -> MachineUse:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        wall = time.monotonic() - self._started
        ours = 0.0
        for w in self._watched:
            used = max(0.0, _cpu_s(_tree(w.pid)) - self._cpu_before.get(w.name, 0.0))
            self.use[w.name].cpu_s = used
            ours += used
        ours += max(0.0, _cpu_s([self._own]) - self._own_before)
        self._sample_memory()
        return MachineUse(
            cpus=psutil.cpu_count() or 1,
            busy_share=psutil.cpu_percent(interval=None) / 100,
            peak_memory_share=self._peak_memory_share,
            ours_cores=ours / wall if wall > 0 else 0.0,
        )

    async def _sample_until_cancelled(self) -> None:
        while True:
            self._sample_memory()
            await asyncio.gather(*(self._probe_lag(w) for w in self._watched))
            await asyncio.sleep(SAMPLE_EVERY_S)

    def _sample_memory(self) -> None:
        self._peak_memory_share = max(self._peak_memory_share, psutil.virtual_memory().percent / 100)
        for w in self._watched:
            use = self.use[w.name]
            tree = _tree(w.pid)
            rss, fds = _rss_and_fds(tree)
            use.peak_rss_bytes, use.peak_fds = max(use.peak_rss_bytes, rss), max(use.peak_fds, fds)
            use.processes = max(use.processes, len(tree))

    async def _probe_lag(self, watched: Watched) -> None:
        config = TransportConfig(total_timeout_s=LAG_PROBE_TIMEOUT_S, max_attempts=1)
        try:
            response = await http_client.request(
                "GET", f"{watched.url}/?loop_lag=1", server_name=watched.name, url_path="/", config=config, retry=False
            )
            await response.read()
        except TransportError:  # no answer in time (perhaps queued behind the step's own calls): no reading
            self.use[watched.name].lag_probes_unanswered += 1
            return
        lag = response.headers.get(LOOP_LAG_HEADER)
        if lag is not None:
            bisect.insort(self.use[watched.name].loop_lag_s, float(lag))
