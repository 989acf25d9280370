"""One request and its response on a server connection: uvicorn's request-response cycle with a fast path.

uvicorn's ``RequestResponseCycle`` is general: every response header is checked against two regular expressions and
lowercased one by one (the ``server`` and ``date`` headers uvicorn adds included), every request gets an
``asyncio.Event``, and ``receive()`` goes through it even when the whole body is already there. For the requests the
servers of a run exchange (small keep-alive HTTP/1.1 requests, answered with a Content-Length) that was a third of a
request's Python time in the server. ``FastCycle`` does the same work cheaper for that case and hands every other case
(chunked or streaming responses, a response header it does not expect, access logging, a full write buffer, any
error) to uvicorn's own code, so what goes on the wire is byte for byte what uvicorn would send
(``tests/unit/test_server_protocol_parity.py`` compares the two).

``check_uvicorn_internals`` is called at server start: the fast path relies on uvicorn internals that are not public
API, and a uvicorn release that changes them must stop the server with a clear message, not misbehave.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from typing import Any

import uvicorn
from uvicorn.protocols.http import httptools_impl
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import HEADER_RE, HEADER_VALUE_RE, STATUS_LINE, RequestResponseCycle

from nemo_gym.errors import LaunchError

__all__ = ["FastCycle", "RequestEvent", "check_uvicorn_internals", "default_header_block"]

_CYCLE_PARAMETERS = (
    "scope",
    "transport",
    "flow",
    "logger",
    "access_logger",
    "access_log",
    "default_headers",
    "message_event",
    "expect_100_continue",
    "keep_alive",
    "on_response",
)
"""``RequestResponseCycle.__init__``'s parameters in the uvicorn versions this module was checked against."""
_CYCLE_ATTRIBUTES = frozenset(
    {
        "scope",
        "transport",
        "flow",
        "logger",
        "access_logger",
        "access_log",
        "default_headers",
        "message_event",
        "on_response",
        "disconnected",
        "keep_alive",
        "waiting_for_100_continue",
        "body",
        "more_body",
        "response_started",
        "response_complete",
        "chunked_encoding",
        "expected_content_length",
    }
)
"""The state a cycle keeps; ``FastCycle`` sets it itself and uvicorn's methods read it."""
_PROTOCOL_METHODS = (
    "on_message_begin",
    "on_url",
    "on_header",
    "on_headers_complete",
    "on_body",
    "on_message_complete",
    "on_response_complete",
    "_start_asgi_task",
    "_unset_keepalive_if_required",
    "timeout_keep_alive_handler",
    "data_received",
    "connection_lost",
    "shutdown",
)
"""``HttpToolsProtocol`` methods the server protocol overrides or calls."""

_SPECIAL_NAMES = frozenset({b"content-length", b"transfer-encoding", b"connection"})
_NAME_CACHE_LIMIT = 256
_lower_names: dict[bytes, bytes] = {}
"""Response header names already checked, to their lowercase form; bounded, as apps send few distinct names."""
_VALUE_CONTROL = bytes(b for b in range(256) if HEADER_VALUE_RE.match(bytes([b])))
"""The bytes uvicorn refuses in a header value (``HEADER_VALUE_RE``): control characters other than tab."""

_default_blocks: tuple[Any, bytes | None] = (None, None)
"""The last server default headers seen (uvicorn replaces the list every second for ``date``) and their bytes."""


def default_header_block(default_headers: list[tuple[bytes, bytes]]) -> bytes | None:
    """The default headers (``server``, ``date``, the config's ``headers``) as they start every response head, or
    ``None`` where they need uvicorn's general path (an invalid one, or one that decides the framing)."""
    global _default_blocks
    cached_for, block = _default_blocks
    if cached_for is default_headers:
        return block
    lines = _header_lines(default_headers)
    block = lines[0] if lines is not None else None
    _default_blocks = (default_headers, block)
    return block


def _checked_lower(name: bytes) -> bytes | None:
    """A response header name in lowercase, or ``None`` if uvicorn would refuse it."""
    lower = _lower_names.get(name)
    if lower is None:
        if HEADER_RE.search(name):
            return None
        lower = name.lower()
        if len(_lower_names) < _NAME_CACHE_LIMIT:
            _lower_names[name] = lower
    return lower


