"""The one HTTP transport every server and client in the framework uses.

Servers talk to each other over HTTP/1.1 JSON, several hops per rollout, thousands of rollouts in flight. This module
keeps that cheap and bounded:

* one pooled :class:`aiohttp.ClientSession` per event loop, so connections are reused (keep-alive) and a process
  never opens more sockets than the pool allows; excess requests queue inside the pool instead of exhausting fds;
* orjson on both directions;
* calls to the run's own servers over plain HTTP skip aiohttp's general machinery (:mod:`.lean_client`), with the
  same pool bound, retries, errors and response type;
* a deadline on every call, and a small, jittered retry budget that only covers failures where the server cannot
  have acted on the request (connection refused/reset, 429, 502, 503, 504).

Errors raised here all derive from :class:`TransportError` and name the server, the path and what went wrong.
"""

from __future__ import annotations

import asyncio
import email.utils
import logging
import math
import random
import socket
import threading
from collections.abc import AsyncGenerator, Callable, Mapping
from datetime import UTC, datetime
from functools import lru_cache
from http.cookies import Morsel
from typing import Any, Final

import aiohttp
import orjson
from pydantic import BaseModel
from yarl import URL

from nemo_gym.transport import access, lean_client
from nemo_gym.transport.admission import NESTED_HEADER, HostGate, QueueTimeout
from nemo_gym.transport.failures import (
    _describe_failure,
    _final_error,
    _path_of,
    _request_error,
    _timeout_error,
    status_error,
    without_credentials,
)
from nemo_gym.transport.origins import origin_of
from nemo_gym.transport.types import (
    UPSTREAM_FAILURE_HEADER,
    ServerRequestError,
    ServerTimeoutError,
    TransportConfig,
    TransportError,
    get_default_config,
    set_default_config,
)

__all__ = [
    "RETRYABLE_STATUSES",
    "ServerRequestError",
    "ServerTimeoutError",
    "TransportConfig",
    "TransportError",
    "close_session",
    "cookies_from",
    "dumps",
    "get_default_config",
    "get_session",
    "raise_for_status",
    "request",
    "response_json",
    "set_default_config",
    "status_error",
    "without_credentials",
]

logger = logging.getLogger(__name__)

Cookies = Mapping[str, "str | Morsel[str]"]
"""What ``cookies=`` takes: plain values (:func:`cookies_from`), or a response's own ``cookies`` as they are."""

RETRYABLE_STATUSES: Final[frozenset[int]] = frozenset({429, 502, 503, 504})
"""Statuses meaning "the server (or a proxy in front of it) did not act on this request; try again later"."""

_RETRY_AFTER_STATUSES: Final[frozenset[int]] = frozenset({429, 503})
_JSON_HEADERS: Final[Mapping[str, str]] = {"Content-Type": "application/json"}
_NESTED_HEADERS: Final[Mapping[str, str]] = {NESTED_HEADER: "1"}
_NESTED_JSON_HEADERS: Final[Mapping[str, str]] = {**_JSON_HEADERS, **_NESTED_HEADERS}


# --------------------------------------------------------------------------------------------------------------------
# Configuration and the per-loop session
# --------------------------------------------------------------------------------------------------------------------

_sessions: dict[asyncio.AbstractEventLoop, aiohttp.ClientSession] = {}
_gates: dict[asyncio.AbstractEventLoop, HostGate] = {}
_closers: dict[asyncio.AbstractEventLoop, AsyncGenerator[None, None]] = {}
_sessions_lock = threading.Lock()


def get_session() -> aiohttp.ClientSession:
    """Return the running loop's shared session, creating it on first use.

    One session per loop because an aiohttp session is bound to the loop it was created on; a process running
    servers in several threads (one loop each) gets one pool per loop.
    """
    return _session_for(asyncio.get_running_loop())


