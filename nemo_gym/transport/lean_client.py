"""A lean HTTP/1.1 client for calls between the servers of a run (agent -> model / resources, collector -> agent).

aiohttp's client is general: tracing hooks, a timeout object per request, URL and multidict objects, cookie parsing,
a connector that knows proxies and TLS. A rollout makes about five calls to our own servers, and at a thousand
rollouts in flight that generality was ~45% of the agent's CPU. Our servers speak plain HTTP/1.1 JSON on keep-alive
connections, so for them this module does only what those calls need: one pooled :class:`asyncio.Protocol` per
connection, ``httptools`` (uvicorn's parser) to read the answer, one ``transport.write`` per request, one timer for the
deadline, headers kept as bytes until someone asks for them.

What it keeps from aiohttp, on purpose:

* the answer is a :class:`LeanResponse`, a subclass of :class:`aiohttp.ClientResponse` whose body is already read, so
  ``.status``, ``.ok``, ``.headers``, ``.cookies``, ``await .json()`` / ``.text()`` / ``.read()``,
  ``.raise_for_status()``, ``async with`` and ``isinstance`` checks behave exactly as they do on aiohttp's; headers,
  cookies and URL objects are only built when read;
* failures are aiohttp's own exception types at the same moments (connection refused: ``ClientConnectorError``,
  closed before any answer: ``ServerDisconnectedError`` / ``ClientOSError``, closed mid-answer:
  ``ClientPayloadError``, a slow connect: ``ConnectionTimeoutError``, the deadline: ``TimeoutError``), so
  :func:`nemo_gym.transport.http_client.request` retries and reports them by the same rules;
* the request carries the headers aiohttp would send (Host, Accept, Accept-Encoding, User-Agent, Content-Length,
  a default Content-Type for a bare body).

Which calls take this path is decided by :mod:`nemo_gym.transport.http_client` (plain ``http://`` to a server of the
run); everything else (outside APIs, TLS, proxies, redirects) stays on aiohttp.
"""

from __future__ import annotations

import asyncio
import functools
import re
import socket
import zlib
from typing import Any, Final

import aiohttp
import httptools
from aiohttp.client_reqrep import ConnectionKey, RequestInfo
from aiohttp.http import SERVER_SOFTWARE, HttpVersion11
from aiohttp.streams import EMPTY_PAYLOAD
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from nemo_gym.transport import local_socket
from nemo_gym.transport.origins import origin_of
from nemo_gym.transport.types import TransportConfig

__all__ = [
    "LeanResponse",
    "close_pools",
    "fast_cookies",
    "is_marked",
    "mark_own_server",
    "origin_of_server",
    "pool_for",
    "split",
]

_REDIRECTS: Final = frozenset({301, 302, 303, 307, 308})
_BODY_METHODS: Final = frozenset({"POST", "PUT", "PATCH"})
_LEAN_METHODS: Final = frozenset({"GET", "POST", "PUT", "PATCH", "DELETE"})
# Request targets sent as they are: yarl (aiohttp's URL type) would send these characters unchanged too. Anything
# else (percent signs, spaces, non-ASCII, dot segments) goes through yarl, as aiohttp would send it.
_PLAIN_TARGET: Final = re.compile(r"/[A-Za-z0-9\-_~/=&?:,+]*(?:\.[A-Za-z0-9\-_~/=&?:,+]+)*")
_PLAIN_AUTHORITY: Final = re.compile(r"[a-z0-9.\-]+(?::[0-9]{1,5})?")
_FIXED_HEADERS: Final = f"Accept: */*\r\nAccept-Encoding: gzip, deflate\r\nUser-Agent: {SERVER_SOFTWARE}\r\n"
_SET_COOKIE: Final = b"set-cookie"
_CONTENT_ENCODING: Final = b"content-encoding"
_CONTENT_LENGTH: Final = b"content-length"
_TRANSFER_ENCODING: Final = b"transfer-encoding"
# Cookies read without aiohttp's parser: conservative character sets (what our servers' session cookies use).
_COOKIE_NAME: Final = re.compile(r"[A-Za-z0-9_\-.]+")
_COOKIE_VALUE: Final = re.compile(r"[A-Za-z0-9_\-.~+/:]*")
_MORSEL_KEYS: Final = frozenset(
    {"expires", "path", "comment", "domain", "max-age", "secure", "httponly", "version", "samesite", "partitioned"}
)


