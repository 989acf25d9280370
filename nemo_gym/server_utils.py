"""What every server process shares: reaching other servers by name, sessions, and running the web server.

``ServerClient`` turns an instance name into ``http://host:port`` using the resolved global config and sends the
request through the pooled transport (:mod:`nemo_gym.transport.http_client`). ``SimpleServer`` is the base of the three
server kinds; ``run_webserver()`` is what an implementation's ``app.py`` calls under ``if __name__ == "__main__"``.
"""

from __future__ import annotations

import difflib
import logging
import os
import re
import secrets
import sys
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import orjson
import uvicorn
from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from omegaconf import DictConfig
from pydantic import BaseModel, ConfigDict

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
from nemo_gym.transport.routes import BodyRoute as _BodyRoute
from nemo_gym.transport.routes import ServerApp as _ServerApp
from nemo_gym.transport.types import ServerTimeoutError, TransportError
from nemo_gym.verifiers.offload import RAY_ADDRESS_ENV_VAR as _RAY_ADDRESS_ENV_VAR

if TYPE_CHECKING:
    import aiohttp

    from nemo_gym.transport.http_client import get_session as get_global_aiohttp_client
    from nemo_gym.transport.passthrough import check_status as raise_for_status
    from nemo_gym.transport.passthrough import request as request

_HTTP_CLIENT = "nemo_gym.transport.http_client"
_LEAN_CLIENT = "nemo_gym.transport.lean_client"

logger = logging.getLogger(__name__)

SESSION_ID_KEY = "session_id"
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
    "in_admitted_request",
    "is_global_aiohttp_client_request_debug_enabled",
    "is_nemo_gym_fastapi_entrypoint",
    "json_response",
    "maybe_get_global_config_dict",
    "raise_for_status",
    "raise_open_file_limit",
    "request",
    "rollout_path_prefix",
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
    # `raise_for_status` and `request` are NeMo Gym's: awaitable, and in aiohttp's own terms (transport/passthrough).
    if name == "raise_for_status":
        from nemo_gym.transport.passthrough import check_status

        return check_status
    if name == "request":
        from nemo_gym.transport.passthrough import request

        return request
    if name == "get_global_aiohttp_client":
        from nemo_gym.transport.http_client import get_session

        return get_session
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def get_server_url(server_name: str) -> str:
    """``http://host:port`` of a server instance of the global config."""
    settings = get_first_server_config_dict(get_global_config_dict(), server_name)
    return f"http://{settings['host']}:{settings['port']}"


def is_global_aiohttp_client_request_debug_enabled() -> bool:
    """Whether the config asks for full details of failed calls (``global_aiohttp_client_request_debug``)."""
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


def _client_modules() -> tuple[Any, Any]:
    """``http_client`` and ``lean_client``, imported on first use (they load aiohttp), then read from the module table:
    an import statement with a from-list runs importlib's ``_handle_fromlist`` in Python on every call."""
    http_client, lean_client = sys.modules.get(_HTTP_CLIENT), sys.modules.get(_LEAN_CLIENT)
    if http_client is None or lean_client is None:
        from nemo_gym.transport import http_client, lean_client
    return http_client, lean_client


# ---------------------------------------------------------------------------------------------------------------------
# Sessions


class SessionCookieMiddleware:
    """Gives every client a session id, carried in a cookie named after this server instance.

    The id is exposed as ``request.session["session_id"]``. Each server has its own cookie name, so one cookie jar (an
    agent threading cookies through a rollout) carries the sessions of several servers at once. Ids are random
    128-bit tokens; a cookie that is not one is replaced. Every response carries the cookie, as NeMo Gym's do: a
    caller that keeps only the last response's cookies (``cookies = resp.cookies``) stays in its session.
    """

    def __init__(self, app: Any, cookie_name: str) -> None:
        self.app = app
        self.cookie_name = cookie_name
        self._prefix = f"{cookie_name}=".encode()
        # One part of a Cookie header that is exactly `<name>=<32 lowercase hex>` (spaces around it allowed).
        self._valid = re.compile(
            rb"(?:^|;)[ \t\n\r\x0b\x0c]*" + re.escape(self._prefix) + rb"([0-9a-f]{32})[ \t\n\r\x0b\x0c]*(?:;|\Z)"
        )

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        session_id = self._read_cookie(scope) or secrets.token_hex(16)
        scope["session"] = {SESSION_ID_KEY: session_id}
        cookie = f"{self.cookie_name}={session_id}; Path=/; HttpOnly; SameSite=Lax".encode()

        async def send_with_cookie(message: dict) -> None:
            if message["type"] == "http.response.start":
                message.setdefault("headers", [])
                message["headers"] = [*message["headers"], (b"set-cookie", cookie)]
            await send(message)

        await self.app(scope, receive, send_with_cookie)

    def _read_cookie(self, scope: dict) -> str | None:
        for name, value in scope.get("headers", ()):
            if name == b"cookie" and self._prefix in value:
                found = self._valid.search(value)
                if found is not None:
                    return found.group(1).decode("latin-1")
        return None


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
        server_name = self.config.name

        @app.exception_handler(TransportError)
        async def _inner_server_failed(request: Request, error: TransportError) -> JSONResponse:
            logger.warning("%s %s: %s", server_name, request.url.path, error)
            content = {
                "error": str(error),
                "server": server_name,
                "upstream_server": getattr(error, "server", None),
                "upstream_path": getattr(error, "url_path", None),
                "upstream_status": getattr(error, "status", None),
                "upstream_timeout": isinstance(error, ServerTimeoutError),
            }
            return JSONResponse(status_code=502, content=content)

        @app.exception_handler(Exception)
        async def _unexpected(request: Request, error: Exception) -> JSONResponse:
            logger.exception("%s %s failed", server_name, request.url.path)
            message = access.short_echo(f"{type(error).__name__}: {error}")
            return JSONResponse(
                status_code=500, content={"error": message, "server": server_name, "path": request.url.path}
            )

        @app.exception_handler(RequestValidationError)
        async def _invalid_body(request: Request, error: RequestValidationError) -> JSONResponse:
            # FastAPI's own handler echoes each bad value whole: a 15 MB body would come back as a 15 MB error.
            details = [
                {**item, "input": access.short_echo(item.get("input"))} if "input" in item else item
                for item in error.errors()
            ]
            return JSONResponse(status_code=422, content={"detail": jsonable_encoder(details)})

        return app

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

    async def _health(self) -> dict[str, str]:
        return {"status": "ok"}

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
