"""The load test's report: a table per step and per server, the JSON file, and the capacity curve (PNG)."""

from __future__ import annotations

import platform
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from nemo_gym.jsonl import write_json_atomic
from nemo_gym.loadtest.ladder import LadderResult, Step

MB = 1024 * 1024


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def _cpu_ms_per_rollout(cpu_s: float, step: Step) -> float | None:
    done = step.counts.completed + step.counts.failed
    return cpu_s * 1000 / done if done else None


def print_report(result: LadderResult, console: Console) -> None:
    steps = Table(title="Load test: one row per concurrency")
    for column in ("concurrency", "rollouts/s", "p50 ms", "p95 ms", "p99 ms", "scored", "failed (by class)", "limit"):
        steps.add_column(column, justify="left" if column in ("failed (by class)", "limit") else "right")
    for step in result.steps:
        c = step.counts
        failed = ", ".join(f"{name} {n}" for name, n in c.failures_by_class.most_common()) or "0"
        note = (step.limit or "") + (" (all rows ran before the duration ended)" if step.exhausted else "")
        steps.add_row(
            str(step.concurrency), f"{c.rollouts_per_s:.1f}", _ms(c.latency_ms(0.5)), _ms(c.latency_ms(0.95)),
            _ms(c.latency_ms(0.99)), str(c.completed), failed, note,
        )  # fmt: skip
    console.print(steps)
    servers = Table(title="Servers per step (psutil over each server's processes; lag from GET /?loop_lag=1)")
    for column in ("concurrency", "server", "CPU ms/rollout", "CPU-s per s", "peak MB", "peak fds", "loop lag p99 ms"):
        servers.add_column(column, justify="left" if column == "server" else "right")
    for step in result.steps:
        for use in step.servers:
            lag = _lag_p99_ms(use.loop_lag_s)
            servers.add_row(
                str(step.concurrency), use.name, _ms(_cpu_ms_per_rollout(use.cpu_s, step)),
                f"{use.busy_cores(step.wall_s):.2f}", f"{use.peak_rss_bytes / MB:.0f}",
                f"{use.peak_fds}" + (f" / {use.fd_limit}" if use.fd_limit else ""), _ms(lag),
            )  # fmt: skip
    console.print(servers)
    if result.steps:
        m = result.steps[-1].machine
        console.print(
            f"Machine at the last step: {m.busy_share:.0%} of {m.cpus} CPUs busy (every process on it), our "
            f"processes {m.ours_cores:.2f} cores; peak memory in use {m.peak_memory_share:.0%}.",
            markup=False,
        )
    if result.stopped_by:
        console.print(f"Stopped: {result.stopped_by}", markup=False)
    console.print(f"First limit: {result.first_limit}", markup=False)


def _lag_p99_ms(lags: list[float]) -> float | None:
    from nemo_gym.rollouts.latency import quantile

    value = quantile(lags, 0.99)
    return None if value is None else value * 1000


def report_json(result: LadderResult, environment: str, settings: dict[str, Any]) -> dict[str, Any]:
    steps = []
    for step in result.steps:
        c = step.counts
        steps.append(
            {
                "concurrency": step.concurrency,
                "rollouts_per_s": c.rollouts_per_s,
                "window_s": c.window_s,
                "wall_s": step.wall_s,
                "latency_ms": {"p50": c.latency_ms(0.5), "p95": c.latency_ms(0.95), "p99": c.latency_ms(0.99)},
                "scored": c.completed,
                "failed": c.failed,
                "failure_rate": c.failure_rate,
                "failures_by_class": dict(c.failures_by_class),
                "exhausted_rows": step.exhausted,
                "limit": step.limit,
                "rollouts_file": str(step.rollouts_path),
                "servers": [
                    {
                        "name": use.name,
                        "type": use.kind,
                        "cpu_s": use.cpu_s,
                        "cpu_ms_per_rollout": _cpu_ms_per_rollout(use.cpu_s, step),
                        "cpu_s_per_s": use.busy_cores(step.wall_s),
                        "peak_rss_mb": use.peak_rss_bytes / MB,
                        "peak_fds": use.peak_fds,
                        "fd_limit": use.fd_limit,
                        "loop_lag_p99_ms": _lag_p99_ms(use.loop_lag_s),
                        "loop_lag_max_ms": use.loop_lag_s[-1] * 1000 if use.loop_lag_s else None,
                        "lag_probes": len(use.loop_lag_s),
                        "lag_probes_unanswered": use.lag_probes_unanswered,
                    }
                    for use in step.servers
                ],
                "machine": {
                    "cpus": step.machine.cpus,
                    "busy_share": step.machine.busy_share,
                    "ours_cores": step.machine.ours_cores,
                    "peak_memory_share": step.machine.peak_memory_share,
                },
            }
        )
    return {
        "environment": environment,
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"platform": platform.platform(), "python": platform.python_version()},
        "settings": settings,
        "rows": result.inputs.num_rows,
        "steps": steps,
        "stopped_by": result.stopped_by,
        "first_limit": result.first_limit,
    }


def write_report(report: dict[str, Any], output: Path) -> Path | None:
    """Write the JSON report and, when matplotlib is installed, the curve beside it (``<stem>.png``)."""
    write_json_atomic(output, report)
    return plot_curve(report, output.with_suffix(".png"))


def plot_curve(report: dict[str, Any], path: Path) -> Path | None:
    """Rollouts/s and p99 against concurrency; None when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    steps = report["steps"]
    x = [s["concurrency"] for s in steps]
    figure, rate_axis = plt.subplots(figsize=(6.4, 4.0), dpi=100)
    rate_axis.plot(x, [s["rollouts_per_s"] for s in steps], "o-", color="tab:blue", label="rollouts/s")
    rate_axis.set_xscale("log", base=2)
    rate_axis.set_xticks(x, [str(c) for c in x])
    rate_axis.set_ylim(bottom=0)
    rate_axis.set_xlabel("concurrency (rollouts in flight)")
    rate_axis.set_ylabel("rollouts/s", color="tab:blue")
    latency_axis = rate_axis.twinx()
    latency_axis.plot(x, [s["latency_ms"]["p99"] or 0 for s in steps], "s--", color="tab:red", label="p99 ms")
    latency_axis.set_ylabel("p99 rollout latency (ms)", color="tab:red")
    latency_axis.set_ylim(bottom=0)
    rate_axis.set_title(f"{report['environment']}: capacity")
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)
    return path
