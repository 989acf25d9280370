"""Who may talk to the servers of a run, and what they may send: the run token, a body-size limit, JSON only.

The token. The launcher makes one random token per run (:func:`new_token`) and writes it into the run's config file
(key :data:`RUN_TOKEN_KEY`; mode 0600, deleted at stop), which every server it starts reads, and into a 0600 token
file named after the head server's address (:func:`token_file`), where a client in another shell (``gym eval run
--no-serve``, ``gym env status``, a trainer's ``ServerClient.load_from_global_config``) finds it, as it finds the
head server itself by its address. :data:`TOKEN_ENV_VAR` overrides the file. The head server never serves it.

Why a header of our own (:data:`TOKEN_HEADER`) and not ``Authorization: Bearer``: model servers are also called by
clients with their own ``Authorization`` header (the ``openai`` SDK always sends its ``api_key`` there), and calls out
of a model server to an upstream API carry the upstream's key in it. So our clients send :data:`TOKEN_HEADER`, and a
model server also accepts ``Authorization: Bearer <token>``, so ``openai.OpenAI(base_url=..., api_key=<token>)``
works against it, and ``x-api-key: <token>``, the header ``anthropic.Anthropic(base_url=..., api_key=<token>)`` sends.

Our clients send the token only to servers of this run: :func:`register` records it per destination
(``scheme://host:port`` of each server instance and the head server), and the pooled client adds the header to a call
whose destination is one of those (:func:`headers_for`). A call to an outside API (api.openai.com, a vLLM endpoint)
never carries it.

"No token configured" is explicit: a config without :data:`RUN_TOKEN_KEY` (a server built in a unit test, a run
started with ``auth: false`` behind the user's own gateway) has no token to require, and the server says so in its
log. The body limit and the content-type rule hold either way: a browser can send ``text/plain`` and form bodies to
any local port without asking (no CORS preflight), and 415 closes that door.
"""

from __future__ import annotations

import hmac
import json
import mmap
import os
import secrets
import stat
import tempfile
from collections.abc import Awaitable, Callable, Iterable, Mapping, MutableMapping
from pathlib import Path
from typing import Any, Final

from nemo_gym.errors import ConfigError
from nemo_gym.transport.origins import origin_of

__all__ = [
    "AUTH_KEY",
    "DEFAULT_MAX_BODY_BYTES",
    "MAX_BODY_KEY",
    "RUN_TOKEN_KEY",
    "TOKEN_DIR_ENV_VAR",
    "TOKEN_ENV_VAR",
    "TOKEN_HEADER",
    "AccessMiddleware",
    "forget",
    "headers_for",
    "max_body_bytes",
    "new_token",
    "read_token_file",
    "register",
    "registered_token",
    "remove_token_file",
    "short_echo",
    "token_file",
    "write_token_file",
]

TOKEN_HEADER: Final = "X-NeMo-Gym-Token"
RUN_TOKEN_KEY: Final = "run_token"
"""Top-level key of the run's config file (written by the launcher, never composed): the token of the run."""
AUTH_KEY: Final = "auth"
"""Top-level setting (``--no-auth`` sets it false): whether the launcher makes a token. Default true."""
MAX_BODY_KEY: Final = "server_max_body_bytes"
"""Top-level setting: the largest request body any server of the run accepts (0 or null: no limit)."""
DEFAULT_MAX_BODY_BYTES: Final = 16 * 1024 * 1024
"""16 MiB. The largest legitimate bodies are a ``/run`` or a model call carrying a whole conversation: a 1M-token
context is ~4-6 MB of JSON, a few images as data URLs a few MB more. ``/aggregate_metrics`` (every row of a run by
design) is exempt (:data:`UNLIMITED_PATHS`)."""
UNLIMITED_PATHS: Final = frozenset({"/aggregate_metrics"})
TOKEN_ENV_VAR: Final = "NEMO_GYM_RUN_TOKEN"
"""A client's token, when it was handed over explicitly; otherwise the head server's token file is read."""
TOKEN_DIR_ENV_VAR: Final = "NEMO_GYM_TOKEN_DIR"
"""Where token files live (default: ``$XDG_RUNTIME_DIR/nemo_gym``, else ``<tmp>/nemo_gym-<uid>``)."""

