"""The servers' HTTP protocol answers byte for byte as uvicorn's own does (the date header aside).

Every scenario is replayed over a raw socket against two servers running the same app: one with uvicorn's stock
``HttpToolsProtocol``, one with ours (``CoalescingHttpToolsProtocol`` and its ``FastCycle``). Write boundaries differ
by design (ours sends a head and its body in one write); the bytes must not.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from nemo_gym.errors import LaunchError
from nemo_gym.transport import runtime, server_cycle
from nemo_gym.transport.server_cycle import FastCycle, RequestEvent, check_uvicorn_internals
from nemo_gym.transport.server_protocol import CoalescingHttpToolsProtocol, _IdleSweeper

pytestmark = pytest.mark.timeout(120)

GUARD_S = 60
"""Deadline of every read: a hang guard only, never reached by a passing test."""


# --------------------------------------------------------------------------------------------------------------------
# The app both servers run


class Gate:
    """Lets a test hold a request inside the app (``/slow``) and see that it got there."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.release = asyncio.Event()


def make_app(gate: Gate) -> Any:
    async def echo(request: Request) -> Response:
        body = await request.body()
        response = Response(body, media_type="application/octet-stream")
        response.set_cookie("session", "abc")
        return response

    async def json(request: Request) -> Response:
        return JSONResponse({"ok": True, "query": request.url.query, "path": request.url.path})

    async def stream(request: Request) -> Response:
        async def chunks() -> AsyncIterator[bytes]:
            yield b"first,"
            yield b"second"

        return StreamingResponse(chunks(), media_type="text/plain")

    async def bad_header(request: Request) -> Response:
        return Response(b"x", headers={"x-bad": "a\nb"})

    async def slow(request: Request) -> Response:
        gate.entered.set()
        await gate.release.wait()
        return JSONResponse({"slow": True})

    routes = [
        Route("/echo", echo, methods=["POST"]),
        Route("/json", json, methods=["GET"]),  # Starlette answers HEAD for it too
        Route("/stream", stream),
        Route("/bad-header", bad_header),
        Route("/slow", slow),
    ]
    starlette_app = Starlette(routes=routes)

    async def app(scope: Any, receive: Any, send: Any) -> None:
        path = scope.get("path", "")
        if scope["type"] == "http" and path.startswith("/raw/"):
            await raw(path[5:], receive, send)
        else:
            await starlette_app(scope, receive, send)

    return app


RAW_CASES: dict[str, tuple[list[tuple[bytes, bytes]], list[tuple[bytes, bool]]]] = {
    # name: (response headers, body parts as (bytes, more_body))
    "no-length": ([(b"content-type", b"text/plain")], [(b"abc", False)]),
    "upper": ([(b"Content-Length", b"3"), (b"X-Thing", b"Value")], [(b"abc", False)]),
    "close": ([(b"content-length", b"3"), (b"Connection", b"close")], [(b"abc", False)]),
    "two-parts": ([(b"content-length", b"6")], [(b"abc", True), (b"def", False)]),
    "short": ([(b"content-length", b"5")], [(b"abc", False)]),
    "long": ([(b"content-length", b"2")], [(b"abc", False)]),
    "bad-length": ([(b"content-length", b"x")], [(b"abc", False)]),
    "two-lengths": ([(b"content-length", b"3"), (b"content-length", b"4")], [(b"abc", False)]),
    "chunked": ([(b"transfer-encoding", b"chunked")], [(b"abc", True), (b"", False)]),
    "no-content": ([(b"content-length", b"0")], [(b"", False)]),
    "bad-name": ([(b"content-length", b"3"), (b"x y", b"1")], [(b"abc", False)]),
    "empty-body-message": ([(b"content-length", b"3")], [(b"", True), (b"abc", False)]),
}


async def raw(case: str, receive: Any, send: Any) -> None:
    """Responses no well-behaved framework sends, to reach every branch of the general path."""
    while (await receive()).get("more_body"):
        pass
    headers, parts = RAW_CASES[case]
    status = 204 if case == "no-content" else 200
    await send({"type": "http.response.start", "status": status, "headers": headers})
    for body, more in parts:
        await send({"type": "http.response.body", "body": body, "more_body": more})


# --------------------------------------------------------------------------------------------------------------------
# Servers and a raw client


