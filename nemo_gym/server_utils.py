"""What every server process shares: reaching other servers by name, sessions, and running the web server.

``ServerClient`` turns an instance name into ``http://host:port`` using the resolved global config and sends the
request through the pooled transport (:mod:`nemo_gym.transport.http_client`). ``SimpleServer`` is the base of the three
server kinds; ``run_webserver()`` is what an implementation's ``app.py`` calls under ``if __name__ == "__main__"``.
"""

from __future__ import annotations

import asyncio
import difflib
import logging
import os
import sys
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import orjson
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import Response
from omegaconf import DictConfig
from pydantic import BaseModel, ConfigDict, PrivateAttr

from nemo_gym.config.head_fetch import HEAD_SERVER_URL_ENV_VAR as HEAD_SERVER_URL_ENV_VAR
from nemo_gym.config.head_fetch import fetch_config_from_head_server as fetch_config_from_head_server
from nemo_gym.config.head_fetch import register_run_token as _register_run_token
from nemo_gym.config.head_fetch import with_token as _with_token
from nemo_gym.config.ports import LISTEN_FD_ENV_VAR
from nemo_gym.config.server_models import SERVER_TYPES, BaseRunServerInstanceConfig, BaseServerConfig
from nemo_gym.config.tree import plain_dict as _plain_dict
from nemo_gym.errors import ConfigError
from nemo_gym.global_config import (
    DEFAULT_HEAD_SERVER_PORT,
    DEFAULT_HOST,
    NEMO_GYM_CONFIG_PATH_ENV_VAR_NAME,
    get_first_server_config_dict,
    get_global_config_dict,
    maybe_get_global_config_dict,
)
from nemo_gym.observability.correlation import apply_rollout_prefix, rollout_path_prefix
from nemo_gym.transport import access, heap, local_socket, runtime
from nemo_gym.transport.admission import in_admitted_request
from nemo_gym.transport.error_answers import answer_upstream_failures_outside as _answer_upstream_failures_outside
from nemo_gym.transport.error_answers import install_error_handlers as _install_error_handlers
from nemo_gym.transport.routes import BodyRoute as _BodyRoute
from nemo_gym.transport.routes import ServerApp as _ServerApp
from nemo_gym.transport.session_cookie import SESSION_ID_KEY, SessionCookieMiddleware
from nemo_gym.transport.shared_session import GlobalAIOHTTPAsyncClientConfig
from nemo_gym.transport.types import LOOP_LAG_HEADER as _LOOP_LAG_HEADER
from nemo_gym.transport.types import STARTED_AT_HEADER as _STARTED_AT_HEADER
from nemo_gym.transport.types import ServerTimeoutError, TransportError
from nemo_gym.verifiers.offload import RAY_ADDRESS_ENV_VAR as _RAY_ADDRESS_ENV_VAR

if TYPE_CHECKING:
    import aiohttp

    from nemo_gym.transport.passthrough import check_status as raise_for_status

_HTTP_CLIENT = "nemo_gym.transport.http_client"
_HEALTHY = b'{"status":"ok"}'
_PROCESS_STARTED_AT = repr(time.time())
"""Seconds since the epoch when this server process loaded its framework, sent on every health answer."""
_LEAN_CLIENT = "nemo_gym.transport.lean_client"

logger = logging.getLogger(__name__)

REQUEST_DEBUG_KEY = "global_aiohttp_client_request_debug"
"""Top-level config key (NeMo Gym's name): servers print full request and response details of failed calls."""
FASTAPI_WORKER_ENV_VAR = "IS_NEMO_GYM_FASTAPI_WORKER"
FASTAPI_ENTRYPOINT_ENV_VAR = "IS_NEMO_GYM_FASTAPI_ENTRYPOINT"