# --------------------------------------------------------------------------------------------------------------------
# Which destinations


_own_origins: set[str] = set()


@functools.lru_cache(maxsize=256)
def origin_of_server(base_url: str) -> str:
    """:func:`origin_of` a server's ``http://host:port``: a handful per run, each parsed once, not once per call."""
    return origin_of(base_url)


def mark_own_server(base_url: str) -> None:
    """Record ``base_url`` (``http://host:port``) as a server of this run: calls to it may take the lean path."""
    _own_origins.add(origin_of_server(base_url))


def is_marked(origin: str) -> bool:
    return origin in _own_origins


def split(url: str | URL, method: str) -> tuple[str, str, str] | None:
    """``(scheme://authority, authority, request target)`` of a URL this client can send as it is, else None."""
    if method not in _LEAN_METHODS or not isinstance(url, str) or not url.startswith("http://"):
        return None
    slash = url.find("/", 7)
    if slash < 0:
        return None
    authority = url[7:slash]
    target = url[slash:]
    if not _PLAIN_AUTHORITY.fullmatch(authority):
        return None
    if not _PLAIN_TARGET.fullmatch(target) or "/." in target:
        target = URL(url).raw_path_qs  # what aiohttp would put on the request line
    return url[:slash], authority, target


# --------------------------------------------------------------------------------------------------------------------
# The response


