"""Removes a server's containers when the server dies without removing them itself (SIGKILL, a crash, OOM).

The ``docker`` provider starts one of these per provider, in its own session, with a pipe for stdin, the first time it
creates a container, and labels every container it makes with an owner id. The provider removes its containers itself
on every path it lives through and then writes ``done``: the watchdog exits touching nothing. EOF before ``done``
means the provider's process is gone: the watchdog removes every container labelled with that owner id and exits.
It detaches at once (a second fork: the provider's child exits and the watchdog is nobody's descendant), so a launcher
that stops a server's whole process tree does not stop the cleanup with it; SIGTERM and SIGINT are ignored for the
same reason. It only reads its pipe and runs the runtime's CLI.

Run as ``python watchdog.py RUNTIME_BINARY OWNER_LABEL`` (a path, not ``-m``: importing ``nemo_gym`` would cost a
second of CPU); standard library only.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

DONE = "done"
REMOVE_TIMEOUT_S = 60.0


def remove_labelled(binary: str, label: str) -> None:
    """Force-remove every container (running or not) that carries ``label`` (``key=value``)."""
    listed = subprocess.run(
        [binary, "ps", "-aq", "--filter", f"label={label}"],
        capture_output=True,
        text=True,
        timeout=REMOVE_TIMEOUT_S,
        check=False,
    )
    ids = listed.stdout.split()
    if ids:
        force = ["-f", "-t", "0"] if binary.endswith("podman") else ["-f"]
        subprocess.run([binary, "rm", *force, *ids], capture_output=True, timeout=REMOVE_TIMEOUT_S, check=False)


def main(argv: list[str]) -> int:
    binary, label = argv[1], argv[2]
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if os.fork() > 0:
        os._exit(0)
    for line in sys.stdin:
        if line.strip() == DONE:
            return 0
    remove_labelled(binary, label)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