def _header_lines(headers: Any, length_allowed: bool = False) -> tuple[bytes, bytes | None] | None:
    """``name: value`` lines for headers uvicorn would send as they are, and the Content-Length among them if
    ``length_allowed``; ``None`` for any other headers (uvicorn's general path takes those)."""
    parts: list[bytes] = []
    length: bytes | None = None
    for name, value in headers:
        lower = _lower_names.get(name) or _checked_lower(name)
        if lower is None:
            return None
        if lower in _SPECIAL_NAMES:
            if not length_allowed or lower != b"content-length" or length is not None:
                return None
            length = value
        parts += (lower, b": ", value, b"\r\n")
    lines = b"".join(parts)
    # Names were checked above; a value may not hold control characters. Each line's own CRLF is two of them: any
    # more means a bad value (one pass in C, where a regular expression per value cost more than the rest together).
    if len(lines) - len(lines.translate(None, _VALUE_CONTROL)) != len(parts) // 2:
        return None
    return lines, length


class RequestEvent:
    """``asyncio.Event`` for one request's body, made only of flags until someone actually waits on it.

    Almost every request's body is complete before the app first reads it, so nothing ever waits; uvicorn's
    ``message_event`` was a full ``asyncio.Event`` per request anyway.
    """

    __slots__ = ("_is_set", "_waiters")

    def __init__(self) -> None:
        self._is_set = False
        self._waiters: list[asyncio.Future[None]] | None = None

    def is_set(self) -> bool:
        return self._is_set

    def set(self) -> None:
        self._is_set = True
        if self._waiters:
            for waiter in self._waiters:
                if not waiter.done():
                    waiter.set_result(None)

    def clear(self) -> None:
        self._is_set = False

    async def wait(self) -> bool:
        if self._is_set:
            return True
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self._waiters is None:
            self._waiters = []
        self._waiters.append(waiter)
        try:
            await waiter
            return True
        finally:
            self._waiters.remove(waiter)


class FastCycle(RequestResponseCycle):
    """A keep-alive HTTP/1.1 request that is neither HEAD nor ``Expect: 100-continue``, and its response.

    The protocol makes one only for such requests; everything this class does not take on itself goes to uvicorn's
    methods, which read and write the same state.
    """

    # A new request's state: uvicorn sets these per instance; as class attributes they cost nothing until changed.
    disconnected = False
    keep_alive = True
    waiting_for_100_continue = False
    body: bytes | bytearray = b""  # type: ignore[assignment]  # bytes until a second piece comes (see on_body)
    more_body = True
    response_started = False
    response_complete = False
    chunked_encoding = None
    expected_content_length = 0

    def __init__(self, protocol: Any, scope: Any) -> None:  # no super().__init__: the same state, set directly
        self.scope = scope
        self.transport = protocol.transport
        self.flow = protocol.flow
        self.logger = protocol.logger
        self.access_logger = protocol.access_logger
        self.access_log = protocol.access_log
        self.default_headers = protocol.server_state.default_headers
        self.message_event = RequestEvent()  # type: ignore[assignment]
        self.on_response = protocol.on_response_complete

    async def receive(self) -> Any:
        """The whole body at once when it is already there, as uvicorn would return it after an event that is set."""
        event = self.message_event
        if event._is_set and not self.disconnected and not self.response_complete:  # type: ignore[attr-defined]
            if self.flow.read_paused:
                self.flow.resume_reading()
            event.clear()
            body = self.body
            self.body = b""
            return {"type": "http.request", "body": bytes(body), "more_body": self.more_body}
        return await super().receive()

    async def send(self, message: Any) -> None:
        """A response head with a Content-Length, and a body sent in one piece, without uvicorn's general checks."""
        if self.flow.write_paused or self.disconnected or self.access_log:
            return await super().send(message)
        if not self.response_started:
            if message["type"] == "http.response.start":
                try:
                    head = self._head(message)
                except (
                    Exception
                ):  # a malformed message: uvicorn's path raises its own error, after its own state change
                    head = None
                if head is not None:
                    self.response_started = True
                    self.transport.write(head)
                    return None
        elif not self.response_complete and message["type"] == "http.response.body" and not self.chunked_encoding:
            body = message.get("body", b"")
            if not message.get("more_body", False) and len(body) == self.expected_content_length:
                self.expected_content_length = 0
                self.transport.write(body)
                self.response_complete = True
                self.message_event.set()
                if not self.keep_alive:
                    self.transport.close()
                self.on_response()
                return None
        return await super().send(message)

    def _head(self, message: Any) -> bytes | None:
        """The status line and headers exactly as uvicorn writes them, for a response that declares its length;
        ``None`` for anything else. Sets the framing state only on success."""
        status_line = STATUS_LINE.get(message["status"])
        defaults = default_header_block(self.default_headers)
        if status_line is None or defaults is None:
            return None
        lines = _header_lines(message.get("headers", ()), length_allowed=True)
        if lines is None or lines[1] is None:
            return None
        try:
            expected = int(lines[1])  # what int(value.decode()) gives for ASCII digits; anything else: uvicorn's path
        except ValueError:
            return None
        self.chunked_encoding = False
        self.expected_content_length = expected
        if not self.keep_alive:
            return b"".join((status_line, defaults, lines[0], b"connection: close\r\n\r\n"))
        return b"".join((status_line, defaults, lines[0], b"\r\n"))