class LeanResponse(aiohttp.ClientResponse):
    """An :class:`aiohttp.ClientResponse` whose body was read by this module; built without a connection or a session.

    Only the attributes aiohttp's own methods read are set; headers, URL objects and request info are made on first
    use (most calls only look at ``status`` and the body).
    """

    def __init__(
        self,
        method: str,
        url: str,
        status: int,
        reason: str,
        raw_headers: tuple[tuple[bytes, bytes], ...],
        body: bytes,
        cookie_headers: tuple[str, ...] | None,
        request_headers: tuple[tuple[str, str], ...],
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.method = method
        self._url_text = url
        self.status = status
        self.reason = reason
        self.version = HttpVersion11
        self._raw_headers = raw_headers
        self._body = body
        self._raw_cookie_headers = cookie_headers
        self._request_headers = request_headers
        self._loop = loop
        self._cache: dict[str, Any] = {}
        self._traces = []
        self.content = EMPTY_PAYLOAD  # as aiohttp's after its body was read: at its end

    async def read(self) -> bytes:
        """The body, read already; as on aiohttp's, a released response (``async with`` left) has none to give."""
        if self._released:
            raise aiohttp.ClientConnectionError("Connection closed")
        return self._body  # type: ignore[return-value]  # always set by __init__

    async def text(self, encoding: str | None = None, errors: str = "strict") -> str:
        """aiohttp's ``text()``. A body whose (first) ``Content-Type`` is exactly ``application/json``, as our servers
        send, is decoded as UTF-8, which is what ``get_encoding()`` answers for it, without building the header
        mapping and parsing the media type for it (the tool output an agent hands to the model, once per call)."""
        if encoding is None and self._declared_type() == b"application/json":
            return self._body.decode("utf-8", errors)  # type: ignore[union-attr]  # always set by __init__
        return await super().text(encoding, errors)

    def _declared_type(self) -> bytes | None:
        for name, value in self._raw_headers:
            if name.lower() == b"content-type":
                return value
        return None

    @property
    def _url(self) -> URL:  # type: ignore[override]  # derived on first use, never assigned
        url = self._cache.get("_url")
        if url is None:
            url = self._cache["_url"] = URL(self._url_text)
        return url

    @property
    def _real_url(self) -> URL:  # type: ignore[override]
        return self._url

    @property
    def _headers(self) -> CIMultiDictProxy[str]:  # type: ignore[override]
        headers = self._cache.get("_headers")
        if headers is None:
            decoded = CIMultiDict(
                (name.decode("utf-8", "surrogateescape"), value.decode("utf-8", "surrogateescape"))
                for name, value in self._raw_headers
            )
            headers = self._cache["_headers"] = CIMultiDictProxy(decoded)
        return headers

    @property
    def _request_info(self) -> RequestInfo:  # type: ignore[override]
        return RequestInfo(self._url, self.method, CIMultiDictProxy(CIMultiDict(self._request_headers)), self._url)


def fast_cookies(resp: LeanResponse) -> dict[str, str] | None:
    """``{name: value}`` of the cookies ``resp`` sets, read straight from its ``Set-Cookie`` headers; None when one
    is not a plain ``name=value; attributes`` (then aiohttp's parser, behind ``resp.cookies``, has the last word)."""
    found: dict[str, str] = {}
    for header in resp._raw_cookie_headers or ():
        name, sep, value = header.partition(";")[0].partition("=")
        name = name.strip()
        value = value.strip()
        if not sep or not _COOKIE_NAME.fullmatch(name) or not _COOKIE_VALUE.fullmatch(value):
            return None
        if name.lower() in _MORSEL_KEYS:
            return None
        found[name] = value
    return found


# --------------------------------------------------------------------------------------------------------------------
# One connection


class _Connection(asyncio.Protocol):
    """One keep-alive connection carrying one request at a time; the parser's callbacks fill in the answer."""

    __slots__ = (
        "_body",
        "_cookies",
        "_deadline_handle",
        "_encoding",
        "_headers",
        "_headers_done",
        "_keep_alive",
        "_length_known",
        "_parser",
        "_reason",
        "_status",
        "_waiter",
        "closed",
        "idle_since",
        "pool",
        "transport",
    )

    def __init__(self, pool: _Pool) -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self._parser = httptools.HttpResponseParser(self)
        self._waiter: asyncio.Future[LeanResponse | None] | None = None
        self._deadline_handle: asyncio.TimerHandle | None = None
        self.closed = False
        self.idle_since = 0.0
        self._reset()

    def _reset(self) -> None:
        self._headers: list[tuple[bytes, bytes]] = []
        self._body: list[bytes] = []
        self._cookies: list[str] | None = None
        self._reason = b""
        self._status = 0
        self._encoding: bytes | None = None
        self._headers_done = False
        self._keep_alive = False
        self._length_known = False

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self._waiter is None:
            self.close()  # bytes nobody asked for: this connection cannot be trusted with the next request
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(self._malformed(exc))
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.pool.forget(self)
        waiter = self._waiter
        if waiter is None or waiter.done():
            return
        if self._headers_done and not self._length_known:
            waiter.set_result(None)  # a body that ends with the connection (no length, not chunked): it has ended
            return
        if self._headers_done:
            self._fail(aiohttp.ClientPayloadError("Response payload is not completed"))
        elif isinstance(exc, OSError):
            self._fail(aiohttp.ClientOSError(*exc.args))
        else:
            self._fail(aiohttp.ServerDisconnectedError())

    # httptools callbacks

    def on_status(self, reason: bytes) -> None:
        self._reason += reason

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name, value))
        lowered = name.lower()
        if lowered == _SET_COOKIE:
            if self._cookies is None:
                self._cookies = []
            self._cookies.append(value.decode("utf-8", "surrogateescape"))
        elif lowered == _CONTENT_LENGTH or lowered == _TRANSFER_ENCODING:
            self._length_known = True
        elif lowered == _CONTENT_ENCODING:
            self._encoding = value.strip().lower()

    def on_headers_complete(self) -> None:
        self._status = self._parser.get_status_code()
        self._headers_done = True
        if self._status in (204, 304) or 100 <= self._status < 200:
            self._length_known = True

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        self._keep_alive = self._parser.should_keep_alive()  # only known here: the parser resets after the message
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # the exchange

    async def exchange(self, payload: bytes | list[bytes], deadline: float) -> None:
        """Send one request and wait for the whole answer; on any failure the connection is closed."""
        loop = self.pool.loop
        self._reset()
        waiter = self._waiter = loop.create_future()
        self._deadline_handle = loop.call_at(deadline, self._on_deadline)
        transport = self.transport
        assert transport is not None
        try:
            if isinstance(payload, bytes):
                transport.write(payload)
            else:
                transport.writelines(payload)
            await waiter
        except BaseException:
            self.close()  # cancelled, timed out or broken halfway: this connection's state is unknown
            raise
        finally:
            self._deadline_handle.cancel()
            self._deadline_handle = None
            self._waiter = None

    def answer(self, method: str, url: str, request_headers: tuple[tuple[str, str], ...]) -> LeanResponse:
        body = b"".join(self._body) if len(self._body) != 1 else self._body[0]
        if self._encoding in (b"gzip", b"deflate") and body:
            body = _decompress(body, self._encoding)
        return LeanResponse(
            method,
            url,
            self._status,
            self._reason.decode("utf-8", "surrogateescape"),
            tuple(self._headers),
            body,
            None if self._cookies is None else tuple(self._cookies),
            request_headers,
            self.pool.loop,
        )

    @property
    def reusable(self) -> bool:
        return not self.closed and self._keep_alive and self._length_known

    def _on_deadline(self) -> None:
        self._fail(TimeoutError())

    def _fail(self, exc: BaseException) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)

    def _malformed(self, exc: Exception) -> aiohttp.ClientError:
        if self._headers_done:
            return aiohttp.ClientPayloadError(f"Response payload is not completed: {exc}")
        return aiohttp.ClientResponseError(
            RequestInfo(URL(), "", CIMultiDictProxy(CIMultiDict())), (), status=400, message=f"Invalid response: {exc}"
        )

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.pool.forget(self)
            if self.transport is not None:
                self.transport.abort()


