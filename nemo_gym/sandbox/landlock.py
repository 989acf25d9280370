"""Landlock: let a process read a few paths, write under a few others, and (optionally) open no TCP connection.

Shared by the ``local`` sandbox provider and ``resources_servers/code_gen``. Standard library only and free of package
imports, because both load it *by file path* in a child interpreter started with ``python -I -S`` (nothing of the
package needs to be importable there) before that child runs anything untrusted.

Run as a script it is the ``local`` provider's launcher: ``python -I -S -B landlock.py CONFIG.json`` (a file, so a
long command does not hit the kernel's limit on one argument) sets the resource limits, restricts itself and ``exec``s ``config["argv"]``; the restriction is inherited by everything the
command starts. Exit code ``LAUNCH_FAILED`` means the restriction could not be set up (the reason is on stderr).

Rights (``linux/landlock.h``): a read path gets execute/read-file/read-dir; a write path gets every right the kernel
handles. With ABI >= 4 TCP bind and connect are denied unless allowed; with ABI >= 6 signals and abstract Unix sockets
cannot reach processes outside the restricted set.
"""

import json
import os
import sys
from typing import Any

__all__ = ["LAUNCH_FAILED", "SYS_CREATE_RULESET", "abi", "restrict"]

LAUNCH_FAILED = 125
"""Exit code of the launcher when the restriction or the ``exec`` failed (the command never ran)."""

_EXECUTE, _WRITE_FILE, _READ_FILE, _READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
_TRUNCATE, _IOCTL_DEV = 1 << 14, 1 << 15
_FILE_RIGHTS = _EXECUTE | _WRITE_FILE | _READ_FILE | _TRUNCATE | _IOCTL_DEV
_READ_ONLY = _EXECUTE | _READ_FILE | _READ_DIR
SYS_CREATE_RULESET, _SYS_ADD_RULE, _SYS_RESTRICT_SELF = 444, 445, 446
_PR_SET_NO_NEW_PRIVS = 38
_RULESET_VERSION_FLAG = 1
_RULE_PATH_BENEATH = 1


def _libc() -> Any:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return libc


def abi() -> int:
    """The kernel's Landlock ABI version: 0 when Landlock is missing, disabled, or this is not Linux."""
    if not sys.platform.startswith("linux"):
        return 0
    try:
        return max(int(_libc().syscall(SYS_CREATE_RULESET, None, 0, _RULESET_VERSION_FLAG)), 0)
    except (OSError, AttributeError):
        return 0


def restrict(read_paths: list[str], write_paths: list[str], *, deny_tcp: bool = True) -> int:
    """Restrict this process (and all it starts) to reading ``read_paths`` and changing anything under
    ``write_paths``. Returns the ABI used; raises ``OSError`` when the kernel has no Landlock or a step fails."""
    import ctypes
    import struct

    libc = _libc()
    version = libc.syscall(SYS_CREATE_RULESET, None, 0, _RULESET_VERSION_FLAG)
    if version < 1:
        raise OSError(ctypes.get_errno(), "Landlock is not available")
    handled_fs = (1 << 13) - 1  # ABI 1: execute .. make_sym
    handled_fs |= (1 << 13) if version >= 2 else 0  # refer
    handled_fs |= _TRUNCATE if version >= 3 else 0
    handled_fs |= _IOCTL_DEV if version >= 5 else 0
    handled_net = 0b11 if version >= 4 and deny_tcp else 0  # bind_tcp, connect_tcp: no rule allows either
    scoped = 0b11 if version >= 6 else 0  # abstract unix sockets and signals stay inside
    attr = struct.pack("=QQQ", handled_fs, handled_net, scoped)[: 8 if version < 4 else 16 if version < 6 else 24]
    attr_buffer = ctypes.create_string_buffer(attr, len(attr))
    ruleset = libc.syscall(SYS_CREATE_RULESET, attr_buffer, len(attr), 0)
    if ruleset < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset failed")
    try:
        rules = [(path, _READ_ONLY) for path in read_paths] + [(path, handled_fs) for path in write_paths]
        for path, access in rules:
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue  # a path that does not exist here needs no rule
            try:
                if not os.path.isdir(path):
                    access &= _FILE_RIGHTS
                rule = ctypes.create_string_buffer(struct.pack("=Qi", access & handled_fs, fd), 12)
                if libc.syscall(_SYS_ADD_RULE, ruleset, _RULE_PATH_BENEATH, rule, 0) < 0:
                    raise OSError(ctypes.get_errno(), f"landlock_add_rule failed for {path}")
            finally:
                os.close(fd)
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(NO_NEW_PRIVS) failed")
        if libc.syscall(_SYS_RESTRICT_SELF, ruleset, 0) < 0:
            raise OSError(ctypes.get_errno(), "landlock_restrict_self failed")
    finally:
        os.close(ruleset)
    return int(version)


def _launch(config: dict[str, Any]) -> None:
    """The launcher: limits, then the restriction (``mode`` "required" fails without it), then ``exec``."""
    import resource

    if config.get("memory_bytes"):
        resource.setrlimit(resource.RLIMIT_AS, (config["memory_bytes"], config["memory_bytes"]))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if config["mode"] != "off":
        try:
            restrict(config["read_paths"], config["write_paths"], deny_tcp=config["deny_tcp"])
        except OSError as e:
            if config["mode"] == "required":
                raise
            os.write(2, f"sandbox: landlock not applied ({e})\n".encode())
    os.execve(config["argv"][0], config["argv"], os.environ)


if __name__ == "__main__":
    try:
        with open(sys.argv[1], encoding="utf-8") as config_file:
            _launch(json.load(config_file))
    except BaseException as error:  # the restriction or the exec failed: the command never ran
        os.write(2, f"sandbox: could not start the command: {type(error).__name__}: {error}\n".encode())
    os._exit(LAUNCH_FAILED)
