"""uvicorn's HTTP protocol, changed to send each response in one write instead of two.

uvicorn writes a response's status line and headers as soon as the app sends ``http.response.start``, then the body
in a second write. On loopback every write is a full trip through the kernel's TCP stack for both ends (and, with
``TCP_NODELAY``, a packet of its own that the client parses separately), so for the small JSON bodies that servers
exchange, the second write is a large share of the cost of a request. Here the head is held back until the body
arrives, which in practice is the same event-loop step, and both leave in one ``send``. If no body follows within
that step (a streaming response waiting for data), the head is flushed on the next loop iteration, so nothing is
delayed by more than one iteration.

A connection also drops its finished request as soon as the answer is out, so an idle keep-alive connection costs only
the connection itself.

The common request (keep-alive HTTP/1.1, not HEAD, no ``Expect``, no upgrade, nothing pipelined ahead of it) gets a
``FastCycle`` (``server_cycle.py``) built from the parser's state without uvicorn's general bookkeeping; every other
request takes uvicorn's own path. Idle keep-alive connections are closed by one sweep per server instead of a timer
armed after every response and cancelled by the next request (``_IdleSweeper``).
"""

from __future__ import annotations

import asyncio
import weakref
from typing import Any
from urllib.parse import unquote

import httptools
from uvicorn.protocols.http.flow_control import HIGH_WATER_LIMIT
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from nemo_gym.transport.server_cycle import FastCycle

__all__ = ["CoalescingHttpToolsProtocol"]

_HEAD_END = b"\r\n\r\n"
_JOIN_LIMIT = 64 * 1024