__all__ = [
    "ServerStatus",
    "DEFAULT_HEAD_SERVER_PORT",
    "DEFAULT_HOST",
    "FASTAPI_ENTRYPOINT_ENV_VAR",
    "FASTAPI_WORKER_ENV_VAR",
    "HEAD_SERVER_URL_ENV_VAR",
    "LISTEN_FD_ENV_VAR",
    "NEMO_GYM_CONFIG_PATH_ENV_VAR_NAME",
    "REQUEST_DEBUG_KEY",
    "SERVER_TYPES",
    "SESSION_ID_KEY",
    "BaseRunServerInstanceConfig",
    "BaseServer",
    "BaseServerConfig",
    "ConfigError",
    "GlobalAIOHTTPAsyncClientConfig",
    "ServerClient",
    "ServerTimeoutError",
    "SessionCookieMiddleware",
    "SimpleServer",
    "TransportError",
    "apply_rollout_prefix",
    "fetch_config_from_head_server",
    "get_first_server_config_dict",
    "get_global_aiohttp_client",
    "get_global_config_dict",
    "get_response_json",
    "get_server_url",
    "global_aiohttp_client_exit",
    "in_admitted_request",
    "is_global_aiohttp_client_setup",
    "is_global_aiohttp_client_request_debug_enabled",
    "is_nemo_gym_fastapi_entrypoint",
    "json_response",
    "maybe_get_global_config_dict",
    "raise_for_status",
    "raise_open_file_limit",
    "request",
    "rollout_path_prefix",
    "set_global_aiohttp_client",
    "setup_server_client",
]


def json_response(content: Any, status_code: int = 200) -> Response:
    """A JSON response serialized with orjson, for hot paths that build plain dicts (no response-model pass)."""
    return Response(content=orjson.dumps(content), status_code=status_code, media_type="application/json")


async def get_response_json(response: aiohttp.ClientResponse) -> Any:
    """The JSON body of a response returned by :class:`ServerClient` (already read, parsed with orjson)."""
    from nemo_gym.transport.http_client import response_json

    return await response_json(response)


def __getattr__(name: str) -> Any:
    # The HTTP client (aiohttp, ~10 MB) is loaded on first use, so servers that never call another server skip it.
    # `raise_for_status` is NeMo Gym's: awaitable, and in aiohttp's own terms (transport/passthrough).
    if name == "raise_for_status":
        from nemo_gym.transport.passthrough import check_status

        return check_status
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ---------------------------------------------------------------------------------------------------------------------
# NeMo Gym's "global aiohttp client": the running loop's pooled session (transport/shared_session.py). The state is
# kept here, as module attributes, because NeMo Gym's tests set it here.

_GLOBAL_AIOHTTP_CLIENT: aiohttp.ClientSession | None = None
"""The session ``set_global_aiohttp_client`` made; ``None`` until then (each loop then makes its own on first use)."""
_GLOBAL_AIOHTTP_CLIENT_REQUEST_DEBUG: bool = False
"""Print full details of failed calls (``global_aiohttp_client_request_debug``), as set by the client's config."""
_GLOBAL_AIOHTTP_CLIENT_QUEUE_TELEMETRY: bool = False
"""Label each call of :func:`request` with its destination (``nemo_gym.telemetry.connection_pool``)."""


def get_global_aiohttp_client(*_parser_args: Any, **_parser_kwargs: Any) -> aiohttp.ClientSession:
    """The session NeMo Gym code sends its own requests through: the one ``set_global_aiohttp_client`` made while it
    can serve the running loop, else the running loop's pooled session (the one :class:`ServerClient` uses). NeMo
    Gym's arguments (a config parser to read the config with) are accepted; the config is already resolved here."""
    from nemo_gym.transport.shared_session import running_loop_session, usable_here

    client = _GLOBAL_AIOHTTP_CLIENT
    if client is not None and usable_here(client):
        return client
    session = running_loop_session()
    if session is None:
        raise RuntimeError("get_global_aiohttp_client() needs a running event loop: sessions belong to one loop")
    return session


