"""The destination label of the outgoing request in flight: which named server a pooled connection is for.

NeMo Gym 0.7 labels its connection-pool metrics with it. Our pool keeps no per-destination metrics, so nothing here
reads the label; it is kept for code that sets it around a call (:func:`destination`) or checks it, and is
``"external"`` whenever no call set it. A context variable, so concurrent calls each see their own.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar, Token

__all__ = ["EXTERNAL", "current_server_name", "destination", "reset_server_name", "set_server_name"]

EXTERNAL = "external"
"""The label of a request to no named server of the run."""

_SERVER_NAME: ContextVar[str] = ContextVar("nemo_gym_http_server_name", default=EXTERNAL)


def set_server_name(server_name: str) -> Token[str]:
    """Label the requests of this context (a call and its retries) until :func:`reset_server_name`."""
    return _SERVER_NAME.set(server_name)


def reset_server_name(token: Token[str]) -> None:
    _SERVER_NAME.reset(token)


def current_server_name() -> str:
    return _SERVER_NAME.get()


@contextmanager
def destination(server_name: str | None) -> Iterator[None]:
    """Label the requests made inside the block (``None``: external)."""
    token = set_server_name(server_name or EXTERNAL)
    try:
        yield
    finally:
        reset_server_name(token)
