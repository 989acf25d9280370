"""Running untrusted Python for one unit test: a fresh temp dir, kernel limits, and a process group that dies whole.

Layers, outermost first (each is tested in ``tests/test_sandbox.py``):

* **Namespaces** (``unshare --net --pid --fork --kill-child``; ``--map-root-user`` added when not root): no network
  interface but a downed loopback, and a PID namespace whose init exits with the program, taking every descendant
  with it. Probed once; ``namespaces: required`` refuses to run without them.
* **Process group**: the child starts its own session; when the program exits or overruns its wall-clock limit, the
  whole group gets SIGKILL *before* the leader is reaped (so its id cannot have been reused).
* **Resource limits** (set in the child): ``RLIMIT_CPU`` (CPU time), ``RLIMIT_AS`` (memory), ``RLIMIT_FSIZE`` (the
  size of any file written, stdout and stderr included, which are files here), ``RLIMIT_NOFILE``, ``RLIMIT_NPROC``
  (effective for non-root users), no core dumps.
* **Seccomp** (``nemo_gym/sandbox/seccomp.py``): no ``fork``/``vfork``/``clone`` of a process (threads pass) and no
  raising of a limit, whatever the user id: the process and limit layers for root, which ``RLIMIT_NPROC`` skips and
  which may raise any rlimit.
* **Landlock** (Linux >= 5.13, ``nemo_gym/sandbox/landlock.py``): read-only access to the interpreter and its
  standard library, read-write access to the temp dir only; TCP bind/connect denied (ABI >= 4); signals to processes
  outside the sandbox denied (ABI >= 6).
* **Audit hook** in the interpreter: process creation, sockets, ctypes, files outside the temp dir, raising limits
  and heap introspection end the run at once with the ``sandbox_violation`` code.

The audit hook alone is not a security boundary against a determined attacker; the kernel layers are, and each holds
with the hook off (``audit_hook: false``; the tests run that way too). On a system without namespaces, seccomp or
Landlock, run the server inside a container.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Literal

from nemo_gym.sandbox import landlock, seccomp
from resources_servers.code_gen import sandbox_child as child

logger = logging.getLogger(__name__)

LayerMode = Literal["auto", "required", "off"]
RunStatus = Literal["ok", "runtime_error", "syntax_error", "timeout", "memory_limit", "output_limit",
                    "sandbox_violation", "sandbox_error"]  # fmt: skip

CHILD_SCRIPT = Path(child.__file__).resolve()
LANDLOCK_MODULE = Path(landlock.__file__).resolve()
"""Loaded by path in the child's init stage (shared with the ``local`` sandbox provider of ``nemo_gym.sandbox``)."""
SECCOMP_MODULE = Path(seccomp.__file__).resolve()
_SYSTEM_LIBRARY_DIRS = ("/lib", "/lib64", "/usr/lib", "/usr/lib64", "/usr/local/lib", "/etc/ld.so.cache", "/dev/null")
_STDERR_KEEP = 4000


@dataclass(frozen=True)
class SandboxLimits:
    time_limit_s: float = 10.0
    """CPU-time limit (whole seconds, rounded up)."""
    wall_factor: float = 2.0
    wall_grace_s: float = 1.0
    """The wall-clock limit is ``time_limit_s * wall_factor + wall_grace_s`` (sleeping or a busy host use no CPU)."""
    memory_mb: int = 1024
    output_kb: int = 16 * 1024
    """Largest stdout/stderr (and any other file) the program may write."""
    open_files: int = 64
    extra_processes: int = 8
    """RLIMIT_NPROC headroom above the user's current process count (root ignores RLIMIT_NPROC; where seccomp works it
    refuses every new process first, for any user)."""


@dataclass(frozen=True)
class SandboxPolicy:
    namespaces: LayerMode = "auto"
    landlock: LayerMode = "auto"
    audit_hook: bool = True
    seccomp: LayerMode = "auto"


@dataclass
class RunResult:
    status: RunStatus
    stdout: str
    stderr: str
    wall_s: float
    exit_code: int | None


