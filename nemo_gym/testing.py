"""Test helpers for server authors: a scripted upstream engine and any ASGI app, each on a real loopback socket.

Both run in their own thread with their own event loop, so sync tests (the official ``openai`` client) and async
tests (httpx against the ASGI app) can use them alike without the test's loop having to serve anything.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import uvicorn
from aiohttp import web

from nemo_gym.servers import http_client

Reply = tuple[int, Any]
"""(HTTP status, JSON body); a ``str`` body is sent as plain text."""


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    json: Any


class FakeUpstream:
    """An HTTP server on 127.0.0.1 that records every request and answers with ``responder(path, json)``."""

    def __init__(self, responder: Callable[[str, Any], Reply] | None = None, delay_s: float = 0.0) -> None:
        self.responder: Callable[[str, Any], Reply] = responder or (lambda path, body: (404, {"error": path}))
        self.delay_s = delay_s
        self.received: list[Received] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()

    @property
    def url(self) -> str:
        """The API root a client would configure (``/v1`` included, as OpenAI-compatible engines serve it)."""
        return f"http://127.0.0.1:{self.port}/v1"

    def bodies(self, path: str) -> list[Any]:
        return [item.json for item in self.received if item.path == path]

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        body = await request.json() if raw else None
        self.received.append(Received(request.path, dict(request.headers), body))
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
            status, reply = self.responder(request.path, body)
        finally:
            self.in_flight -= 1
        if isinstance(reply, str):
            return web.Response(status=status, text=reply)
        return web.json_response(reply, status=status)

    def start(self) -> FakeUpstream:
        self._thread = threading.Thread(target=self._serve, name="fake-upstream", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout=10):
            raise RuntimeError("fake upstream did not start within 10 s")
        return self

    def _serve(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        runner = web.AppRunner(app, access_log=None)
        loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, "127.0.0.1", 0)
        loop.run_until_complete(site.start())
        self.port = site._server.sockets[0].getsockname()[1]
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            loop.run_until_complete(runner.cleanup())
            loop.close()

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)


@contextlib.contextmanager
def serve_in_thread(app: Any) -> Iterator[str]:
    """Run an ASGI app under uvicorn on 127.0.0.1 (a free port) and yield its base URL."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))

    def run() -> None:
        # Like server.run(), plus closing the pooled upstream session this loop's requests opened.
        loop = asyncio.new_event_loop()
        try:
            loop.run_until_complete(server.serve(sockets=[sock]))
            loop.run_until_complete(http_client.close_session())
        finally:
            loop.close()

    thread = threading.Thread(target=run, name="model-server", daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("model server did not start within 10 s")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()
