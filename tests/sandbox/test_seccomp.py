"""The seccomp filter in a real child interpreter: what it refuses, what it lets through, and that it survives exec.

Each check runs in a fresh ``python -I -S`` that loads ``seccomp.py`` by path (as the code_gen sandbox does), installs
the filter and prints what its system calls returned; the test process itself is never filtered.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from nemo_gym.sandbox import seccomp

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(seccomp.unsupported_reason() is not None, reason=str(seccomp.unsupported_reason())),
]

PROBE = """
import ctypes, errno, importlib.util, json, os, platform, resource, subprocess, sys, threading
spec = importlib.util.spec_from_file_location("seccomp", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
module.deny_new_processes()
libc = ctypes.CDLL(None, use_errno=True)
machine = {"amd64": "x86_64", "arm64": "aarch64"}.get(platform.machine().lower(), platform.machine().lower())
clone = {"x86_64": 56, "aarch64": 220}[machine]
seen = {}

def attempt(name, call):
    try:
        call()
        seen[name] = "ok"
    except OSError as e:
        seen[name] = errno.errorcode[e.errno]
    except ValueError as e:  # resource.setrlimit reports EPERM as ValueError
        seen[name] = "EPERM"

def raw(number, *args):
    result = libc.syscall(number, *args)
    if result == 0:
        os._exit(0)  # a child that got through: leave at once
    if result < 0:
        raise OSError(ctypes.get_errno(), "raw")

attempt("os.fork", os.fork)
attempt("subprocess", lambda: subprocess.run([sys.executable, "-c", "pass"]))
attempt("raw clone (SIGCHLD)", lambda: raw(clone, 17, 0, 0, 0, 0))
attempt("raw clone3", lambda: raw(435, 0, 0))
if machine == "x86_64":
    attempt("x32 fork", lambda: raw(0x40000000 + 57))
attempt("setrlimit lower", lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (16, 16)))
attempt("getrlimit", lambda: resource.getrlimit(resource.RLIMIT_NOFILE))
box = []
attempt("thread", lambda: [t.start() or t.join() for t in [threading.Thread(target=box.append, args=(1,))]])
seen["thread ran"] = box == [1]
print(json.dumps(seen))
sys.stdout.flush()
if len(sys.argv) > 2:  # the filter stays across exec: the new program is just as bound
    os.execv(sys.executable, [sys.executable, "-I", "-S", "-c", "import os\\ntry:\\n    os.fork()\\n    print('forked')\\nexcept OSError as e:\\n    print(e.errno)"])
"""


def run_probe(*extra: str) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-c", PROBE, seccomp.__file__, *extra], capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_the_filter_refuses_processes_and_limit_changes_but_not_threads() -> None:
    seen = json.loads(run_probe()[0])
    assert seen.pop("x32 fork", "ENOSYS") == "ENOSYS"
    assert seen == {
        "os.fork": "EAGAIN",
        "subprocess": "EAGAIN",
        "raw clone (SIGCHLD)": "EAGAIN",
        "raw clone3": "ENOSYS",
        "setrlimit lower": "EPERM",
        "getrlimit": "ok",
        "thread": "ok",
        "thread ran": True,
    }


def test_the_filter_survives_exec() -> None:
    lines = run_probe("exec")
    assert lines[1] == "11"  # EAGAIN in the program exec'd after the filter was installed


def test_an_unknown_architecture_is_named_not_guessed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(seccomp.platform, "machine", lambda: "riscv64")
    reason = seccomp.unsupported_reason()
    assert reason is not None and "riscv64" in reason
    with pytest.raises(OSError, match="riscv64"):
        seccomp.deny_new_processes()  # refuses before touching this (test) process


I386_FORK = """
import ctypes, importlib.util, mmap, os, sys
spec = importlib.util.spec_from_file_location("seccomp", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
module.deny_new_processes()
page = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
page.write(bytes.fromhex("b802000000cd80c3"))  # mov eax, 2 (fork in the 32-bit table); int 0x80; ret
result = ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(page)))()
if result == 0:
    os._exit(0)
print(result)
"""


@pytest.mark.skipif(seccomp.platform.machine() != "x86_64", reason="the 32-bit system call table is x86-64's")
def test_a_32_bit_system_call_cannot_dodge_the_filter() -> None:
    """``int 0x80`` numbers system calls differently (2 is fork there); the filter refuses that whole ABI."""
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-c", I386_FORK, seccomp.__file__], capture_output=True, text=True, timeout=30
    )
    # -ENOSYS from the filter; a kernel without 32-bit emulation kills the process instead. Never a child's pid.
    assert (done.returncode, done.stdout.strip()) == (0, "-38") or done.returncode < 0, (done.returncode, done.stdout)