@contextlib.asynccontextmanager
async def serving(protocol: Any, gate: Gate, keep_alive_s: float = 30) -> AsyncIterator[tuple[int, uvicorn.Server]]:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    config = runtime.uvicorn_config(make_app(gate), "127.0.0.1", 0, {"server_event_loop": "asyncio"})
    config.http = protocol
    config.timeout_keep_alive = keep_alive_s  # type: ignore[assignment]
    config.log_level = "critical"
    config.lifespan = "off"
    config.timeout_graceful_shutdown = None  # a request held at shutdown waits for the test, however slow the box
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[listener]))
    while not server.started:  # pytest's timeout guards a hang
        if task.done():
            task.result()
            raise RuntimeError("uvicorn exited before it started serving")
        await asyncio.sleep(0.01)
    try:
        yield listener.getsockname()[1], server
    finally:
        gate.release.set()
        server.should_exit = True
        await task
        listener.close()


class RawClient:
    """Reads whole HTTP/1.1 responses, exactly as they arrived, from one connection."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.seen = bytearray()

    async def _read(self, coroutine: Any) -> bytes:
        data = await asyncio.wait_for(coroutine, GUARD_S)
        self.seen += data
        return bytes(data)

    async def response(self, head_request: bool = False) -> None:
        """One response; an interim ``100 Continue`` counts as one."""
        head = await self._read(self.reader.readuntil(b"\r\n\r\n"))
        status = int(head.split(b" ", 2)[1])
        fields: dict[bytes, bytes] = {}
        for line in head.split(b"\r\n")[1:]:
            if line:
                name, value = line.lower().split(b": ", 1)
                fields.setdefault(name, value)  # the first Content-Length is the one that counts
        if head_request or status in (100, 204, 304):
            return
        if b"content-length" in fields:
            await self._read(self.reader.readexactly(int(fields[b"content-length"])))
        elif fields.get(b"transfer-encoding") == b"chunked":
            while True:
                size_line = await self._read(self.reader.readuntil(b"\r\n"))
                size = int(size_line.strip(), 16)
                await self._read(self.reader.readexactly(size + 2))
                if size == 0:
                    return
        else:
            await self.eof()

    async def eof(self) -> None:
        """Everything up to the server's close."""
        await self._read(self.reader.read())

    def send(self, data: bytes) -> None:
        self.writer.write(data)


def request(
    method: str = "GET", path: str = "/json", body: bytes | None = None, *extra: str, version: str = "1.1"
) -> bytes:
    lines = [f"{method} {path} HTTP/{version}", "host: 127.0.0.1"]
    if body is not None:
        lines.append(f"content-length: {len(body)}")
    lines.extend(extra)
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + (body or b"")


Step = tuple[str, Any]

