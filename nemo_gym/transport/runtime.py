"""How a server process runs: event loop, HTTP protocol, connection pools, garbage collector, listening socket.

Every choice here was measured with ``benchmarks/performance/rollout_overhead`` (weather environment, instant model, 2 cores);
the docstrings say what each one bought. Settings come from the global config, so ``gym env start`` can change them
for every server at once.
"""

from __future__ import annotations

import gc
import importlib.util
import socket
from collections.abc import Callable
from typing import Any

import uvicorn
from pydantic import ValidationError

from nemo_gym.errors import ConfigError
from nemo_gym.transport import types as transport_types
from nemo_gym.transport.admission import AdmissionMiddleware

__all__ = [
    "MAX_ACTIVE_REQUESTS_KEY",
    "CONNECTOR_LIMIT_KEY",
    "CONNECTOR_LIMIT_PER_HOST_KEY",
    "EVENT_LOOP_KEY",
    "GRACEFUL_SHUTDOWN_S",
    "configure_transport",
    "event_loop_choice",
    "http_protocol",
    "inherited_socket",
    "max_active_requests",
    "tune_garbage_collector",
    "uvicorn_config",
    "websocket_protocol",
]

EVENT_LOOP_KEY = "server_event_loop"
"""Global config key: ``auto`` (uvloop where installed), ``uvloop`` or ``asyncio``."""
CONNECTOR_LIMIT_KEY = "global_aiohttp_connector_limit"
"""Global config key (the reference implementation's name): open connections per server process, all destinations."""
CONNECTOR_LIMIT_PER_HOST_KEY = "global_aiohttp_connector_limit_per_host"
"""Global config key (the reference implementation's name): open connections per server process and destination."""
SERVER_CALL_TIMEOUT_KEY = "server_call_timeout_seconds"
"""Deadline of one call from a server to another (``total_timeout_s``; 600 s by default): an agent's ``/run`` under an
environment server lasts a whole rollout, which a small CPU running a local model can stretch past ten minutes."""
MAX_ACTIVE_REQUESTS_KEY = "max_active_requests"
"""Requests from outside the server mesh one server handles at once; the rest wait in arrival order. Set it in a
server instance's block for that server, or as ``server_max_active_requests`` at the top level for every server;
``null``/``0`` there means no bound. Default: the connection-pool size per destination (see ``max_active_requests``)."""
GLOBAL_MAX_ACTIVE_REQUESTS_KEY = f"server_{MAX_ACTIVE_REQUESTS_KEY}"

GRACEFUL_SHUTDOWN_S = 3
"""After SIGTERM, how long in-flight requests may still finish before uvicorn cancels them and the process exits.
Unbounded, an agent waiting on a hung model outlived its launcher by the whole model-call deadline. Shorter than the
launcher's grace period (``SHUTDOWN_GRACE_S``) and the reaper's (``GRACE_S``), so a stop rarely needs SIGKILL."""

GC_GEN0_THRESHOLD = 20_000
"""Allocations between young collections (CPython's default is 700)."""


def event_loop_choice(global_config: Any) -> str:
    """The event loop of a server process.

    uvloop took ~10% off the CPU of a rollout. It once had a bug that matters at high concurrency: a connect cancelled
    by a timeout left the socket object owning a descriptor that libuv had already closed, so a later garbage
    collection closed whatever connection reused that number (uvloop issue 738, the reason the reference
    implementation considered going back to asyncio). uvloop 0.23, the minimum this project installs, detaches the
    socket on that path (tested in ``tests/unit/test_server_runtime.py``). ``server_event_loop: asyncio`` is there
    to rule uvloop out when chasing a problem.
    """
    wanted = str(global_config.get(EVENT_LOOP_KEY) or "auto").lower()
    if wanted not in ("auto", "uvloop", "asyncio"):
        raise ConfigError(f"{EVENT_LOOP_KEY} must be auto, uvloop or asyncio, not {wanted!r}")
    if wanted == "auto":
        return "uvloop" if importlib.util.find_spec("uvloop") is not None else "asyncio"
    if wanted == "uvloop" and importlib.util.find_spec("uvloop") is None:
        raise ConfigError(f"{EVENT_LOOP_KEY}: uvloop is not installed in this server's environment")
    return wanted


def http_protocol() -> str:
    """uvicorn's httptools protocol (a C parser) where httptools is installed, else its pure-Python h11.

    Until issue 36 the servers ran our own protocol on uvicorn's private classes, with each response in one write and
    a shorter request cycle. Measured against plain uvicorn on the rollout benchmark it saved less than the 15% of
    CPU per rollout that would pay for keeping it in step with every uvicorn release (see "Which HTTP server" in
    ``benchmarks/performance/rollout_overhead/README.md``), so uvicorn serves as it ships.
    """
    return "httptools" if importlib.util.find_spec("httptools") is not None else "h11"


