"""Small helpers for sandbox configs and the environment a sandboxed command starts with."""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence

__all__ = ["CPU_CAP_ENV_VARS", "command_leaving_nothing", "cpu_cap_env", "rewrite_image"]

CPU_CAP_ENV_VARS: tuple[str, ...] = (
    # Toolchains outside Python: CMake, Go, libuv (Node), Rust and cargo.
    "CARGO_BUILD_JOBS",
    "CMAKE_BUILD_PARALLEL_LEVEL",
    "GOMAXPROCS",
    "RAYON_NUM_THREADS",
    "RUST_TEST_THREADS",
    "UV_THREADPOOL_SIZE",
    # Python itself (3.13+) and the Python pools that size themselves from it.
    "DJANGO_TEST_PROCESSES",
    "LOKY_MAX_CPU_COUNT",
    "NUMBA_NUM_THREADS",
    "POLARS_MAX_THREADS",
    "PYTEST_XDIST_AUTO_NUM_WORKERS",
    "PYTHON_CPU_COUNT",
    # OpenMP and the BLAS/LAPACK builds loaded by numpy, scipy and torch (GNU nproc reads OMP_NUM_THREADS too, so
    # `make -j$(nproc)` follows it).
    "BLIS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "NUMEXPR_NUM_THREADS",
    "OMP_NUM_THREADS",
    "OMP_THREAD_LIMIT",
    "OPENBLAS_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
)
"""Variables that size worker pools. Tools count the host's cores, not the sandbox's CPU limit, so on a wide machine
a sandbox of 2 CPUs starts dozens of workers, is throttled and runs out of memory. ``MAKEFLAGS`` is left out on
purpose: a ``-j`` in it would make every plain ``make`` parallel."""


def cpu_cap_env(cpu: float | int | None) -> dict[str, str]:
    """Each of :data:`CPU_CAP_ENV_VARS` set to the whole CPUs of a limit (at least 1); ``{}`` without a limit.

    Nothing applies this by default: the server that builds a spec merges it under its own ``env``
    (``cpu_cap_env(resources.cpu) | env``), so a value the config sets explicitly wins.
    """
    if cpu is None:
        return {}
    whole = str(int(cpu) if cpu >= 1 else 1)
    return dict.fromkeys(CPU_CAP_ENV_VARS, whole)


def rewrite_image(image: str | None, rewrites: Sequence[Mapping[str, str]]) -> str | None:
    """Point an image at a mirror: the first rule whose ``from`` prefixes ``image`` swaps that prefix for its ``to``.

    Datasets name public images (``docker.io/...``); a cluster often pulls from its own registry, so the config keeps
    an ordered list of ``{"from": prefix, "to": prefix}`` rules. No matching rule, or no image, returns it unchanged.
    """
    if image is None:
        return None
    for rule in rewrites:
        prefix = rule["from"]
        if image.startswith(prefix):
            return rule["to"] + image[len(prefix) :]
    return image


def command_leaving_nothing(command: str, timeout_s: float) -> str:
    """A POSIX shell line that runs ``command`` with a deadline and then kills everything it started.

    The command runs in a process group of its own (``setsid``) under ``timeout``; when it ends, or at the deadline,
    the whole group gets SIGKILL, so a background job, a daemon or a fork bomb (held to the container's process
    limit) does not outlive the call and the next command finds the sandbox as it was. The exit status is the
    command's, or 124 at the deadline. Needs ``setsid`` and ``timeout`` (util-linux and coreutils, or busybox).
    """
    wrapper = 'setsid timeout -k 2 "$1" sh -c "$0" & p=$!; wait $p; rc=$?; kill -9 -$p 2>/dev/null; exit $rc'
    return f"sh -c {shlex.quote(wrapper)} {shlex.quote(command)} {timeout_s:g}"