@cache
def namespace_prefix() -> tuple[str, ...] | None:
    """The ``unshare`` command line that gives a child its own network and PID namespaces here, or None."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return None
    base = ("--net", "--pid", "--fork", "--kill-child")
    candidates: list[tuple[str, ...]] = [(unshare, *base)] if os.geteuid() == 0 else []
    candidates.append((unshare, "--map-root-user", *base))
    for candidate in candidates:
        try:
            probe = subprocess.run([*candidate, "true"], capture_output=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if probe.returncode == 0:
            return candidate
    return None


@cache
def landlock_abi() -> int:
    """The kernel's Landlock ABI version (0 when Landlock is missing or disabled)."""
    return landlock.abi()


def describe_layers(policy: SandboxPolicy) -> dict[str, object]:
    """Which layers this host gives the configured policy (logged at startup, reported by the server)."""
    return {
        "namespaces": policy.namespaces != "off" and namespace_prefix() is not None,
        "landlock_abi": landlock_abi() if policy.landlock != "off" else 0,
        "seccomp": policy.seccomp != "off" and seccomp.unsupported_reason() is None,
        "audit_hook": policy.audit_hook,
        "process_group_kill": True,
    }


def check_policy(policy: SandboxPolicy) -> None:
    """Fail at startup, not per test, when a layer marked ``required`` is unavailable on this host."""
    if policy.namespaces == "required" and namespace_prefix() is None:
        raise RuntimeError("code_gen sandbox: namespaces are required but `unshare --net --pid` does not work here")
    if policy.landlock == "required" and landlock_abi() < 1:
        raise RuntimeError("code_gen sandbox: Landlock is required but this kernel does not provide it")
    if policy.seccomp == "required" and (reason := seccomp.unsupported_reason()) is not None:
        raise RuntimeError(f"code_gen sandbox: seccomp is required but unavailable here ({reason})")


@cache
def interpreter_read_paths() -> tuple[str, ...]:
    """What a fresh interpreter needs to read: its binary, its prefix (stdlib, shared library) and system libraries."""
    executable = os.path.realpath(sys.executable)
    paths = {executable, os.path.realpath(sys.base_prefix), os.path.realpath(sysconfig.get_paths()["stdlib"])}
    paths.add(os.path.realpath(sysconfig.get_paths()["platstdlib"]))
    paths.add(os.path.join(os.path.dirname(os.path.dirname(executable)), "pyvenv.cfg"))
    paths.update(os.path.realpath(p) for p in _SYSTEM_LIBRARY_DIRS)
    paths.add(str(CHILD_SCRIPT))
    return tuple(sorted(p for p in paths if os.path.exists(p)))


