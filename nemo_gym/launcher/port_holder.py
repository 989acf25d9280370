"""Which process listens on a TCP port, so a port clash names its holder instead of guessing it is a gym run.

Linux only, from ``/proc`` (``/proc/net/tcp*`` gives the listening socket's inode, ``/proc/<pid>/fd`` the process
that holds it); anywhere else, or for another user's process, nothing is found and the caller says so.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

_LISTEN = "0A"
"""The ``st`` column of a listening socket in ``/proc/net/tcp``."""

_GYM_MARKERS = ("nemo_gym", "/gym ", "/ng ")
"""What a gym command's command line contains (``python -m nemo_gym.cli.main``, ``.../bin/gym env start``)."""


@dataclass(frozen=True)
class PortHolder:
    """A process listening on the port a server wanted, as ``/proc`` shows it."""

    pid: int
    command: str

    @property
    def is_gym(self) -> bool:
        line = f"{self.command} "
        return any(marker in line for marker in _GYM_MARKERS) or line.startswith(("gym ", "ng "))


def port_holder(port: int, proc: Path = Path("/proc")) -> PortHolder | None:
    """The process listening on ``port`` (any address), or None when it cannot be found."""
    inodes = _listening_inodes(port, proc)
    if not inodes:
        return None
    sockets = {f"socket:[{inode}]" for inode in inodes}
    for entry in proc.iterdir():
        if entry.name.isdigit() and not sockets.isdisjoint(_fd_targets(entry)):
            return PortHolder(int(entry.name), _command_of(entry))
    return None


def _fd_targets(entry: Path) -> set[str]:
    """What a process's descriptors point at; empty for another user's process or one gone meanwhile."""
    targets = set()
    try:
        fds = list((entry / "fd").iterdir())
    except OSError:
        return set()
    for fd in fds:
        try:
            targets.add(os.readlink(fd))
        except OSError:  # closed meanwhile (the listing's own descriptor, in this process)
            continue
    return targets


def _listening_inodes(port: int, proc: Path) -> set[str]:
    inodes: set[str] = set()
    for table in ("tcp", "tcp6"):
        try:
            lines = (proc / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 9 and fields[3] == _LISTEN and int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(fields[9])
    return inodes


def _command_of(entry: Path) -> str:
    try:
        parts = (entry / "cmdline").read_bytes().split(b"\0")
    except OSError:
        return "?"
    return " ".join(part.decode(errors="replace") for part in parts if part) or "?"


def describe_holder(port: int, proc: Path = Path("/proc")) -> str:
    """How a clash on ``port`` is told: the holder and whether it is a gym run, or that it could not be found."""
    holder = port_holder(port, proc)
    if holder is None:
        return (
            "held by a process this user cannot see (not a gym run of this user, or not on this machine's /proc), "
            "e.g. `ss -ltnp 'sport = :" + str(port) + "'` as root names it"
        )
    command = holder.command if len(holder.command) <= 80 else holder.command[:77] + "..."
    if holder.is_gym:
        return f"held by another gym run (pid {holder.pid}: {command}; see `gym env status`)"
    return f"held by pid {holder.pid} ({command}), which is not a gym server"
