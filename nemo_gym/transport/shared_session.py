"""NeMo Gym 0.7's "global aiohttp client", mapped onto our per-loop pooled sessions.

NeMo Gym keeps one ``aiohttp.ClientSession`` per process, made by ``set_global_aiohttp_client(cfg)`` from a
:class:`GlobalAIOHTTPAsyncClientConfig`. Ours keeps one per event loop (:mod:`nemo_gym.transport.http_client`), since a
session is bound to the loop that made it. Here the 0.7 config is turned into our :class:`TransportConfig`, and the
session "set" is the running loop's own pooled session, so the calls of :class:`~nemo_gym.server_utils.ServerClient`
and of ``get_global_aiohttp_client()`` share it. The state itself (which session is "the global one") lives on
``nemo_gym.server_utils``, where NeMo Gym's tests set and read it.
"""

from __future__ import annotations

import asyncio
import logging
import warnings
from typing import Any

from pydantic import BaseModel, Field

from nemo_gym.transport.types import TransportConfig, get_default_config, set_default_config

__all__ = [
    "UNBOUNDED_CONNECTIONS",
    "GlobalAIOHTTPAsyncClientConfig",
    "apply_client_config",
    "close_anywhere",
    "running_loop_session",
    "usable_here",
]

logger = logging.getLogger(__name__)

UNBOUNDED_CONNECTIONS = 1 << 20
"""What a limit of 0 ("no limit" in NeMo Gym's config) becomes: our pool always has a bound."""


class GlobalAIOHTTPAsyncClientConfig(BaseModel):
    """NeMo Gym's settings of the process's HTTP client, under the top-level config keys it reads them from.

    Extra keys are ignored, so the whole global config can be validated into it, as NeMo Gym does.
    """

    global_aiohttp_connector_limit: int = Field(default=100 * 1024, ge=0)
    """Open connections in all; 0: no limit."""
    global_aiohttp_connector_limit_per_host: int = Field(default=1024, ge=0)
    """Open connections to one destination; 0: no limit."""
    global_aiohttp_intended_concurrency: int | None = Field(default=None, gt=0)
    """Requests the run expects at once (NeMo Gym warns when the pool is smaller); informational here."""
    global_aiohttp_intended_concurrency_per_host: int | None = Field(default=None, gt=0)
    """The same, per destination; informational here."""
    global_aiohttp_client_request_debug: bool = False
    """Print full request and response details of failed calls."""
    global_aiohttp_tcp_keepalive_idle_seconds: int = Field(default=60, ge=1, le=32767)
    """Idle seconds before the kernel probes a silent connection."""
    global_aiohttp_tcp_keepalive_interval_seconds: int = Field(default=10, ge=1, le=32767)
    """Seconds between keep-alive probes."""
    global_aiohttp_tcp_keepalive_probes: int = Field(default=3, ge=1, le=127)
    """Unanswered probes before the connection is dropped."""


def apply_client_config(cfg: GlobalAIOHTTPAsyncClientConfig) -> TransportConfig:
    """Make ``cfg``'s pool sizes and keep-alive settings the process default; sessions made after this use them."""
    limit = cfg.global_aiohttp_connector_limit or UNBOUNDED_CONNECTIONS
    per_host = cfg.global_aiohttp_connector_limit_per_host or limit
    updated = get_default_config().model_copy(
        update={
            "limit": limit,
            "limit_per_host": min(per_host, limit),
            "tcp_keepalive_idle_s": cfg.global_aiohttp_tcp_keepalive_idle_seconds,
            "tcp_keepalive_interval_s": cfg.global_aiohttp_tcp_keepalive_interval_seconds,
            "tcp_keepalive_count": cfg.global_aiohttp_tcp_keepalive_probes,
        }
    )
    set_default_config(updated)
    return updated


def running_loop_session() -> Any:
    """The running loop's pooled session (made now, with the current defaults, if it has none); ``None`` outside a
    running loop, where a session could not be used anyway: each loop makes its own on first use."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return None
    from nemo_gym.transport.http_client import get_session

    return get_session()


def usable_here(session: Any) -> bool:
    """Whether ``session`` can carry a request made now: open, and bound to the running loop. Anything that is not an
    aiohttp session (a test's stand-in) is taken as it is."""
    import aiohttp

    if not isinstance(session, aiohttp.ClientSession):
        return True
    if session.closed:
        return False
    try:
        return _loop_of(session) is asyncio.get_running_loop()
    except RuntimeError:
        return False


def close_anywhere(session: Any) -> None:
    """Close ``session`` from synchronous code: at once when its loop is idle, scheduled when it is the running one.
    A session whose loop is gone needs nothing: its sockets went with the loop."""
    import aiohttp

    if not isinstance(session, aiohttp.ClientSession) or session.closed:
        return
    loop = _loop_of(session)
    if loop is None or loop.is_closed():
        return
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        loop.create_task(session.close())
    elif not loop.is_running():
        loop.run_until_complete(session.close())
    else:  # running in another thread
        asyncio.run_coroutine_threadsafe(session.close(), loop)


def _loop_of(session: Any) -> asyncio.AbstractEventLoop | None:
    """The loop ``session`` belongs to: ours are registered per loop; another one is asked through its public
    ``loop`` property, which aiohttp deprecated but still answers (its warning is not the caller's business)."""
    from nemo_gym.transport.http_client import _sessions

    for loop, pooled in list(_sessions.items()):
        if pooled is session:
            return loop
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        own: Any = getattr(session, "loop", None)
    return own if isinstance(own, asyncio.AbstractEventLoop) else None
