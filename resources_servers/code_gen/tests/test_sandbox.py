"""Acceptance tests of the sandbox: submitted code cannot read files outside its temp dir, open sockets, fork-bomb,
or outlive its timeout. Each test checks that nothing leaked (no content, no connection, no process); none measures
how long anything took, so a busy machine cannot fail them (pytest's timeout is the hang guard). Where the kernel
layers exist, the tests run again with the audit hook off, to show the kernel alone holds: files, sockets, a fork
storm (seccomp, which binds root too), memory, CPU time, file sizes, open files and raising a limit."""

from __future__ import annotations

import os
import secrets
import socket
import sys
import tempfile
import time
from collections.abc import Iterator

import psutil
import pytest

from nemo_gym.sandbox import seccomp
from resources_servers.code_gen.grading import grade_solution
from resources_servers.code_gen.sandbox import (
    SandboxLimits,
    SandboxPolicy,
    check_policy,
    describe_layers,
    landlock_abi,
    namespace_prefix,
)

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the sandbox uses Linux rlimits and namespaces"),
]

LIMITS = SandboxLimits(time_limit_s=10.0, wall_factor=2.0, wall_grace_s=1.0, memory_mb=512)
"""Far above what the code of the leak tests needs, so on a busy machine they end by what they try, not by a timeout."""
SHORT = SandboxLimits(time_limit_s=1.0, wall_factor=2.0, wall_grace_s=1.0, memory_mb=512)
"""For the tests that run into the time limit on purpose."""
FULL = SandboxPolicy()
KERNEL_ONLY = SandboxPolicy(audit_hook=False)
needs_landlock = pytest.mark.skipif(landlock_abi() < 4, reason="needs Landlock ABI >= 4 (files and TCP)")
needs_namespaces = pytest.mark.skipif(namespace_prefix() is None, reason="needs `unshare --net --pid`")
needs_process_limit = pytest.mark.skipif(
    os.geteuid() == 0 and seccomp.unsupported_reason() is not None,
    reason=f"as root only seccomp limits processes: {seccomp.unsupported_reason()}",
)


@pytest.fixture(autouse=True)
def sandbox_root(tmp_path, monkeypatch) -> Iterator[str]:
    """Each test's sandbox dirs live under its own tmp dir, whose path then marks its processes (other test runs on
    the machine may be running sandboxes of their own at the same time)."""
    root = tmp_path / "sandboxes"
    root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    try:
        yield str(root)
    finally:  # a failing test must not leave a storm behind: the tests assert there is nothing left to kill here
        for process in sandbox_processes(str(root)):
            process.kill()


def sandbox_processes(marker: str | None = None) -> list[psutil.Process]:
    """Every live process, anywhere on the machine, started for a sandboxed run of the current test."""
    marker = marker or tempfile.gettempdir()
    found = []
    for process in psutil.process_iter(["cmdline", "status"]):
        cmdline = process.info["cmdline"] or []
        if process.info["status"] != psutil.STATUS_ZOMBIE and any(marker in part for part in cmdline):
            found.append(process)
    return found


def run(code: str, policy: SandboxPolicy = FULL, limits: SandboxLimits = LIMITS):
    return grade_solution(code, ["\n"], ["never printed\n"], None, limits, policy)


@pytest.mark.parametrize("policy", [FULL, pytest.param(KERNEL_ONLY, marks=needs_landlock)], ids=["full", "kernel"])
def test_code_cannot_read_files_outside_its_temp_dir(tmp_path, policy):
    secret = f"top-secret-{secrets.token_hex(8)}"
    (tmp_path / "secret.txt").write_text(secret)
    code = f"""
import os
found = []
for attempt in (lambda: open({str(tmp_path / "secret.txt")!r}).read(),
                lambda: os.listdir({str(tmp_path)!r}),
                lambda: open('../' * 12 + {str(tmp_path / "secret.txt")!r}.lstrip('/')).read()):
    try:
        found.append(str(attempt()))
    except Exception as e:
        found.append(type(e).__name__)
print(found)
"""
    grade = run(code, policy)
    expected = "sandbox_violation" if policy.audit_hook else "wrong_answer"  # kernel only: every attempt fails
    assert grade.result == expected
    assert secret not in str(grade.failure) and "secret.txt" not in (grade.failure["actual_output"] or "")
    if not policy.audit_hook:
        assert grade.failure["actual_output"].count("PermissionError") == 3
    assert not sandbox_processes()


