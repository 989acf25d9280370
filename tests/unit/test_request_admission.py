"""A server works on a bounded number of outside requests; the rest wait at the door in arrival order.

Nested calls (made while serving an admitted request) and the health check never wait, so two servers calling each
other cannot deadlock and a busy server still answers "alive".
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from fastapi import FastAPI, Request
from omegaconf import OmegaConf

from nemo_gym.config_types import BaseServerConfig
from nemo_gym.errors import ConfigError
from nemo_gym.server_utils import ServerClient
from nemo_gym.transport import http_client, runtime, types
from nemo_gym.transport.admission import NESTED_HEADER, AdmissionMiddleware, in_admitted_request
from tests.helpers import serving

pytestmark = pytest.mark.timeout(120)


class Gauge:
    """Counts requests inside the app right now, the most at once, and the order they got in."""

    def __init__(self) -> None:
        self.inside = 0
        self.most = 0
        self.order: list[int] = []
        self.release = asyncio.Event()


@contextlib.asynccontextmanager
async def gauged_server(max_active: int) -> AsyncIterator[tuple[Gauge, str, Any, aiohttp.ClientSession]]:
    """A server around ``gauged_app`` and a client session. On the way out the gauge is released, so a failed
    assertion ends the test at once instead of leaving requests parked that the server's shutdown would wait for."""
    gauge = Gauge()
    async with serving(gauged_app(gauge), max_active=max_active) as (url, server), aiohttp.ClientSession() as session:
        try:
            yield gauge, url, server, session
        finally:
            gauge.release.set()


def gauged_app(gauge: Gauge) -> FastAPI:
    app = FastAPI()

    @app.post("/work/{i}")
    async def work(i: int) -> dict[str, Any]:
        gauge.inside += 1
        gauge.most = max(gauge.most, gauge.inside)
        gauge.order.append(i)
        try:
            await gauge.release.wait()
        finally:
            gauge.inside -= 1
        return {"i": i, "admitted": in_admitted_request()}

    @app.get("/")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    return app


async def wait_until(condition: Any, timeout_s: float = 60.0) -> None:
    """Return as soon as ``condition()`` holds; ``timeout_s`` is a hang guard, not a measure of anything."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


def door(server: Any) -> AdmissionMiddleware:
    """The admission middleware of a server started by ``serving``: it says how many requests wait at the door."""
    middleware = server.config.app
    assert isinstance(middleware, AdmissionMiddleware)
    return middleware


async def test_at_most_limit_requests_are_worked_on_and_the_rest_get_in_in_arrival_order() -> None:
    async with gauged_server(max_active=3) as (gauge, url, server, session):

        async def post(i: int) -> dict[str, Any]:
            async with session.post(f"{url}/work/{i}") as resp:
                assert resp.status == 200
                return await resp.json()

        first = [asyncio.create_task(post(i)) for i in range(3)]
        await wait_until(lambda: gauge.inside == 3)
        rest = []
        for i in range(3, 12):  # each is waiting at the door before the next is sent, so their order is known
            rest.append(asyncio.create_task(post(i)))
            await wait_until(lambda i=i: door(server).waiting == i - 2 or gauge.inside > 3)
        assert gauge.inside == 3, "requests past the limit must wait at the door"
        async with session.get(url) as resp:  # the health check never waits
            assert resp.status == 200
        gauge.release.set()
        results = await asyncio.gather(*first, *rest)
    assert gauge.most == 3
    assert gauge.order[3:] == list(range(3, 12))
    assert all(r["admitted"] for r in results)


async def test_a_request_whose_client_gave_up_while_waiting_is_never_worked_on() -> None:
    async with gauged_server(max_active=1) as (gauge, url, server, session):
        first = asyncio.create_task(session.post(f"{url}/work/0"))
        await wait_until(lambda: gauge.inside == 1)
        port = int(url.rpartition(":")[2])
        _, writer = await asyncio.open_connection("127.0.0.1", port)  # a raw client, to hang up at a known moment
        writer.write(b"POST /work/1 HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
        await wait_until(lambda: door(server).waiting == 1)  # it waits at the door ...
        writer.close()  # ... and its client hangs up
        await writer.wait_closed()
        await wait_until(lambda: len(server.server_state.connections) == 1)  # the server has seen it go
        gauge.release.set()
        (await first).release()
        # A later request is admitted only after the abandoned one had its turn (arrival order), so once it has been
        # served, the abandoned one was either dropped or run: never a matter of waiting long enough.
        async with session.post(f"{url}/work/2") as resp:
            assert resp.status == 200
    assert gauge.order == [0, 2]


async def test_nested_calls_skip_the_queue() -> None:
    async with gauged_server(max_active=1) as (gauge, url, _, session):
        outside = asyncio.create_task(session.post(f"{url}/work/0"))
        await wait_until(lambda: gauge.inside == 1)
        nested = [asyncio.create_task(session.post(f"{url}/work/{i}", headers={NESTED_HEADER: "1"})) for i in (1, 2)]
        await wait_until(lambda: gauge.inside == 3)  # both got in although the one slot is taken
        gauge.release.set()
        for response in await asyncio.gather(outside, *nested):
            assert response.status == 200
            response.release()


async def test_calls_between_servers_made_while_serving_an_admitted_request_carry_the_nested_mark() -> None:
    """End to end: server A (limit 1) calls server B (limit 1) which calls A back, each through ``ServerClient``.
    Without the mark A's second request would queue behind its first, which waits for it: a deadlock."""
    a_app, b_app = FastAPI(), FastAPI()
    ports: dict[str, int] = {}

    def client() -> ServerClient:
        servers = {
            name: {"resources_servers": {"x": {"host": "127.0.0.1", "port": port}}} for name, port in ports.items()
        }
        return ServerClient(
            head_server_config=BaseServerConfig(host="127.0.0.1", port=1), global_config_dict=OmegaConf.create(servers)
        )

    @a_app.post("/start")
    async def start() -> dict[str, Any]:
        return {"b": await http_client.response_json(await client().post("b", "/middle", json={}))}

    @a_app.post("/leaf")
    async def leaf(request: Request) -> dict[str, Any]:
        return {"leaf": True, "nested": request.headers.get(NESTED_HEADER)}

    @b_app.post("/middle")
    async def middle() -> dict[str, Any]:
        return {"a": await http_client.response_json(await client().post("a", "/leaf", json={}))}

    async with serving(a_app, max_active=1) as (a_url, _), serving(b_app, max_active=1) as (b_url, _):
        ports.update(a=int(a_url.rpartition(":")[2]), b=int(b_url.rpartition(":")[2]))
        try:
            assert not in_admitted_request()  # a plain client: no mark, its calls queue like anyone's
            resp = await asyncio.wait_for(client().post("a", "/start", json={}), 60)  # a hang guard (deadlock)
            assert await http_client.response_json(resp) == {"b": {"a": {"leaf": True, "nested": "1"}}}
        finally:
            await http_client.close_session()


