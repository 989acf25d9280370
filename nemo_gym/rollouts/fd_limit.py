"""The open-file limit (``ulimit -n``) against the concurrency, checked before a run starts.

Each rollout in flight holds a socket in the collector (its ``/run``) and two in its agent (the ``/run`` it serves
and the call it makes), and the servers of a run inherit the collector's limits. Below the need, rollouts fail with
"Too many open files" one after another, every one charged an attempt. So a run lifts its soft limit when the hard
limit allows and otherwise refuses at start, saying what to change.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from nemo_gym.errors import UserError
from nemo_gym.transport.types import get_default_config

RESERVE_FDS = 128
"""Descriptors besides the rollouts' sockets: the interpreter and its libraries, output, failures and input files, the
output's lock, the head server, each server's log pipes and listening socket, the breakers' probes."""


class OpenFileLimitError(UserError):
    """The hard open-file limit is below what ``--concurrency`` needs."""


def fds_needed(concurrency: int, serving: bool) -> int:
    """Descriptors one process of the run needs at ``concurrency``: the collector (``serving=False``) or the agent a
    run starts (``serving=True``: 2 per rollout). Connections to one server never exceed the pool's per-host size
    (``limit_per_host``): beyond it rollouts wait for a connection without a socket."""
    sockets = min(concurrency, get_default_config().limit_per_host)
    return (2 if serving else 1) * sockets + RESERVE_FDS


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
        most = max(1, (hard - RESERVE_FDS) // (2 if serving else 1))
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
