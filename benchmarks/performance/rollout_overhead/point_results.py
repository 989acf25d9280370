"""The numbers of a run: one ``PointResult`` per concurrency and round, their medians per concurrency, the table.

Kept apart from ``run.py`` so the driver reads on its own; ``--client collect`` adds the columns of the whole
collect command (end to end, steady state, start -> first model request, CPU by process with the collector).
"""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import dataclass, field


@dataclass
class PointResult:
    """Everything measured at one concurrency."""

    concurrency: int
    requested: int
    round: int = 1
    stack: str = ""
    """The HTTP server the servers ran on (``--stack``); empty: as they are."""
    completed: int = 0
    ok: int = 0
    wall_s: float = 0.0
    rollouts_per_s: float = 0.0
    cpu_ms_per_rollout: float = 0.0
    cpu_s_by_process: dict[str, float] = field(default_factory=dict)
    cpu_system_s: float = 0.0
    """Kernel part of the stack's CPU (loopback TCP, epoll): what no Python change can remove."""
    background_cpu_s: float = 0.0
    """CPU used by processes outside the stack during the point: other load on the box skews every number."""
    steal_s: float = 0.0
    """CPU time the hypervisor took for other guests during the point."""
    calibration_ms: float = 0.0
    """A fixed Python loop timed just before the point (see ``cpu_calibration_ms``): higher means a slower box."""
    rss_start_mb: float = 0.0
    rss_peak_mb: float = 0.0
    rss_end_mb: float = 0.0
    rss_peak_by_process_mb: dict[str, float] = field(default_factory=dict)
    pss_peak_mb: float = 0.0
    """Peak of the summed proportional set sizes: shared library pages counted once, not once per process."""
    pss_peak_by_process_mb: dict[str, float] = field(default_factory=dict)
    fds_peak: int = 0
    latency_ms: dict[str, float] = field(default_factory=dict)
    failures: dict[str, int] = field(default_factory=dict)
    aborted: str = ""
    rss_growth_mb: float = 0.0
    """RSS at 90% of the point minus RSS at 50%: about 0 means memory is flat under a steady load."""
    rss_growth_by_process_mb: dict[str, float] = field(default_factory=dict)
    rss_timeline_mb: list[tuple[float, float]] = field(default_factory=list)
    # --client collect only (rollouts_per_s is then the whole command's rate, start to exit):
    steady_rollouts_per_s: float = 0.0
    """Rollouts / (last model request - first model request)."""
    first_model_request_s: float = 0.0
    """Collect command start -> first model request: its start-up tax."""
    startup_cpu_s: float = 0.0
    """CPU the collect command (row checker included) had used by its first model request: on N cores the start-up
    cannot take less than this / N."""
    startup_floor_s: float = 0.0
    """``startup_floor.py``'s floor for the same rows, timed right after the point: what start-up cannot skip."""
    collector_reported_per_s: float = 0.0
    """The rate ``gym eval run`` prints (its own clock, after start-up)."""
    collector_rss_peak_mb: float = 0.0
    """The collector's exact peak RSS (``ru_maxrss``)."""

    @property
    def failed(self) -> int:
        return sum(self.failures.values())


# --------------------------------------------------------------------------------------------------------------------
# Medians over rounds and the table


@dataclass
class Summary:
    """One concurrency over every round: medians of rates and latencies, the worst memory, all failures."""

    concurrency: int
    rounds: int
    ok: int
    failed: int
    rollouts_per_s: float
    rollouts_per_s_by_round: list[float]
    cpu_ms_per_rollout: float
    cpu_ms_by_round: list[float]
    rss_peak_mb: float
    pss_peak_mb: float
    rss_growth_mb: float
    p50_ms: float
    p99_ms: float
    calibration_ms: float
    notes: str
    cpu_ms_by_process: dict[str, float] = field(default_factory=dict)
    steady_rollouts_per_s: float = 0.0
    first_model_request_s: float = 0.0
    startup_cpu_s: float = 0.0
    startup_floor_s: float = 0.0
    startup_over_floor: float = 0.0
    """Median over points of ->1st model / its floor (each point beside its own floor)."""
    collector_reported_per_s: float = 0.0
    collector_rss_peak_mb: float = 0.0
    stack: str = ""


