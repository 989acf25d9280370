"""The errors a failed call raises: ours (server, path, status, what went wrong) and aiohttp's kind at once.

Every error of :mod:`nemo_gym.transport.http_client` is a :class:`TransportError` that names the server, the path and
the start of the answer. Code written for NeMo Gym reads the same failures in aiohttp's terms instead, because NeMo
Gym hands aiohttp's own exceptions on: ``except ClientResponseError as e: e.status, e.response_content`` after
``raise_for_status``, ``isinstance(e, ClientConnectionError)`` or ``ClientPayloadError`` to decide on a retry. So each
error here is also the aiohttp exception of its kind:

* :class:`StatusError` - a non-2xx answer: ``aiohttp.ClientResponseError`` with ``status``, ``message`` (the
  reason), ``headers``, ``request_info`` and ``response_content`` (the body, as NeMo Gym's ``raise_for_status`` sets);
* :class:`ConnectionFailed` - no answer (refused, reset, closed): ``aiohttp.ClientConnectionError``;
* :class:`PayloadFailed` - the answer broke off mid-body: ``aiohttp.ClientPayloadError``.
"""

from __future__ import annotations

from typing import Any, Final

import aiohttp
from yarl import URL

from nemo_gym.transport.admission import QueueTimeout
from nemo_gym.transport.types import ServerRequestError, ServerTimeoutError, TransportConfig, TransportError

__all__ = ["ConnectionFailed", "PayloadFailed", "StatusError", "status_error", "without_credentials"]

_SNIPPET_CHARS: Final[int] = 200
_UNPICKLABLE: Final = frozenset({"request_info", "headers", "history"})


class _AiohttpKind(ServerRequestError):
    """Keeps our message as ``str()`` and ``args`` (aiohttp's classes put other things there), and pickles without
    the request details aiohttp keeps in unpicklable multidict views."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self)!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        state = {key: value for key, value in vars(self).items() if key not in _UNPICKLABLE}
        return (type(self), (str(self),), state)


class StatusError(_AiohttpKind, aiohttp.ClientResponseError):  # type: ignore[misc]  # status: int here, never None
    """A non-2xx answer, as our :class:`ServerRequestError` and as aiohttp's ``ClientResponseError``."""

    def __init__(
        self,
        message: str = "",
        *,
        server: str = "",
        url_path: str = "",
        status: int | None = None,
        attempts: int = 1,
        body_snippet: str = "",
        body: bytes | None = None,
        request_info: Any = None,
        history: tuple[Any, ...] = (),
        reason: str = "",
        headers: Any = None,
    ) -> None:
        # Not ServerRequestError.__init__: its cooperative super() call would land in aiohttp's __init__.
        aiohttp.ClientResponseError.__init__(
            self, request_info, history, status=status or 0, message=reason, headers=headers
        )
        self.args = (message,)
        self.server = server
        self.url_path = url_path
        self.attempts = attempts
        self.body_snippet = body_snippet
        self.response_content = body
        """The whole body of the answer (NeMo Gym's attribute)."""


class ConnectionFailed(_AiohttpKind, aiohttp.ClientConnectionError):
    """No answer came (refused, reset, closed before a response): also aiohttp's ``ClientConnectionError``."""


class PayloadFailed(_AiohttpKind, aiohttp.ClientPayloadError):
    """The answer started and then broke off: also aiohttp's ``ClientPayloadError``."""


def status_error(
    resp: aiohttp.ClientResponse, body: bytes | None, server_name: str | None = None, url_path: str | None = None
) -> StatusError:
    """The error for a non-2xx response whose body is ``body``: server, path, status and the start of the body."""
    target = _describe_target(resp.url, server_name)
    path = _path_of(resp.url, url_path)
    snippet = _snippet(body)
    message = f"{resp.method} {path} to {target} returned HTTP {resp.status} {resp.reason or ''}".rstrip()
    if snippet:
        message += f": {snippet}"
    return _status_failure(message, resp, body, target, path, snippet, attempts=1)


def _status_failure(
    message: str,
    resp: aiohttp.ClientResponse,
    body: bytes | None,
    target: str,
    path: str,
    snippet: str,
    attempts: int,
) -> StatusError:
    return StatusError(
        message,
        server=target,
        url_path=path,
        status=resp.status,
        attempts=attempts,
        body_snippet=snippet,
        body=body,
        # a stand-in response (tests, adapters) may lack aiohttp's request details; the error still says what failed
        request_info=getattr(resp, "request_info", None),
        history=getattr(resp, "history", ()),
        reason=getattr(resp, "reason", None) or "",
        headers=getattr(resp, "headers", None),
    )