async def close_session() -> None:
    """Close the running loop's session (call on shutdown); a later call creates a fresh one."""
    loop = asyncio.get_running_loop()
    with _sessions_lock:
        session = _sessions.pop(loop, None)
        _gates.pop(loop, None)
        closer = _closers.pop(loop, None)
    lean_client.close_pools(loop)
    if closer is not None:
        await closer.aclose()  # runs its cleanup now, so the loop's shutdown finds nothing left to do
    if session is not None and not session.closed:
        await session.close()


async def _close_at_loop_shutdown(session: aiohttp.ClientSession) -> AsyncGenerator[None, None]:
    """Closes ``session`` when its loop shuts down, if nobody called :func:`close_session` first.

    A script that calls servers with ``asyncio.run(...)`` and never closes the session would otherwise leave aiohttp
    printing "Unclosed client session" at exit. Started once, this generator is registered with the running loop
    (its async-generator hooks), and ``asyncio.run`` / uvloop close every such generator while the loop still runs,
    which runs the ``finally`` below. ``_closers`` keeps it alive until then (the loop only holds it weakly).
    """
    try:
        yield
    finally:
        loop = asyncio.get_running_loop()
        with _sessions_lock:
            if _sessions.get(loop) is session:  # else close_session() (or a newer session) took its place already
                del _sessions[loop]
                _gates.pop(loop, None)
                _closers.pop(loop, None)
                lean_client.close_pools(loop)
        if not session.closed:
            await session.close()


def _watch_loop_shutdown(loop: asyncio.AbstractEventLoop, session: aiohttp.ClientSession) -> None:
    closer = _close_at_loop_shutdown(session)
    try:
        closer.asend(None).send(None)  # run to its ``yield`` now: registers it with the running loop
    except StopIteration:
        pass
    _closers[loop] = closer


def _session_for(loop: asyncio.AbstractEventLoop) -> aiohttp.ClientSession:
    session = _sessions.get(loop)
    if session is not None and not session.closed:
        return session
    with _sessions_lock:
        session = _sessions.get(loop)
        if session is None or session.closed:
            # Forget sessions of loops that are gone; their sockets died with the loop.
            for old_loop in [old for old in _sessions if old.is_closed()]:
                del _sessions[old_loop]
                _gates.pop(old_loop, None)
                _closers.pop(old_loop, None)
            config = get_default_config()
            session = _new_session(config)
            _sessions[loop] = session
            _gates[loop] = HostGate(config.limit_per_host, loop)
            _watch_loop_shutdown(loop, session)
    return session


def _new_session(config: TransportConfig) -> aiohttp.ClientSession:
    connector = aiohttp.TCPConnector(
        limit=config.limit,
        limit_per_host=config.limit_per_host,
        keepalive_timeout=config.keepalive_timeout_s,
        use_dns_cache=True,
        ttl_dns_cache=config.dns_cache_ttl_s,
        socket_factory=_keepalive_socket_factory(config),
    )
    return aiohttp.ClientSession(
        connector=connector,
        # Cookies are threaded through calls by hand (per-rollout sessions); a shared jar would mix rollouts.
        cookie_jar=aiohttp.DummyCookieJar(),
        timeout=_client_timeout(config.total_timeout_s, config.connect_timeout_s),
        # Internal calls must never be routed through an HTTP proxy found in the environment.
        trust_env=False,
    )


def _keepalive_socket_factory(config: TransportConfig) -> Callable[[tuple[Any, ...]], socket.socket]:
    """Build sockets with TCP keep-alive probes, so a silently dropped peer is noticed before the deadline."""
    options = lean_client.keepalive_options(config)

    def factory(addr_info: tuple[Any, ...]) -> socket.socket:
        family, sock_type, proto = addr_info[0], addr_info[1], addr_info[2]
        sock = socket.socket(family=family, type=sock_type, proto=proto)
        try:
            for level, option, value in options:
                sock.setsockopt(level, option, value)
        except OSError:
            # Keep-alive is an optimisation; a platform refusing an option must not fail the call.
            logger.debug("could not set TCP keep-alive options", exc_info=True)
        return sock

    return factory


@lru_cache(maxsize=256)
def _client_timeout(total_s: float, connect_s: float) -> aiohttp.ClientTimeout:
    # sock_connect, not connect: aiohttp's "connect" also counts time queued for a pooled connection.
    return aiohttp.ClientTimeout(total=total_s, sock_connect=connect_s)


