"""NeMo Gym 0.7's server-kit names on our core: the exception and cancellation middleware hooks of ``SimpleServer``,
the process's "global aiohttp client", ``ServerClient._server_base_urls``, errors in aiohttp's own kinds, and
``NeMoGymAsyncOpenAI``'s retry settings."""

from __future__ import annotations

import asyncio
import contextlib
import pickle
from collections.abc import AsyncIterator, MutableMapping
from typing import Any, cast
from unittest.mock import MagicMock

import aiohttp
import pytest
from aiohttp import web
from fastapi import FastAPI, Request
from fastapi.responses import Response
from fastapi.testclient import TestClient
from omegaconf import OmegaConf

from nemo_gym import server_utils
from nemo_gym.config.server_models import BaseRunServerInstanceConfig
from nemo_gym.server_utils import GlobalAIOHTTPAsyncClientConfig, ServerClient, SimpleServer
from nemo_gym.telemetry import connection_pool
from nemo_gym.transport import http_client, lean_client, passthrough
from nemo_gym.transport.cancellation import WATCH_AFTER_S
from nemo_gym.transport.failures import ConnectionFailed, PayloadFailed, StatusError
from nemo_gym.transport.openai_client import NeMoGymAsyncOpenAI
from nemo_gym.transport.types import (
    UPSTREAM_FAILURE_HEADER,
    ServerRequestError,
    TransportError,
    get_default_config,
    set_default_config,
)
from tests.helpers import serving

_CONFIG = BaseRunServerInstanceConfig(host="127.0.0.1", port=1, entrypoint="app.py", name="srv")


