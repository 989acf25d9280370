"""The open-file limit (``ulimit -n``) against the concurrency, checked before a run starts.

The limit is per process, and the servers a run starts inherit the collector's. The busiest process is the agent:
each rollout in flight holds three sockets there (the ``/run`` it serves, its connection to the model server and its
connection to the resources server, both kept open between the steps of a rollout), against one in the collector
(its ``/run``) and one in each other server. Below the need, rollouts fail with "Too many open files" one after
another, every one charged an attempt. So a run lifts its soft limit when the hard limit allows and otherwise refuses
at start with the largest ``--concurrency`` the hard limit holds, counted the same way.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from nemo_gym.errors import UserError
from nemo_gym.transport.types import get_default_config

RESERVE_FDS = 128
"""Descriptors besides the rollouts' sockets: the interpreter and its libraries, output, failures and input files, the
output's lock, the head server, each server's log pipes and listening socket, the breakers' probes. An idle server
holds about 15 and the collector about 35: the rest is headroom for connections being replaced."""

AGENT_SOCKETS_PER_ROLLOUT = 3
"""Sockets one rollout in flight holds in its agent: the ``/run`` it serves, one to the model server and one to the
resources server (measured: 3 per rollout at the peak, ``tests/rollouts/test_open_file_limit.py``)."""

COLLECTOR_SOCKETS_PER_ROLLOUT = 1
"""Sockets one rollout in flight holds in the collector: its ``/run``."""


class OpenFileLimitError(UserError):
    """The hard open-file limit is below what ``--concurrency`` needs."""


def fds_needed(concurrency: int, serving: bool) -> int:
    """Descriptors the busiest process of the run needs at ``concurrency``: the collector (``serving=False``) or the
    agent a run starts (``serving=True``). The ``/run`` connections an agent serves are ``concurrency``; its
    connections to one server never exceed the pool's per-host size (``limit_per_host``): beyond it rollouts wait for
    a connection without a socket."""
    if not serving:
        return COLLECTOR_SOCKETS_PER_ROLLOUT * concurrency + RESERVE_FDS
    outbound = min(concurrency, get_default_config().limit_per_host)
    return concurrency + (AGENT_SOCKETS_PER_ROLLOUT - 1) * outbound + RESERVE_FDS


def most_concurrency(limit: int, serving: bool) -> int:
    """The largest ``--concurrency`` whose :func:`fds_needed` fits ``limit`` open files (at least 1)."""
    low, high = 1, max(1, limit)
    while low < high:  # fds_needed grows with concurrency: the last one that fits
        middle = (low + high + 1) // 2
        if fds_needed(middle, serving) <= limit:
            low = middle
        else:
            high = middle - 1
    return low


def check_open_file_limit(concurrency: int, serving: bool, say: Callable[[str], None] | None = None) -> None:
    """Raise this process's soft ``RLIMIT_NOFILE`` to what ``concurrency`` needs (children started later inherit it),
    saying so in one line; :class:`OpenFileLimitError` when the hard limit is lower. No-op where there are no
    rlimits."""
    try:
        import resource
    except ImportError:  # not a POSIX system
        return
    needed = fds_needed(concurrency, serving)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return
    if hard != resource.RLIM_INFINITY and hard < needed:
        most = most_concurrency(hard, serving)
        raise OpenFileLimitError(
            f"--concurrency {concurrency} needs about {needed} open files but the limit (ulimit -n) is {soft} and "
            f"cannot go above {hard} (ulimit -Hn): lower --concurrency to {most} or less, or raise the hard limit "
            f"(ulimit -n {needed} as root, LimitNOFILE= for a service, nofile in /etc/security/limits.conf)"
        )
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))
    except (ValueError, OSError) as e:
        raise OpenFileLimitError(
            f"--concurrency {concurrency} needs about {needed} open files, the limit (ulimit -n) is {soft} and raising "
            f"it failed ({e}): lower --concurrency or run `ulimit -n {needed}` first"
        ) from e
    (say or _to_stderr)(
        f"raised the open-file limit (ulimit -n) from {soft} to {needed} for --concurrency {concurrency}"
    )


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