def _decompress(body: bytes, encoding: bytes) -> bytes:
    try:
        return zlib.decompress(body, 16 + zlib.MAX_WBITS if encoding == b"gzip" else zlib.MAX_WBITS)
    except zlib.error:
        if encoding == b"deflate":
            return zlib.decompress(body, -zlib.MAX_WBITS)  # raw deflate, as some servers send it
        raise aiohttp.ClientPayloadError("Can not decode content-encoding: gzip") from None


# --------------------------------------------------------------------------------------------------------------------
# The pool of one destination


class _Pool:
    """Keep-alive connections to one ``host:port``. How many are in use at once is bounded by the caller's gate
    (:class:`~nemo_gym.transport.admission.FairLimiter`, ``limit_per_host``); here idle ones wait to be reused."""

    __slots__ = (
        "_addresses", "_dns_expires", "_fixed", "_head", "_idle", "_open", "_sweep", "_unix_address", "config", "host",
        "loop", "port",
    )  # fmt: skip

    def __init__(self, loop: asyncio.AbstractEventLoop, authority: str, config: TransportConfig) -> None:
        host, _, port = authority.partition(":")
        self.loop = loop
        self.host = host
        self.port = int(port) if port else 80
        self.config = config
        self._head = f"Host: {authority}\r\n{_FIXED_HEADERS}"
        self._fixed = (("Host", authority), *(tuple(line.split(": ", 1)) for line in _FIXED_HEADERS.splitlines()))
        self._idle: list[_Connection] = []
        """Oldest first: a connection is appended when it becomes idle and reused from the end."""
        self._sweep: asyncio.TimerHandle | None = None
        self._open: set[_Connection] = set()
        self._addresses: list[tuple[Any, ...]] = []
        self._dns_expires = 0.0
        self._unix_address = local_socket.address(self.host, self.port)
        """Where the server may listen beside its loopback port (:mod:`.local_socket`)."""

    async def send(
        self,
        method: str,
        url: str,
        target: str,
        headers: Any,
        body: bytes | None,
        deadline: float,
        connect_timeout_s: float,
    ) -> LeanResponse | None:
        """Send one request; the answer with its body read, or None for a redirect (aiohttp follows those)."""
        request_headers, payload = self._serialise(method, target, headers, body)
        connection = self._idle_connection()
        if connection is None:
            connection = await self._connect(url, deadline, connect_timeout_s)
        await connection.exchange(payload, deadline)
        response = connection.answer(method, url, request_headers)
        if connection.reusable:
            connection.idle_since = self.loop.time()
            self._idle.append(connection)
            if self._sweep is None:
                self._sweep = self.loop.call_later(self.config.keepalive_timeout_s, self._close_stale)
        else:
            connection.close()
        return None if response.status in _REDIRECTS else response

    def _serialise(
        self, method: str, target: str, headers: Any, body: bytes | None
    ) -> tuple[tuple[tuple[str, str], ...], bytes | list[bytes]]:
        pairs = tuple(headers.items()) if headers else ()
        lines = [f"{method} {target} HTTP/1.1\r\n", self._head]
        has_type = has_length = False
        for name, value in pairs:
            if "\n" in value or "\r" in value or "\n" in name or "\r" in name:
                raise ValueError("Newline or carriage return character detected in HTTP status message or header")
            lowered = name.lower()
            has_type = has_type or lowered == "content-type"
            has_length = has_length or lowered == "content-length"
            lines.append(f"{name}: {value}\r\n")
        # aiohttp's defaults: a bare body (or any body method) is octet-stream; every method but GET says its length.
        if not has_type and (body is not None or method in _BODY_METHODS):
            lines.append("Content-Type: application/octet-stream\r\n")
        if not has_length and (body is not None or method != "GET"):
            lines.append(f"Content-Length: {0 if body is None else len(body)}\r\n")
        lines.append("\r\n")
        head = "".join(lines).encode("utf-8")
        sent = self._fixed + pairs  # what request_info shows (aiohttp's lists what it sent)
        if body is None:
            return sent, head
        return sent, (head + body if len(body) < 65536 else [head, body])

    def _idle_connection(self) -> _Connection | None:
        idle = self._idle
        oldest_allowed = self.loop.time() - self.config.keepalive_timeout_s
        while idle:
            connection = idle.pop()
            if connection.closed:
                continue
            if connection.idle_since < oldest_allowed:
                # The newest idle connection is too old to trust: so is every one under it.
                for stale in [connection, *idle]:
                    stale.close()
                idle.clear()
                return None
            return connection
        return None

    def _close_stale(self) -> None:
        """Close the connections idle for longer than the keep-alive, as aiohttp's connector does: after a burst of
        thousands of calls, their sockets (and each server's side of them) would otherwise stay until the server's
        own keep-alive ends them. One timer per pool, set again for the oldest connection left."""
        self._sweep = None
        idle = self._idle
        oldest_allowed = self.loop.time() - self.config.keepalive_timeout_s
        stale = 0
        while stale < len(idle) and idle[stale].idle_since < oldest_allowed:
            idle[stale].close()
            stale += 1
        del idle[:stale]
        if idle:
            delay = idle[0].idle_since - oldest_allowed
            self._sweep = self.loop.call_later(delay, self._close_stale)

    async def _connect(self, url: str, deadline: float, connect_timeout_s: float) -> _Connection:
        remaining = deadline - self.loop.time()
        by_connect = connect_timeout_s < remaining
        try:
            async with asyncio.timeout(min(connect_timeout_s, remaining)):
                sock = await self._open_socket()
                _, connection = await self.loop.create_connection(lambda: _Connection(self), sock=sock)
        except TimeoutError as exc:
            if by_connect:
                raise aiohttp.ConnectionTimeoutError(f"Connection timeout to host {url}") from exc
            raise
        except OSError as exc:
            key = ConnectionKey(self.host, self.port, False, True, None, None, None)
            raise aiohttp.ClientConnectorError(key, exc) from exc
        self._open.add(connection)
        return connection

    async def _open_socket(self) -> socket.socket:
        if self._unix_address is not None:
            local = await local_socket.connect(self.loop, self._unix_address)
            if local is not None:
                return local
        last_error: OSError | None = None
        for family, sock_type, proto, _, address in await self._resolve():
            sock = socket.socket(family, sock_type, proto)
            try:
                _configure(sock, self.config)
                sock.setblocking(False)
                await self.loop.sock_connect(sock, address)
                return sock
            except OSError as exc:
                sock.close()
                last_error = exc
            except BaseException:
                sock.close()
                raise
        raise last_error or OSError(f"no address for {self.host}")

    async def _resolve(self) -> list[tuple[Any, ...]]:
        if self._addresses and self.loop.time() < self._dns_expires:
            return self._addresses
        try:
            socket.inet_pton(socket.AF_INET, self.host)  # an address already: no lookup (a thread) per connection
        except OSError:
            found = await self.loop.getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM)
        else:
            found = [(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (self.host, self.port))]
        self._addresses = found
        self._dns_expires = self.loop.time() + self.config.dns_cache_ttl_s
        return found

    def forget(self, connection: _Connection) -> None:
        self._open.discard(connection)

    def close(self) -> None:
        for connection in list(self._open):
            connection.close()
        self._idle.clear()
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None


