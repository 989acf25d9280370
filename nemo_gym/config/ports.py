"""Race-free ports for server instances.

The reference implementation probes a port by binding and releasing it, then lets the child bind it later: another
process can take it in between. Here the parent binds a listening socket and *keeps it open*; the launcher hands that
socket to the child process (``pass_fds``), which serves on it directly. The port is never free in between, so two
launches on one host cannot collide.
"""

from __future__ import annotations

import random
import socket
from collections.abc import Collection
from dataclasses import dataclass

from nemo_gym.errors import ConfigError

LISTEN_FD_ENV_VAR = "NEMO_GYM_LISTEN_FD"
"""Environment variable through which a child server learns the file descriptor of its inherited socket."""
DEFAULT_PORT_RANGE: tuple[int, int] = (10001, 20000)
"""Ports picked from when a config sets ``port_range_low`` / ``port_range_high`` only partly (or for
:func:`probe_free_port` when it sets neither)."""


@dataclass
class PortReservation:
    """A listening socket held open until a server process takes it over."""

    host: str
    port: int
    socket: socket.socket

    def fileno(self) -> int:
        return self.socket.fileno()

    def close(self) -> None:
        self.socket.close()


_reservations: dict[str, PortReservation] = {}


def reserve_port(
    name: str,
    host: str,
    port: int | None = None,
    port_range: tuple[int, int] | None = None,
    disallowed: set[int] | frozenset[int] = frozenset(),
) -> PortReservation:
    """Bind (and listen on) a port for server ``name``; the socket stays open in this process.

    ``port`` given: that exact port, with an error naming the server if it is taken. Otherwise a port from
    ``port_range`` (random order) or, without a range, one the OS picks.
    """
    if name in _reservations:
        return _reservations[name]
    if port:
        candidates = [port]
    elif port_range:
        low, high = port_range
        candidates = random.sample(range(low, high + 1), k=min(200, high - low + 1))
    else:
        candidates = [0]
    last_error: OSError | None = None
    for candidate in candidates:
        if candidate and candidate in disallowed and not port:
            continue
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, candidate))
            sock.listen(2048)
        except OSError as e:
            sock.close()
            last_error = e
            continue
        sock.set_inheritable(True)
        reservation = PortReservation(host, sock.getsockname()[1], sock)
        _reservations[name] = reservation
        return reservation
    if port:
        raise ConfigError(f"server {name!r}: cannot listen on {host}:{port} ({last_error}); pick another port")
    raise ConfigError(f"server {name!r}: no free port on {host} in range {port_range} ({last_error})")


def get_reservation(name: str) -> PortReservation | None:
    return _reservations.get(name)


def release(name: str) -> None:
    """Close the socket held for ``name`` (a restarted server's child has taken it)."""
    reservation = _reservations.pop(name, None)
    if reservation is not None:
        reservation.close()


def release_all() -> None:
    """Close every held socket (after the children have taken them, or on shutdown)."""
    for reservation in _reservations.values():
        reservation.close()
    _reservations.clear()


def probe_free_port(
    port_range: tuple[int, int] = DEFAULT_PORT_RANGE, disallowed: Collection[int] = (), attempts: int = 50
) -> int:
    """A port in ``port_range`` that nothing listens on right now, for a process this one does not start itself
    (a model engine launched by a model server). Unlike :func:`reserve_port` nothing is held: it may be taken
    before that process binds it."""
    low, high = port_range
    allowed = [port for port in range(low, high + 1) if port not in disallowed]
    last_error: OSError | None = None
    for port in random.sample(allowed, k=min(attempts, len(allowed))):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("", port))
            except OSError as e:
                last_error = e
                continue
        return port
    raise ConfigError(
        f"no free port in range {low}-{high} after {min(attempts, len(allowed))} tries ({last_error}); "
        "widen port_range_low / port_range_high"
    )