def set_global_aiohttp_client(cfg: GlobalAIOHTTPAsyncClientConfig) -> aiohttp.ClientSession | None:
    """Apply ``cfg`` (pool sizes, keep-alive, request debugging) and make the running loop's session the global one.

    Called outside a running loop, only the settings are applied and ``None`` comes back: the session is made in
    the loop that first uses it. As in NeMo Gym, a global client that is still open must be given up first
    (:func:`global_aiohttp_client_exit`, or setting ``_GLOBAL_AIOHTTP_CLIENT`` to ``None``).
    """
    from nemo_gym.transport.shared_session import apply_client_config, running_loop_session, usable_here

    global _GLOBAL_AIOHTTP_CLIENT, _GLOBAL_AIOHTTP_CLIENT_REQUEST_DEBUG, _GLOBAL_AIOHTTP_CLIENT_QUEUE_TELEMETRY
    if _GLOBAL_AIOHTTP_CLIENT is not None and usable_here(_GLOBAL_AIOHTTP_CLIENT):
        raise RuntimeError("a global aiohttp client is already set up; call global_aiohttp_client_exit() to replace it")
    apply_client_config(cfg)
    _GLOBAL_AIOHTTP_CLIENT_REQUEST_DEBUG = cfg.global_aiohttp_client_request_debug
    _GLOBAL_AIOHTTP_CLIENT_QUEUE_TELEMETRY = False  # our pool keeps no per-destination queue metrics
    _GLOBAL_AIOHTTP_CLIENT = running_loop_session()
    return _GLOBAL_AIOHTTP_CLIENT


def is_global_aiohttp_client_setup() -> bool:
    return _GLOBAL_AIOHTTP_CLIENT is not None


def global_aiohttp_client_exit() -> None:
    """Close the global client (from synchronous code, e.g. a test's teardown) and forget it."""
    global _GLOBAL_AIOHTTP_CLIENT, _GLOBAL_AIOHTTP_CLIENT_QUEUE_TELEMETRY
    client, _GLOBAL_AIOHTTP_CLIENT = _GLOBAL_AIOHTTP_CLIENT, None
    _GLOBAL_AIOHTTP_CLIENT_QUEUE_TELEMETRY = False
    if client is not None:
        from nemo_gym.transport.shared_session import close_anywhere

        close_anywhere(client)


async def request(
    method: str,
    url: str,
    _internal: bool = False,
    _max_connection_retries: int | None = None,
    _server_name: str | None = None,
    **kwargs: Any,
) -> aiohttp.ClientResponse:
    """NeMo Gym's ``request``: aiohttp's keyword arguments, the response's body left unread (see
    :mod:`nemo_gym.transport.passthrough`), sent through :func:`get_global_aiohttp_client`'s session."""
    from nemo_gym.transport.passthrough import request as send

    session = get_global_aiohttp_client()
    if not _GLOBAL_AIOHTTP_CLIENT_QUEUE_TELEMETRY:
        return await send(method, url, _internal, _max_connection_retries, _server_name, session=session, **kwargs)
    from nemo_gym.telemetry.connection_pool import destination

    with destination(_server_name):
        return await send(method, url, _internal, _max_connection_retries, _server_name, session=session, **kwargs)


def get_server_url(server_name: str) -> str:
    """``http://host:port`` of a server instance of the global config."""
    settings = get_first_server_config_dict(get_global_config_dict(), server_name)
    return f"http://{settings['host']}:{settings['port']}"


def is_global_aiohttp_client_request_debug_enabled() -> bool:
    """Whether full details of failed calls are asked for: by the config (``global_aiohttp_client_request_debug``),
    or by the settings the global client was set up with."""
    if _GLOBAL_AIOHTTP_CLIENT_REQUEST_DEBUG:
        return True
    config = maybe_get_global_config_dict()
    return bool(config is not None and config.get(REQUEST_DEBUG_KEY, False))


def is_nemo_gym_fastapi_entrypoint(file: str) -> bool:
    """True in a uvicorn worker process importing ``file`` as its app module, so ``app.py`` can end with
    ``elif is_nemo_gym_fastapi_entrypoint(__file__): app = MyServer.run_webserver()``. Our launcher runs one process
    per server, so this is False unless a multi-worker runner sets ``IS_NEMO_GYM_FASTAPI_WORKER`` and
    ``IS_NEMO_GYM_FASTAPI_ENTRYPOINT`` (the app's path)."""
    entrypoint = os.environ.get(FASTAPI_ENTRYPOINT_ENV_VAR)
    return os.environ.get(FASTAPI_WORKER_ENV_VAR) == "1" and bool(entrypoint) and file.endswith(str(entrypoint))


_BASE_URL_CACHE_SIZE = 1024
_base_url_cache: dict[tuple[int, str], tuple[DictConfig, str]] = {}


