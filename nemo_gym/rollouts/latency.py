"""Per-rollout latency as a dispatcher sees it, for drivers that start rollouts against a time budget.

Throughput alone misleads: more concurrency raises rollouts per hour while each rollout gets slower, until rollouts
start missing their own deadline. Reporting the latency quantiles beside the rate shows that trade early, and the
upper quartile tells a driver how much budget a new rollout needs before it is worth starting.
"""

from __future__ import annotations

import bisect

__all__ = ["DispatchLatencyTracker", "quantile"]

_MIN_SAMPLES_FOR_MARGIN = 5
"""Finished rollouts needed before their upper quartile is trusted as the drain margin."""


class DispatchLatencyTracker:
    """Durations of finished rollouts (kept sorted: a quantile is read before every dispatch) and the count of rows
    left undispatched because the budget ran out."""

    _drained: int = 0

    def __init__(self) -> None:
        self._sorted: list[float] = []  # ascending, so a quantile is one index away

    def record(self, seconds: float) -> None:
        """One finished rollout's duration; a non-positive one carries no information and is ignored."""
        if seconds <= 0:
            return
        bisect.insort(self._sorted, seconds)

    def record_drained(self) -> None:
        """Count one rollout that was never dispatched."""
        self._drained += 1

    @property
    def drained(self) -> int:
        """How many rollouts ``record_drained`` has counted."""
        return self._drained

    def quantile(self, q: float) -> float | None:
        """The ``q`` quantile (linear interpolation between ranks); None before any rollout finished."""
        return quantile(self._sorted, q)

    def drain_margin(self, configured: float | None) -> float | None:
        """Seconds a rollout needs left in the budget to be started: ``configured`` when given, else this run's own
        upper quartile once enough rollouts finished, else None (no margin yet)."""
        if configured is None and len(self._sorted) >= _MIN_SAMPLES_FOR_MARGIN:
            return self.quantile(0.75)
        return configured

    def summary(self) -> str:
        """A few lines for the run's log: median, p90, p99 and max in minutes, total task-hours, rows drained."""
        if self._sorted:

            def minutes(q: float) -> float:
                return (self.quantile(q) or 0.0) / 60

            lines = [
                f"Per-task latency over {len(self._sorted)} completed rollout(s): median {minutes(0.5):.1f} min, "
                f"p90 {minutes(0.9):.1f} min, p99 {minutes(0.99):.1f} min, max {self._sorted[-1] / 60:.1f} min",
                f"Task-time delivered: {sum(self._sorted) / 3600:.1f} task-hours",
            ]
        else:
            lines = ["No completed rollouts to report latency for."]
        if self._drained:
            lines.append(
                f"Drained (not dispatched, no time left in the budget): {self._drained}. "
                "They wrote no row and run again on resume."
            )
        return "\n".join(lines)


def quantile(values: list[float], q: float) -> float | None:
    """The ``q`` quantile of ascending ``values`` (linear interpolation between ranks); None when there are none."""
    if not values:
        return None
    position = (len(values) - 1) * q
    below = int(position)
    above = min(below + 1, len(values) - 1)
    fraction = position - below
    return values[below] + (values[above] - values[below]) * fraction