def run_python(
    source: str,
    stdin: str,
    limits: SandboxLimits,
    policy: SandboxPolicy = SandboxPolicy(),
    fn_name: str | None = None,
) -> RunResult:
    """Run ``source`` once with ``stdin`` in a fresh temp dir; blocking (call it from a worker thread)."""
    workdir = tempfile.mkdtemp(prefix="nemo_gym_code_")
    try:
        Path(workdir, "solution.py").write_text(source, encoding="utf-8")
        Path(workdir, "stdin.txt").write_text(stdin, encoding="utf-8")
        return _run_in(workdir, limits, policy, fn_name)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _run_in(workdir: str, limits: SandboxLimits, policy: SandboxPolicy, fn_name: str | None) -> RunResult:
    workdir = os.path.realpath(workdir)
    python = os.path.realpath(sys.executable)
    config = {
        "stage": "init",
        "python": python,
        "workdir": workdir,
        "read_paths": list(interpreter_read_paths()),
        "landlock": policy.landlock,
        "landlock_module": str(LANDLOCK_MODULE),
        "seccomp": policy.seccomp,
        "seccomp_module": str(SECCOMP_MODULE),
        "audit_hook": policy.audit_hook,
        "fn_name": fn_name,
        "limits": {
            "cpu_s": max(1, math.ceil(limits.time_limit_s)),
            "memory_bytes": limits.memory_mb * 1024 * 1024,
            "file_bytes": limits.output_kb * 1024,
            "open_files": limits.open_files,
            "extra_processes": limits.extra_processes,
        },
    }
    prefix = namespace_prefix() if policy.namespaces != "off" else None
    if policy.namespaces == "required" and prefix is None:
        return RunResult("sandbox_error", "", "namespaces required but unavailable", 0.0, None)
    command = [*(prefix or ()), python, "-I", "-S", "-B", str(CHILD_SCRIPT), json.dumps(config)]
    env = {"PATH": "/usr/bin:/bin", "HOME": workdir, "TMPDIR": workdir, "LC_ALL": "C.UTF-8", "LANG": "C.UTF-8"}
    out_path, err_path = os.path.join(workdir, "stdout.txt"), os.path.join(workdir, "stderr.txt")
    wall_limit = limits.time_limit_s * limits.wall_factor + limits.wall_grace_s
    start = time.monotonic()
    with (
        open(os.path.join(workdir, "stdin.txt"), "rb") as stdin_file,
        open(out_path, "wb") as stdout_file,
        open(err_path, "wb") as stderr_file,
    ):
        process = subprocess.Popen(
            command, stdin=stdin_file, stdout=stdout_file, stderr=stderr_file, cwd=workdir, env=env,
            start_new_session=True, close_fds=True,
        )  # fmt: skip
    timed_out = not _wait_without_reaping(process.pid, start + wall_limit)
    _kill_group(process.pid)
    process.wait()
    _wait_for_group_to_vanish(process.pid)
    wall = time.monotonic() - start
    stdout = _read_text(out_path, limits.output_kb * 1024)
    stderr = _read_text(err_path, _STDERR_KEEP, tail=True)
    if timed_out:
        status: RunStatus = "timeout"
    elif os.path.getsize(out_path) >= limits.output_kb * 1024 or os.path.getsize(err_path) >= limits.output_kb * 1024:
        status = "output_limit"  # Python ignores SIGXFSZ, so the write failed with EFBIG instead
    else:
        status = _classify(process.returncode, stderr, wall, limits)
    return RunResult(status, stdout, stderr, wall, process.returncode)


def _wait_without_reaping(pid: int, deadline: float) -> bool:
    """True once ``pid`` has exited (left as a zombie, so its process group id stays ours); False at the deadline."""
    delay = 0.001
    while True:
        if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
            return True
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        time.sleep(min(delay, remaining))
        delay = min(delay * 2, 0.02)


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _wait_for_group_to_vanish(pgid: int, timeout_s: float = 10.0) -> None:
    """SIGKILL is asynchronous: return only once no member of the group is left (the id cannot be reused before)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            return
        try:  # members re-parented to us (if this process is a subreaper) would stay zombies otherwise
            os.waitpid(-pgid, os.WNOHANG)
        except ChildProcessError:
            pass
        time.sleep(0.005)
    logger.warning("process group %d still has members %.0f s after SIGKILL", pgid, timeout_s)


def _classify(code: int | None, stderr: str, wall: float, limits: SandboxLimits) -> RunStatus:
    """Map the child's exit status (``128 + n`` when signal ``n`` ended the worker) to a result code."""
    if code is None:
        return "sandbox_error"
    if code < 0:  # the init itself died from a signal (not something user code can do from inside)
        code = 128 - code
    if code == child.EXIT_OK:
        return "ok"
    if code == child.EXIT_SYNTAX_ERROR:
        return "syntax_error"
    if code == child.EXIT_MEMORY_ERROR:
        return "memory_limit"
    if code == child.EXIT_VIOLATION:
        return "sandbox_violation"
    if code == child.EXIT_SETUP_ERROR:
        return "sandbox_error"
    if code > 128:
        signum = code - 128
        if signum == signal.SIGXCPU:
            return "timeout"
        if signum == signal.SIGXFSZ:
            return "output_limit"
        if signum == signal.SIGKILL:  # the CPU hard limit, or the kernel's OOM killer
            return "timeout" if wall >= limits.time_limit_s else "memory_limit"
    if "MemoryError" in stderr:
        return "memory_limit"
    return "runtime_error"


def _read_text(path: str, limit: int, tail: bool = False) -> str:
    try:
        with open(path, "rb") as f:
            if tail:
                size = os.fstat(f.fileno()).st_size
                f.seek(max(0, size - limit))
            data = f.read(limit)
    except OSError:
        return ""
    return data.decode("utf-8", errors="replace")