@pytest.mark.parametrize(
    "policy", [FULL, pytest.param(KERNEL_ONLY, marks=[needs_landlock, needs_namespaces])], ids=["full", "kernel"]
)
def test_code_cannot_open_sockets(policy):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        listener.setblocking(False)
        port = listener.getsockname()[1]
        code = f"""
import socket
for family, address in ((socket.AF_INET, ("127.0.0.1", {port})), (socket.AF_INET6, ("::1", {port}))):
    try:
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.settimeout(2)
            s.connect(address)
            s.sendall(b"leak")
            print("connected")
    except OSError as e:
        print(type(e).__name__)
"""
        grade = run(code, policy)
        with pytest.raises(BlockingIOError):
            listener.accept()  # nobody connected
    assert grade.result == ("sandbox_violation" if policy.audit_hook else "wrong_answer")
    assert "connected" not in grade.failure["actual_output"]
    assert not sandbox_processes()


@pytest.mark.parametrize(
    "bomb",
    [
        "import os\nwhile True:\n    try:\n        os.fork()\n    except Exception:\n        pass",
        "import subprocess, sys\nwhile True:\n    subprocess.Popen([sys.executable, '-c', 'while True: pass'])",
        "import multiprocessing\n\ndef spin():\n    while True:\n        multiprocessing.Process(target=spin).start()\n\n"
        "if __name__ == '__main__':\n    spin()",
        "import os\nos.system(':(){ :|:& };:')",
        "import pty\npty.fork()",
    ],
    ids=["os.fork", "subprocess", "multiprocessing", "os.system", "pty"],
)
def test_fork_bombs_are_stopped_before_they_spread(bomb):
    grade = run(bomb)
    assert grade.result == "sandbox_violation"
    assert not sandbox_processes()  # nothing of the bomb is left anywhere on the host


@pytest.mark.parametrize(
    "code",
    [
        "while True:\n    pass",
        "import time\nwhile True:\n    time.sleep(1)",
        "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nsignal.signal(signal.SIGXCPU, signal.SIG_IGN)\n"
        "while True:\n    pass",
        "import threading, time\nfor _ in range(4):\n    threading.Thread(target=time.sleep, args=(3600,)).start()",
    ],
    ids=["busy", "sleeping", "ignores-signals", "threads"],
)
def test_code_cannot_outlive_its_timeout(code):
    grade = run(code, limits=SHORT)  # none of these ends by itself: only the limits can end it
    assert grade.result == "timeout"
    assert not sandbox_processes()


@needs_namespaces
def test_a_process_that_escapes_its_group_dies_with_the_pid_namespace():
    """With the audit hook off, a real fork + setsid leaves the process group; the PID namespace still ends it."""
    code = "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(600)\nprint('parent done')"
    grade = run(code, SandboxPolicy(audit_hook=False, landlock="off", seccomp="off"))  # the namespace alone
    assert grade.result == "wrong_answer" and grade.failure["actual_output"] == "parent done\n"
    deadline = time.monotonic() + 60  # a hang guard: the loop ends as soon as the namespace is gone
    while sandbox_processes() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not sandbox_processes()


FORK_STORM = """
import ctypes, os, subprocess, sys, time
SYS_FORK = {"x86_64": 57}.get(os.uname().machine)  # aarch64 has only clone
SYS_CLONE = {"x86_64": 56, "aarch64": 220}[os.uname().machine]
libc = ctypes.CDLL(None, use_errno=True)
started = refused = 0

def child():
    time.sleep(600)  # a process that got out would still be here for the test to find
    os._exit(0)

for attempt in range(200):
    try:
        if attempt % 4 == 0:
            pid = os.fork()
        elif attempt % 4 == 1:
            pid = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", os.getcwd()]).pid
        elif attempt % 4 == 2:
            pid = os.posix_spawn(sys.executable, [sys.executable, "-c", "import time; time.sleep(600)", os.getcwd()],
                                 {})
        else:  # the bare system call, past any Python-level check
            pid = libc.syscall(SYS_FORK) if SYS_FORK else libc.syscall(SYS_CLONE, 17, 0, 0, 0, 0)
            if pid < 0:
                raise OSError(ctypes.get_errno(), "raw fork")
    except OSError:
        refused += 1
        continue
    if pid == 0:
        child()
    started += 1
print(started, refused)
"""