_JSON_TYPE: Final = b"application/json"
_BODY_METHODS: Final = frozenset({"POST", "PUT", "PATCH"})
_TOKEN_KEY: Final = TOKEN_HEADER.lower().encode()
_ECHO_CHARS: Final = 200


def new_token() -> str:
    return secrets.token_urlsafe(32)


# --------------------------------------------------------------------------------------------------------------------
# The client side: which destinations get the token


_tokens: dict[str, str] = {}


def register(token: str | None, urls: Iterable[str]) -> None:
    """Send ``token`` on every later call to these servers (``http://host:port``; a wildcard host counts as loopback)."""
    if not token:
        return
    for url in urls:
        origin = origin_of(url)
        _tokens[origin] = token
        for wildcard, loopback in (("://0.0.0.0:", "://127.0.0.1:"), ("://[::]:", "://[::1]:")):
            if wildcard in origin:
                _tokens[origin.replace(wildcard, loopback)] = token


def forget(urls: Iterable[str]) -> None:
    for url in urls:
        _tokens.pop(origin_of(url), None)


def registered_token(url: str) -> str | None:
    return _tokens.get(origin_of(url)) if _tokens else None


def headers_for(origin: str, headers: Mapping[str, str] | None) -> Mapping[str, str] | None:
    """``headers`` plus the run token when ``origin`` (:func:`origin_of` a URL) is a server of a registered run;
    ``headers`` itself (no copy) otherwise."""
    if not _tokens:
        return headers
    token = _tokens.get(origin)
    if token is None:
        return headers
    return {TOKEN_HEADER: token} if not headers else {**headers, TOKEN_HEADER: token}


# --------------------------------------------------------------------------------------------------------------------
# Token files: how a client in another shell learns the token of a running head server


def token_file(host: str, port: int) -> Path:
    base = os.environ.get(TOKEN_DIR_ENV_VAR)
    if not base:
        runtime = os.environ.get("XDG_RUNTIME_DIR")
        base = os.path.join(runtime, "nemo_gym") if runtime else os.path.join(tempfile.gettempdir(), _user_dir())
    safe_host = "".join(c if c.isalnum() or c in ".-" else "_" for c in host)
    return Path(base) / f"head-{safe_host}-{port}.token"


def _user_dir() -> str:
    return f"nemo_gym-{os.getuid()}" if hasattr(os, "getuid") else "nemo_gym"


def write_token_file(path: Path, token: str) -> None:
    """The token, readable by this user only, in a directory only this user may enter."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    found = path.parent.lstat()  # not a link someone else planted in a shared temporary directory
    if not stat.S_ISDIR(found.st_mode) or (hasattr(os, "getuid") and found.st_uid != os.getuid()):
        raise ConfigError(
            f"{path.parent} is not a directory of yours; set {TOKEN_DIR_ENV_VAR} to one for the run's token file"
        )
    path.parent.chmod(0o700)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(token)
    os.replace(tmp, path)


def read_token_file(host: str, port: int) -> str | None:
    """The token for the head server at ``host:port``: :data:`TOKEN_ENV_VAR`, else its token file, else None."""
    explicit = os.environ.get(TOKEN_ENV_VAR)
    if explicit:
        return explicit
    for candidate in {host, {"0.0.0.0": "127.0.0.1", "localhost": "127.0.0.1"}.get(host, host), "127.0.0.1"}:
        try:
            return token_file(candidate, port).read_text(encoding="utf-8").strip() or None
        except OSError:
            continue
    return None


def remove_token_file(path: Path, token: str) -> None:
    """Remove the file if it still holds ``token`` (a later run on the same port may have replaced it)."""
    try:
        if path.read_text(encoding="utf-8").strip() == token:
            path.unlink()
    except OSError:
        pass


def max_body_bytes(config: Any) -> int | None:
    """The config's body limit (:data:`MAX_BODY_KEY`): the default when unset, None for ``0``/``null``."""
    if config is None or MAX_BODY_KEY not in config:
        return DEFAULT_MAX_BODY_BYTES
    value = config.get(MAX_BODY_KEY)
    if value is None or value == 0:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"{MAX_BODY_KEY} must be a whole number of bytes (0 or null: no limit), not {value!r}")
    return value