@pytest.fixture(autouse=True)
async def _fresh_transport(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[None]:
    defaults = get_default_config()
    monkeypatch.setattr(server_utils, "_GLOBAL_AIOHTTP_CLIENT", None)
    monkeypatch.setattr(server_utils, "_GLOBAL_AIOHTTP_CLIENT_REQUEST_DEBUG", False)
    yield
    set_default_config(defaults)
    await http_client.close_session()


class _Failing(SimpleServer):
    """Routes that fail in the two ways the error answers tell apart."""

    def setup_webserver(self) -> FastAPI:
        app = super().setup_webserver()

        @app.post("/upstream")
        async def upstream() -> None:
            raise ServerRequestError("inner call failed", server="judge", url_path="/v1/responses", status=500)

        @app.post("/context")
        async def context() -> None:
            error = StatusError("too long", status=400, body=b'{"error":"maximum context length"}')
            error.propagate = True  # type: ignore[attr-defined]
            raise error

        return app


class _Propagating(_Failing):
    """NeMo Gym's vLLM pattern: its own middleware first, then the base's."""

    def setup_exception_middleware(self, app: FastAPI) -> None:
        @app.middleware("http")
        async def context_errors(request: Request, call_next: Any) -> Response:
            try:
                return await call_next(request)
            except aiohttp.ClientResponseError as error:
                if getattr(error, "propagate", False):
                    body = getattr(error, "response_content", b"")  # NeMo Gym's attribute, set on ours
                    return Response(body, status_code=error.status, media_type="application/json")
                raise

        super().setup_exception_middleware(app)


def _server(cls: type[SimpleServer]) -> SimpleServer:
    return cls(config=_CONFIG, server_client=MagicMock(spec=ServerClient))


# ---------------------------------------------------------------------------------------------------------------------
# SimpleServer's middleware hooks


def test_setup_exception_middleware_keeps_our_answers_once() -> None:
    server = _server(_Failing)
    app = server.setup_webserver()
    handlers, layers = dict(app.exception_handlers), len(app.user_middleware)
    server.setup_exception_middleware(app)
    server.setup_exception_middleware(app)
    assert app.exception_handlers == handlers and len(app.user_middleware) == layers  # create_app did it already
    answer = TestClient(app).post("/upstream")
    assert answer.status_code == 502 and answer.headers[UPSTREAM_FAILURE_HEADER] == "1"
    assert answer.json()["upstream_server"] == "judge" and answer.json()["upstream_status"] == 500


def test_an_app_built_without_create_app_gets_the_answers() -> None:
    server = _server(_Failing)
    app = FastAPI()

    @app.get("/boom")
    async def boom() -> None:
        raise ServerRequestError("down", server="judge")

    server.setup_exception_middleware(app)
    assert TestClient(app).get("/boom").status_code == 502


@pytest.mark.parametrize("status", [400, 409, 422, 408, 429, 500, 503])
def test_a_failed_inner_call_is_a_marked_502_naming_the_upstream_status(status: int) -> None:
    """Also a refusal (a 4xx), where NeMo Gym answers 500: the structured 502 is what the collector reads the failing
    hop from (``verify_failed``, ``model_failed``), and our clients never retry it."""
    app = FastAPI()

    @app.post("/run")
    async def run() -> None:
        raise StatusError("POST /verify failed", server="resource", url_path="/verify", status=status)

    server_utils.SimpleServer.setup_exception_middleware(_server(_Failing), app)
    answer = TestClient(app).post("/run")
    assert answer.status_code == 502 and answer.headers[UPSTREAM_FAILURE_HEADER] == "1"
    assert answer.json()["upstream_status"] == status


def test_a_subclass_middleware_sees_the_error_before_the_base_answers() -> None:
    server = _server(_Propagating)
    app = server.setup_webserver()
    server.setup_exception_middleware(app)
    client = TestClient(app)
    context = client.post("/context")
    assert context.status_code == 400 and context.json() == {"error": "maximum context length"}
    upstream = client.post("/upstream")  # not the subclass's: re-raised, then the base's 502
    assert upstream.status_code == 502 and upstream.headers[UPSTREAM_FAILURE_HEADER] == "1"


def test_setup_cancellation_middleware_is_added_once() -> None:
    server = _server(_Failing)
    app = server.setup_webserver()
    before = len(app.user_middleware)
    server.setup_cancellation_middleware(app)
    server.setup_cancellation_middleware(app)
    assert len(app.user_middleware) == before + 1


async def test_a_handler_whose_client_left_is_cancelled_and_others_are_answered() -> None:
    server = _server(_Failing)
    app = server.setup_webserver()
    outcome: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    entered = asyncio.Event()

    @app.post("/slow")
    async def slow(body: dict) -> dict:
        entered.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            outcome.set_result("cancelled")
            raise
        return body

    @app.post("/quick")
    async def quick(body: dict) -> dict:
        await asyncio.sleep(0)
        return body

    @app.post("/watched")  # runs past the point where its connection is watched, then answers
    async def watched(body: dict) -> dict:
        await asyncio.sleep(WATCH_AFTER_S + 0.1)
        return body

    server.setup_exception_middleware(app)
    server.setup_cancellation_middleware(app)
    async with serving(app) as (url, _), aiohttp.ClientSession() as session:
        for _ in range(3):  # several on one keep-alive connection: the watcher must end with each response
            async with session.post(f"{url}/quick", json={"n": 1}) as answer:
                assert answer.status == 200 and await answer.json() == {"n": 1}
        call = asyncio.create_task(session.post(f"{url}/slow", json={"n": 2}))
        await asyncio.wait_for(entered.wait(), 5)
        call.cancel()  # the client hangs up
        with contextlib.suppress(asyncio.CancelledError):
            await call
        assert await asyncio.wait_for(outcome, 5) == "cancelled"
        async with session.post(f"{url}/quick", json={"n": 3}) as answer:
            assert await answer.json() == {"n": 3}
        for _ in range(2):
            async with session.post(f"{url}/watched", json={"n": 4}) as answer:
                assert answer.status == 200 and await answer.json() == {"n": 4}


# ---------------------------------------------------------------------------------------------------------------------
# The global aiohttp client


async def test_set_global_aiohttp_client_applies_the_config_and_is_the_loops_session() -> None:
    cfg = GlobalAIOHTTPAsyncClientConfig(
        global_aiohttp_connector_limit_per_host=7, global_aiohttp_client_request_debug=True
    )
    session = server_utils.set_global_aiohttp_client(cfg)
    assert session is http_client.get_session() is server_utils.get_global_aiohttp_client()
    assert get_default_config().limit_per_host == 7 and server_utils.is_global_aiohttp_client_request_debug_enabled()
    assert server_utils.is_global_aiohttp_client_setup()
    with pytest.raises(RuntimeError, match="already set up"):
        server_utils.set_global_aiohttp_client(cfg)
    await session.close()  # what NeMo Gym's tests do at the end: the loop then makes a fresh one
    assert server_utils.get_global_aiohttp_client() is not session
    assert http_client.get_session() is server_utils.get_global_aiohttp_client()


def test_set_outside_a_loop_returns_none_and_exit_forgets_it() -> None:
    cfg = GlobalAIOHTTPAsyncClientConfig(global_aiohttp_connector_limit=0, global_aiohttp_connector_limit_per_host=0)
    assert server_utils.set_global_aiohttp_client(cfg) is None
    assert get_default_config().limit == get_default_config().limit_per_host > 100_000  # 0: no limit
    loop = asyncio.new_event_loop()
    try:
        session = loop.run_until_complete(_make_global())
        server_utils.global_aiohttp_client_exit()  # from synchronous code: closed on its own loop
        assert session.closed and not server_utils.is_global_aiohttp_client_setup()
    finally:
        loop.close()


async def _make_global() -> aiohttp.ClientSession:
    server_utils._GLOBAL_AIOHTTP_CLIENT = None
    session = server_utils.set_global_aiohttp_client(GlobalAIOHTTPAsyncClientConfig())
    assert session is not None
    return session


async def test_request_goes_through_the_patched_client_with_its_destination_label(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[tuple[dict[str, Any], str]] = []

    class _Client:
        async def request(self, **kwargs: Any) -> str:
            seen.append((kwargs, connection_pool.current_server_name()))
            return "answer"

    monkeypatch.setattr(server_utils, "get_global_aiohttp_client", lambda: _Client())
    monkeypatch.setattr(server_utils, "_GLOBAL_AIOHTTP_CLIENT_QUEUE_TELEMETRY", True)
    answer: Any = await server_utils.request(
        "POST", "http://h:1/x", _server_name="svc", json={"a": 1}, allow_redirects=False
    )
    assert answer == "answer"
    kwargs, label = seen[0]
    assert (kwargs["method"], kwargs["url"], kwargs["allow_redirects"], label) == ("POST", "http://h:1/x", False, "svc")
    assert kwargs["data"] == b'{"a":1}' and connection_pool.current_server_name() == "external"


async def test_max_connection_retries_bounds_attempts_and_raises_aiohttps_error() -> None:
    attempts = 0

    class _Refusing:  # a session whose every connection fails
        async def request(self, **kwargs: Any) -> None:
            nonlocal attempts
            attempts += 1
            raise aiohttp.ServerDisconnectedError()

    with pytest.raises(aiohttp.ServerDisconnectedError):
        await passthrough.request(
            "GET", "http://h:1/", _max_connection_retries=2, session=cast(aiohttp.ClientSession, _Refusing())
        )
    assert attempts == 2
    with pytest.raises(aiohttp.ServerDisconnectedError):
        await passthrough.request(
            "GET", "http://h:1/", _max_connection_retries=0, session=cast(aiohttp.ClientSession, _Refusing())
        )
    assert attempts == 3


def test_server_base_urls_pin_a_name_to_an_address() -> None:
    client = ServerClient.model_construct(global_config_dict=OmegaConf.create({}))
    client._server_base_urls["policy"] = "http://127.0.0.1:9"
    assert client.server_base_url("policy") == "http://127.0.0.1:9"


def test_setup_server_client_sizes_the_global_client(monkeypatch: pytest.MonkeyPatch) -> None:
    config = OmegaConf.create({"global_aiohttp_connector_limit_per_host": 11, "other": "${oc.env:NOPE_NOT_SET}"})
    made = ServerClient.model_construct(global_config_dict=config)
    monkeypatch.setattr(ServerClient, "load_from_global_config", classmethod(lambda cls, head=None: made))
    assert server_utils.setup_server_client() is made
    assert get_default_config().limit_per_host == 11


# ---------------------------------------------------------------------------------------------------------------------
# Errors in aiohttp's kinds, and what is never retried


@contextlib.asynccontextmanager
async def _endpoint(answers: list[tuple[int, dict[str, str]]]) -> AsyncIterator[tuple[str, list[str]]]:
    seen: list[str] = []

    async def handle(request: web.Request) -> web.Response:
        seen.append(request.path)
        status, headers = answers.pop(0) if answers else (200, {})
        return web.json_response({"path": request.path, "status": status}, status=status, headers=headers)

    app = web.Application()
    app.add_routes([web.route("*", "/{tail:.*}", handle)])
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}", seen
    finally:
        await runner.cleanup()


async def test_a_status_error_is_also_aiohttps_client_response_error() -> None:
    async with _endpoint([(409, {})]) as (url, _):
        answer = await http_client.request("POST", f"{url}/verify", json={}, server_name="resource")
        with pytest.raises(aiohttp.ClientResponseError) as caught:
            await server_utils.raise_for_status(answer)
    error = caught.value
    assert isinstance(error, StatusError) and isinstance(error, TransportError)
    assert error.status == 409 and error.response_content == b'{"path": "/verify", "status": 409}'
    assert str(error).startswith("POST /verify to 127.0.0.1:") and "HTTP 409 Conflict" in str(error)
    copy = pickle.loads(pickle.dumps(error))
    assert (type(copy), str(copy), copy.status, copy.response_content) == (
        StatusError,
        str(error),
        409,
        error.response_content,
    )


def test_connection_and_payload_failures_are_aiohttps_kinds_too() -> None:
    assert issubclass(ConnectionFailed, aiohttp.ClientConnectionError) and issubclass(ConnectionFailed, TransportError)
    assert issubclass(PayloadFailed, aiohttp.ClientPayloadError) and issubclass(PayloadFailed, TransportError)
    error = ConnectionFailed("refused", server="judge", attempts=4)
    assert (str(error), error.server, error.attempts) == ("refused", "judge", 4)


@pytest.mark.parametrize("own_server", [False, True], ids=["aiohttp", "lean client"])
async def test_our_own_502_is_an_answer_and_not_retried(own_server: bool) -> None:
    marked = (502, {UPSTREAM_FAILURE_HEADER: "1"})
    async with _endpoint([marked, (502, {})]) as (url, seen):
        if own_server:
            lean_client.mark_own_server(url)  # what ServerClient does for a server of the run
        answer = await http_client.request("POST", f"{url}/run", json={})
        assert answer.status == 502 and len(seen) == 1
        answer = await http_client.request("POST", f"{url}/run", json={})  # a gateway's 502: tried again
        assert answer.status == 200 and len(seen) == 3


async def test_openai_client_bounds_retries_by_max_http_attempts() -> None:
    async with _endpoint([(500, {}), (404, {}), (500, {})]) as (url, seen):
        client = NeMoGymAsyncOpenAI(base_url=url, api_key="k", max_http_attempts=2, max_connection_retries=8)
        with pytest.raises(aiohttp.ClientResponseError) as caught:
            await client.create_chat_completion(messages=[])
        assert len(seen) == 2 and caught.value.status == 404  # a 404 is retried too, within the budget
        assert b'"status": 404' in caught.value.response_content  # type: ignore[attr-defined]
        assert (await client.create_chat_completion(messages=[]))["status"] == 200  # the last 500, then 200
    assert NeMoGymAsyncOpenAI(base_url=url, api_key="k").max_http_attempts == 3


async def test_the_upstream_answer_middleware_leaves_a_started_response_alone() -> None:
    from nemo_gym.transport.error_answers import UpstreamFailureAnswers

    sent: list[dict[str, Any]] = []

    async def app(scope: dict, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        raise ServerRequestError("late")

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(dict(message))

    with pytest.raises(ServerRequestError):
        await UpstreamFailureAnswers(app, "srv")({"type": "http", "path": "/x"}, None, send)
    assert [m["type"] for m in sent] == ["http.response.start"]
