"""Seccomp: a kernel filter that stops a process, and whatever it ``exec``s, from starting processes or raising limits.

``RLIMIT_NPROC`` does not bind root (the kernel exempts uid 0 and ``CAP_SYS_RESOURCE``), and root may raise any
rlimit again, so as root the resource limits of a sandbox need one more kernel layer. This filter, installed in the
sandboxed child before it ``exec``s untrusted code, makes

* ``fork``, ``vfork`` and ``clone`` without ``CLONE_THREAD`` fail with ``EAGAIN`` (threads still start);
* ``clone3`` fail with ``ENOSYS`` (its flags sit behind a pointer a filter cannot read; the C library then falls back
  to ``clone``, which the filter can judge);
* ``setrlimit`` and ``prlimit64`` with a new limit fail with ``EPERM`` (reading a limit still works);
* any system call of another ABI (32-bit ``int 0x80`` on x86-64, x32) fail with ``ENOSYS``, so the numbers above
  cannot be dodged.

It binds whatever the user id or capabilities, cannot be removed once installed, and is inherited across ``fork`` and
``execve``. Standard library only and free of package imports: ``resources_servers/code_gen`` loads it by file path
in a child interpreter started with ``python -I -S`` (like ``landlock.py``). Linux on x86-64 or aarch64; elsewhere
:func:`unsupported_reason` says why not.
"""

import errno
import os
import platform
import struct
import sys
from typing import Any

__all__ = ["deny_new_processes", "unsupported_reason"]

# Classic BPF opcodes (linux/filter.h) and seccomp return values (linux/seccomp.h).
_LD_W_ABS, _JEQ_K, _JGE_K, _JSET_K, _RET_K = 0x20, 0x15, 0x35, 0x45, 0x06
_RET_ALLOW = 0x7FFF0000
_RET_ERRNO = 0x00050000
_PR_SET_NO_NEW_PRIVS, _PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 38, 22, 2
_CLONE_THREAD = 0x00010000
_X32_SYSCALL_BIT = 0x40000000
# Offsets in ``struct seccomp_data``: nr, arch, instruction pointer, then six 64-bit arguments (low word first here).
_NR, _ARCH = 0, 4


def _arg_low(index: int) -> int:
    return 16 + 8 * index


def _arg_high(index: int) -> int:
    return 20 + 8 * index


# Per machine: the audit architecture and the system call numbers the filter judges (None: no such call there).
_MACHINES: dict[str, dict[str, Any]] = {
    "x86_64": {"arch": 0xC000003E, "fork": 57, "vfork": 58, "clone": 56, "clone3": 435, "setrlimit": 160,
               "prlimit64": 302, "x32": True},
    "aarch64": {"arch": 0xC00000B7, "fork": None, "vfork": None, "clone": 220, "clone3": 435, "setrlimit": 164,
                "prlimit64": 261, "x32": False},
}  # fmt: skip
_MACHINE_ALIASES = {"amd64": "x86_64", "arm64": "aarch64"}


def _machine() -> dict[str, Any] | None:
    name = platform.machine().lower()
    return _MACHINES.get(_MACHINE_ALIASES.get(name, name))


def unsupported_reason() -> str | None:
    """None when :func:`deny_new_processes` can work here; else why not, in a few words."""
    if not sys.platform.startswith("linux"):
        return "seccomp needs Linux"
    if _machine() is None:
        return f"no seccomp filter for the {platform.machine()} architecture (only x86_64 and aarch64)"
    if sys.byteorder != "little":
        return "no seccomp filter for big-endian machines"
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            if not any(line.startswith("Seccomp:") for line in status):
                return "this kernel has no seccomp"
    except OSError:
        pass  # /proc may be unreadable (Landlock); installing the filter tells for sure
    return None


class _Program:
    """A tiny BPF assembler: jumps name a label further down, resolved to the relative offsets the kernel wants."""

    def __init__(self) -> None:
        self._items: list[tuple[int, str | int, str | int, int] | str] = []

    def label(self, name: str) -> None:
        self._items.append(name)

    def op(self, code: int, k: int, true: str | int = 0, false: str | int = 0) -> None:
        self._items.append((code, true, false, k))

    def assemble(self) -> bytes:
        places: dict[str, int] = {}
        count = 0
        for item in self._items:
            if isinstance(item, str):
                places[item] = count
            else:
                count += 1
        code, index = b"", 0
        for item in self._items:
            if isinstance(item, str):
                continue
            opcode, true, false, k = item
            jumps = [places[j] - index - 1 if isinstance(j, str) else j for j in (true, false)]
            code += struct.pack("=HBBI", opcode, jumps[0], jumps[1], k)
            index += 1
        return code


def _filter(machine: dict[str, Any]) -> bytes:
    """The filter program for one architecture (see the module docstring for what it refuses)."""
    p = _Program()
    p.op(_LD_W_ABS, _ARCH)
    p.op(_JEQ_K, machine["arch"], 0, "nosys")
    p.op(_LD_W_ABS, _NR)
    if machine["x32"]:
        p.op(_JGE_K, _X32_SYSCALL_BIT, "nosys", 0)
    for name in ("fork", "vfork"):
        if machine[name] is not None:
            p.op(_JEQ_K, machine[name], "again", 0)
    p.op(_JEQ_K, machine["clone3"], "nosys", 0)
    p.op(_JEQ_K, machine["setrlimit"], "perm", 0)
    p.op(_JEQ_K, machine["clone"], "clone", 0)
    p.op(_JEQ_K, machine["prlimit64"], "prlimit", 0)
    p.op(_RET_K, _RET_ALLOW)
    p.label("clone")  # clone(flags, ...): a thread shares everything, a process does not
    p.op(_LD_W_ABS, _arg_low(0))
    p.op(_JSET_K, _CLONE_THREAD, "allow", "again")
    p.label("prlimit")  # prlimit64(pid, resource, new_limit, old_limit): only a read passes
    p.op(_LD_W_ABS, _arg_low(2))
    p.op(_JEQ_K, 0, 0, "perm")
    p.op(_LD_W_ABS, _arg_high(2))
    p.op(_JEQ_K, 0, "allow", "perm")
    p.label("allow")
    p.op(_RET_K, _RET_ALLOW)
    p.label("again")
    p.op(_RET_K, _RET_ERRNO | errno.EAGAIN)
    p.label("perm")
    p.op(_RET_K, _RET_ERRNO | errno.EPERM)
    p.label("nosys")
    p.op(_RET_K, _RET_ERRNO | errno.ENOSYS)
    return p.assemble()


def deny_new_processes() -> None:
    """Install the filter on this process (and everything it later ``exec``s). Raises ``OSError`` when this host
    cannot: the caller decides whether running without it is acceptable."""
    import ctypes

    reason = unsupported_reason()
    if reason is not None:
        raise OSError(errno.ENOSYS, reason)
    program = _filter(_machine() or {})
    buffer = ctypes.create_string_buffer(program, len(program))

    class _Fprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    fprog = _Fprog(len(program) // 8, ctypes.addressof(buffer))
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:  # required to install a filter without CAP_SYS_ADMIN
        raise OSError(ctypes.get_errno(), "prctl(NO_NEW_PRIVS) failed")
    if libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"installing the seccomp filter failed: {os.strerror(code)}")
