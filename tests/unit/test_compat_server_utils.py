"""NeMo Gym's ``server_utils`` helpers as its environments use them: ``await raise_for_status(resp)``, ``request`` in
aiohttp's terms with the body left unread, a session cookie on every response, and the config look-ups."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import AsyncIterator, Iterator

import aiohttp
import orjson
import pytest
from aiohttp import web
from fastapi import Request
from fastapi.testclient import TestClient
from multidict import CIMultiDict, CIMultiDictProxy
from omegaconf import OmegaConf
from pydantic import BaseModel, ValidationError
from yarl import URL

from nemo_gym import server_utils
from nemo_gym.config.server_models import BaseRunServerInstanceConfig, BaseServerConfig
from nemo_gym.errors import ConfigError
from nemo_gym.global_config import reset_global_config_dict, set_global_config_dict
from nemo_gym.server_utils import (
    SESSION_ID_KEY,
    ServerClient,
    SimpleServer,
    apply_rollout_prefix,
    get_first_server_config_dict,
    get_response_json,
    get_server_url,
    is_global_aiohttp_client_request_debug_enabled,
    is_nemo_gym_fastapi_entrypoint,
    raise_for_status,
    request,
    rollout_path_prefix,
)
from nemo_gym.transport import http_client
from nemo_gym.transport.http_client import ServerRequestError

pytestmark = pytest.mark.timeout(120)

CONFIG = {
    "head_server": {"host": "127.0.0.1", "port": 11000},
    "my_model": {"responses_api_models": {"openai_model": {"host": "10.0.0.7", "port": 8123, "entrypoint": "app.py"}}},
}


@pytest.fixture(autouse=True)
async def _close_pooled_session() -> AsyncIterator[None]:
    yield
    await http_client.close_session()


@pytest.fixture
def global_config() -> Iterator[None]:
    set_global_config_dict(CONFIG)
    yield
    reset_global_config_dict()


@contextlib.asynccontextmanager
async def serve(*routes: web.RouteDef) -> AsyncIterator[str]:
    app = web.Application()
    app.add_routes(list(routes))
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


async def echo(req: web.Request) -> web.Response:
    body = orjson.loads(await req.read()) if req.can_read_body else None
    return web.json_response({"body": body, "query": dict(req.query), "type": req.headers.get("Content-Type")})


async def refuse(req: web.Request) -> web.Response:
    return web.Response(status=429, text="slow down, please")


# ---------------------------------------------------------------------------------------------------------------------
# request and raise_for_status


async def test_request_takes_aiohttp_arguments_and_leaves_the_body_to_the_caller() -> None:
    async with serve(web.post("/echo", echo)) as url:
        resp = await request(method="POST", url=f"{url}/echo", json={"a": 1}, params={"q": "x"}, timeout=30)
        assert isinstance(resp, aiohttp.ClientResponse) and resp._body is None
        assert orjson.loads(await resp.content.read()) == {
            "body": {"a": 1},
            "query": {"q": "x"},
            "type": "application/json",
        }
        async with await request("POST", f"{url}/echo", json={"b": 2}) as resp:
            assert (await get_response_json(resp))["body"] == {"b": 2}


async def test_await_raise_for_status_passes_a_2xx_and_hands_the_response_back() -> None:
    async with serve(web.post("/echo", echo)) as url:
        unread = await request("POST", f"{url}/echo", json={})
        assert await raise_for_status(unread) is unread
        read = await http_client.request("POST", f"{url}/echo", json={})
        assert await raise_for_status(read) is read
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # the plain call of our own code stays silent on success
            raise_for_status(read)


async def test_raise_for_status_on_an_unread_error_reads_the_body_then_raises_aiohttps_error() -> None:
    """NeMo Gym's order: the body is read first, then the response's own check raises, the body kept on the error."""
    async with serve(web.get("/busy", refuse)) as url:
        resp = await request("GET", f"{url}/busy")
        with pytest.raises(aiohttp.ClientResponseError) as caught:
            await raise_for_status(resp)
        assert caught.value.status == 429
        assert b"slow down, please" in caught.value.response_content  # type: ignore[attr-defined]


async def test_raise_for_status_lets_a_test_doubles_own_error_through() -> None:
    """Environments' tests fake the response; whatever its ``raise_for_status()`` raises is what the caller sees."""

    class FakeResponse:
        ok = False
        status = 500

        async def read(self) -> bytes:
            return b'{"error": "model down"}'

        def raise_for_status(self) -> None:
            raise RuntimeError("model server unavailable")

    with pytest.raises(RuntimeError, match="model server unavailable"):
        await raise_for_status(FakeResponse())  # type: ignore[arg-type]


class _Content:
    def __init__(self, body: bytes) -> None:
        self.body = body

    async def read(self) -> bytes:
        return self.body


