"""What a dead launcher leaves behind: a tiny process that stops its servers, and a sweep of its config files.

The launcher stops its servers on every path it lives through (normal exit, Ctrl-C, SIGTERM). A SIGKILLed launcher
cannot, and what the kernel offers instead is not enough: the parent-death signal (``PR_SET_PDEATHSIG``, see
``processes.py``) is a SIGTERM to each direct child only, which a frozen (stopped, or stuck in C code) server never
acts on, and which never reaches a server's own children.

So each launch starts one reaper, in its own session (a Ctrl-C or a hang-up of the terminal does not reach it), with a
pipe for stdin. The launcher writes the pid of every server it spawns (each leads its own process group) and, once it
has stopped them all, ``done``. EOF before ``done`` means the launcher died: the reaper SIGTERMs every group, gives
the servers :data:`GRACE_S` to finish, SIGKILLs what is left (groups, and descendants that moved to a session of
their own), deletes the run's config file (it holds secrets), and exits. It reads nothing else and holds no socket.

It runs as ``python reaper.py CONFIG_PATH`` (a path, not ``-m``: importing the ``nemo_gym`` package would cost a
second of CPU per launch), so it imports only the standard library and psutil.

If the reaper dies too (``kill -9`` of both, a reboot), the config file stays behind. Each run directory therefore
holds an owner record (host, pid, start time of its launcher), and every launch first sweeps the run directories
whose launcher on this host is gone (:func:`sweep_dead_runs`); a live launcher's files are never touched.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import IO

import psutil

GRACE_S = 5.0
"""Time the servers get after the reaper's SIGTERM; their own graceful shutdown is shorter (``runtime.py``)."""
DONE = "done"
CONFIG_FILE = "config.yaml"
OWNER_FILE = "launcher"

__all__ = ["CONFIG_FILE", "GRACE_S", "Reaper", "remove_run_files", "sweep_dead_runs", "write_owner"]


class Reaper:
    """The launcher's handle on its reaper process; every method is a no-op once the reaper is gone."""

    def __init__(self, config_path: Path | None) -> None:
        args = [sys.executable, str(Path(__file__).resolve()), str(config_path or "")]
        self._popen = subprocess.Popen(
            args, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
        )
        self.pid = self._popen.pid

    def watch(self, pid: int) -> None:
        """Stop this process group too if the launcher dies."""
        self._send(str(pid))

    def release(self) -> None:
        """The launcher stopped everything itself: the reaper exits without touching anything."""
        self._send(DONE)
        with contextlib.suppress(OSError):
            assert self._popen.stdin is not None
            self._popen.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._popen.wait(timeout=5)

    def _send(self, word: str) -> None:
        with contextlib.suppress(OSError, ValueError):  # the reaper died or was released: nothing left to tell it
            assert self._popen.stdin is not None
            self._popen.stdin.write(f"{word}\n".encode())
            self._popen.stdin.flush()


# --------------------------------------------------------------------------------------------------------------------
# Run directories: results/run/<stamp>/ holds config.yaml (secrets) and the owner record of the launcher that wrote it


def write_owner(run_dir: Path) -> None:
    """Record which launcher owns ``run_dir`` (host, pid, start time), so a later start can tell if it died."""
    me = os.getpid()
    (run_dir / OWNER_FILE).write_text(f"{socket.gethostname()} {me} {_create_time(me)}\n", encoding="utf-8")


def remove_run_files(config_path: Path) -> None:
    """Delete a run's config file and owner record, then its directory unless someone put something else there."""
    for path in (config_path, config_path.parent / OWNER_FILE):
        with contextlib.suppress(OSError):
            path.unlink()
    with contextlib.suppress(OSError):
        config_path.parent.rmdir()


def sweep_dead_runs(run_root: Path) -> list[Path]:
    """Remove the config files that launchers which died on this host left behind; never one of a live launcher.

    A run directory without an owner record is left alone (a launch that is just writing it, or an older version).
    """
    removed = []
    host = socket.gethostname()
    for record in sorted(run_root.glob(f"*/{OWNER_FILE}")):
        with contextlib.suppress(OSError, ValueError):
            owner_host, pid, created = record.read_text(encoding="utf-8").split()
            if owner_host != host or _alive(int(pid), None if created == "None" else float(created)):
                continue
            remove_run_files(record.parent / CONFIG_FILE)
            removed.append(record.parent)
    return removed


# --------------------------------------------------------------------------------------------------------------------
# The reaper process itself


def _create_time(pid: int) -> float | None:
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


def _alive(pid: int, created: float | None) -> bool:
    """Whether process ``pid`` still is the one that was created at ``created`` (pids are reused)."""
    now = _create_time(pid)
    return now is not None and (created is None or abs(now - created) < 0.5)


def _still_ours(pgid: int, created: float | None) -> bool:
    """Whether group ``pgid`` is still the server's: its leader unchanged, or gone with members left (a group id in
    use is never handed to a new process, so those members are the server's)."""
    if _create_time(pgid) is not None:
        return created is not None and _alive(pgid, created)
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _live(processes: list[psutil.Process]) -> list[psutil.Process]:
    alive = []
    for process in processes:
        with contextlib.suppress(psutil.Error):
            if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                alive.append(process)
    return alive


def _stop(groups: dict[int, float | None]) -> None:
    """SIGTERM every group still ours, wait up to GRACE_S, SIGKILL the groups and the descendants found first."""
    ours = [pgid for pgid, created in groups.items() if _still_ours(pgid, created)]
    members: list[psutil.Process] = []
    for pgid in ours:
        with contextlib.suppress(psutil.Error):
            leader = psutil.Process(pgid)
            members += [leader, *leader.children(recursive=True)]
    for pgid in ours:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + GRACE_S
    while _live(members) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pgid in ours:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
    for process in _live(members):
        with contextlib.suppress(psutil.Error):
            process.kill()


def main(stdin: IO[str], config_path: str) -> None:
    """Read pids until ``done`` (exit quietly) or EOF (the launcher died: stop its servers)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the launcher's Ctrl-C is the launcher's business
    groups: dict[int, float | None] = {}
    for line in stdin:
        word = line.strip()
        if word == DONE:
            return
        if word.isdigit():
            groups[int(word)] = _create_time(int(word))
    _stop(groups)
    if config_path:
        remove_run_files(Path(config_path))


if __name__ == "__main__":
    main(sys.stdin, sys.argv[1] if len(sys.argv) > 1 else "")