SCENARIOS: dict[str, list[Step]] = {
    "keep-alive reuse": [
        ("send", request("POST", "/echo", b'{"a": 1}')),
        ("read", False),
        ("send", request("POST", "/echo", b'{"b": 2}')),
        ("read", False),
        ("send", request("GET", "/json?x=1")),
        ("read", False),
    ],
    "pipelined pair": [
        ("send", request("POST", "/echo", b"one") + request("POST", "/echo", b"two")),
        ("read", False),
        ("read", False),
    ],
    "pipelined trio, last one closes": [
        (
            "send",
            request("GET", "/json")
            + request("POST", "/echo", b"2")
            + request("GET", "/json", None, "connection: close"),
        ),
        ("read", False),
        ("read", False),
        ("read", False),
        ("eof", None),
    ],
    "100-continue": [
        ("send", request("POST", "/echo", None, "content-length: 5", "expect: 100-continue")),
        ("read", False),
        ("send", b"hello"),
        ("read", False),
        ("send", request("POST", "/echo", b"after")),
        ("read", False),
    ],
    "chunked request body": [
        ("send", request("POST", "/echo", None, "transfer-encoding: chunked") + b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"),
        ("read", False),
        ("send", request("POST", "/echo", b"next")),
        ("read", False),
    ],
    "body in two packets": [
        ("send", request("POST", "/echo", b"0123456789")[:-4]),
        ("send", b"6789"),
        ("read", False),
    ],
    "HEAD": [("send", request("HEAD", "/json")), ("read", True), ("send", request("GET", "/json")), ("read", False)],
    "HTTP/1.0": [("send", request("GET", "/json", version="1.0")), ("read", False), ("eof", None)],
    "HTTP/1.0 keep-alive": [
        ("send", request("GET", "/json", None, "connection: keep-alive", version="1.0")),
        ("read", False),
        ("eof", None),
    ],
    "streaming response": [("send", request("GET", "/stream")), ("read", False), ("send", request()), ("read", False)],
    "large body": [("send", request("POST", "/echo", bytes(range(256)) * 4096)), ("read", False)],
    "bad header value": [("send", request("GET", "/bad-header")), ("eof", None)],  # the head fails: uvicorn closes
    "connection close": [("send", request("GET", "/json", None, "connection: close")), ("read", False), ("eof", None)],
    "quoted path and query": [("send", request("GET", "/json?q=a%20b&r=1")), ("read", False)],
    "percent-encoded path": [("send", request("GET", "/js%6Fn")), ("read", False)],
    "not found": [("send", request("GET", "/nowhere")), ("read", False), ("send", request()), ("read", False)],
    "method not allowed": [("send", request("DELETE", "/json")), ("read", False)],
    "invalid request": [("send", b"NOT HTTP AT ALL\r\n\r\n"), ("read", False), ("eof", None)],
    "upgrade that is not a websocket": [
        ("send", request("GET", "/json", None, "connection: upgrade", "upgrade: h2c")),
        ("read", False),
    ],
    **{
        f"raw {case}": [
            ("send", request("POST", f"/raw/{case}", b"x")),
            ("read", False),
            ("send", request("GET", "/json", None, "connection: close")),
            ("read", False),
            ("eof", None),
        ]
        for case in RAW_CASES
        if case not in ("short", "long", "bad-length", "bad-name", "close")
    },
    "raw close": [("send", request("POST", "/raw/close", b"x")), ("read", False), ("eof", None)],
    **{
        f"raw {case}": [("send", request("POST", f"/raw/{case}", b"x")), ("eof", None)]
        for case in ("short", "long", "bad-length", "bad-name")  # the app fails: uvicorn closes the connection
    },
}

DATE = re.compile(rb"\r\ndate: [^\r]*\r\n")


async def replay(port: int, steps: list[Step]) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    client = RawClient(reader, writer)
    try:
        for action, argument in steps:
            if action == "send":
                client.send(argument)
            elif action == "read":
                await client.response(head_request=argument)
            else:
                await client.eof()
    finally:
        writer.close()
    return DATE.sub(b"\r\ndate: -\r\n", bytes(client.seen))


async def test_every_scenario_gets_the_bytes_uvicorn_sends() -> None:
    stock_gate, our_gate = Gate(), Gate()
    async with (
        serving(HttpToolsProtocol, stock_gate) as (stock, _),
        serving(CoalescingHttpToolsProtocol, our_gate) as (ours, _),
    ):
        for name, steps in SCENARIOS.items():
            expected = await replay(stock, steps)
            assert await replay(ours, steps) == expected, name


async def test_an_idle_connection_is_closed_after_the_keep_alive_timeout() -> None:
    answers = []
    for protocol in (HttpToolsProtocol, CoalescingHttpToolsProtocol):
        async with serving(protocol, Gate(), keep_alive_s=0.2) as (port, _):
            # The read to the server's close is the point: the timeout closes the idle connection (guarded).
            answers.append(await replay(port, [("send", request()), ("read", False), ("eof", None)]))
    assert answers[0] == answers[1]
    assert answers[0].startswith(b"HTTP/1.1 200 OK")


async def test_a_request_in_flight_at_shutdown_is_answered_and_the_connection_closed() -> None:
    answers = []
    for protocol in (HttpToolsProtocol, CoalescingHttpToolsProtocol):
        gate = Gate()
        async with serving(protocol, gate) as (port, server):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            client = RawClient(reader, writer)
            client.send(request("GET", "/slow"))
            await asyncio.wait_for(gate.entered.wait(), GUARD_S)
            server.should_exit = True
            (connection,) = server.server_state.connections
            while (
                connection.cycle.keep_alive
            ):  # uvicorn's shutdown has reached the connection (pytest's timeout guards)
                await asyncio.sleep(0.01)
            gate.release.set()
            await client.response()
            await client.eof()
            writer.close()
            answers.append(DATE.sub(b"\r\ndate: -\r\n", bytes(client.seen)))
    assert answers[0] == answers[1]
    assert b"connection: close" in answers[0]


# --------------------------------------------------------------------------------------------------------------------
# Which path a request takes


async def test_the_common_request_takes_the_fast_path_and_the_rest_uvicorns() -> None:
    cycles: list[type] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        cycles.append(type(receive.__self__))
        while (await receive()).get("more_body"):
            pass
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    config = runtime.uvicorn_config(app, "127.0.0.1", 0, {"server_event_loop": "asyncio"})
    config.log_level, config.lifespan = "critical", "off"
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[listener]))
    while not server.started:
        await asyncio.sleep(0.01)
    try:
        steps: list[Step] = [
            ("send", request("POST", "/", b"body")),
            ("read", False),
            ("send", request("GET", "/")),
            ("read", False),
            ("send", request("HEAD", "/")),
            ("read", True),
            ("send", request("POST", "/", None, "content-length: 1", "expect: 100-continue")),
            ("read", False),
            ("send", b"x"),
            ("read", False),
            ("send", request("GET", "/", None, "connection: close")),
            ("read", False),
        ]
        await replay(listener.getsockname()[1], steps)
    finally:
        server.should_exit = True
        await task
        listener.close()
    assert cycles == [FastCycle, FastCycle, RequestResponseCycle, RequestResponseCycle, RequestResponseCycle]


