"""Run one command in a sandbox under a deadline, then prove that nothing it started is still running.

A harness that runs inside a sandbox can leave processes behind (a shell tool's background job, a daemon that
called ``setsid``); killing its process group misses those. This file is uploaded beside the harness and run with
the sandbox's own Python, so it imports only the standard library::

    python3 -I process_supervisor.py --timeout 600 --receipt /run/cleanup.json [--cleanup-timeout 10]
        [--stop-file /run/stop] -- python3 harness.py ...

It becomes a child subreaper (Linux), so every orphan of the worker is re-parented to it and can be found and
killed. At the deadline, on SIGTERM, or once the stop file exists, the worker gets SIGTERM and ``cleanup-timeout``
seconds to checkpoint, then its group gets SIGKILL and every remaining descendant is killed and reaped. Only then is
the receipt written (atomically): ``cleanup_confirmed``, ``return_code``, ``error``, ``timed_out``. The exit status is
0 only for a confirmed cleanup without error. A stop file present before the worker would start fences the launch:
nothing runs, and the receipt confirms there is nothing to clean up.

The server waits for the sandbox ``exec`` with :func:`exec_timeout`, which leaves room for the cleanup.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType
from typing import TypedDict

__all__ = ["DEFAULT_CLEANUP_TIMEOUT", "CleanupReceipt", "exec_timeout", "main"]

DEFAULT_CLEANUP_TIMEOUT = 10.0
"""Seconds each cleanup phase may take: the worker's grace after SIGTERM, reaping it, draining its descendants."""

_CLEANUP_PHASES = 3
_START_AND_RECEIPT_SLACK_S = 30.0
_PR_SET_CHILD_SUBREAPER = 36
_POLL_S = 0.05


class CleanupReceipt(TypedDict):
    """What the supervisor writes once cleanup has finished (or failed)."""

    cleanup_confirmed: bool
    return_code: int | None
    error: str | None
    timed_out: bool


def exec_timeout(*, timeout: float, cleanup_timeout: float = DEFAULT_CLEANUP_TIMEOUT) -> float:
    """How long the caller's ``exec`` should wait for a supervisor run with these settings.

    The worker's deadline, each cleanup phase at its longest, and slack for starting Python and writing the
    receipt: an ``exec`` that gives up earlier would abandon the supervisor before it can confirm anything.
    """
    return timeout + _CLEANUP_PHASES * cleanup_timeout + _START_AND_RECEIPT_SLACK_S


def _reap_descendants(within_s: float) -> None:
    """SIGKILL and reap every child left (orphans come to us as subreaper); ``TimeoutError`` if some survive."""
    children_file = Path(f"/proc/self/task/{os.getpid()}/children")
    give_up = time.monotonic() + within_s
    while True:
        for pid in children_file.read_text().split():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
        try:
            while os.waitpid(-1, os.WNOHANG)[0] != 0:
                pass
        except ChildProcessError:
            return  # no children at all: everything is gone
        if time.monotonic() > give_up:
            raise TimeoutError("processes started in the sandbox are still alive after cleanup")
        time.sleep(0.01)


class _Supervisor:
    """One supervised run; ``run()`` always finishes the cleanup before it returns the receipt."""

    def __init__(self, command: list[str], *, timeout: float, cleanup_timeout: float, stop_file: Path | None) -> None:
        self.command = command
        self.timeout = timeout
        self.cleanup_timeout = cleanup_timeout
        self.stop_file = stop_file
        self.asked_to_stop = False
        self.worker: subprocess.Popen[bytes] | None = None
        self.reaping = False
        self.receipt: CleanupReceipt = {
            "cleanup_confirmed": False,
            "return_code": None,
            "error": None,
            "timed_out": False,
        }

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        self.asked_to_stop = True  # only a flag: the loop below acts on it, never mid-Popen

    def _stop_wanted(self) -> bool:
        return self.asked_to_stop or (self.stop_file is not None and self.stop_file.exists())

    def run(self) -> CleanupReceipt:
        signal.signal(signal.SIGTERM, self._on_sigterm)
        try:
            self._supervise()
        except Exception as error:
            self.receipt["error"] = f"{type(error).__name__}: {error}"
        finally:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second TERM must not cut the cleanup short
            self._clean_up()
        return self.receipt

    def _supervise(self) -> None:
        if self._stop_wanted():
            return  # fenced before launch: no worker, nothing to clean up
        if not sys.platform.startswith("linux"):
            raise RuntimeError("process supervision needs Linux (/proc and PR_SET_CHILD_SUBREAPER)")
        if os.getpgrp() != os.getpid():
            os.setsid()  # out of the launcher's group, so a kill aimed at it does not hit us mid-cleanup
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed")
        self.reaping = True
        self.worker = subprocess.Popen(self.command, start_new_session=True)
        ends_at = time.monotonic() + self.timeout
        while self.worker.poll() is None and not self._stop_wanted():
            if time.monotonic() >= ends_at:
                self.receipt["timed_out"] = True
                break
            time.sleep(_POLL_S)
        if self.worker.poll() is None:
            self.worker.send_signal(signal.SIGTERM)  # a chance to checkpoint before the hard kill
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.worker.wait(timeout=self.cleanup_timeout)

    def _clean_up(self) -> None:
        try:
            if self.worker is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.worker.pid, signal.SIGKILL)
                self.receipt["return_code"] = self.worker.wait(timeout=self.cleanup_timeout)
            if self.reaping:
                _reap_descendants(self.cleanup_timeout)
            self.receipt["cleanup_confirmed"] = True
        except Exception as error:
            self.receipt["error"] = f"cleanup: {type(error).__name__}: {error}"


def _seconds(text: str) -> float:
    value = float(text)
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of seconds")
    return value


def _write_atomically(path: Path, receipt: CleanupReceipt) -> None:
    staging = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    staging.write_text(json.dumps(receipt))
    os.replace(staging, path)


def main(argv: list[str] | None = None) -> int:
    """The command line (see the module docstring); returns the exit status."""
    parser = argparse.ArgumentParser(prog="process_supervisor.py", description="Supervise one sandboxed command.")
    parser.add_argument("--timeout", type=_seconds, required=True, help="the worker's deadline in seconds")
    parser.add_argument("--cleanup-timeout", type=_seconds, default=DEFAULT_CLEANUP_TIMEOUT)
    parser.add_argument("--receipt", type=Path, required=True, help="where the cleanup receipt is written")
    parser.add_argument("--stop-file", type=Path, default=None, help="its existence stops (or fences) the worker")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the worker's argv")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the worker's command after --")
    receipt = _Supervisor(
        command, timeout=args.timeout, cleanup_timeout=args.cleanup_timeout, stop_file=args.stop_file
    ).run()
    _write_atomically(args.receipt, receipt)
    return 0 if receipt["cleanup_confirmed"] and receipt["error"] is None else 1


if __name__ == "__main__":
    raise SystemExit(main())