def configure_transport(global_config: Any) -> None:
    """Apply the config's connection-pool sizes and call deadline to this process's outgoing calls (see
    ``TransportConfig``)."""
    updates = {}
    fields = ((CONNECTOR_LIMIT_KEY, "limit"), (CONNECTOR_LIMIT_PER_HOST_KEY, "limit_per_host"),
              (SERVER_CALL_TIMEOUT_KEY, "total_timeout_s"))  # fmt: skip
    for key, field in fields:
        value = global_config.get(key)
        if value is not None:
            updates[field] = value
    if not updates:
        return
    current = transport_types.get_default_config()
    try:
        transport_types.set_default_config(
            transport_types.TransportConfig.model_validate(current.model_dump() | updates)
        )
    except ValidationError as e:
        problems = "; ".join(f"{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors())
        raise ConfigError(f"invalid connection setting in the config ({problems})") from e


def max_active_requests(global_config: Any, instance_config: Any = None) -> int | None:
    """How many outside requests (a collector's ``/run``) this server works on at once; ``None``: no bound.

    The default is the connection pool's size per destination (``global_aiohttp_connector_limit_per_host``, 1024):
    a rollout holds at most one outgoing call at a time, so more rollouts than that could only wait for a
    connection, holding their parsed bodies and FastAPI's per-request state while they do. Waiting at the door
    instead costs a few KB each. Raising the pool size raises this bound with it.
    """
    value: Any = getattr(instance_config, MAX_ACTIVE_REQUESTS_KEY, None) if instance_config is not None else None
    where = f"{MAX_ACTIVE_REQUESTS_KEY} of server {getattr(instance_config, 'name', '') or '(unnamed)'!r}"
    if value is None and GLOBAL_MAX_ACTIVE_REQUESTS_KEY in global_config:
        value = global_config.get(GLOBAL_MAX_ACTIVE_REQUESTS_KEY)
        where = GLOBAL_MAX_ACTIVE_REQUESTS_KEY
        if value is None:
            return None
    if value is None:
        return transport_types.get_default_config().limit_per_host
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"{where} must be a whole number of requests (0 or null: no bound), not {value!r}")
    return value or None


def tune_garbage_collector(gen0_threshold: int = GC_GEN0_THRESHOLD) -> None:
    """Keep Python's cyclic garbage collector from dominating a busy server; call once, after startup.

    With a thousand rollouts in flight their objects outlive the young collections, so with the default thresholds
    the agent ran a collection every ~700 allocations plus full collections that walk every object of the process,
    the ~130k objects of the imported libraries included: more time than it spent serving requests. Freezing what
    exists after startup takes those objects out of every collection, and a larger first threshold means fewer
    collections of the rest. Together: CPU per rollout -30%. Reference cycles are still collected.
    """
    gc.collect()
    gc.freeze()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(gen0_threshold, gen1, gen2)


def websocket_protocol(app: Any) -> str:
    """``"none"`` for an app whose routes are all plain HTTP routes, else uvicorn's ``"auto"``.

    uvicorn's default loads the ``websockets`` library into every server (~1.5 MB of RSS each) to answer upgrades
    that no route here accepts. Any WebSocket route, or any route whose kind cannot be seen (a mounted ASGI app that
    is not a router, a host route), keeps the default.
    """
    return "none" if _only_http_routes(getattr(app, "routes", None)) else "auto"


def _only_http_routes(routes: Any) -> bool:
    from starlette.routing import Mount, Route

    if routes is None:
        return False
    for route in routes:
        if isinstance(route, Mount):
            if not _only_http_routes(getattr(route.app, "routes", None)):
                return False
        elif not isinstance(route, Route):
            return False
    return True


def uvicorn_config(
    app: Any,
    host: str,
    port: int,
    global_config: Any,
    max_active: int | None = None,
    outer: Callable[[Any], Any] | None = None,
) -> uvicorn.Config:
    """uvicorn settings shared by every server; ``max_active`` bounds the outside requests handled at once, and
    ``outer`` wraps the whole (the access checks, so a refused request never waits for admission)."""
    ws = websocket_protocol(app)
    app = AdmissionMiddleware(app, max_active) if max_active else app
    return uvicorn.Config(
        outer(app) if outer is not None else app,
        loop=event_loop_choice(global_config),
        http=http_protocol(),
        ws=ws,
        host=host,
        port=port,
        log_level="debug" if global_config.get("verbose") else "info",
        access_log=bool(global_config.get("uvicorn_access_log", False)),
        # Longer than the client pool's keep-alive (4 s), so the client always drops an idle connection first.
        timeout_keep_alive=30,
        # Thousands of rollouts can connect in one burst; the kernel caps this at net.core.somaxconn.
        backlog=4096,
        # Servers talk to each other directly; no proxy's X-Forwarded-* headers to trust, so skip that layer.
        proxy_headers=False,
        lifespan="on",
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
    )


def inherited_socket(fd: int) -> socket.socket:
    """The listening socket a launcher handed down as a descriptor.

    Not uvicorn's ``fd=``: that wraps the descriptor as AF_UNIX, so the event loop treats every accepted TCP
    connection as a Unix one and never sets TCP_NODELAY on it. Responses go out in two writes, and Nagle's algorithm
    then holds the second until the client's delayed ACK (~40 ms): at low concurrency that was most of a request's
    latency. ``socket(fileno=)`` asks the kernel for the real family.
    """
    return socket.socket(fileno=fd)