# --------------------------------------------------------------------------------------------------------------------
# The parts on their own


class FakeLoop:
    def __init__(self) -> None:
        self.now = 100.0
        self.planned: list[tuple[float, Any]] = []

    def time(self) -> float:
        return self.now

    def call_at(self, when: float, callback: Any) -> Any:
        self.planned.append((when, callback))
        return object()

    def run_next(self) -> None:
        when, callback = self.planned.pop(0)
        self.now = max(self.now, when)
        callback()


class FakeConnection:
    def __init__(self, idle_since: float | None) -> None:
        self._idle_since = idle_since
        self.closed = False

    def timeout_keep_alive_handler(self) -> None:
        self.closed = True


def test_the_sweep_closes_only_connections_idle_for_the_whole_timeout() -> None:
    loop = FakeLoop()
    idle, later, busy = FakeConnection(100.0), FakeConnection(None), FakeConnection(None)
    sweeper = _IdleSweeper(loop, {idle, later, busy}, timeout=30)  # type: ignore[arg-type]
    sweeper.watch(100.0)
    sweeper.watch(100.0)  # one sweep planned, however many connections go idle
    assert [when for when, _ in loop.planned] == [130.0]
    later._idle_since = 110.0
    loop.run_next()
    assert (idle.closed, later.closed, busy.closed) == (True, False, False)
    assert [when for when, _ in loop.planned] == [140.0]  # the next idle deadline
    later._idle_since = None  # a request came: it is busy again
    loop.run_next()
    assert not later.closed and loop.planned == []  # nothing idle: no sweep planned


def test_sweeps_of_a_busy_server_are_at_least_the_slack_apart() -> None:
    loop = FakeLoop()
    first, second = FakeConnection(100.0), FakeConnection(100.01)
    sweeper = _IdleSweeper(loop, {first, second}, timeout=30)  # type: ignore[arg-type]
    sweeper.watch(100.0)
    loop.run_next()
    assert first.closed and not second.closed
    assert loop.planned[0][0] == pytest.approx(131.0)  # not 130.01: one wake per second at most


async def test_the_request_event_behaves_as_an_asyncio_event() -> None:
    event = RequestEvent()
    assert not event.is_set()
    waiters = [asyncio.create_task(event.wait()) for _ in range(3)]
    await asyncio.sleep(0)
    waiters[0].cancel()  # one waiter cancelled: the others still wake
    event.set()
    assert await waiters[1] and await waiters[2]
    assert waiters[0].cancelled()
    assert event.is_set() and await event.wait()
    event.clear()
    assert not event.is_set()


def test_the_installed_uvicorn_has_the_internals_the_fast_path_needs() -> None:
    check_uvicorn_internals()
    assert runtime.http_protocol() is CoalescingHttpToolsProtocol


def test_a_uvicorn_with_other_internals_stops_the_server_with_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    class Changed(RequestResponseCycle):
        def __init__(self, scope: Any, transport: Any, config: Any) -> None:
            pass

    monkeypatch.setattr(server_cycle, "RequestResponseCycle", Changed)
    with pytest.raises(
        LaunchError, match=r"uvicorn .* changed internals .*RequestResponseCycle\(scope, transport, config\)"
    ):
        runtime.http_protocol()


def test_a_uvicorn_protocol_without_a_method_it_relies_on_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(HttpToolsProtocol, "_unset_keepalive_if_required")
    with pytest.raises(LaunchError, match="HttpToolsProtocol without _unset_keepalive_if_required"):
        check_uvicorn_internals()


def test_a_uvicorn_that_writes_other_bytes_stops_the_server(monkeypatch: pytest.MonkeyPatch) -> None:
    class Louder(RequestResponseCycle):
        async def send(self, message: Any) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message["headers"], (b"x-extra", b"1")]}
            await super().send(message)

    monkeypatch.setattr(server_cycle, "RequestResponseCycle", Louder)
    with pytest.raises(LaunchError, match="RequestResponseCycle.send writes .*x-extra"):
        check_uvicorn_internals()
