"""What one step of the ladder measured, read back from the files it wrote, and which limit the ladder met first.

The step's numbers come from its rollouts and failures files (each record stamped with when it was sent and how long
it took), not from counters kept on the side, so anyone can recount them from the files with the same definitions:

* rollouts/s: scored rollouts / (last end - first start) over every record of the step;
* p50/p95/p99: quantiles (linear between ranks) of the scored rollouts' durations;
* failure rate: failure records / all records.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nemo_gym.jsonl import iter_jsonl
from nemo_gym.rollouts.latency import quantile
from nemo_gym.row_fields import FAILURE_CLASS_KEY, ROLLOUT_SECONDS_KEY, ROLLOUT_STARTED_AT_KEY

FD_SHARE = 0.8
"""A server holding this share of its open-file limit has met that limit (the next burst of sockets fails)."""
MEMORY_SHARE = 0.9
"""The machine's memory counts as the limit when this share of it was in use at a step's peak."""
BUSY_CORES = 0.9
"""A server whose processes used this many CPU-seconds per second is bound by its event loop's one core."""
MACHINE_BUSY = 0.9
"""The machine's CPUs count as saturated when this share of all of them was busy over a step (every process's)."""
SCALING_GAIN = 1.15
"""Throughput counts as still rising when a step with more concurrency gets at least this factor more rollouts/s."""
LOOP_LAG_S = 0.1
"""A server's event loop counts as saturated when a lag probe waited this long for its turn."""


@dataclass
class StepCounts:
    """A step's rollouts by the definitions above."""

    completed: int = 0
    failed: int = 0
    failures_by_class: Counter = field(default_factory=Counter)
    window_s: float = 0.0
    latencies_s: list[float] = field(default_factory=list)
    """Ascending durations of the scored rollouts."""

    @property
    def rollouts_per_s(self) -> float:
        return self.completed / self.window_s if self.window_s > 0 else 0.0

    @property
    def failure_rate(self) -> float:
        total = self.completed + self.failed
        return self.failed / total if total else 0.0

    def latency_ms(self, q: float) -> float | None:
        value = quantile(self.latencies_s, q)
        return None if value is None else value * 1000


def count_step(rollouts: Path, failures: Path) -> StepCounts:
    """The counts of one step from its two files (either may be missing: nothing of that kind)."""
    counts = StepCounts()
    first, last = float("inf"), float("-inf")
    for path, scored in ((rollouts, True), (failures, False)):
        if not path.exists():
            continue
        for _, row in iter_jsonl(path):
            started, seconds = _stamp(row)
            first, last = min(first, started), max(last, started + seconds)
            if scored:
                counts.completed += 1
                counts.latencies_s.append(seconds)
            else:
                counts.failed += 1
                counts.failures_by_class[str(row.get(FAILURE_CLASS_KEY) or "unknown")] += 1
    counts.latencies_s.sort()
    counts.window_s = max(0.0, last - first) if last >= first else 0.0
    return counts


def _stamp(row: dict[str, Any]) -> tuple[float, float]:
    try:
        return float(row[ROLLOUT_STARTED_AT_KEY]), float(row[ROLLOUT_SECONDS_KEY])
    except (KeyError, TypeError, ValueError):
        raise ValueError(f"a load-test record without {ROLLOUT_STARTED_AT_KEY}/{ROLLOUT_SECONDS_KEY}") from None


def stated_limit(counts: StepCounts, max_failure_rate: float, max_p99_ms: float | None) -> str | None:
    """Why the ladder stops after this step (a limit the user stated), or None to go on."""
    if counts.completed + counts.failed == 0:
        return "no rollout finished in the step"
    if counts.failure_rate > max_failure_rate:
        classes = ", ".join(f"{name} {n}" for name, n in counts.failures_by_class.most_common())
        return f"failure rate {counts.failure_rate:.1%} > {max_failure_rate:.1%} ({classes})"
    p99 = counts.latency_ms(0.99)
    if max_p99_ms is not None and p99 is not None and p99 > max_p99_ms:
        return f"p99 {p99:.0f} ms > {max_p99_ms:g} ms"
    return None


@dataclass
class ServerUse:
    """One server's processes over a step (``probes.py``)."""

    name: str
    kind: str
    cpu_s: float = 0.0
    """CPU seconds of the server's process and its children (those still running and those it reaped)."""
    peak_rss_bytes: int = 0
    peak_fds: int = 0
    fd_limit: int | None = None
    loop_lag_s: list[float] = field(default_factory=list)
    """Lag probes answered during the step (ascending)."""
    lag_probes_unanswered: int = 0
    processes: int = 1
    """The most processes its tree had at once (a server with workers can use more than one core)."""

    def busy_cores(self, wall_s: float) -> float:
        return self.cpu_s / wall_s if wall_s > 0 else 0.0


@dataclass
class MachineUse:
    """The whole machine over a step: every process on it, not only ours."""

    cpus: int
    busy_share: float
    """Share of all CPUs busy (psutil's system-wide figure over the step)."""
    peak_memory_share: float
    ours_cores: float = 0.0
    """CPU-seconds per second of our processes (the servers and this collector) over the step."""


def step_limit(
    counts: StepCounts, previous: StepCounts | None, servers: list[ServerUse], machine: MachineUse, wall_s: float
) -> str | None:
    """The limit this step shows, as a sentence saying what was measured, or None when it shows none."""
    for server in servers:
        if server.fd_limit and server.peak_fds >= FD_SHARE * server.fd_limit:
            return f"file descriptors: {server.name} held {server.peak_fds} of its limit {server.fd_limit}"
    if machine.peak_memory_share >= MEMORY_SHARE:
        return f"memory: {machine.peak_memory_share:.0%} of the machine's memory in use at the step's peak"
    busiest = max(servers, key=lambda s: s.busy_cores(wall_s), default=None)
    if busiest is not None:
        used, own = busiest.busy_cores(wall_s), busiest.kind == "resources_servers"
        what = f"{busiest.name}, the environment's own tools and verify" if own else busiest.name
        cores = min(busiest.processes, machine.cpus)
        if used >= BUSY_CORES * cores:
            room = "its event loop's one core" if busiest.processes == 1 else f"{cores} cores for its processes"
            return f"CPU: {what}, used {used:.2f} CPU-s per s ({room})"
        if machine.busy_share >= MACHINE_BUSY:
            return (
                f"machine CPU: {machine.busy_share:.0%} of {machine.cpus} CPUs busy; our processes "
                f"{machine.ours_cores:.2f} cores of it (the most: {what}, {used:.2f}), the rest other processes"
            )
    lagging = [s for s in servers if s.loop_lag_s and s.loop_lag_s[-1] >= LOOP_LAG_S]
    if lagging:
        worst = max(lagging, key=lambda s: s.loop_lag_s[-1])
        return f"event loop: {worst.name} answered a lag probe {worst.loop_lag_s[-1] * 1000:.0f} ms late"
    if (
        previous is not None
        and previous.rollouts_per_s
        and counts.rollouts_per_s < SCALING_GAIN * previous.rollouts_per_s
    ):
        return (
            f"throughput stopped rising ({previous.rollouts_per_s:.1f} -> {counts.rollouts_per_s:.1f} rollouts/s) "
            "with no server at its CPU, file or memory limit"
        )
    return None
