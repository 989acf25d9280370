"""The lean client for calls between our own servers (transport/lean_client.py), against real loopback servers.

Every test that can compares the lean path with aiohttp's general path on the same server: same status, body,
headers, cookies and errors. Nothing here measures time; deadlines below are hang guards or the subject of a test.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from yarl import URL

from nemo_gym.transport import access, http_client, lean_client
from nemo_gym.transport.admission import origin_of
from nemo_gym.transport.http_client import (
    ServerRequestError,
    ServerTimeoutError,
    TransportConfig,
    close_session,
    cookies_from,
    raise_for_status,
    request,
    response_json,
)
from nemo_gym.transport.lean_client import LeanResponse

pytestmark = pytest.mark.timeout(120)

FAST = TransportConfig(
    connect_timeout_s=30.0, total_timeout_s=60.0, max_attempts=3, backoff_base_s=0.01, backoff_cap_s=0.05
)


@pytest.fixture(autouse=True)
async def _fresh_state() -> AsyncIterator[None]:
    yield
    await close_session()
    lean_client._own_origins.clear()


@contextlib.asynccontextmanager
async def serve(*routes: web.RouteDef) -> AsyncIterator[str]:
    app = web.Application()
    app.add_routes(list(routes))
    runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, backlog=256)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


@contextlib.asynccontextmanager
async def raw_server(
    handle: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]],
) -> AsyncIterator[str]:
    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    async with server:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"


def own(base: str) -> None:
    lean_client.mark_own_server(origin_of(base))


def general(base: str) -> None:
    lean_client._own_origins.discard(origin_of(base))


async def both(method: str, url: str, **kwargs: Any) -> tuple[Any, Any]:
    """The same call through aiohttp and through the lean client."""
    base = origin_of(url)
    general(base)
    slow = await request(method, url, config=FAST, **kwargs)
    assert type(slow) is aiohttp.ClientResponse
    own(base)
    fast = await request(method, url, config=FAST, **kwargs)
    assert type(fast) is LeanResponse
    return slow, fast


async def same_answer(slow: aiohttp.ClientResponse, fast: aiohttp.ClientResponse) -> None:
    assert (fast.status, fast.reason, fast.ok) == (slow.status, slow.reason, slow.ok)
    assert await fast.read() == await slow.read()
    assert await fast.text() == await slow.text()
    assert fast.content_type == slow.content_type and fast.charset == slow.charset
    assert str(fast.url) == str(slow.url)
    ignore = {"Date", "Server"}
    assert [(k, v) for k, v in fast.headers.items() if k not in ignore] == [
        (k, v) for k, v in slow.headers.items() if k not in ignore
    ]
    assert {k: m.OutputString() for k, m in fast.cookies.items()} == {
        k: m.OutputString() for k, m in slow.cookies.items()
    }
    assert cookies_from(fast) == cookies_from(slow)
    assert fast.closed and slow.closed
    assert await fast.content.read() == await slow.content.read()  # both at the end of their body already


# ----------------------------------------------------------------------------------------------------------- answers


async def test_json_headers_and_cookies_are_the_same_on_both_paths() -> None:
    async def echo(req: web.Request) -> web.Response:
        resp = web.json_response({"body": await req.json(), "cookie": req.headers.get("Cookie")})
        resp.headers.add("Set-Cookie", "SimpleAgent___a=0123abcd; Path=/; HttpOnly; SameSite=Lax")
        resp.headers.add("X-Extra", "1")
        return resp

    async with serve(web.post("/ng-rollout/7/run", echo)) as base:
        slow, fast = await both("POST", f"{base}/ng-rollout/7/run", json={"a": "é"}, cookies={"s": "v"})
        await same_answer(slow, fast)
        assert await response_json(fast) == {"body": {"a": "é"}, "cookie": "s=v"}
        assert await fast.json() == await slow.json()


async def test_the_server_sees_the_same_request_on_both_paths() -> None:
    seen: list[dict[str, str]] = []

    async def record(req: web.Request) -> web.Response:
        headers = {k: v for k, v in req.headers.items() if k != "Host" or v.startswith("127.0.0.1:")}
        seen.append({"method": req.method, "path": req.raw_path, **headers, "body": (await req.read()).decode()})
        return web.Response(text="ok")

    async with serve(web.route("*", "/{tail:.*}", record)) as base:
        await both("POST", f"{base}/a/b?x=1&y=2", json={"k": 1}, headers={"X-Trace": "t"})
        await both("POST", f"{base}/raw", data=b"\x00\x01")  # a bare body: aiohttp's default content type
        await both("POST", f"{base}/empty")
        await both("GET", f"{base}/q?page=2")
        await both("DELETE", f"{base}/item/3", nested=True)
        await both("GET", f"{base}/with space/%7Euser")  # quoted by yarl on both paths
    assert len(seen) == 12
    for slow, fast in zip(seen[::2], seen[1::2], strict=True):
        assert fast == slow


@pytest.mark.parametrize("chunked", [True, False])
async def test_chunked_and_content_length_bodies(chunked: bool) -> None:
    payload = orjson.dumps({"items": list(range(5000))})

    async def big(req: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        if chunked:
            resp.enable_chunked_encoding()
        else:
            resp.content_length = len(payload)
        await resp.prepare(req)
        for start in range(0, len(payload), 4096):
            await resp.write(payload[start : start + 4096])
        await resp.write_eof()
        return resp

    async with serve(web.get("/big", big)) as base:
        slow, fast = await both("GET", f"{base}/big")
        await same_answer(slow, fast)
    assert await fast.read() == payload


async def test_gzip_bodies_are_decoded_as_aiohttp_decodes_them() -> None:
    async def zipped(_: web.Request) -> web.Response:
        body = gzip.compress(b'{"ok": true}')
        return web.Response(body=body, headers={"Content-Encoding": "gzip", "Content-Type": "application/json"})

    async with serve(web.get("/z", zipped)) as base:
        slow, fast = await both("GET", f"{base}/z")
        assert await fast.read() == await slow.read() == b'{"ok": true}'


async def test_error_statuses_are_returned_and_raise_alike() -> None:
    async def fail(_: web.Request) -> web.Response:
        return web.json_response({"detail": "nope"}, status=422)

    async with serve(web.post("/verify", fail)) as base:
        slow, fast = await both("POST", f"{base}/verify", json={}, server_name="resources", url_path="/verify")
        await same_answer(slow, fast)
        with pytest.raises(ServerRequestError) as from_slow:
            raise_for_status(slow, "resources", "/verify")
        with pytest.raises(ServerRequestError) as from_fast:
            raise_for_status(fast, "resources", "/verify")
        assert str(from_fast.value) == str(from_slow.value)
        assert from_fast.value.status == 422
        with pytest.raises(aiohttp.ClientResponseError) as own_error:
            fast.raise_for_status()
        assert own_error.value.status == 422 and own_error.value.request_info.method == "POST"


async def test_a_released_response_is_closed_as_aiohttps_is() -> None:
    async def ok(_: web.Request) -> web.Response:
        return web.json_response({"a": 1})

    async with serve(web.get("/", ok)) as base:
        slow, fast = await both("GET", f"{base}/")
        for resp in (slow, fast):
            async with resp as entered:
                assert await entered.json() == {"a": 1}
            with pytest.raises(aiohttp.ClientConnectionError, match="Connection closed"):
                await resp.read()


async def test_redirects_are_followed_by_aiohttp() -> None:
    async def moved(_: web.Request) -> web.Response:
        raise web.HTTPTemporaryRedirect("/new")

    async def new(req: web.Request) -> web.Response:
        return web.json_response({"body": await req.json()})

    async with serve(web.post("/old", moved), web.post("/new", new)) as base:
        own(base)
        resp = await request("POST", f"{base}/old", json={"x": 1}, config=FAST)
    assert resp.status == 200 and await response_json(resp) == {"body": {"x": 1}}


# ------------------------------------------------------------------------------------------------------- connections


async def test_connections_are_kept_alive_and_reused() -> None:
    peers: list[Any] = []

    async def peer(req: web.Request) -> web.Response:
        peers.append(req.transport.get_extra_info("peername") if req.transport else None)
        return web.Response(text="ok")

    async with serve(web.get("/", peer)) as base:
        own(base)
        for _ in range(4):
            assert type(await request("GET", f"{base}/", config=FAST)) is LeanResponse
    assert len(peers) == 4 and len(set(peers)) == 1


async def test_the_pool_is_bounded_per_host_and_queues_the_rest() -> None:
    in_flight = peak = 0
    two_at_once = asyncio.Event()
    peers: set[Any] = set()

    async def work(req: web.Request) -> web.Response:
        nonlocal in_flight, peak
        peers.add(req.transport.get_extra_info("peername") if req.transport else None)
        in_flight += 1
        peak = max(peak, in_flight)
        if in_flight == 2:
            two_at_once.set()
        await two_at_once.wait()
        in_flight -= 1
        return web.Response(text="ok")

    previous = http_client.get_default_config()
    await close_session()
    http_client.set_default_config(previous.model_copy(update={"limit_per_host": 2}))
    try:
        async with serve(web.get("/", work)) as base:
            own(base)
            responses = await asyncio.gather(*(request("GET", f"{base}/", config=FAST) for _ in range(10)))
    finally:
        http_client.set_default_config(previous)
    assert all(type(r) is LeanResponse and r.status == 200 for r in responses)
    assert peak == 2 and len(peers) == 2


async def test_idle_connections_are_closed_after_the_keep_alive_without_another_call() -> None:
    """As aiohttp's connector does: a burst's idle sockets do not wait for the next call (or the server) to end."""
    closed_by_client = asyncio.Event()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        if await reader.read() == b"":  # the server never closes: only the client can end the connection
            closed_by_client.set()
        writer.close()

    previous = http_client.get_default_config()
    await close_session()
    http_client.set_default_config(previous.model_copy(update={"keepalive_timeout_s": 0.05}))
    try:
        async with raw_server(handle) as base:
            own(base)
            response = await request("GET", f"{base}/", config=FAST)
            assert type(response) is LeanResponse and await response.text() == "ok"
            await asyncio.wait_for(closed_by_client.wait(), timeout=60)  # a hang guard, not a measurement
    finally:
        http_client.set_default_config(previous)


async def test_a_connection_the_server_closes_is_not_reused() -> None:
    connections = 0

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        await reader.readuntil(b"\r\n\r\n")
        # No length and no chunking: the body ends with the connection.
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\nuntil the end")
        await writer.drain()
        writer.close()

    async with raw_server(handle) as base:
        slow, fast = await both("GET", f"{base}/x")
        assert await fast.text() == await slow.text() == "until the end"
        await request("GET", f"{base}/x", config=FAST)
    assert connections == 3


async def test_disconnect_before_any_answer_is_retried_on_both_paths() -> None:
    connections = 0

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        await reader.readuntil(b"\r\n\r\n")
        if connections % 2 == 0:
            body = b'{"ok": true}'
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
            await writer.drain()
        writer.close()

    async with raw_server(handle) as base:
        slow, fast = await both("POST", f"{base}/verify", json={})
    assert await response_json(fast) == await response_json(slow) == {"ok": True}
    assert connections == 4


async def test_connection_lost_mid_answer_is_not_retried_on_both_paths() -> None:
    connections = 0

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npartial")
        await writer.drain()
        writer.transport.abort()  # a reset halfway through the body

    async with raw_server(handle) as base:
        errors = []
        for mark in (general, own):
            mark(base)
            with pytest.raises(ServerRequestError, match="not retried") as info:
                await request("POST", f"{base}/verify", json={}, server_name="resources", config=FAST)
            errors.append(info.value)
    assert connections == 2
    assert [type(e.__cause__) for e in errors] == [aiohttp.ClientPayloadError] * 2
    assert all("resources" in str(e) and "/verify" in str(e) for e in errors)


async def test_connection_refused_is_retried_and_named_as_aiohttp_names_it() -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        base = f"http://127.0.0.1:{sock.getsockname()[1]}"
        own(base)
        with pytest.raises(ServerRequestError) as info:
            await request("POST", f"{base}/run", json={}, server_name="agent", url_path="/run", config=FAST)
    assert info.value.attempts == FAST.max_attempts
    assert isinstance(info.value.__cause__, aiohttp.ClientConnectorError)
    assert "ClientConnectorError" in str(info.value) and "Cannot connect to host 127.0.0.1" in str(info.value)


async def test_the_deadline_covers_the_answer_and_is_not_retried() -> None:
    hits = 0
    release = asyncio.Event()

    async def slow(_: web.Request) -> web.Response:
        nonlocal hits
        hits += 1
        await release.wait()
        return web.Response(text="late")

    config = FAST.model_copy(update={"total_timeout_s": 0.3})
    async with serve(web.post("/v1/responses", slow)) as base:
        own(base)
        with pytest.raises(ServerTimeoutError) as info:
            await request("POST", f"{base}/v1/responses", json={}, server_name="policy_model", config=config)
        release.set()
    assert hits == 1 and info.value.timeout_s == 0.3
    assert "not retried" in str(info.value) and "policy_model" in str(info.value)


async def test_the_deadline_covers_a_slow_body() -> None:
    async def dribble(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n" + b"x" * 10)
        await writer.drain()
        await asyncio.sleep(30)  # hang guard: the client gives up long before

    async with raw_server(dribble) as base:
        own(base)
        with pytest.raises(ServerTimeoutError):
            await request("GET", f"{base}/big", config=FAST.model_copy(update={"total_timeout_s": 0.3}))


# ---------------------------------------------------------------------------------------------- who gets the lean path


async def test_servers_of_the_run_get_the_token_and_the_lean_path_others_neither() -> None:
    async def token(req: web.Request) -> web.Response:
        return web.json_response({"token": req.headers.get(access.TOKEN_HEADER)})

    async with serve(web.get("/t", token)) as ours, serve(web.get("/t", token)) as theirs:
        access.register("secret", [ours])
        try:
            mine = await request("GET", f"{ours}/t", config=FAST)
            other = await request("GET", f"{theirs}/t", config=FAST)
        finally:
            access.forget([ours])
    assert type(mine) is LeanResponse and await response_json(mine) == {"token": "secret"}
    assert type(other) is aiohttp.ClientResponse and await response_json(other) == {"token": None}


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8000/run",
        "http://127.0.0.1:8000/ng-rollout/abc-1/v1/responses",
        "http://127.0.0.1:8000/a/b?x=1&y=two,three+four",
        "http://localhost:9/get_weather",
        "http://127.0.0.1:8000/with space",
        "http://127.0.0.1:8000/caf%C3%A9/é",
        "http://127.0.0.1:8000/a/../b",
        "http://127.0.0.1:8000/file.json",
    ],
)
def test_request_targets_are_what_aiohttp_sends(url: str) -> None:
    split = lean_client.split(url, "POST")
    assert split is not None
    assert split[0] == origin_of(url) or origin_of(split[0]) == origin_of(url)
    assert split[2] == URL(url).raw_path_qs


@pytest.mark.parametrize(
    "url", ["https://127.0.0.1/x", "http://user:pw@127.0.0.1:1/x", "http://[::1]:8000/x", "http://127.0.0.1:1"]
)
def test_urls_the_lean_client_leaves_to_aiohttp(url: str) -> None:
    assert lean_client.split(url, "POST") is None
    assert lean_client.split("http://127.0.0.1:1/x", "HEAD") is None


@pytest.mark.parametrize(
    "header",
    [
        "s=0123abcd; Path=/; HttpOnly; SameSite=Lax",
        "s=",
        " s = v ; Max-Age=0",
        "a.b-c_d=x~y+z/w:1",
        'q="quoted value"; Path=/',
        "bad name=1",
        "path=/x",
        "x=a,b",
        "novalue",
        "x=1; Expires=Wed, 21 Oct 2015 07:28:00 GMT",
    ],
)
async def test_cookies_read_fast_match_aiohttps_parser(header: str) -> None:
    async def set_cookie(_: web.Request) -> web.Response:
        resp = web.Response(text="ok")
        resp.headers.add("Set-Cookie", header)
        resp.headers.add("Set-Cookie", "second=2")
        return resp

    async with serve(web.get("/", set_cookie)) as base:
        slow, fast = await both("GET", f"{base}/")
    assert cookies_from(fast) == cookies_from(slow)
    fresh = await _lean_copy(fast)
    assert {k: m.coded_value for k, m in fresh.cookies.items()} == {k: m.coded_value for k, m in slow.cookies.items()}


async def _lean_copy(resp: LeanResponse) -> LeanResponse:
    return LeanResponse(
        resp.method, str(resp.url), resp.status, resp.reason or "", resp._raw_headers, await resp.read(),
        resp._raw_cookie_headers, (), asyncio.get_running_loop(),
    )  # fmt: skip


async def test_a_host_name_is_resolved_and_every_address_tried() -> None:
    async def ok(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    async with serve(web.get("/", ok)) as base:
        by_name = base.replace("127.0.0.1", "localhost")  # may resolve to ::1 first, where nothing listens
        own(by_name)
        resp = await request("GET", f"{by_name}/", config=FAST)
    assert type(resp) is LeanResponse and await resp.text() == "ok"


async def test_server_client_calls_take_the_lean_path_with_nemo_gyms_helpers() -> None:
    from omegaconf import OmegaConf

    from nemo_gym import server_utils
    from nemo_gym.config.server_models import BaseServerConfig

    async def tool(req: web.Request) -> web.Response:
        status = 200 if (await req.json()).get("ok") else 500
        return web.json_response({"cookie": req.headers.get("Cookie")}, status=status)

    async with serve(web.post("/tool", tool)) as base:
        port = int(base.rsplit(":", 1)[1])
        config = OmegaConf.create({"env": {"resources_servers": {"r": {"host": "127.0.0.1", "port": port}}}})
        client = server_utils.ServerClient(
            head_server_config=BaseServerConfig(host="127.0.0.1", port=1), global_config_dict=config
        )
        good = await client.post("env", "/tool", json={"ok": True}, cookies={"s": "1"})
        assert type(good) is LeanResponse
        assert await server_utils.get_response_json(good) == {"cookie": "s=1"}
        assert await server_utils.raise_for_status(good) is good  # NeMo Gym's awaitable form
        bad = await client.post("env", "/tool", json={"ok": False})
        with pytest.raises(ServerRequestError, match="HTTP 500"):
            server_utils.raise_for_status(bad)


async def test_retryable_statuses_and_retry_after_are_honoured_on_both_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    hits = 0
    waits: list[float] = []

    async def busy(_: web.Request) -> web.Response:
        nonlocal hits
        hits += 1
        if hits % 2:
            return web.Response(status=503, text="busy", headers={"Retry-After": "0"})
        return web.json_response({"hits": hits})

    real_backoff = http_client._backoff_s

    def spy(cfg: TransportConfig, attempt: int, failure: Any) -> float:
        waits.append(real_backoff(cfg, attempt, failure))
        return waits[-1]

    monkeypatch.setattr(http_client, "_backoff_s", spy)
    async with serve(web.post("/run", busy)) as base:
        slow, fast = await both("POST", f"{base}/run", json={})
    assert await response_json(slow) == {"hits": 2} and await response_json(fast) == {"hits": 4}
    # Retry-After: 0 plus jitter below the base backoff, on both paths.
    assert len(waits) == 2 and all(0 <= w <= FAST.backoff_base_s for w in waits)


@pytest.mark.parametrize(
    "headers",
    [
        ((b"content-type", b"application/json"),),
        ((b"Content-Type", b"application/json"), (b"content-type", b"text/plain; charset=latin-1")),
        ((b"content-type", b"text/plain; charset=latin-1"), (b"content-type", b"application/json")),
        ((b"content-type", b"application/json; charset=latin-1"),),
        ((b"content-type", b"Application/JSON"),),
        ((b"content-type", b"application/json "),),
        ((b"content-type", b"text/plain"),),
        ((b"content-length", b"3"),),
        (),
    ],
)
@pytest.mark.parametrize("body", ['{"a": "é"}'.encode(), "é".encode("latin-1"), b"\xff\xfe"])
@pytest.mark.parametrize(("encoding", "errors"), [(None, "strict"), (None, "replace"), ("latin-1", "strict")])
async def test_text_decodes_as_aiohttps_text(
    headers: tuple[tuple[bytes, bytes], ...], body: bytes, encoding: str | None, errors: str
) -> None:
    """``LeanResponse.text`` (a shortcut for exactly ``application/json``) gives aiohttp's answer or its error."""
    resp = LeanResponse("POST", "http://127.0.0.1:1/t", 200, "OK", headers, body, None, (), asyncio.get_running_loop())
    outcomes = []
    for text in (resp.text, lambda *a: aiohttp.ClientResponse.text(resp, *a)):
        try:
            outcomes.append(("ok", await text(encoding, errors)))
        except Exception as error:  # the same exception type either way
            outcomes.append(("error", type(error).__name__))
    assert outcomes[0] == outcomes[1]
