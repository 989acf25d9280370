"""The open-file refusal's advice holds: under a hard ``ulimit -n`` of 1024 the ``--concurrency`` it suggests runs with
nothing charged.

The refusal is read from a real ``gym eval run``; the suggestion is then run exactly, with every rollout in flight at
once: verifies after the first are held (one line each in a file) until all of them are, so the agent holds every
rollout's ``/run``, its resources connection and the model connections of the burst before anything is released.
"""

from __future__ import annotations

import re
import resource
import time
from pathlib import Path

import pytest

from nemo_gym.rollouts.fd_limit import fds_needed, most_concurrency
from tests.rollouts.conftest import write_dataset
from tests.rollouts.test_collection import ENV, HANG_GUARD_S, finished_lines, read
from tests.rollouts.test_server_down import Run

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

HARD = 1024


def _open_files(limit: int):
    def lower() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))

    return lower


def _wait_for_all_held_or_a_failure(count: int, held: Path, failures: Path, run: Run) -> None:
    """Until ``count`` verifies are held, or a rollout failed (then the test fails on it, not on a hang guard)."""
    deadline = time.monotonic() + HANG_GUARD_S
    while finished_lines(held) < count and not failures.exists():
        assert run.process.poll() is None, run.log()
        assert time.monotonic() < deadline, f"fewer than {count} verifies held after {HANG_GUARD_S} s"
        time.sleep(0.05)


def test_the_agent_counts_three_sockets_per_rollout_capped_per_server_by_the_pool() -> None:
    assert fds_needed(100, serving=False) == fds_needed(0, serving=False) + 100
    assert fds_needed(100, serving=True) == fds_needed(0, serving=True) + 300
    # beyond the pool's 1024 connections per server only the served /run sockets grow
    assert fds_needed(2000, serving=True) == fds_needed(1024, serving=True) + 976


@pytest.mark.parametrize("serving", [True, False])
def test_the_suggestion_is_the_largest_concurrency_that_fits(serving: bool) -> None:
    most = most_concurrency(HARD, serving)
    assert fds_needed(most, serving) <= HARD < fds_needed(most + 1, serving)
    assert most_concurrency(1, serving) == 1


def test_under_a_hard_ulimit_of_1024_the_suggested_concurrency_runs_with_no_failure(workdir: Path) -> None:
    refused = Run(workdir, write_dataset(workdir / "big.jsonl", 8), "--concurrency", "1024", preexec=_open_files(HARD))
    assert refused.finish() == 1, refused.log()
    (error,) = [line for line in refused.lines if line.startswith("error: ")]
    found = re.search(r"lower --concurrency to (\d+) or less", error)
    assert found, error
    suggested = int(found.group(1))
    assert 1 < suggested < 1024

    rows = suggested + 1  # the first verify passes; the other `suggested` are all in flight together
    held, release = workdir / "held", workdir / "release"
    slow = "++policy_model.responses_api_models.scripted_model.reply_delay_s=1"  # the model calls overlap
    hold = (slow, f"{ENV}.hold_verifies_after=1", f"{ENV}.release_file={release}", f"{ENV}.held_file={held}")
    data = write_dataset(workdir / "data.jsonl", rows)
    run = Run(workdir, data, "--concurrency", str(suggested), *hold, preexec=_open_files(HARD))
    output = workdir / "out" / "rollouts.jsonl"
    failures = output.with_name("rollouts_failures.jsonl")
    _wait_for_all_held_or_a_failure(suggested, held, failures, run)
    release.touch()
    assert run.finish() == 0, run.log()
    assert not failures.exists(), failures.read_text()[:2000]
    assert len(read(output)) == rows, run.log()
    assert not any("_ng_attempt" in row for row in read(output)), "no rollout was charged an attempt"