@needs_process_limit
def test_without_the_audit_hook_a_200_fork_storm_is_refused_by_the_kernel():
    """os.fork, subprocess, posix_spawn and raw fork/clone system calls, 50 each, with only the kernel layers: at
    most ``extra_processes`` start (none where seccomp works), and nothing of the storm is left on the host."""
    grade = run(FORK_STORM, KERNEL_ONLY)
    assert grade.result == "wrong_answer", grade.failure
    started, refused = map(int, grade.failure["actual_output"].split())
    assert started + refused == 200
    assert started <= LIMITS.extra_processes
    if seccomp.unsupported_reason() is None:
        assert started == 0
    assert not sandbox_processes()


RAISE_LIMIT = "import resource\ntry:\n    resource.setrlimit(resource.{0}, (-1, -1))\nexcept (OSError, ValueError) as e:\n    pass\n"
"""Prefix: try to lift a limit first (root may raise a hard limit; seccomp refuses it, and so did the hook)."""


@pytest.mark.parametrize(
    ("code", "limits", "expected", "in_stderr"),
    [
        (RAISE_LIMIT.format("RLIMIT_AS") + "x = bytearray(1024 * 1024 * 1024)", LIMITS, "memory_limit", ""),
        (RAISE_LIMIT.format("RLIMIT_CPU") + "while True:\n    pass", SHORT, "timeout", ""),
        (
            RAISE_LIMIT.format("RLIMIT_FSIZE") + "import sys\nsys.stdout.write('x' * (17 << 20))",
            LIMITS,
            "output_limit",
            "",
        ),
        (
            RAISE_LIMIT.format("RLIMIT_FSIZE") + "open('big', 'wb').write(b'x' * (17 << 20))",
            LIMITS,
            "runtime_error",
            "File too large",
        ),
        (
            RAISE_LIMIT.format("RLIMIT_NOFILE") + "files = [open('f%d' % i, 'w') for i in range(100)]",
            LIMITS,
            "runtime_error",
            "Too many open files",
        ),
        (
            "import resource\nresource.setrlimit(resource.RLIMIT_NOFILE, (32, 32))",
            LIMITS,
            "runtime_error",
            "not allowed to raise",
        ),
    ],
    ids=["memory-1GiB", "cpu", "stdout-17MiB", "file-17MiB", "100-open-files", "any-setrlimit"],
)
def test_without_the_audit_hook_the_kernel_limits_hold(code, limits, expected, in_stderr):
    """The rlimits are set in the child before it runs the program, and seccomp keeps root from lifting them (root
    with ``CAP_SYS_RESOURCE`` may raise a hard limit). Any ``setrlimit`` ends the run under the hook; without it,
    seccomp refuses even lowering one (which the kernel itself always allows), which shows the filter is in place."""
    if in_stderr == "not allowed to raise" and seccomp.unsupported_reason() is not None:
        pytest.skip(f"needs seccomp: {seccomp.unsupported_reason()}")
    grade = run(code, KERNEL_ONLY, limits)
    assert grade.result == expected, grade.failure
    assert in_stderr in (grade.failure["stderr"] or "")
    assert not sandbox_processes()


def test_a_required_seccomp_layer_is_checked_at_startup(monkeypatch):
    """``seccomp: required`` on a host without it refuses to start, naming why; ``auto`` starts and reports it off."""
    monkeypatch.setattr(seccomp, "unsupported_reason", lambda: "no seccomp filter for the riscv64 architecture")
    with pytest.raises(RuntimeError, match="seccomp is required but unavailable here .*riscv64"):
        check_policy(SandboxPolicy(seccomp="required"))
    check_policy(SandboxPolicy(seccomp="auto"))
    assert describe_layers(SandboxPolicy(seccomp="auto"))["seccomp"] is False
