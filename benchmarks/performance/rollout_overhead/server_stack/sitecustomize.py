"""Serve each launched server of the benchmark's stack with another HTTP server (``run.py --stack``).

Python imports ``sitecustomize`` at start-up from the first folder on ``sys.path`` that has one; ``run.py`` puts this
folder on the servers' ``PYTHONPATH`` and names the stack in ``ROLLOUT_BENCH_SERVER_STACK``. Only a process the
launcher started on a listening socket (``NEMO_GYM_LISTEN_FD``) is changed, so the collect command and anything else
that inherits the variables runs as it always does. The app, its middleware and the socket address stay the
framework's; only the object that reads and writes HTTP changes:

* ``fast``: the servers unchanged, as they served before issue 36 switched them to plain uvicorn: our own protocol
  on uvicorn (``transport/server_protocol.py``); a checkout without it refuses to start;
* ``uvicorn``: uvicorn's own httptools protocol, as uvicorn ships it;
* ``granian``: granian's embedded server (``pip install granian`` in the venv first; never a dependency), ASGI with
  lifespan, HTTP/1.1, one worker on this process's event loop. It binds the address itself, so the inherited socket
  is closed first, and it serves TCP alone: run it with ``+server_unix_socket=false`` (``run.py`` does).
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import os
import signal
from collections.abc import Callable
from typing import Any

STACK_ENV = "ROLLOUT_BENCH_SERVER_STACK"
_LISTEN_FD_ENV = "NEMO_GYM_LISTEN_FD"


def _serve_with_granian(server: Any, sockets: list[Any] | None = None) -> None:
    constants = importlib.import_module("granian.constants")  # not installed unless this stack is measured
    embed = importlib.import_module("granian.server.embed")

    config = server.config
    host, port = config.host, config.port
    if sockets:
        host, port = sockets[0].getsockname()[:2]
        for sock in sockets:
            sock.close()
    embedded = embed.Server(
        config.app,
        address=host,
        port=port,
        interface=constants.Interfaces.ASGI,
        http=constants.HTTPModes.http1,
        websockets=False,
        backlog=config.backlog,
        log_access=False,
    )

    async def serve() -> None:
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, embedded.stop)
        await embedded.serve()

    if config.loop == "uvloop":
        import uvloop

        uvloop.run(serve())
    else:
        asyncio.run(serve())


def _install(stack: str) -> None:
    import uvicorn

    original = uvicorn.Server.run

    def run_plain_uvicorn(self: Any, sockets: list[Any] | None = None) -> None:
        self.config.http = "httptools"
        original(self, sockets=sockets)

    runners: dict[str, Callable[..., None]] = {"uvicorn": run_plain_uvicorn, "granian": _serve_with_granian}
    if stack in runners:
        uvicorn.Server.run = runners[stack]  # type: ignore[method-assign]
    elif stack == "fast":
        # The servers as they were until the fast path was deleted: measure it from a checkout that has it.
        if importlib.util.find_spec("nemo_gym.transport.server_protocol") is None:
            raise SystemExit("--stack fast: this checkout has no fast path (nemo_gym/transport/server_protocol.py)")
    else:
        raise SystemExit(f"{STACK_ENV} must be fast, uvicorn or granian, not {stack!r}")


if os.environ.get(_LISTEN_FD_ENV) and os.environ.get(STACK_ENV):
    _install(os.environ[STACK_ENV])