def summarize(results: list[PointResult]) -> list[Summary]:
    summaries = []
    for stack, concurrency in dict.fromkeys((r.stack, r.concurrency) for r in results):
        points = [r for r in results if r.concurrency == concurrency and r.stack == stack]
        failures: Counter[str] = Counter()
        for r in points:
            failures.update(r.failures)
        notes = [", ".join(f"{k}={v}" for k, v in sorted(failures.items()))]
        notes += [f"round {r.round}: {r.aborted}" for r in points if r.aborted]
        busy = [r for r in points if r.background_cpu_s > 0.05 * r.wall_s]
        if busy:
            worst = max(r.background_cpu_s / r.wall_s for r in busy)
            notes.append(f"busy box in {len(busy)} round(s): up to {worst:.0%} of a core used by other processes")
        summaries.append(
            Summary(
                stack=stack,
                concurrency=concurrency,
                rounds=len(points),
                ok=sum(r.ok for r in points),
                failed=sum(r.failed for r in points),
                rollouts_per_s=round(statistics.median(r.rollouts_per_s for r in points), 1),
                rollouts_per_s_by_round=[r.rollouts_per_s for r in points],
                cpu_ms_per_rollout=round(statistics.median(r.cpu_ms_per_rollout for r in points), 2),
                cpu_ms_by_round=[r.cpu_ms_per_rollout for r in points],
                # Memory of the first round: later ones start from the high-water mark of the largest point before.
                rss_peak_mb=points[0].rss_peak_mb,
                pss_peak_mb=points[0].pss_peak_mb,
                rss_growth_mb=max(r.rss_growth_mb for r in points),
                p50_ms=round(statistics.median(r.latency_ms["p50"] for r in points), 1),
                p99_ms=round(statistics.median(r.latency_ms["p99"] for r in points), 1),
                calibration_ms=round(statistics.median(r.calibration_ms for r in points), 1),
                notes="; ".join(n for n in notes if n),
                cpu_ms_by_process={
                    name: round(
                        statistics.median(1000 * r.cpu_s_by_process.get(name, 0.0) / max(r.ok, 1) for r in points), 2
                    )
                    for name in points[0].cpu_s_by_process
                },
                steady_rollouts_per_s=round(statistics.median(r.steady_rollouts_per_s for r in points), 1),
                first_model_request_s=round(statistics.median(r.first_model_request_s for r in points), 3),
                startup_cpu_s=round(statistics.median(r.startup_cpu_s for r in points), 2),
                startup_floor_s=round(statistics.median(r.startup_floor_s for r in points), 3),
                startup_over_floor=round(
                    statistics.median(r.first_model_request_s / (r.startup_floor_s or float("nan")) for r in points), 2
                ),
                collector_reported_per_s=round(statistics.median(r.collector_reported_per_s for r in points), 1),
                collector_rss_peak_mb=max(r.collector_rss_peak_mb for r in points),
            )
        )
    return summaries


def stack_column(summaries: list[Summary], summary: Summary | None = None) -> str:
    """The ``stack`` column's cell (its header without ``summary``) when the run named stacks, else nothing."""
    if not any(s.stack for s in summaries):
        return ""
    return f"{summary.stack if summary else 'stack':>8} "


def print_table(summaries: list[Summary]) -> None:
    header = stack_column(summaries) + (
        f"{'conc':>6} {'rounds':>6} {'ok':>7} {'fail':>5} {'rollouts/s':>10} {'CPU ms/r':>9} {'RSS peak MB':>11} "
        f"{'PSS peak MB':>11} {'RSS growth':>10} {'p50 ms':>9} {'p99 ms':>9} {'calib ms':>8}  notes"
    )
    print("medians over rounds (rates, CPU, latency, calib); peak memory of the first round; largest growth")
    print(header)
    print("-" * len(header))
    for s in summaries:
        print(
            f"{stack_column(summaries, s)}{s.concurrency:>6} {s.rounds:>6} {s.ok:>7} {s.failed:>5} "
            f"{s.rollouts_per_s:>10.1f} "
            f"{s.cpu_ms_per_rollout:>9.2f} {s.rss_peak_mb:>11.0f} {s.pss_peak_mb:>11.0f} {s.rss_growth_mb:>10.1f} "
            f"{s.p50_ms:>9.1f} {s.p99_ms:>9.1f} {s.calibration_ms:>8.1f}  {s.notes}"
        )


def print_collect_table(summaries: list[Summary], roles: dict[str, str]) -> None:
    """The whole collect command per concurrency (``--client collect``): what issue 17 measures; ``roles`` gives the
    servers' CPU columns short names (agent, model, resources)."""
    names = [n for n in summaries[0].cpu_ms_by_process if n != "launcher"] if summaries else []
    header = stack_column(summaries) + (
        f"{'conc':>6} {'rounds':>6} {'ok':>7} {'fail':>5} {'end-to-end/s':>12} {'steady/s':>9} {'->1st model s':>13} "
        f"{'floor s':>7} {'x floor':>7} {'its CPU s':>9} {'CPU ms/r':>9} "
        + " ".join(f"{roles.get(n, n)[:10]:>10}" for n in names)
        + f" {'RSS peak MB':>11} {'collector MB':>12} "
        f"{'calib ms':>8}  notes"
    )
    print("whole `gym eval run --no-serve` per point: medians over rounds; CPU ms per rollout by process (launcher")
    print("left out of the columns, in the total); RSS peak of the whole stack with the collector, first round;")
    print("'floor s': startup_floor.py's floor for the same rows, timed after each point (median); 'x floor': the")
    print("median of each point's ->1st model s over its floor; 'its CPU s': the collect command's CPU by then")
    print(header)
    print("-" * len(header))
    for s in summaries:
        by_process = " ".join(f"{s.cpu_ms_by_process.get(n, 0.0):>10.2f}" for n in names)
        print(
            f"{stack_column(summaries, s)}{s.concurrency:>6} {s.rounds:>6} {s.ok:>7} {s.failed:>5} "
            f"{s.rollouts_per_s:>12.1f} "
            f"{s.steady_rollouts_per_s:>9.1f} {s.first_model_request_s:>13.3f} "
            f"{s.startup_floor_s:>7.3f} {s.startup_over_floor:>7.2f} "
            f"{s.startup_cpu_s:>9.2f} "
            f"{s.cpu_ms_per_rollout:>9.2f} "
            f"{by_process} {s.rss_peak_mb:>11.0f} {s.collector_rss_peak_mb:>12.0f} {s.calibration_ms:>8.1f}  {s.notes}"
        )