def keepalive_options(config: TransportConfig) -> list[tuple[int, int, int]]:
    """``setsockopt`` arguments for TCP keep-alive probes, so a silently dropped peer is noticed before the deadline
    (the platform's names only where it has them). Both clients' sockets get them."""
    options = [(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)]
    for name, value in (
        ("TCP_KEEPIDLE", config.tcp_keepalive_idle_s),
        ("TCP_KEEPINTVL", config.tcp_keepalive_interval_s),
        ("TCP_KEEPCNT", config.tcp_keepalive_count),
    ):
        if hasattr(socket, name):
            options.append((socket.IPPROTO_TCP, getattr(socket, name), value))
    return options


def _configure(sock: socket.socket, config: TransportConfig) -> None:
    """No Nagle delay (one write per request), and TCP keep-alive probes as aiohttp's sockets get them."""
    for level, option, value in [(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1), *keepalive_options(config)]:
        try:
            sock.setsockopt(level, option, value)
        except OSError:
            pass  # an optimisation a platform may refuse


# --------------------------------------------------------------------------------------------------------------------
# Pools per event loop


_pools: dict[asyncio.AbstractEventLoop, dict[str, _Pool]] = {}


def pool_for(loop: asyncio.AbstractEventLoop, prefix: str, authority: str, config: TransportConfig) -> _Pool:
    """The pool of ``prefix`` (``http://host:port``) on ``loop``, created on first use with the process's pool
    settings (``config``)."""
    pools = _pools.get(loop)
    if pools is None:
        for old in [old for old in list(_pools) if old.is_closed()]:
            _pools.pop(old, None)  # their sockets died with them
        pools = _pools[loop] = {}
    pool = pools.get(prefix)
    if pool is None:
        pool = pools[prefix] = _Pool(loop, authority, config)
    return pool


def close_pools(loop: asyncio.AbstractEventLoop) -> None:
    """Close every connection of ``loop``'s pools (at shutdown, with the aiohttp session)."""
    for pool in _pools.pop(loop, {}).values():
        pool.close()
