"""Claiming a run's output: one writer at a time, and never over earlier results unless asked.

A run writes a family of files beside its output ``<stem>.jsonl``: ``<stem>_failures.jsonl``,
``<stem>_materialized_inputs.jsonl``, ``<stem>_aggregate_metrics.json`` and ``<stem>_run.json``. Two guards keep
them whole:

* **A lock.** ``<output>.lock`` is held with ``flock`` from before the inputs are materialized until the metrics are
  written. A second run (fresh or ``--resume``) on the same output is refused at once, naming the pid that holds it.
  The kernel drops the lock when its holder dies, however it dies, so a crashed run never blocks the next one.
* **No silent overwrite.** A run that finds results there already (a non-empty rollouts or failures file, or
  metrics) is refused unless it continues them (``--resume``) or replaces them (``--overwrite``). Materialized
  inputs and the run record alone are not results: they are rebuilt from the input.

A fresh run (not ``--resume``) that fails or is interrupted before it wrote any result removes its materialized
inputs and run record as it lets go of the output (:func:`discard_without_results`): beside no results they only look
like a run that is not there, and the next run rebuilds both from the input. Beside results they stay (``--resume``
checks its input against the run record; ``gym eval profile`` and ``reverify`` read the materialized inputs), and a
``--resume`` leaves them as they were: they are the earlier run's.
"""

from __future__ import annotations

import fcntl
import logging
import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from nemo_gym.errors import ConfigError, UserError
from nemo_gym.rollouts.config import RolloutCollectionConfig
from nemo_gym.rollouts.outputs import aggregate_metrics_path, failures_path, manifest_path, materialized_inputs_path

logger = logging.getLogger(__name__)


class OutputInUseError(UserError):
    """Another run holds the output's lock: it is being written right now."""


class OutputExistsError(ConfigError, FileExistsError):
    """The output holds results that this run would replace, and neither ``--resume`` nor ``--overwrite`` was given."""


def lock_path(output: Path) -> Path:
    return output.with_name(f"{output.name}.lock")


def result_files(output: Path) -> list[Path]:
    """The files of a run that hold its results (what ``--overwrite`` would lose)."""
    return [output, failures_path(output), aggregate_metrics_path(output)]


@contextmanager
def claim_output(settings: RolloutCollectionConfig) -> Iterator[Path]:
    """Hold the lock of ``settings``' output for the block, once it is known that the run loses nothing by accident.

    Yields the output path (absolute). Raises :class:`OutputInUseError` or :class:`OutputExistsError` before
    anything is written.
    """
    output = Path(settings.output_jsonl_fpath).expanduser().resolve()
    if settings.resume_from_cache and settings.overwrite:
        raise ConfigError("--resume and --overwrite contradict each other: continue the run or replace it, not both")
    lock = _acquire(lock_path(output), output)
    try:
        check_nothing_lost(output, resume=settings.resume_from_cache, overwrite=settings.overwrite)
        try:
            yield output
        except BaseException:
            if not settings.resume_from_cache:
                discard_without_results(output)
            raise
    finally:
        _release(lock, lock_path(output))


def discard_without_results(output: Path) -> None:
    """Remove what a failed run wrote beside ``output`` when it holds no result: its materialized inputs, its run
    record and empty result files. Anything beside a result is kept (see the module's docstring for why)."""
    results = result_files(output)
    if any(path.is_file() and path.stat().st_size > 0 for path in results):
        return
    for path in (materialized_inputs_path(output), manifest_path(output), *results):
        path.unlink(missing_ok=True)


def check_nothing_lost(output: Path, *, resume: bool, overwrite: bool) -> None:
    """Refuse a run that would replace earlier results the user did not ask to replace."""
    if overwrite:
        return
    found = next((path for path in result_files(output) if path.is_file() and path.stat().st_size > 0), None)
    if found is None:
        return
    if not resume:
        raise OutputExistsError(
            f"{found} already holds results of an earlier run; pass --resume to continue that run or --overwrite to "
            "replace it (+resume_from_cache=true / +overwrite=true), or choose another --output"
        )
    if not manifest_path(output).exists():
        raise OutputExistsError(
            f"cannot resume {output}: {manifest_path(output).name}, the record of the run that wrote it, is missing; "
            "pass --overwrite to replace it, or choose another --output"
        )


def _acquire(path: Path, output: Path) -> int | None:
    """Lock ``path`` (created if needed) and write our pid into it; the open descriptor holds the lock.

    The holder removes the file when it is done. A run that opened the file just before that would lock a file no
    one else sees, so after locking, the file must still be the one at ``path``; if not, it tries again.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            raise OutputInUseError(
                f"{output} is being written by another run{holder}; wait for it to finish, or choose another --output"
            ) from None
        except OSError as e:  # a file system without locks (some network mounts): run, but say what is not kept
            os.close(fd)
            logger.warning("cannot lock %s (%s): two runs on this output would not be kept apart", path, e.strerror)
            return None
        try:
            same = os.path.samestat(os.fstat(fd), os.stat(path))
        except FileNotFoundError:
            same = False
        if same:
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()} {socket.gethostname()}\n".encode())
            return fd
        os.close(fd)


def _holder(fd: int) -> str:
    """`` (pid N)`` (with the host when it is another machine) from the lock file, or "" before the holder wrote it."""
    try:
        pid, _, host = os.pread(fd, 256, 0).decode("utf-8", "replace").strip().partition(" ")
    except OSError:
        return ""
    if not pid.isdigit():
        return ""
    return f" (pid {pid}{f' on {host}' if host and host != socket.gethostname() else ''})"


def _release(fd: int | None, path: Path) -> None:
    """Remove the lock file while still holding the lock, then let it go (see :func:`_acquire` for why)."""
    if fd is None:
        return
    path.unlink(missing_ok=True)
    os.close(fd)