# --------------------------------------------------------------------------------------------------------------------
# Bodies, cookies and errors
# --------------------------------------------------------------------------------------------------------------------


def _orjson_default(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", exclude_unset=True)
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serialisable")


def dumps(value: Any) -> bytes:
    """Serialise a request body with orjson; pydantic models (also nested) are dumped with ``exclude_unset=True``."""
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json", exclude_unset=True)
    raw = orjson.dumps(value, default=_orjson_default)
    # orjson's bytes keep the buffer it reserved for the worst case: at least 4 KB, ~6x a body of 2.5 KB. A body is
    # held while its call is in flight (thousands at once in an agent) or kept for a run's end, so a small one is
    # handed on as an exact-size copy (one memcpy). A large one is left as it is: the pages of its reserve it never
    # wrote are not resident, and a copy would double it for a moment.
    return bytes(memoryview(raw)) if len(raw) < _COMPACT_BELOW else raw


_COMPACT_BELOW: Final = 1 << 20


async def response_json(resp: aiohttp.ClientResponse) -> Any:
    """Parse a response body with orjson (several times faster than ``resp.json()`` on large model outputs)."""
    return orjson.loads(await resp.read())


def cookies_from(resp: aiohttp.ClientResponse) -> dict[str, str]:
    """Return the cookies a response set, as a plain dict to pass as ``cookies=`` to the next call.

    Values are kept exactly as the server encoded them, so sending them back is byte-for-byte what it issued.
    """
    if type(resp) is lean_client.LeanResponse and resp._cookies is None:
        plain = lean_client.fast_cookies(resp)  # the common case without building a SimpleCookie
        if plain is not None:
            return plain
    return {name: morsel.coded_value for name, morsel in resp.cookies.items()}


def raise_for_status(
    resp: aiohttp.ClientResponse, server_name: str | None = None, url_path: str | None = None
) -> aiohttp.ClientResponse:
    """Raise :class:`ServerRequestError` for a non-2xx response, else return it (so calls can be chained).

    The message names the server, path, status and the start of the body, which is usually the server's own
    explanation of what went wrong.
    """
    if 200 <= resp.status < 300:
        return resp
    raise status_error(resp, resp._body, server_name, url_path)  # request() always reads the body before returning


def _build_headers(
    headers: Mapping[str, str] | None, cookies: Cookies | None, is_json: bool, nested: bool = False
) -> Mapping[str, str] | None:
    """The request's headers: content type, the caller's own, cookies, and the nested-call mark inside a server."""
    if not cookies and headers is None:
        if is_json:
            return _NESTED_JSON_HEADERS if nested else _JSON_HEADERS
        return _NESTED_HEADERS if nested else None
    if not cookies and not is_json and not nested:
        return headers
    merged: dict[str, str] = dict(_JSON_HEADERS) if is_json else {}
    if nested:
        merged.update(_NESTED_HEADERS)
    if headers:
        merged.update(headers)
    if cookies:
        cookie_header = _cookie_header(cookies)
        existing = next((key for key in merged if key.lower() == "cookie"), None) if headers else None
        if existing is None:
            merged["Cookie"] = cookie_header
        else:
            merged[existing] = f"{merged[existing]}; {cookie_header}"
    return merged


def _cookie_header(cookies: Cookies) -> str:
    # Sent verbatim (as a browser echoes Set-Cookie values); only characters that would break the header are refused.
    # A response's own ``cookies`` (Morsels, attributes and all) may be passed as they are, as NeMo Gym's agents do:
    # only each morsel's value goes out.
    parts = []
    for name, cookie in cookies.items():
        value = cookie.coded_value if isinstance(cookie, Morsel) else cookie
        pair = f"{name}={value}"
        if ";" in pair or "\r" in pair or "\n" in pair or "=" in name:
            raise ValueError(f"cookie {name!r} contains a character that cannot be sent in a Cookie header")
        parts.append(pair)
    return "; ".join(parts)


def _retry_after_s(resp: aiohttp.ClientResponse) -> float | None:
    value = resp.headers.get("Retry-After")
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        seconds = (when - datetime.now(UTC)).total_seconds()
    return max(0.0, seconds) if math.isfinite(seconds) else None


# --------------------------------------------------------------------------------------------------------------------
# request()
# --------------------------------------------------------------------------------------------------------------------

_CONNECTION_ERRORS: Final = (aiohttp.ClientConnectorError, aiohttp.ServerDisconnectedError, aiohttp.ClientOSError)


async def request(
    method: str,
    url: str | URL,
    *,
    json: Any = None,
    data: bytes | None = None,
    headers: Mapping[str, str] | None = None,
    cookies: Cookies | None = None,
    server_name: str | None = None,
    url_path: str | None = None,
    config: TransportConfig | None = None,
    retry: bool | None = None,
    nested: bool = False,
) -> aiohttp.ClientResponse:
    """Send one HTTP request through the shared pool and return the response with its body already read.

    Because the body is read, the connection is back in the pool on return and ``await resp.json()``,
    ``await resp.text()`` or :func:`response_json` work afterwards.

    Args:
        method: HTTP method.
        url: Full URL, e.g. ``http://127.0.0.1:8000/verify``.
        json: Body to send as JSON (any orjson-serialisable value or a pydantic model). Exclusive with ``data``.
        data: A body already serialised, sent as is.
        headers: Extra request headers.
        cookies: Cookies to send on this call only (the session stores none); see :func:`cookies_from`.
        server_name: Name of the target server instance, used in error messages.
        url_path: Path used in error messages (defaults to the URL's path).
        config: Timeouts and retry budget for this call (default: :func:`get_default_config`).
        nested: Mark the call as made while serving an admitted request (``X-NeMo-Gym-Nested``), so the target
            server never queues it (see :mod:`nemo_gym.transport.admission`). :class:`~nemo_gym.server_utils.ServerClient`
            sets it for calls between servers; calls to outside APIs never carry it.
        retry: ``False`` makes exactly one attempt and returns any status untouched. Otherwise (the default)
            connection errors and 429/502/503/504 are retried up to ``config.max_attempts`` with capped, fully
            jittered exponential backoff, honouring ``Retry-After`` on 429/503.

    Returns:
        The response. Statuses other than the retryable ones are returned untouched, including 4xx and 500; use
        :func:`raise_for_status` when they are errors for the caller.

    Raises:
        ServerRequestError: a connection error or retryable status persisted through every attempt, the next
            backoff would pass the deadline, or aiohttp failed in another way (malformed response, bad URL).
        ServerTimeoutError: the deadline (``total_timeout_s``) passed, or connecting timed out on the last attempt.
    """
    if json is not None and data is not None:
        raise ValueError("pass either json= or data=, not both")
    cfg = config if config is not None else get_default_config()
    body = dumps(json) if json is not None else data
    lean = lean_client.split(url, method)
    origin = origin_of(url) if lean is None else lean_client.origin_of_server(lean[0])
    # A server of this run gets the run's token; any other destination never does (see transport/access.py).
    request_headers = access.headers_for(origin, _build_headers(headers, cookies, json is not None, nested))
    max_attempts = 1 if retry is False else cfg.max_attempts
    loop = asyncio.get_running_loop()
    session = _session_for(loop)
    limiter = _gates[loop].limiter(origin)
    deadline = loop.time() + cfg.total_timeout_s
    timeout = _client_timeout(cfg.total_timeout_s, cfg.connect_timeout_s)
    pool = None
    if lean is not None and (lean_client.is_marked(origin) or access.registered_token(lean[0]) is not None):
        pool = lean_client.pool_for(loop, lean[0], lean[1], get_default_config())  # one of the run's own servers

    attempt = 0
    while True:
        attempt += 1
        failure: aiohttp.ClientResponse | BaseException
        if not limiter.try_acquire():
            # Every connection to this server is busy: queue (first come, first served) within the deadline.
            try:
                await limiter.acquire(deadline)
            except QueueTimeout as exc:
                raise _timeout_error(method, url, server_name, url_path, cfg.total_timeout_s, attempt, exc) from exc
            timeout = aiohttp.ClientTimeout(
                total=max(deadline - loop.time(), 0.001), sock_connect=cfg.connect_timeout_s
            )
        try:
            lean_resp = None
            if pool is not None and lean is not None:
                lean_resp = await pool.send(
                    method, str(url), lean[2], request_headers, body, deadline, cfg.connect_timeout_s
                )
            if lean_resp is None:  # not one of ours, or a redirect (aiohttp follows those)
                resp = await session.request(method, url, data=body, headers=request_headers, timeout=timeout)
            else:
                resp = lean_resp
        except aiohttp.ConnectionTimeoutError as exc:
            # Nothing was sent, so this is safe to retry like any other connection failure.
            failure = exc
        except aiohttp.ClientSSLError as exc:
            # A certificate or TLS mismatch will not fix itself between attempts.
            raise _request_error(method, url, server_name, url_path, attempt, exc) from exc
        except _CONNECTION_ERRORS as exc:
            # Refused, reset, or closed before any response arrived.
            failure = exc
        except TimeoutError as exc:
            # The request may have reached the server: retrying could run it twice.
            raise _timeout_error(method, url, server_name, url_path, cfg.total_timeout_s, attempt, exc) from exc
        except aiohttp.ClientError as exc:
            raise _request_error(method, url, server_name, url_path, attempt, exc) from exc
        else:
            try:
                # Reading to EOF hands the connection back to the pool (read() closes it on failure). Not
                # `async with`: that marks the response released and makes a later `await resp.read()` raise.
                await resp.read()
            except TimeoutError as exc:
                raise _timeout_error(method, url, server_name, url_path, cfg.total_timeout_s, attempt, exc) from exc
            except aiohttp.ClientError as exc:
                # The server already answered, so it acted on the request: never retried.
                raise _request_error(method, url, server_name, url_path, attempt, exc) from exc
            if retry is False or resp.status not in RETRYABLE_STATUSES or _answered(resp):
                return resp
            failure = resp
        finally:
            limiter.release()

        if attempt >= max_attempts:
            raise _final_error(method, url, server_name, url_path, cfg, attempt, failure, "")
        delay = _backoff_s(cfg, attempt, failure)
        remaining = deadline - loop.time()
        if delay >= remaining:
            note = f"; gave up: the next retry (in {delay:.2f} s) would pass the {cfg.total_timeout_s:g} s deadline"
            raise _final_error(method, url, server_name, url_path, cfg, attempt, failure, note)
        logger.debug(
            "retrying %s %s (attempt %d/%d) in %.3f s after %s",
            method,
            _path_of(url, url_path),
            attempt + 1,
            max_attempts,
            delay,
            _describe_failure(failure),
        )
        await asyncio.sleep(delay)
        # Later attempts get only what is left of the deadline.
        timeout = aiohttp.ClientTimeout(total=max(deadline - loop.time(), 0.001), sock_connect=cfg.connect_timeout_s)


def _answered(resp: aiohttp.ClientResponse) -> bool:
    """A 502 from a server of ours whose own call to another server failed: its answer, never retried."""
    return resp.status == 502 and UPSTREAM_FAILURE_HEADER in resp.headers


def _backoff_s(cfg: TransportConfig, attempt: int, failure: aiohttp.ClientResponse | BaseException) -> float:
    if isinstance(failure, aiohttp.ClientResponse) and failure.status in _RETRY_AFTER_STATUSES:
        retry_after = _retry_after_s(failure)
        if retry_after is not None:
            # A little jitter on top keeps many rollouts told "retry in 1 s" from returning in the same instant.
            return min(retry_after, cfg.retry_after_cap_s) + random.uniform(0.0, cfg.backoff_base_s)
    bound = min(cfg.backoff_cap_s, cfg.backoff_base_s * (2 ** (attempt - 1)))
    return random.uniform(0.0, bound)
