"""How server processes run: uvicorn's httptools protocol, the inherited socket, loop choice, pool sizes, the
collector."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import importlib.util
import socket
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from fastapi import FastAPI, WebSocket
from fastapi.responses import StreamingResponse
from omegaconf import OmegaConf
from pydantic import BaseModel

from nemo_gym.config_types import BaseServerConfig
from nemo_gym.errors import ConfigError
from nemo_gym.server_utils import ServerClient
from nemo_gym.transport import http_client, runtime
from tests.helpers import serving

pytestmark = pytest.mark.timeout(60)


# --------------------------------------------------------------------------------------------------------------------
# A real server on an inherited socket


class Weather(BaseModel):
    city: str


def weather_app(second_chunk: asyncio.Event | None = None) -> FastAPI:
    """``/stream`` sends its second chunk only once ``second_chunk`` is set (by the client, after reading the first)."""
    app = FastAPI()

    @app.post("/get_weather")
    async def get_weather(body: Weather) -> dict[str, str]:
        return {"city": body.city, "weather_description": "cold"}

    @app.get("/stream")
    async def stream() -> StreamingResponse:
        async def chunks() -> AsyncIterator[bytes]:
            yield b"first,"
            if second_chunk is not None:
                await second_chunk.wait()  # the head and the first chunk must not wait for this
            yield b"second"

        return StreamingResponse(chunks(), media_type="text/plain")

    return app


async def test_the_inherited_socket_is_tcp_and_accepted_connections_are_nodelay() -> None:
    async with serving(weather_app()) as (url, server), aiohttp.ClientSession() as session:
        async with session.post(f"{url}/get_weather", json={"city": "Paris"}) as resp:
            assert resp.status == 200
            assert await resp.json() == {"city": "Paris", "weather_description": "cold"}
            for connection in server.server_state.connections:
                sock = connection.transport.get_extra_info("socket")
                assert sock.family == socket.AF_INET
                assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)


async def test_validation_and_streaming_work_through_the_servers_protocol() -> None:
    second_chunk = asyncio.Event()
    async with serving(weather_app(second_chunk)) as (url, _), aiohttp.ClientSession() as session:
        async with session.post(f"{url}/get_weather", json={"town": "Paris"}) as resp:
            assert resp.status == 422
            assert (await resp.json())["detail"][0]["loc"] == ["body", "city"]
        async with session.get(f"{url}/stream") as resp:
            assert resp.status == 200
            try:
                # The second chunk does not exist until the first has arrived: were anything held back, this would
                # hang (60 s: a hang guard only).
                first = await asyncio.wait_for(resp.content.readexactly(len(b"first,")), 60)
            finally:
                second_chunk.set()  # also on failure, so the server can shut down
            assert first == b"first,"
            assert await resp.read() == b"second"


async def test_pipelined_requests_are_all_answered_in_order() -> None:
    """Requests written back to back on one connection: the first one's end must not forget the next."""
    body = b'{"city": "%s"}'
    requests = b"".join(
        b"POST /get_weather HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
        % (len(body % city), body % city)
        for city in (b"Paris", b"Oslo", b"Rome")
    )
    async with serving(weather_app()) as (url, _):
        reader, writer = await asyncio.open_connection("127.0.0.1", int(url.rsplit(":", 1)[1]))
        writer.write(requests)
        answers = []
        for _ in range(3):  # the read deadline is a hang guard only
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 60)
            length = int(next(h for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")).split(b":")[1])
            answers.append(await asyncio.wait_for(reader.readexactly(length), 60))
        writer.close()
    assert [a.split(b'"city":"')[1].split(b'"')[0] for a in answers] == [b"Paris", b"Oslo", b"Rome"]


@pytest.mark.parametrize("loop_name", ["asyncio", "uvloop"])
def test_the_configured_event_loop_serves(loop_name: str) -> None:
    if loop_name == "uvloop" and importlib.util.find_spec("uvloop") is None:
        pytest.skip("uvloop is not installed")
    config = runtime.uvicorn_config(weather_app(), "127.0.0.1", 0, {"server_event_loop": loop_name})
    loop_factory = config.get_loop_factory()

    async def one_request() -> int:
        async with serving(weather_app(), loop_name) as (url, _), aiohttp.ClientSession() as session:
            async with session.post(f"{url}/get_weather", json={"city": "Oslo"}) as resp:
                return resp.status

    with asyncio.Runner(loop_factory=loop_factory) as runner:
        assert runner.run(one_request()) == 200
        assert type(runner.get_loop()).__module__.split(".")[0] == loop_name


def test_servers_run_uvicorn_s_own_http_protocol() -> None:
    """Plain uvicorn (issue 36): its httptools protocol by name, none of ours."""
    config = runtime.uvicorn_config(weather_app(), "127.0.0.1", 0, {})
    assert config.http == ("httptools" if importlib.util.find_spec("httptools") else "h11")


def test_an_app_without_websocket_routes_does_not_load_the_websocket_protocol() -> None:
    plain = weather_app()
    assert runtime.websocket_protocol(plain) == "none"
    assert runtime.uvicorn_config(plain, "127.0.0.1", 0, {}).ws == "none"
    mounted = FastAPI()
    mounted.mount("/sub", weather_app())
    assert runtime.websocket_protocol(mounted) == "none"


def test_any_websocket_route_or_opaque_mount_keeps_uvicorn_s_websocket_support() -> None:
    with_socket = FastAPI()

    @with_socket.websocket("/ws")
    async def echo(websocket: WebSocket) -> None:
        await websocket.accept()
        await websocket.send_text(await websocket.receive_text())
        await websocket.close()

    nested = FastAPI()
    nested.mount("/sub", with_socket)
    opaque = FastAPI()

    async def raw_asgi(scope: Any, receive: Any, send: Any) -> None:
        raise AssertionError("never called")

    opaque.mount("/raw", raw_asgi)
    for app in (with_socket, nested, opaque, raw_asgi):
        assert runtime.websocket_protocol(app) == "auto"
    assert runtime.uvicorn_config(with_socket, "127.0.0.1", 0, {}).ws == "auto"

    async def round_trip() -> str:
        async with serving(with_socket) as (url, _), aiohttp.ClientSession() as session:
            async with session.ws_connect(f"{url.replace('http', 'ws', 1)}/ws") as ws:
                await ws.send_str("ping")
                return await asyncio.wait_for(ws.receive_str(), 30)  # a hang guard only

    assert asyncio.run(round_trip()) == "ping"


# --------------------------------------------------------------------------------------------------------------------
# Settings


def test_event_loop_choice() -> None:
    installed = "uvloop" if importlib.util.find_spec("uvloop") is not None else "asyncio"
    assert runtime.event_loop_choice({}) == installed
    assert runtime.event_loop_choice({"server_event_loop": "auto"}) == installed
    assert runtime.event_loop_choice({"server_event_loop": "asyncio"}) == "asyncio"
    with pytest.raises(ConfigError, match="server_event_loop must be"):
        runtime.event_loop_choice({"server_event_loop": "trio"})


@pytest.mark.skipif(importlib.util.find_spec("uvloop") is None, reason="uvloop is not installed")
def test_uvloop_detaches_the_socket_of_a_cancelled_connect() -> None:
    """The uvloop bug behind the reference implementation's doubts: a cancelled ``create_connection(sock=)`` left the
    socket object owning a descriptor libuv had closed, so its finalizer later closed an unrelated connection."""
    import uvloop

    async def cancelled_connects() -> list[int]:
        server = await asyncio.start_server(lambda reader, writer: None, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        loop = asyncio.get_running_loop()
        filenos = []
        for _ in range(20):
            sock = socket.socket()
            sock.setblocking(False)
            await loop.sock_connect(sock, ("127.0.0.1", port))
            connecting = asyncio.ensure_future(loop.create_connection(asyncio.Protocol, sock=sock))
            await asyncio.sleep(0)
            connecting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await connecting
            filenos.append(sock.fileno())
        server.close()
        return filenos

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        assert set(runner.run(cancelled_connects())) == {-1}


@pytest.fixture
def restore_transport_defaults() -> Any:
    previous = http_client.get_default_config()
    yield
    http_client.set_default_config(previous)


def test_pool_sizes_come_from_the_config(restore_transport_defaults: Any) -> None:
    runtime.configure_transport(
        {"global_aiohttp_connector_limit": 2000, "global_aiohttp_connector_limit_per_host": 500}
    )
    config = http_client.get_default_config()
    assert (config.limit, config.limit_per_host) == (2000, 500)
    with pytest.raises(ConfigError, match="limit_per_host"):
        runtime.configure_transport({"global_aiohttp_connector_limit_per_host": 0})


def test_the_call_deadline_comes_from_the_config(restore_transport_defaults: Any) -> None:
    runtime.configure_transport({"server_call_timeout_seconds": 3000})
    assert http_client.get_default_config().total_timeout_s == 3000
    with pytest.raises(ConfigError, match="total_timeout_s"):
        runtime.configure_transport({"server_call_timeout_seconds": -1})


def test_no_pool_keys_leave_the_defaults(restore_transport_defaults: Any) -> None:
    before = http_client.get_default_config()
    runtime.configure_transport({})
    assert http_client.get_default_config() == before


def test_garbage_collector_tuning_freezes_startup_objects() -> None:
    thresholds = gc.get_threshold()
    try:
        runtime.tune_garbage_collector(12345)
        assert gc.get_freeze_count() > 0
        assert gc.get_threshold()[0] == 12345
        cycle: list[Any] = []
        cycle.append(cycle)
        del cycle
        assert gc.collect() >= 1  # cycles created after startup are still collected
    finally:
        gc.unfreeze()
        gc.set_threshold(*thresholds)


def test_server_urls_are_cached_per_config_object() -> None:
    def config(port: int) -> Any:
        return OmegaConf.create({"m": {"responses_api_models": {"x": {"host": "127.0.0.1", "port": port}}}})

    client = ServerClient(head_server_config=BaseServerConfig(host="127.0.0.1", port=1), global_config_dict=config(5))
    assert client.server_base_url("m") == "http://127.0.0.1:5"
    assert client.server_base_url("m") == "http://127.0.0.1:5"
    client.global_config_dict = config(6)  # a new config is looked up afresh
    assert client.server_base_url("m") == "http://127.0.0.1:6"
    with pytest.raises(ConfigError, match="no server named 'n'"):
        client.server_base_url("n")
