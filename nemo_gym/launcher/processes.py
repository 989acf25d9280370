"""Starting, watching and stopping child processes so that none outlives the launcher.

Every child (a server, or a ``uv`` build) runs in its own session, so the launcher can signal the child *and everything
it spawned* as one process group, and a Ctrl-C in the terminal reaches only the launcher, which then shuts the
children down in order. On Linux each child also asks the kernel for SIGTERM when its parent dies
(``PR_SET_PDEATHSIG``), which covers a launcher killed with SIGKILL.

``PR_SET_PDEATHSIG`` fires when the *thread* that forked the child exits, not the process. Children are therefore
always forked from one long-lived spawner thread, never from short-lived worker threads.

Exit status is observed with ``waitid(..., WNOWAIT)``: the exited child stays a zombie until shutdown reaps it, so its
pid (which is also its process-group id) cannot be reused while the launcher may still signal that group.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import IO, Any, TypeVar

import psutil

from nemo_gym import INSTALL_DIR

_PR_SET_PDEATHSIG = 1
T = TypeVar("T")

__all__ = [
    "LogSink",
    "exit_code",
    "kill_group",
    "read_lines_into",
    "server_pythonpath",
    "spawn",
    "stop_process_groups",
]


# --------------------------------------------------------------------------------------------------------------------
# Spawning
# --------------------------------------------------------------------------------------------------------------------


def server_pythonpath(impl_dir: str | Path, root: str | Path, inherited: str | None) -> str:
    """A server's ``PYTHONPATH``: its folder, its search root, whatever was set already, then the framework's install
    root, so a server written in a root of its own imports the framework's servers (``responses_api_agents.
    simple_agent.app``, which a new agent subclasses) as it would inside a checkout."""
    parts = dict.fromkeys(str(p) for p in (impl_dir, root, inherited, INSTALL_DIR) if p)
    return os.pathsep.join(parts)


def _load_prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _load_prctl()


def _make_preexec(parent_pid: int) -> Callable[[], None] | None:
    """A pre-exec hook that ties the child's life to the launcher (Linux only; elsewhere the group kill suffices)."""
    if _PRCTL is None:
        return None
    prctl = _PRCTL

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
        if os.getppid() != parent_pid:  # the launcher died before the hook was armed
            os.kill(os.getpid(), signal.SIGTERM)

    return preexec


class _Spawner:
    """One daemon thread that performs every fork, so that the forking thread lives as long as the process."""

    def __init__(self) -> None:
        self._queue: queue.Queue[tuple[Callable[[], Any], Future[Any]]] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def call(self, fn: Callable[[], T], on_abandon: Callable[[T], None]) -> T:
        """Run ``fn`` on the spawner thread; if the caller is interrupted meanwhile, ``on_abandon`` gets the result."""
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="nemo-gym-spawner", daemon=True)
                self._thread.start()
        if threading.current_thread() is self._thread:
            return fn()
        future: Future[T] = Future()
        self._queue.put((fn, future))
        try:
            return future.result()
        except BaseException:
            # Ctrl-C while the fork was in flight: nobody will ever own that child, so it must not outlive us.
            def abandon(done: Future[T]) -> None:
                if done.exception() is None:
                    on_abandon(done.result())

            future.add_done_callback(abandon)
            raise

    def _loop(self) -> None:
        while True:
            fn, future = self._queue.get()
            try:
                future.set_result(fn())
            except BaseException as e:  # handed back to the caller, who re-raises it
                future.set_exception(e)


_SPAWNER = _Spawner()


def spawn(
    args: Sequence[str],
    *,
    cwd: Path | str | None = None,
    env: dict[str, str] | None = None,
    pass_fds: Sequence[int] = (),
) -> subprocess.Popen[bytes]:
    """Start a child in its own session with stdout and stderr merged into one pipe."""
    parent_pid = os.getpid()

    def start() -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            list(args),
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            pass_fds=tuple(pass_fds),
            start_new_session=True,
            preexec_fn=_make_preexec(parent_pid),
        )

    def abandon(popen: subprocess.Popen[bytes]) -> None:
        kill_group(popen, signal.SIGKILL)
        popen.wait()

    return _SPAWNER.call(start, abandon)


# --------------------------------------------------------------------------------------------------------------------
# Observing
# --------------------------------------------------------------------------------------------------------------------