ServerStatus = Literal["success", "connection_error", "timeout", "unknown_error"]
"""What :meth:`ServerClient.poll_for_status` finds."""
_POLL_TIMEOUT_S = 5.0


class ServerClient(BaseModel):
    """Calls any server of the running config by instance name: ``await client.post("my_agent", "/run", json=row)``."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    head_server_config: BaseServerConfig
    global_config_dict: DictConfig

    _server_base_urls: dict[str, str] = PrivateAttr(default_factory=dict)
    """Base URLs by server name that take precedence over the config (NeMo Gym's name; its tests fill it to point
    a client at servers they started themselves)."""

    def model_post_init(self, context: Any) -> None:
        # A config with the run's token (a server's own, the launcher's): every server it names gets the token.
        _register_run_token(self.global_config_dict)

    @classmethod
    def load_from_global_config(cls, head_server_config: BaseServerConfig | None = None) -> ServerClient:
        """A client for the servers this process knows of.

        Inside a server (or a command that composed a config) the global config is already here. An outside script
        asks the head server for it (``NEMO_GYM_HEAD_SERVER_URL``, default ``http://127.0.0.1:11000``).
        """
        config = maybe_get_global_config_dict()
        if config is not None and head_server_config is None:
            head = config.get("head_server") or {}
            head_server_config = BaseServerConfig(
                host=head.get("host", DEFAULT_HOST), port=head.get("port", DEFAULT_HEAD_SERVER_PORT)
            )
            return cls(head_server_config=head_server_config, global_config_dict=config)
        if head_server_config is None:
            url = os.environ.get(HEAD_SERVER_URL_ENV_VAR, f"http://{DEFAULT_HOST}:{DEFAULT_HEAD_SERVER_PORT}")
            host, _, port = url.removeprefix("http://").rstrip("/").rpartition(":")
            head_server_config = BaseServerConfig(host=host, port=int(port))
        return cls(
            head_server_config=head_server_config, global_config_dict=fetch_config_from_head_server(head_server_config)
        )

    def server_base_url(self, server_name: str) -> str:
        """``http://host:port`` of an instance. Cached: walking an OmegaConf tree on every call was the agent's
        single largest cost per request. An entry is only used while ``global_config_dict`` is the same object."""
        pinned = self._server_base_urls.get(server_name)
        if pinned is not None:
            return pinned
        if "_build_server_base_url" in vars(self):  # replaced on this client: its answer is not the shared one
            return self._lookup_base_url(server_name)
        config = self.global_config_dict
        key = (id(config), server_name)
        hit = _base_url_cache.get(key)
        if hit is not None and hit[0] is config:
            return hit[1]
        url = self._lookup_base_url(server_name)
        if len(_base_url_cache) >= _BASE_URL_CACHE_SIZE:
            _base_url_cache.clear()
        _base_url_cache[key] = (config, url)  # holding the config keeps its id from being reused
        return url

    def _lookup_base_url(self, server_name: str) -> str:
        block = self.global_config_dict.get(server_name)
        server_type = next((t for t in SERVER_TYPES if isinstance(block, DictConfig) and t in block), None)
        if server_type is None:
            names = [
                str(k)
                for k, v in self.global_config_dict.items()
                if isinstance(v, DictConfig) and set(v) & set(SERVER_TYPES)
            ]
            close = difflib.get_close_matches(server_name, names, n=3, cutoff=0.5)
            hint = f" Did you mean: {', '.join(close)}?" if close else f" Known servers: {', '.join(names) or 'none'}."
            raise ConfigError(f"no server named {server_name!r} in the config.{hint}")
        return self._build_server_base_url(next(iter(block[server_type].values())))

    def _build_server_base_url(self, server_config_dict: Any) -> str:
        """``http://host:port`` of one instance's settings block. NeMo Gym's name: its agents call it to hand a
        model server's URL to a CLI, and a runner may replace it on one client to send every call of that client
        to another address."""
        return f"http://{server_config_dict['host']}:{server_config_dict['port']}"

    def poll_for_status(self, server_name: str) -> ServerStatus:
        """Whether a server (or ``head_server``) answers at all, any HTTP status included (it may have no route at
        ``/``). Blocking, for start-up loops that wait for a sibling; NeMo Gym's name and answers."""
        if server_name == "head_server":
            url = f"http://{self.head_server_config.host}:{self.head_server_config.port}"
        else:
            url = self._build_server_base_url(get_first_server_config_dict(self.global_config_dict, server_name))
        try:
            with urllib.request.urlopen(_with_token(url), timeout=_POLL_TIMEOUT_S):
                return "success"
        except urllib.error.HTTPError:
            return "success"  # it answered
        except TimeoutError:
            return "timeout"
        except urllib.error.URLError as error:
            return "timeout" if isinstance(error.reason, TimeoutError) else "connection_error"
        except Exception:
            return "unknown_error"

    async def request(self, method: str, server_name: str, url_path: str, **kwargs: Any) -> aiohttp.ClientResponse:
        http_client, lean_client = _client_modules()
        base_url = self.server_base_url(server_name)
        lean_client.mark_own_server(base_url)  # a server of this run: the lean client may call it
        url = base_url + url_path
        # Inside a request this server admitted, the call serves work already admitted: the target must not queue it.
        kwargs.setdefault("nested", in_admitted_request())
        return await http_client.request(method, url, server_name=server_name, url_path=url_path, **kwargs)

    async def post(self, server_name: str, url_path: str, json: Any = None, **kwargs: Any) -> aiohttp.ClientResponse:
        return await self.request("POST", server_name, url_path, json=json, **kwargs)

    async def get(self, server_name: str, url_path: str, **kwargs: Any) -> aiohttp.ClientResponse:
        return await self.request("GET", server_name, url_path, **kwargs)


def setup_server_client(head_server_config: BaseServerConfig | None = None) -> ServerClient:
    """A :class:`ServerClient` for this process's servers, with the process's HTTP client sized by the same config
    (``global_aiohttp_connector_limit``, ...) unless one is set up already. NeMo Gym's helper for scripts and the
    rollout collector."""
    client = ServerClient.load_from_global_config(head_server_config)
    if not is_global_aiohttp_client_setup():
        config = client.global_config_dict
        keys = [key for key in GlobalAIOHTTPAsyncClientConfig.model_fields if config.get(key) is not None]
        set_global_aiohttp_client(GlobalAIOHTTPAsyncClientConfig.model_validate({key: config[key] for key in keys}))
    return client


def _client_modules() -> tuple[Any, Any]:
    """``http_client`` and ``lean_client``, imported on first use (they load aiohttp), then read from the module table:
    an import statement with a from-list runs importlib's ``_handle_fromlist`` in Python on every call."""
    http_client, lean_client = sys.modules.get(_HTTP_CLIENT), sys.modules.get(_LEAN_CLIENT)
    if http_client is None or lean_client is None:
        from nemo_gym.transport import http_client, lean_client
    return http_client, lean_client


# ---------------------------------------------------------------------------------------------------------------------
# Servers


def _fastapi_telemetry() -> Any:
    """FastAPI's native OpenTelemetry asks three global providers on every request whether anyone listens (3% of a
    model server's CPU); nemo_gym records its own observations (``nemo_gym.observability``), so it is off unless the
    process asks FastAPI to set OpenTelemetry up (``FASTAPI_OTEL_AUTO_CONFIGURE=true``)."""
    if os.environ.get("FASTAPI_OTEL_AUTO_CONFIGURE", "").lower() == "true":
        return None
    return {"tracing": False, "metrics": False, "logs": False}


@asynccontextmanager
async def _close_client_on_shutdown(app: FastAPI) -> AsyncIterator[None]:
    yield
    client = sys.modules.get(_HTTP_CLIENT)  # never imported: no connections to close
    if client is not None:
        await client.close_session()


class BaseServer(BaseModel):
    model_config = ConfigDict(arbitrary_types_allowed=True)

    config: BaseRunServerInstanceConfig


class SimpleServer(BaseServer):
    """Base of model, resources and agent servers: a FastAPI app with sessions, a health route and error handling."""

    server_client: ServerClient

    accepts_bearer_token: ClassVar[bool] = False
    """Whether ``Authorization: Bearer <run token>`` also lets a caller in (model servers: the ``openai`` SDK)."""

    ray_enabled: ClassVar[bool | None] = None
    """Whether this server's process may join the run's Ray cluster (NeMo Gym 0.7's class setting, which its folders
    write as ``ray_enabled = False``). ``False``: the cluster's address is taken out of the process before the app is
    built, so CPU offload (:mod:`nemo_gym.verifiers.offload`) uses a local pool. ``None`` (undeclared) or ``True``:
    the cluster is joined on first use, when the run has one."""

    def setup_webserver(self) -> FastAPI:
        """Build the app. Subclasses call ``super().setup_webserver()`` and add their routes."""
        return self.create_app()

    @property
    def session_cookie_name(self) -> str:
        return f"{type(self).__name__}___{self.config.name}"

    def create_app(self) -> FastAPI:
        app = _ServerApp(
            title=f"{type(self).__name__} ({self.config.name})",
            lifespan=_close_client_on_shutdown,
            telemetry=_fastapi_telemetry(),
        )
        app.router.route_class = _BodyRoute  # typed body routes without FastAPI's general path, same answers
        self.setup_session_middleware(app)
        app.get("/")(self._health)
        _install_error_handlers(app, self.config.name)
        return app

    def setup_exception_middleware(self, app: FastAPI) -> None:
        """Turn a failure inside a handler into an answer instead of a dropped connection (NeMo Gym 0.7's name).

        :meth:`create_app` already does this, so for its apps this only confirms it; an app built some other way
        gets the same handlers. A subclass that overrides this to add its own ``@app.middleware("http")`` and then
        calls ``super()`` works as in NeMo Gym; :meth:`run_webserver` calls it on every server. For such a subclass
        the 502 for a failed inner call (:mod:`nemo_gym.transport.error_answers`) moves outside its middleware, so
        that middleware sees the error as raised, as NeMo Gym's order has it.
        """
        _install_error_handlers(app, self.config.name)
        if type(self).setup_exception_middleware is not SimpleServer.setup_exception_middleware:
            _answer_upstream_failures_outside(app, self.config.name)

    def setup_cancellation_middleware(self, app: FastAPI) -> None:
        """Stop handling a request whose client disconnected (NeMo Gym 0.7's name; see
        :mod:`nemo_gym.transport.cancellation`). Called last by :meth:`run_webserver`, so the layer wraps every
        other middleware; calling it again changes nothing."""
        if getattr(app.state, "has_cancellation_middleware", False):
            return
        from nemo_gym.transport.cancellation import DisconnectCancellation

        app.add_middleware(DisconnectCancellation)
        app.state.has_cancellation_middleware = True

    def guarded(self, app: Any) -> access.AccessMiddleware:
        """``app`` behind the run token, the body limit and JSON-only bodies (:mod:`nemo_gym.transport.access`).

        Applied by :meth:`run_webserver` outside everything else (admission included), so a refused request costs
        one header scan. An app built in a test (``TestClient(server.setup_webserver())``) has no run: no guard.
        """
        config = self.server_client.global_config_dict
        token = config.get(access.RUN_TOKEN_KEY)
        return access.AccessMiddleware(
            app,
            token=str(token) if token else None,
            max_body=access.max_body_bytes(config),
            accept_bearer=self.accepts_bearer_token,
        )

    def setup_session_middleware(self, app: FastAPI) -> None:
        if not getattr(app.state, "has_session_middleware", False):
            app.add_middleware(SessionCookieMiddleware, cookie_name=self.session_cookie_name)
            app.state.has_session_middleware = True

    LIVENESS_PATHS: ClassVar[tuple[str, ...]] = ("/", "/livez", "/readyz", "/healthz", "/health")

    def setup_liveness(self, app: FastAPI) -> None:
        """``GET /`` (what the launcher probes) and NeMo Gym 0.7's other liveness paths, where the app has none: a
        subclass that builds its own ``FastAPI()`` instead of extending ``super().setup_webserver()`` (NeMo Gym's
        ``GymnasiumServer`` does) would otherwise never be seen as started."""
        taken = {
            getattr(route, "path", None) for route in app.routes if "GET" in (getattr(route, "methods", None) or ())
        }
        for path in self.LIVENESS_PATHS:
            if path not in taken:
                app.get(path, include_in_schema=False)(self._health)

    async def _health(self, request: Request) -> Response:
        """``{"status": "ok"}``, with when this process started: the collector's breaker tells a restarted server
        from one that was up all along by it (``rollouts/breaker.py``). With ``?loop_lag=1`` also the event loop's
        scheduling delay, measured over one yield (bounded: it costs one turn of the loop)."""
        headers = {_STARTED_AT_HEADER: _PROCESS_STARTED_AT}
        if "loop_lag" in request.query_params:
            before = time.perf_counter()  # not loop.time(): uvloop's clock ticks in whole milliseconds
            await asyncio.sleep(0)
            headers[_LOOP_LAG_HEADER] = f"{time.perf_counter() - before:.6f}"
        return Response(_HEALTHY, media_type="application/json", headers=headers)

    @classmethod
    def load_config(cls, name: str, global_config: DictConfig) -> BaseRunServerInstanceConfig:
        """This class's config for instance ``name``: the implementation block plus ``name``."""
        block = global_config.get(name)
        server_type = next((t for t in SERVER_TYPES if isinstance(block, DictConfig) and t in block), None)
        if server_type is None:
            raise ConfigError(f"server instance {name!r} is not in the config handed to this process")
        inner = _plain_dict(next(iter(block[server_type].values())))
        config_type = cls.model_fields["config"].annotation
        if not (isinstance(config_type, type) and issubclass(config_type, BaseRunServerInstanceConfig)):
            raise TypeError(f"{cls.__name__}.config must be annotated with a BaseRunServerInstanceConfig subclass")
        return config_type.model_validate({**inner, "name": name})

    @classmethod
    def run_webserver(cls) -> None:
        """Serve this server class as the instance named by ``NEMO_GYM_CONFIG_PATH`` (set by the launcher)."""
        logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s", stream=sys.stdout)
        global_config = get_global_config_dict()
        name = os.environ.get(NEMO_GYM_CONFIG_PATH_ENV_VAR_NAME)
        if not name:
            raise ConfigError(f"{NEMO_GYM_CONFIG_PATH_ENV_VAR_NAME} is not set: start servers with `gym env start`")
        if global_config.get("verbose"):
            logging.getLogger().setLevel(logging.DEBUG)
        config = cls.load_config(name, global_config)
        if cls.ray_enabled is False:
            os.environ.pop(_RAY_ADDRESS_ENV_VAR, None)
        server = cls(config=config, server_client=ServerClient.load_from_global_config())
        app = server.setup_webserver()
        server.setup_liveness(app)
        server.setup_exception_middleware(app)
        server.setup_cancellation_middleware(app)  # last: it wraps every other middleware
        if not global_config.get(access.RUN_TOKEN_KEY):
            logger.warning("%s: no run token in its config (auth: false, or started by hand): it answers anyone", name)
        if global_config.get("dry_run"):
            return
        raise_open_file_limit()
        runtime.configure_transport(global_config)
        runtime.tune_garbage_collector()
        heap.release_freed_memory()  # what building the app freed (config, schemas): 1-2 MB back per server
        max_active = runtime.max_active_requests(global_config, config)
        uvicorn_server = uvicorn.Server(
            runtime.uvicorn_config(app, config.host, config.port or 0, global_config, max_active, outer=server.guarded)
        )
        fd = os.environ.get(LISTEN_FD_ENV_VAR)
        if not fd:
            uvicorn_server.run()
            return
        sock = runtime.inherited_socket(int(fd))
        logger.info("%s listening on http://%s:%s", name, *sock.getsockname()[:2])
        port = sock.getsockname()[1]
        # Calls from this machine skip loopback TCP (transport/local_socket.py).
        local = (
            local_socket.listen(config.host, port, uvicorn_server.config.backlog)
            if local_socket.wanted(global_config)
            else None
        )
        uvicorn_server.run(sockets=[sock] if local is None else [sock, local])


def raise_open_file_limit(target: int = 65535) -> None:
    """Thousands of concurrent rollouts need thousands of sockets; lift the soft limit toward the hard one."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        wanted = target if hard == resource.RLIM_INFINITY else min(target, hard)
        if soft < wanted:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    except (ImportError, ValueError, OSError):  # not on this platform, or not allowed: keep the current limit
        pass