def _describe_target(url: str | URL, server_name: str | None) -> str:
    try:
        parsed = url if isinstance(url, URL) else URL(url)
        host_port = f"{parsed.host}:{parsed.port}" if parsed.host else str(url)
    except (TypeError, ValueError):
        host_port = str(url)
    return f"server '{server_name}' ({host_port})" if server_name else host_port


def _path_of(url: str | URL, url_path: str | None) -> str:
    if url_path:
        return without_credentials(url_path)
    try:
        return (url if isinstance(url, URL) else URL(url)).path or "/"
    except (TypeError, ValueError):
        return str(url)


def without_credentials(url: str | URL) -> str:
    """``url`` as an error message or a log line may show it: without ``user:password@``."""
    text = str(url)
    if "@" not in text or "://" not in text:
        return text
    try:
        return str(URL(text).with_user(None))
    except (TypeError, ValueError):
        return text.split("://", 1)[0] + "://<unparseable URL>"


def _snippet(body: bytes | None) -> str:
    if not body:
        return ""
    text = body[: _SNIPPET_CHARS * 4].decode("utf-8", errors="replace")
    text = " ".join(text.split())
    return text if len(text) <= _SNIPPET_CHARS else text[:_SNIPPET_CHARS] + "..."


def _describe_failure(failure: aiohttp.ClientResponse | BaseException) -> str:
    if isinstance(failure, aiohttp.ClientResponse):
        return f"HTTP {failure.status} {failure.reason or ''}".rstrip()
    return f"{type(failure).__name__}: {failure}"


def _kind_of(exc: BaseException) -> type[ServerRequestError]:
    """Our error class for an aiohttp failure: the one that is also its aiohttp kind."""
    if isinstance(exc, aiohttp.ClientPayloadError):
        return PayloadFailed
    if isinstance(exc, aiohttp.ClientConnectionError):
        return ConnectionFailed
    return ServerRequestError


def _final_error(
    method: str,
    url: str | URL,
    server_name: str | None,
    url_path: str | None,
    cfg: TransportConfig,
    attempts: int,
    failure: aiohttp.ClientResponse | BaseException,
    note: str,
) -> TransportError:
    target = _describe_target(url, server_name)
    path = _path_of(url, url_path)
    plural = "s" if attempts != 1 else ""
    if isinstance(failure, aiohttp.ConnectionTimeoutError):
        message = (
            f"{method} {path} to {target} could not connect within {cfg.connect_timeout_s:g} s "
            f"(connect_timeout_s) after {attempts} attempt{plural}{note}"
        )
        error: TransportError = ServerTimeoutError(
            message, server=target, url_path=path, timeout_s=cfg.connect_timeout_s, attempts=attempts
        )
        error.__cause__ = failure
        return error
    message = f"{method} {path} to {target} failed after {attempts} attempt{plural}: {_describe_failure(failure)}"
    if isinstance(failure, aiohttp.ClientResponse):
        snippet = _snippet(failure._body)
        if snippet:
            message += f": {snippet}"
        return _status_failure(message + note, failure, failure._body, target, path, snippet, attempts)
    error = _kind_of(failure)(message + note, server=target, url_path=path, attempts=attempts)
    error.__cause__ = failure
    return error


def _timeout_error(
    method: str,
    url: str | URL,
    server_name: str | None,
    url_path: str | None,
    total_timeout_s: float,
    attempts: int,
    exc: BaseException,
) -> ServerTimeoutError:
    target = _describe_target(url, server_name)
    path = _path_of(url, url_path)
    message = (
        f"{method} {path} to {target} timed out: no complete response within the {total_timeout_s:g} s deadline "
        f"(total_timeout_s, attempt {attempts}); not retried because the server may have processed it"
    )
    if isinstance(exc, QueueTimeout):
        message = (
            f"{method} {path} to {target} timed out before it was sent: every one of the {exc.slots} connections to "
            f"that server (limit_per_host) stayed busy until the {total_timeout_s:g} s deadline (total_timeout_s)"
        )
    return ServerTimeoutError(message, server=target, url_path=path, timeout_s=total_timeout_s, attempts=attempts)


def _request_error(
    method: str, url: str | URL, server_name: str | None, url_path: str | None, attempts: int, exc: BaseException
) -> ServerRequestError:
    target = _describe_target(url, server_name)
    path = _path_of(url, url_path)
    message = f"{method} {path} to {target} failed (not retried): {type(exc).__name__}: {exc}"
    return _kind_of(exc)(message, server=target, url_path=path, attempts=attempts)