def exit_code(popen: subprocess.Popen) -> int | None:
    """The child's exit code (negative signal number if killed), or None while it runs; never reaps it."""
    if popen.returncode is not None:
        return popen.returncode
    try:
        info = os.waitid(os.P_PID, popen.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:  # already reaped by someone else
        return popen.poll() if popen.returncode is None else popen.returncode
    if info is None:
        return None
    if info.si_code == os.CLD_EXITED:
        return info.si_status
    return -info.si_status


class LogSink:
    """One server's log: its lines go to its log file, and (optionally) to the launcher's stdout prefixed by name.

    ``mask`` rewrites each line first (the launcher masks secrets with it); without one, lines are written raw.
    """

    _echo_lock = threading.Lock()

    def __init__(self, name: str, path: Path, echo: bool, mask: Callable[[str], str] | None = None) -> None:
        self.name = name
        self.path = path
        self.echo = echo
        self.mask = mask
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file: IO[bytes] | None = open(path, "wb")
        self._lock = threading.Lock()
        self._prefix = f"({name}) "

    def write(self, line: bytes, echo: bool = True) -> None:
        if not line.endswith(b"\n"):
            line += b"\n"
        if self.mask is not None:
            line = self.mask(line.decode("utf-8", errors="replace")).encode()
        with self._lock:
            if self._file is not None:
                self._file.write(line)
                self._file.flush()
        if self.echo and echo:
            text = self._prefix + line.decode("utf-8", errors="replace")
            with self._echo_lock:
                try:
                    sys.stdout.write(text)
                    sys.stdout.flush()
                except (OSError, ValueError):  # stdout closed (e.g. a pipe whose reader went away)
                    pass

    def note(self, message: str, echo: bool = True) -> None:
        """A line from the launcher itself, marked so it stands out from the server's own output."""
        self.write(f"[nemo-gym] {message}".encode(), echo=echo)

    def tail(self, lines: int = 20) -> list[str]:
        with self._lock:
            if self._file is not None:
                self._file.flush()
        try:
            with open(self.path, "rb") as f:
                last = deque(f, maxlen=lines)
        except OSError:
            return []
        return [line.decode("utf-8", errors="replace").rstrip("\n") for line in last]

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None


def read_lines_into(stream: IO[bytes], sinks: Iterable[LogSink], echo_first_only: bool = True) -> None:
    """Copy a child's output, line by line, into every sink until EOF (run in a thread)."""
    sinks = list(sinks)
    with contextlib.suppress(OSError, ValueError):
        for line in iter(stream.readline, b""):
            for i, sink in enumerate(sinks):
                sink.write(line, echo=not echo_first_only or i == 0)
    with contextlib.suppress(OSError):
        stream.close()


# --------------------------------------------------------------------------------------------------------------------
# Stopping
# --------------------------------------------------------------------------------------------------------------------


def kill_group(popen: subprocess.Popen, sig: int) -> None:
    """Signal the child's whole process group; a group that is already gone is not an error."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(popen.pid, sig)


def _descendants(popens: Iterable[subprocess.Popen]) -> list[psutil.Process]:
    found: list[psutil.Process] = []
    for popen in popens:
        with contextlib.suppress(psutil.Error):
            found.extend(psutil.Process(popen.pid).children(recursive=True))
    return found


def stop_process_groups(
    popens: Sequence[subprocess.Popen],
    grace_s: float = 10.0,
    force: threading.Event | None = None,
) -> None:
    """SIGTERM every child's group, wait up to ``grace_s`` (or until ``force`` is set), SIGKILL what is left, reap all.

    Descendants that moved to their own session are remembered before signalling and killed at the end too, so no
    process started by a server survives it.
    """
    descendants = _descendants(p for p in popens if exit_code(p) is None)
    for popen in popens:
        kill_group(popen, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while any(exit_code(p) is None for p in popens) and time.monotonic() < deadline:
        if force is not None and force.is_set():
            break
        time.sleep(0.05)
    for popen in popens:
        # The leader is still an unreaped zombie at this point, so its group id cannot belong to anyone else yet.
        kill_group(popen, signal.SIGKILL)
    for process in descendants:
        with contextlib.suppress(psutil.Error):
            process.kill()
    for popen in popens:
        with contextlib.suppress(subprocess.TimeoutExpired):
            popen.wait(timeout=5)