def check_uvicorn_internals() -> None:
    """Raise ``LaunchError`` if the installed uvicorn no longer has the internals ``FastCycle`` and the server
    protocol build on (they are not uvicorn's public API)."""
    problems = []
    parameters = tuple(inspect.signature(RequestResponseCycle.__init__).parameters)[1:]
    if parameters != _CYCLE_PARAMETERS:
        problems.append(f"RequestResponseCycle({', '.join(parameters)})")
    else:
        probe = RequestResponseCycle(**dict.fromkeys(_CYCLE_PARAMETERS))  # type: ignore[arg-type]
        if set(vars(probe)) != _CYCLE_ATTRIBUTES:
            problems.append(f"RequestResponseCycle state {sorted(set(vars(probe)) ^ _CYCLE_ATTRIBUTES)}")
    missing = [
        name for name in _PROTOCOL_METHODS if not callable(getattr(httptools_impl.HttpToolsProtocol, name, None))
    ]
    if missing:
        problems.append(f"HttpToolsProtocol without {', '.join(missing)}")
    if not isinstance(STATUS_LINE, dict) or STATUS_LINE.get(200) != b"HTTP/1.1 200 OK\r\n":
        problems.append("STATUS_LINE")
    if not problems:
        for keep_alive in (True, False):
            ours, theirs = _probe_response(FastCycle, keep_alive), _probe_response(RequestResponseCycle, keep_alive)
            if ours != theirs:
                problems.append(f"RequestResponseCycle.send writes {theirs!r}, FastCycle {ours!r}")
    if problems:
        raise LaunchError(
            f"uvicorn {uvicorn.__version__} changed internals that nemo_gym.transport.server_protocol relies on "
            f"({'; '.join(problems)}); install the uvicorn version pinned in nemo_gym's pyproject.toml"
        )


class _Recorder:
    """The transport and protocol a probe cycle needs: records what would be written."""

    def __init__(self) -> None:
        self.written = bytearray()
        self.transport = self
        self.flow = FlowControl(self)  # type: ignore[arg-type]
        self.logger = self.access_logger = logging.getLogger("uvicorn.error")
        self.access_log = False
        self.server_state = self
        self.default_headers = [(b"server", b"probe"), (b"date", b"Thu, 01 Jan 1970 00:00:00 GMT")]

    def write(self, data: bytes) -> None:
        self.written += data

    def close(self) -> None:
        pass

    def is_closing(self) -> bool:
        return False

    def on_response_complete(self) -> None:
        pass


def _probe_response(cycle_class: type[RequestResponseCycle], keep_alive: bool) -> bytes:
    """The bytes a cycle of ``cycle_class`` writes for a small JSON response (its ``send`` never waits here)."""
    recorder = _Recorder()
    scope = {"type": "http", "method": "POST", "headers": []}
    if cycle_class is FastCycle:
        cycle: RequestResponseCycle = FastCycle(recorder, scope)
    else:
        cycle = cycle_class(
            scope,  # type: ignore[arg-type]
            recorder,  # type: ignore[arg-type]
            recorder.flow,
            recorder.logger,
            recorder.access_logger,
            False,
            recorder.default_headers,
            asyncio.Event(),
            False,
            True,
            recorder.on_response_complete,
        )
    cycle.keep_alive = keep_alive
    headers = [(b"content-length", b"2"), (b"Content-Type", b"application/json"), (b"set-cookie", b"a=b; Path=/")]
    for message in (
        {"type": "http.response.start", "status": 200, "headers": headers},
        {"type": "http.response.body", "body": b"{}", "more_body": False},
    ):
        step = cycle.send(message)  # type: ignore[arg-type]
        try:
            step.send(None)
        except StopIteration:
            continue
        step.close()
        raise LaunchError("uvicorn's RequestResponseCycle.send waited while probed; nemo_gym cannot check it")
    return bytes(recorder.written)
