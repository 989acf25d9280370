"""Requests in aiohttp's own terms, for code written against NeMo Gym's ``server_utils.request``.

:func:`request` takes aiohttp's keyword arguments (``params=``, ``timeout=``, ``allow_redirects=``, ...) and returns
the :class:`aiohttp.ClientResponse` with its body *unread*: the caller streams it, reads ``resp.content``, or uses
``async with``, and the connection goes back to the shared pool of :mod:`nemo_gym.transport.http_client` once the body
is read. Connection failures are retried as that module retries them (the server cannot have acted on them); a status
is never retried, and nothing else is wrapped, so aiohttp's own exceptions reach the caller.

:func:`check_status` is NeMo Gym's ``raise_for_status``: ``await check_status(resp)`` works for every response, and a
plain call still raises at once when the body is already read (responses of ``http_client.request``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Generator
from typing import Any, Final

import aiohttp
from yarl import URL

from nemo_gym.transport import access
from nemo_gym.transport.http_client import (
    _backoff_s,
    _final_error,
    dumps,
    get_session,
    raise_for_status,
    status_error,
)
from nemo_gym.transport.origins import origin_of
from nemo_gym.transport.types import get_default_config

__all__ = ["check_status", "request"]

_CONNECTION_ERRORS: Final = (aiohttp.ClientConnectorError, aiohttp.ServerDisconnectedError, aiohttp.ClientOSError)


async def request(
    method: str,
    url: str | URL,
    _internal: bool = False,
    _max_connection_retries: int | None = None,
    _server_name: str | None = None,
    *,
    session: aiohttp.ClientSession | None = None,
    **kwargs: Any,
) -> aiohttp.ClientResponse:
    """Send one request through the shared pool; the body of the answer is left for the caller to read.

    ``json=`` is serialised with orjson (pydantic models dumped with ``exclude_unset=True``). ``_internal`` is
    accepted for NeMo Gym's signature and changes nothing: every call gets the same retry budget.
    ``_max_connection_retries`` (NeMo Gym's): at most that many attempts when the connection fails (0 or 1: one),
    and then aiohttp's own error is raised, for a caller that runs its own retry loop or can find a moved endpoint;
    ``None``: the transport's budget (``max_attempts``), then a :class:`TransportError`. ``_server_name`` names the
    destination in that error. ``session``: the session to send through (the running loop's pooled one by default).
    """
    if kwargs.get("json") is not None:
        kwargs["data"] = dumps(kwargs.pop("json"))
        headers = dict(kwargs.get("headers") or {})
        if not any(key.lower() == "content-type" for key in headers):
            headers["Content-Type"] = "application/json"
        kwargs["headers"] = headers
    kwargs["headers"] = access.headers_for(origin_of(url), kwargs.get("headers"))  # our own servers only
    cfg = get_default_config()
    if session is None:
        session = get_session()
    budget = cfg.max_attempts if _max_connection_retries is None else max(1, _max_connection_retries)
    attempt = 0
    while True:
        attempt += 1
        try:
            return await session.request(method=method, url=url, **kwargs)
        except aiohttp.ConnectionTimeoutError as exc:
            failure: BaseException = exc
        except _CONNECTION_ERRORS as exc:
            failure = exc
        if attempt >= budget:
            if _max_connection_retries is not None:
                raise failure
            raise _final_error(method, url, _server_name, None, cfg, attempt, failure, "") from failure
        await asyncio.sleep(_backoff_s(cfg, attempt, failure))


class _Passed:
    """A 2xx response, awaitable: ``await check_status(resp)`` gives ``resp`` back, and a plain call costs nothing."""

    __slots__ = ("response",)

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self.response = response

    def __await__(self) -> Generator[Any, None, aiohttp.ClientResponse]:
        yield from ()
        return self.response


def check_status(
    resp: aiohttp.ClientResponse, server_name: str | None = None, url_path: str | None = None
) -> Awaitable[aiohttp.ClientResponse]:
    """Raise :class:`ServerRequestError` for a non-2xx response, else hand the response back when awaited.

    A response whose body is already read fails at once, awaited or not. One whose body is unread (from
    :func:`request`) can only fail once the body is read, so its error comes with the ``await``, and it is the
    response's own (aiohttp's ``ClientResponseError``), as in NeMo Gym; a caller that
    forgets the ``await`` gets Python's "coroutine was never awaited" warning rather than silence.

    Anything that is not an aiohttp response (the stand-ins environments' tests hand over) is judged as NeMo Gym
    judges it, touching only what NeMo Gym touches: ``ok``, then on failure ``content.read()`` and its own
    ``raise_for_status()``. Such a stand-in often has no ``status``, ``url`` or ``_body`` at all.
    """
    real = isinstance(resp, aiohttp.ClientResponse)
    status = resp.status if real else None
    passed = 200 <= status < 300 if isinstance(status, int) else bool(resp.ok)  # a mock's status may be unset
    if passed:
        return _Passed(resp)
    if real and isinstance(getattr(resp, "_body", None), bytes):
        raise_for_status(resp, server_name, url_path)
    return _raise_after_reading(resp, server_name, url_path, real)


async def _raise_after_reading(
    resp: aiohttp.ClientResponse, server_name: str | None, url_path: str | None, real: bool
) -> aiohttp.ClientResponse:
    """NeMo Gym's order: read the body, then the response's own ``raise_for_status()`` raises (aiohttp's
    ``ClientResponseError``, or whatever a test double raises) with the body kept as ``response_content``.

    An aiohttp response is read with ``read()``, so its body stays readable after the error; a stand-in is read
    through ``content`` as NeMo Gym reads it (its ``read()`` when it has no ``content``).
    """
    stream = None if real else getattr(resp, "content", None)
    body = await (resp.read() if stream is None else stream.read())
    content = body if isinstance(body, bytes) else None
    try:
        resp.raise_for_status()
    except aiohttp.ClientResponseError as exc:
        exc.response_content = content  # type: ignore[attr-defined]  # NeMo Gym's extra attribute
        raise
    if not real:
        return resp  # a stand-in whose own check lets it pass: NeMo Gym lets the call go on
    raise status_error(resp, content, server_name, url_path)  # a response whose own check let it pass