class _CoalescingTransport:
    """Wraps one connection's transport: a response head waits for the next write, or for the next loop iteration."""

    __slots__ = ("_flush_handle", "_head", "_loop", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._head: bytes | None = None
        self._flush_handle: asyncio.Handle | None = None

    def write(self, data: bytes | bytearray | memoryview) -> None:
        head = self._head
        if head is not None:
            self._head = None
            if len(data) <= _JOIN_LIMIT:
                self._transport.write(head + bytes(data))
            else:  # a large body is not copied: writelines hands both buffers to the kernel at once
                self._transport.writelines([head, data])
            return
        if isinstance(data, bytes) and data.endswith(_HEAD_END) and data.startswith(b"HTTP/"):
            self._head = data
            if self._flush_handle is None:
                self._flush_handle = self._loop.call_soon(self._flush)
            return
        self._transport.write(data)

    def writelines(self, list_of_data: Any) -> None:
        self.write(b"".join(list_of_data))

    def _flush(self) -> None:
        self._flush_handle = None
        head = self._head
        if head is not None:
            self._head = None
            if not self._transport.is_closing():
                self._transport.write(head)

    def write_eof(self) -> None:
        self._flush()
        self._transport.write_eof()

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def abort(self) -> None:
        self._head = None
        self._transport.abort()

    def is_closing(self) -> bool:  # asked on every response: not through __getattr__
        return self._transport.is_closing()

    def get_write_buffer_size(self) -> int:
        pending = len(self._head) if self._head is not None else 0
        return self._transport.get_write_buffer_size() + pending

    def __getattr__(self, name: str) -> Any:
        # Everything else (extra info, flow control, is_closing, set_protocol) is the real transport's.
        return getattr(self._transport, name)


class _IdleSweeper:
    """Closes one server's keep-alive connections that stayed idle ``timeout`` seconds, as uvicorn's per-response timer
    does, with one timer for the whole server: a connection closes between ``timeout`` and ``timeout + slack`` after
    its last response, and a busy server wakes at most once per ``slack`` for it."""

    __slots__ = ("_connections", "_handle", "_loop", "_slack", "_timeout")

    def __init__(self, loop: asyncio.AbstractEventLoop, connections: set[Any], timeout: float) -> None:
        self._loop = loop
        self._connections = connections
        self._timeout = timeout
        self._slack = min(1.0, timeout / 4)
        self._handle: asyncio.TimerHandle | None = None

    def watch(self, idle_since: float) -> None:
        """A connection went idle at ``idle_since``; a sweep already planned is never later than its deadline."""
        if self._handle is None:
            self._handle = self._loop.call_at(idle_since + self._timeout, self._sweep)

    def _sweep(self) -> None:
        self._handle = None
        now = self._loop.time()
        earliest: float | None = None
        for connection in list(self._connections):
            idle_since = getattr(connection, "_idle_since", None)  # a WebSocket protocol has none
            if idle_since is None:
                continue
            deadline = idle_since + self._timeout
            if deadline <= now:
                connection._idle_since = None
                connection.timeout_keep_alive_handler()
            elif earliest is None or deadline < earliest:
                earliest = deadline
        if earliest is not None:
            self._handle = self._loop.call_at(max(earliest, now + self._slack), self._sweep)


_sweepers: weakref.WeakKeyDictionary[ServerState, _IdleSweeper] = weakref.WeakKeyDictionary()


def _sweeper_for(protocol: HttpToolsProtocol) -> _IdleSweeper:
    sweeper = _sweepers.get(protocol.server_state)
    if sweeper is None:
        sweeper = _IdleSweeper(protocol.loop, protocol.connections, protocol.timeout_keep_alive)
        _sweepers[protocol.server_state] = sweeper
    return sweeper


class CoalescingHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol whose responses leave in one write, and whose idle connections hold no request;
    pass it as ``uvicorn.Config(http=...)``."""

    _idle_since: float | None = None
    """When the last response of an idle keep-alive connection ended (loop time); ``None`` while it is busy."""
    _sweeper: _IdleSweeper

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(_CoalescingTransport(transport, self.loop))  # type: ignore[arg-type]
        self._sweeper = _sweeper_for(self)

    def on_headers_complete(self) -> None:
        """Start the app on a ``FastCycle`` for the common request; uvicorn's own path for everything else."""
        parser = self.parser
        cycle = self.cycle
        if (
            self.expect_100_continue
            or self.limit_concurrency is not None
            or (cycle is not None and not cycle.response_complete)  # pipelined behind a running request
            or parser.should_upgrade()
            or parser.get_http_version() != "1.1"
            or not parser.should_keep_alive()
        ):
            return super().on_headers_complete()
        method = parser.get_method().decode("ascii")
        if method == "HEAD":
            return super().on_headers_complete()
        url = httptools.parse_url(self.url)
        raw_path = url.path
        path = raw_path.decode("ascii")
        if "%" in path:
            path = unquote(path)
        scope = self.scope
        scope["method"] = method
        root = self.root_path
        scope["path"] = root + path if root else path
        scope["raw_path"] = root.encode("ascii") + raw_path if root else raw_path
        scope["query_string"] = url.query or b""
        self.cycle = FastCycle(self, scope)
        self._start_asgi_task(self.cycle, self.app)

    def on_body(self, body: bytes) -> None:
        """A ``FastCycle`` keeps a body that came in one piece as it came (no copy); more pieces are collected."""
        cycle = self.cycle
        if type(cycle) is not FastCycle:
            return super().on_body(body)
        if cycle.response_complete:
            return None
        if not cycle.body:
            cycle.body = body
        else:
            if not isinstance(cycle.body, bytearray):  # the first piece, kept as bytes
                cycle.body = bytearray(cycle.body)
            cycle.body += body
        if len(cycle.body) > HIGH_WATER_LIMIT:
            self.flow.pause_reading()
        cycle.message_event.set()
        return None

    def on_message_complete(self) -> None:
        cycle = self.cycle
        if type(cycle) is not FastCycle:
            return super().on_message_complete()
        if not cycle.response_complete:
            cycle.more_body = False
            cycle.message_event.set()
        return None

    def _unset_keepalive_if_required(self) -> None:
        """The connection is busy again (or gone): the sweep leaves it alone."""
        self._idle_since = None
        if self.timeout_keep_alive_task is not None:
            super()._unset_keepalive_if_required()

    def on_response_complete(self) -> None:
        """Start the next pipelined request or mark the connection idle, as uvicorn does (without its timer); then
        forget the finished request, as uvicorn does not until the next one arrives.

        A keep-alive connection otherwise holds its last request's cycle and scope (headers, and whatever the app
        left in the scope) while it waits: ~6 KB per idle connection, ~6 MB in a server that a thousand rollouts keep
        connections to. Only a request that was read to its end, whose answer is complete and with nothing pipelined
        behind it, is forgotten; every uvicorn path treats a missing cycle as "no request", and the cycle's task keeps
        its own reference until it ends.
        """
        self.server_state.total_requests += 1
        if not self.transport.is_closing():
            if self.flow.read_paused:
                self.flow.resume_reading()
            if self.pipeline:
                next_cycle, app = self.pipeline.pop()
                self._start_asgi_task(next_cycle, app)
            else:  # idle: the server's sweep closes it after timeout_keep_alive unless a request comes first
                self._idle_since = idle_since = self.loop.time()
                self._sweeper.watch(idle_since)
        cycle = self.cycle
        if cycle is not None and cycle.response_complete and not cycle.more_body and not self.pipeline:
            self.cycle = None  # type: ignore[assignment]
            self.scope = None  # type: ignore[assignment]
            self.headers = None  # type: ignore[assignment]
