"""The CPU-heavy verifier of the offload test, importable by name on every Ray node and pool worker."""

from __future__ import annotations

import time


def burn_cpu(seconds: float) -> float:
    """Spin for ``seconds`` of this process's CPU time (not wall time: a loaded machine only makes it slower)."""
    start = time.process_time()
    spins = 0
    while time.process_time() - start < seconds:
        spins += 1
    return 1.0