async def test_raise_for_status_judges_a_stand_in_by_ok_alone() -> None:
    """Environments' tests hand over stand-ins with only what NeMo Gym reads: ``ok``, the body, maybe cookies."""

    class Passing:
        ok = True

        async def read(self) -> bytes:
            return b'{"answer": 42}'

    passing = Passing()
    assert await raise_for_status(passing) is passing  # type: ignore[arg-type]
    assert await get_response_json(passing) == {"answer": 42}  # type: ignore[arg-type]

    class FailingButLetThrough:
        ok = False
        content = _Content(b"ignored")

        def raise_for_status(self) -> None:  # its own check decides, as in NeMo Gym
            pass

    lenient = FailingButLetThrough()
    assert await raise_for_status(lenient) is lenient  # type: ignore[arg-type]


async def test_raise_for_status_reads_a_failing_stand_ins_body_through_content() -> None:
    """The body kept on the error is the one ``content.read()`` gives, as NeMo Gym reads it, not ``read()``'s."""
    info = aiohttp.RequestInfo(URL("http://judge/v1/responses"), "POST", CIMultiDictProxy(CIMultiDict()))

    class Refused:
        ok = False
        content = _Content(b"rate limited")

        async def read(self) -> bytes:
            return b'{"verdict": "yes"}'

        def raise_for_status(self) -> None:
            raise aiohttp.ClientResponseError(info, (), status=429, message="Too Many Requests")

    with pytest.raises(aiohttp.ClientResponseError) as caught:
        await raise_for_status(Refused())  # type: ignore[arg-type]
    assert caught.value.status == 429
    assert caught.value.response_content == b"rate limited"  # type: ignore[attr-defined]


async def test_raise_for_status_on_a_read_error_raises_even_without_await() -> None:
    async with serve(web.get("/busy", refuse)) as url:
        resp = await http_client.request("GET", f"{url}/busy", retry=False)
        with pytest.raises(ServerRequestError, match="slow down"):
            raise_for_status(resp)
        with pytest.raises(ServerRequestError, match="slow down"):
            await raise_for_status(resp)


async def test_request_retries_then_names_an_unreachable_server() -> None:
    with socket_bound_but_closed() as port:
        with pytest.raises(ServerRequestError, match="attempt"):
            await request("GET", f"http://127.0.0.1:{port}/")


@contextlib.contextmanager
def socket_bound_but_closed() -> Iterator[int]:
    """A local port with nothing listening on it (connections are refused at once)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    yield port


async def test_the_global_aiohttp_client_is_the_shared_pool() -> None:
    assert server_utils.get_global_aiohttp_client() is http_client.get_session()


# ---------------------------------------------------------------------------------------------------------------------
# Sessions


class _Server(SimpleServer):
    def setup_webserver(self):  # type: ignore[no-untyped-def]
        app = self.create_app()

        @app.post("/whoami")
        async def whoami(request: Request) -> dict[str, str]:
            return {"session": request.session[SESSION_ID_KEY]}

        @app.post("/count")
        async def count(body: _Count) -> dict[str, int]:
            _Count.model_validate({"n": "not a number"} if body.n < 0 else {"n": body.n})  # a server-side slip
            return {"n": body.n}

        return app


class _Count(BaseModel):
    n: int


def _app(raise_server_exceptions: bool = True) -> TestClient:
    config = BaseRunServerInstanceConfig(name="resources", host="127.0.0.1", port=0, entrypoint="app.py")
    client = ServerClient(
        head_server_config=BaseServerConfig(host="127.0.0.1", port=1), global_config_dict=OmegaConf.create(CONFIG)
    )
    app = _Server(config=config, server_client=client).setup_webserver()
    return TestClient(app, raise_server_exceptions=raise_server_exceptions)


def test_a_bad_body_is_a_422_but_a_validation_error_in_the_handler_is_the_servers_500() -> None:
    with _app(raise_server_exceptions=False) as client:
        assert client.post("/count", json={"n": 3}).json() == {"n": 3}
        assert client.post("/count", json={"n": "three"}).status_code == 422
        broken = client.post("/count", json={"n": -1})
        assert broken.status_code == 500 and broken.json()["error"].startswith("ValidationError")
    with _app() as client, pytest.raises(ValidationError, match="_Count"):
        client.post("/count", json={"n": -1})  # as with NeMo Gym's servers, a test client sees the error itself


def test_a_test_client_keeps_one_session_across_calls() -> None:
    with _app() as client:
        first = client.post("/whoami").json()["session"]
        assert [client.post("/whoami").json()["session"] for _ in range(3)] == [first] * 3


def test_every_response_carries_the_cookie_so_the_last_response_cookies_keep_the_session() -> None:
    with _app() as client:
        seeded = client.post("/whoami")
        cookies = dict(seeded.cookies)
        client.cookies.clear()
        for _ in range(2):
            answer = client.post("/whoami", cookies=cookies)
            client.cookies.clear()
            assert answer.json() == seeded.json()
            cookies = dict(answer.cookies)  # NeMo Gym's agents keep only the latest response's cookies
        header = answer.headers["set-cookie"]
        assert "HttpOnly" in header and "SameSite=Lax" in header and "Path=/" in header


# ---------------------------------------------------------------------------------------------------------------------
# Config look-ups and rollout prefixes


def test_server_url_and_first_server_config_dict(global_config: None) -> None:
    assert get_server_url("my_model") == "http://10.0.0.7:8123"
    assert get_first_server_config_dict(OmegaConf.create(CONFIG), "my_model").port == 8123
    with pytest.raises(ConfigError, match="no_such"):
        get_server_url("no_such")


def test_first_server_config_dict_of_a_plain_dict() -> None:
    """Agents' tests set ``global_config_dict`` to a plain nested dict; the settings block comes back as it is."""
    plain = {"weather": {"resources_servers": {"mcp": {"host": "127.0.0.1", "port": 8123}}}}
    assert get_first_server_config_dict(plain, "weather") == {"host": "127.0.0.1", "port": 8123}  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="weather"):
        get_first_server_config_dict({"weather": {"resources_servers": {}}}, "weather")  # type: ignore[arg-type]