# --------------------------------------------------------------------------------------------------------------------
# The server side

_Scope = MutableMapping[str, Any]
_Message = MutableMapping[str, Any]
_Receive = Callable[[], Awaitable[_Message]]
_Send = Callable[[_Message], Awaitable[None]]
_App = Callable[[_Scope, _Receive, _Send], Awaitable[None]]


class AccessMiddleware:
    """ASGI middleware: the run token (401), a body-size limit (413) and JSON-only bodies (415), in one header scan.

    ``token=None``: no token is required. ``accept_bearer``: ``Authorization: Bearer <token>`` and ``x-api-key:
    <token>`` also count (model servers). A body over ``max_body`` is refused from its ``Content-Length`` before the app runs, or, sent chunked,
    as soon as the bytes read pass the limit: nothing past the limit is kept, so memory stays flat.
    """

    def __init__(self, app: _App, token: str | None, max_body: int | None, accept_bearer: bool = False) -> None:
        self.app = app
        self._token = token.encode() if token else None
        self._bearer = b"bearer " + self._token if self._token and accept_bearer else None
        self.max_body = max_body

    async def __call__(self, scope: _Scope, receive: _Receive, send: _Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        presented: bytes | None = None
        authorization: bytes | None = None
        api_key: bytes | None = None
        content_type: bytes | None = None
        length: bytes | None = None
        chunked = False
        for name, value in scope["headers"]:
            if name == _TOKEN_KEY:
                presented = value
            elif name == b"authorization":
                authorization = value
            elif name == b"x-api-key":
                api_key = value
            elif name == b"content-type":
                content_type = value
            elif name == b"content-length":
                length = value
            elif name == b"transfer-encoding":
                chunked = b"chunked" in value.lower()
        if self._token is not None and not self._authorized(presented, authorization, api_key):
            await _reply(send, 401, self._refusal(presented, authorization, api_key))
            return
        declared = _declared_length(length)
        if scope["method"] in _BODY_METHODS and (chunked or declared != 0) and not _is_json(content_type):
            shown = (content_type or b"none").decode("latin-1")[:80]
            await _reply(send, 415, f"request bodies must be application/json, not {shown}")
            return
        limit = None if scope["path"] in UNLIMITED_PATHS else self.max_body
        if limit is None:
            await self.app(scope, receive, send)
            return
        if declared is None and chunked:
            await self._limited(scope, receive, send, limit)
        elif declared is not None and declared > limit:
            await _refuse_too_large(receive, send, declared, limit)
        else:  # the HTTP parser never hands over more than the declared length
            await self.app(scope, receive, send)

    def _authorized(self, presented: bytes | None, authorization: bytes | None, api_key: bytes | None) -> bool:
        assert self._token is not None
        if presented is not None and hmac.compare_digest(presented, self._token):
            return True
        if self._bearer is not None and api_key is not None and hmac.compare_digest(api_key, self._token):
            return True
        if self._bearer is not None and authorization is not None:
            scheme, _, credential = authorization.partition(b" ")
            return scheme.lower() == b"bearer" and hmac.compare_digest(credential.strip(), self._token)
        return False

    def _refusal(self, presented: bytes | None, authorization: bytes | None, api_key: bytes | None) -> str:
        """The 401's error, about the credential the caller did send (a wrong Bearer token is not a missing header
        the caller never heard of); short, as every 401 is."""
        run = "use the run's token (its token file, or NEMO_GYM_RUN_TOKEN)"
        if presented is not None:
            return f"wrong {TOKEN_HEADER} header: {run}"
        bearer = authorization is not None and authorization.partition(b" ")[0].lower() == b"bearer"
        if self._bearer is None and (bearer or api_key is not None):
            sent = "Authorization: Bearer" if bearer else "x-api-key"
            return f"this server does not take {sent}: send the run's token as the {TOKEN_HEADER} header"
        if bearer:
            return f"wrong Authorization: Bearer token: {run}"
        if api_key is not None:
            return f"wrong x-api-key: {run}"
        accepted = f"{TOKEN_HEADER} or Authorization: Bearer" if self._bearer else f"{TOKEN_HEADER} header"
        return f"missing {accepted}: this server belongs to a run; {run}"

    async def _limited(self, scope: _Scope, receive: _Receive, send: _Send, limit: int) -> None:
        """A body of unknown length (chunked): read up to ``limit`` into one buffer, then hand it to the app whole.

        Checking inside the app's own read would leave the refusal to the app (FastAPI turns an error while reading
        into a 400) and the bytes read so far in a traceback until the next garbage collection. The buffer is an
        anonymous map: its pages are touched only as bytes arrive, and go back to the system when it is closed, so
        a refused body leaves nothing behind (a heap buffer of that size would stay in the process's free lists).
        """
        buffer = mmap.mmap(-1, limit + 1)
        size = 0
        try:
            while True:
                message = await receive()
                if message["type"] != "http.request":
                    return  # the client hung up mid-body: no one to answer
                chunk = message.get("body", b"")
                if size + len(chunk) > limit:
                    buffer.close()
                    await _refuse_too_large(receive, send, None, limit)
                    return
                buffer[size : size + len(chunk)] = chunk
                size += len(chunk)
                if not message.get("more_body", False):
                    break
            pending: list[_Message] = [{"type": "http.request", "body": buffer[:size], "more_body": False}]
        finally:
            buffer.close()

        async def replay() -> _Message:
            return pending.pop() if pending else await receive()

        await self.app(scope, replay, send)


def _declared_length(value: bytes | None) -> int | None:
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        return None


def _is_json(content_type: bytes | None) -> bool:
    if content_type is None:
        return False
    media = content_type.partition(b";")[0].strip().lower()
    return media == _JSON_TYPE or (media.startswith(b"application/") and media.endswith(b"+json"))


_DRAIN_LIMIT: Final = 64 * 1024 * 1024


async def _refuse_too_large(receive: _Receive, send: _Send, declared: int | None, limit: int) -> None:
    # Read (and drop) what the client is still sending, up to a bound, so that it reads the answer instead of a
    # connection reset halfway through its upload. Nothing read is kept.
    drained = 0
    while declared is None or declared <= _DRAIN_LIMIT:
        message = await receive()
        if message["type"] != "http.request":
            break
        drained += len(message.get("body", b""))
        if not message.get("more_body", False) or drained > _DRAIN_LIMIT:
            break
    size = f"{declared} bytes" if declared is not None else f"more than {limit} bytes"
    await _reply(send, 413, f"request body too large ({size}); the limit is {limit} bytes ({MAX_BODY_KEY})")


async def _reply(send: _Send, status: int, error: str) -> None:
    body = json.dumps({"error": error}).encode()
    headers = [(b"content-type", _JSON_TYPE), (b"content-length", str(len(body)).encode())]
    if status == 401:
        headers.append((b"www-authenticate", b'Bearer realm="nemo-gym"'))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def short_echo(value: Any) -> Any:
    """A value an error may echo back: itself if short, else its first characters and its size."""
    if value is None or isinstance(value, (bool, int, float)):
        return value
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    if len(text) <= _ECHO_CHARS:
        return value
    return f"{text[:_ECHO_CHARS]}... ({len(text.encode())} bytes)"