async def test_calls_to_outside_apis_never_carry_the_mark() -> None:
    """A model server calling OpenAI or vLLM through the transport directly sends no internal header."""
    seen: list[str | None] = []
    upstream, proxy = FastAPI(), FastAPI()

    @upstream.post("/v1/responses")
    async def responses(request: Request) -> dict[str, Any]:
        seen.append(request.headers.get(NESTED_HEADER))
        return {}

    async with serving(upstream) as (upstream_url, _), serving(proxy, max_active=4) as (proxy_url, _):

        @proxy.post("/call")
        async def call() -> dict[str, Any]:
            await http_client.request("POST", f"{upstream_url}/v1/responses", json={})
            return {}

        try:
            assert (await http_client.request("POST", f"{proxy_url}/call", json={})).status == 200
        finally:
            await http_client.close_session()
    assert seen == [None]


async def test_without_a_limit_the_app_is_served_directly() -> None:
    app = FastAPI()
    config = runtime.uvicorn_config(app, "127.0.0.1", 0, {}, None)
    assert config.app is app
    wrapped = runtime.uvicorn_config(app, "127.0.0.1", 0, {}, 8).app
    assert isinstance(wrapped, AdmissionMiddleware) and wrapped.limit == 8


async def test_lifespan_passes_through_untouched() -> None:
    seen: list[str] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        seen.append(scope["type"])
        assert not in_admitted_request()  # tasks started at startup are not inside any request

    middleware = AdmissionMiddleware(app, 1)
    await middleware({"type": "lifespan"}, None, None)
    assert seen == ["lifespan"]
    with pytest.raises(ValueError, match="at least 1"):
        AdmissionMiddleware(app, 0)


def test_nested_mark_is_added_to_headers_only_inside_a_request() -> None:
    build = http_client._build_headers
    assert build(None, None, True) == {"Content-Type": "application/json"}
    assert build(None, None, True, nested=True) == {"Content-Type": "application/json", NESTED_HEADER: "1"}
    assert build(None, None, False, nested=True) == {NESTED_HEADER: "1"}
    merged = build({"X-A": "b"}, {"s": "1"}, True, nested=True)
    assert merged == {"Content-Type": "application/json", NESTED_HEADER: "1", "X-A": "b", "Cookie": "s=1"}


# --------------------------------------------------------------------------------------------------------------------
# The bound's configuration


def test_default_bound_follows_the_connection_pool_size() -> None:
    assert runtime.max_active_requests(OmegaConf.create({})) == types.get_default_config().limit_per_host
    previous = types.get_default_config()
    try:
        runtime.configure_transport(OmegaConf.create({"global_aiohttp_connector_limit_per_host": 4096}))
        assert runtime.max_active_requests(OmegaConf.create({})) == 4096
    finally:
        types.set_default_config(previous)


def test_instance_setting_beats_the_global_one_and_zero_or_null_means_no_bound() -> None:
    class Instance:
        max_active_requests = 7

    assert runtime.max_active_requests(OmegaConf.create({"server_max_active_requests": 100}), Instance()) == 7
    assert runtime.max_active_requests(OmegaConf.create({"server_max_active_requests": 100})) == 100
    assert runtime.max_active_requests(OmegaConf.create({"server_max_active_requests": 0})) is None
    assert runtime.max_active_requests(OmegaConf.create({"server_max_active_requests": None})) is None
    Instance.max_active_requests = 0
    assert runtime.max_active_requests(OmegaConf.create({}), Instance()) is None


@pytest.mark.parametrize("value", [-1, "many", 2.5, True])
def test_a_bad_bound_is_a_config_error_naming_the_key(value: Any) -> None:
    with pytest.raises(ConfigError, match="server_max_active_requests must be a whole number"):
        runtime.max_active_requests(OmegaConf.create({"server_max_active_requests": value}))

    class Instance:
        name = "my_agent"
        max_active_requests = value

    with pytest.raises(ConfigError, match="max_active_requests of server 'my_agent' must be a whole number"):
        runtime.max_active_requests(OmegaConf.create({}), Instance())