def test_build_server_base_url_is_the_hook_every_address_goes_through() -> None:
    """NeMo Gym's agents call ``_build_server_base_url`` on a settings block; a runner replaces it on one client to
    send that client's calls elsewhere, without changing what other clients of the same config see."""
    config = OmegaConf.create(CONFIG)
    client = ServerClient.model_construct(global_config_dict=config)
    assert client._build_server_base_url(get_first_server_config_dict(config, "my_model")) == "http://10.0.0.7:8123"
    assert client._build_server_base_url({"host": "h", "port": 1}) == "http://h:1"
    assert client.server_base_url("my_model") == "http://10.0.0.7:8123"

    redirected = ServerClient.model_construct(global_config_dict=config)
    redirected._build_server_base_url = lambda settings: "http://sandbox-model:9000"  # type: ignore[method-assign,assignment]
    assert redirected.server_base_url("my_model") == "http://sandbox-model:9000"
    assert client.server_base_url("my_model") == "http://10.0.0.7:8123"


def test_request_debug_follows_the_config_key(global_config: None) -> None:
    assert is_global_aiohttp_client_request_debug_enabled() is False
    set_global_config_dict({**CONFIG, "global_aiohttp_client_request_debug": True})
    assert is_global_aiohttp_client_request_debug_enabled() is True


def test_fastapi_entrypoint_only_inside_a_worker_of_that_file(monkeypatch: pytest.MonkeyPatch) -> None:
    app = "/repo/responses_api_models/vllm_model/app.py"
    assert is_nemo_gym_fastapi_entrypoint(app) is False
    monkeypatch.setenv("IS_NEMO_GYM_FASTAPI_ENTRYPOINT", "responses_api_models/vllm_model/app.py")
    assert is_nemo_gym_fastapi_entrypoint(app) is False  # not a worker
    monkeypatch.setenv("IS_NEMO_GYM_FASTAPI_WORKER", "1")
    assert is_nemo_gym_fastapi_entrypoint(app) is True
    assert is_nemo_gym_fastapi_entrypoint("/repo/resources_servers/other/app.py") is False


def test_rollout_prefixes() -> None:
    assert rollout_path_prefix(None) == "" and apply_rollout_prefix("http://m:1/v1", None) == "http://m:1/v1"
    assert rollout_path_prefix("3-1") == "/ng-rollout/3-1"
    assert apply_rollout_prefix("http://m:1/", "3-1", token_capture=True) == (
        "http://m:1/ng-rollout/3-1/training-token-capture"
    )


def test_poll_for_status_says_whether_a_server_answers_at_all() -> None:
    """NeMo Gym's start-up loops wait with ``while client.poll_for_status(name) != "success"``: any HTTP answer (a 404
    at ``/`` too) is success, a closed port is a connection error."""
    import socket
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    class NotFound(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_error(404)

        def log_message(self, *args: object) -> None:
            pass

    httpd = HTTPServer(("127.0.0.1", 0), NotFound)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        closed_port = closed.getsockname()[1]  # bound, never listening: connections are refused
        config = OmegaConf.create({
            "head_server": {"host": "127.0.0.1", "port": httpd.server_address[1]},
            "up": {"responses_api_models": {"m": {"host": "127.0.0.1", "port": httpd.server_address[1]}}},
            "down": {"responses_api_models": {"m": {"host": "127.0.0.1", "port": closed_port}}},
        })  # fmt: skip
        client = server_utils.ServerClient(
            head_server_config=BaseServerConfig(host="127.0.0.1", port=httpd.server_address[1]),
            global_config_dict=config,
        )
        try:
            assert client.poll_for_status("up") == "success"
            assert client.poll_for_status("head_server") == "success"
            assert client.poll_for_status("down") == "connection_error"
        finally:
            httpd.shutdown()
