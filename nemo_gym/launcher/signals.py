"""How the launcher's process treats SIGINT and SIGTERM: both stop the servers in order, and a second one hurries."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any

__all__ = ["second_signal_forces", "sigterm_as_interrupt"]


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM takes the same orderly-shutdown path as Ctrl-C (a KeyboardInterrupt), instead of killing this process
    before it stops the servers and deletes their config file. Only where SIGTERM has its default action: a handler
    someone else installed is kept."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
        yield
        return
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def second_signal_forces(force: threading.Event) -> Iterator[None]:
    """While shutting down, Ctrl-C / SIGTERM again skips the grace period instead of interrupting the cleanup."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        force.set()

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
