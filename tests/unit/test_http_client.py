"""Tests for the shared HTTP transport, against real servers on 127.0.0.1 (no mocks of the network layer)."""

from __future__ import annotations

import asyncio
import contextlib
import pickle
import socket
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from types import SimpleNamespace
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from pydantic import BaseModel

from nemo_gym.transport import http_client
from nemo_gym.transport.http_client import (
    ServerRequestError,
    ServerTimeoutError,
    TransportConfig,
    TransportError,
    close_session,
    cookies_from,
    get_session,
    raise_for_status,
    request,
    response_json,
)

pytestmark = pytest.mark.timeout(120)

# Small backoffs keep every failure path quick. The timeouts are hang guards for calls that should succeed: a busy
# machine may be slow, and no test here measures how long anything took (those that need a deadline set their own).
FAST = TransportConfig(
    connect_timeout_s=30.0,
    total_timeout_s=60.0,
    max_attempts=3,
    backoff_base_s=0.01,
    backoff_cap_s=0.05,
    retry_after_cap_s=2.0,
)


class SleepSpy:
    """Stands in for the ``asyncio`` module inside ``http_client`` and records every backoff it sleeps for, so tests
    check the waits the client chose instead of timing them on a machine that may be busy."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(asyncio, name)

    async def sleep(self, delay: float, result: Any = None) -> Any:
        self.delays.append(delay)
        return await asyncio.sleep(delay, result)


@pytest.fixture
def sleeps(monkeypatch: pytest.MonkeyPatch) -> SleepSpy:
    spy = SleepSpy()
    monkeypatch.setattr(http_client, "asyncio", spy)
    return spy


@pytest.fixture(autouse=True)
async def _close_pooled_session() -> AsyncIterator[None]:
    """Each test has its own loop; close that loop's pooled session so no socket or warning outlives the test."""
    yield
    await close_session()


@contextlib.asynccontextmanager
async def serve(*routes: web.RouteDef) -> AsyncIterator[str]:
    """Run an aiohttp app on an ephemeral loopback port and yield its base URL."""
    app = web.Application()
    app.add_routes(list(routes))
    runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=0.1)
    await runner.setup()
    # A backlog above the 500-way burst below: aiohttp's default (128) drops SYNs and costs a 1 s retransmit.
    site = web.TCPSite(runner, "127.0.0.1", 0, backlog=1024)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def echo(req: web.Request) -> web.Response:
    return web.json_response(
        {"body": orjson.loads(await req.read()), "content_type": req.headers.get("Content-Type")},
        dumps=lambda v: orjson.dumps(v).decode(),
    )


class Message(BaseModel):
    role: str
    content: str
    name: str | None = None


class Params(BaseModel):
    input: list[Message]
    temperature: float | None = None
    model: str = "policy"


# ---------------------------------------------------------------------------------------------------------------- bodies


async def test_json_body_round_trips_through_orjson() -> None:
    payload = {"text": "héllo ✓", "n": [1, 2.5, None, True], "nested": {"a": {"b": "c"}}}
    async with serve(web.post("/echo", echo)) as base:
        resp = await request("POST", f"{base}/echo", json=payload, config=FAST)
        assert resp.status == 200
        data = await response_json(resp)
        # The body was read inside request(): aiohttp's own helpers still work afterwards.
        assert await resp.json() == data
    assert data == {"body": payload, "content_type": "application/json"}


async def test_pydantic_body_is_dumped_without_unset_fields() -> None:
    params = Params(input=[Message(role="user", content="hi")], temperature=0.5)
    async with serve(web.post("/echo", echo)) as base:
        top = await response_json(await request("POST", f"{base}/echo", json=params, config=FAST))
        nested = await response_json(await request("POST", f"{base}/echo", json={"params": params}, config=FAST))
    expected = {"input": [{"role": "user", "content": "hi"}], "temperature": 0.5}
    assert top["body"] == expected
    assert nested["body"] == {"params": expected}


async def test_json_and_data_are_exclusive() -> None:
    with pytest.raises(ValueError, match="either json= or data="):
        await request("POST", "http://127.0.0.1:9/x", json={}, data=b"{}")


# --------------------------------------------------------------------------------------------------------------- retries


async def test_503_is_retried_until_success() -> None:
    hits = 0

    async def flaky(_: web.Request) -> web.Response:
        nonlocal hits
        hits += 1
        return web.Response(status=503) if hits < 3 else web.json_response({"ok": True})

    async with serve(web.post("/verify", flaky)) as base:
        resp = await request("POST", f"{base}/verify", json={"x": 1}, config=FAST)
    assert resp.status == 200
    assert await response_json(resp) == {"ok": True}
    assert hits == 3


async def test_429_retry_after_is_honoured(sleeps: SleepSpy) -> None:
    hit_times: list[float] = []

    async def limited(_: web.Request) -> web.Response:
        hit_times.append(time.monotonic())
        if len(hit_times) == 1:
            return web.Response(status=429, headers={"Retry-After": "1"})
        return web.Response(text="ok")

    async with serve(web.post("/v1/responses", limited)) as base:
        resp = await request("POST", f"{base}/v1/responses", json={}, config=FAST)
    assert resp.status == 200
    assert len(hit_times) == 2
    (delay,) = sleeps.delays
    assert 1.0 <= delay <= 1.0 + FAST.backoff_base_s  # the server's Retry-After, plus a little jitter
    assert hit_times[1] - hit_times[0] >= 0.95  # and it really waited (a sleep never ends early)


async def test_retry_after_is_capped(sleeps: SleepSpy) -> None:
    hits = 0

    async def limited(_: web.Request) -> web.Response:
        nonlocal hits
        hits += 1
        return web.Response(status=503, headers={"Retry-After": "3600"}) if hits == 1 else web.Response(text="ok")

    config = FAST.model_copy(update={"retry_after_cap_s": 0.05})
    async with serve(web.post("/v1/responses", limited)) as base:
        resp = await request("POST", f"{base}/v1/responses", json={}, config=config)
    assert resp.status == 200
    assert hits == 2
    assert sleeps.delays and max(sleeps.delays) <= 0.05 + FAST.backoff_base_s  # not the hour the server asked for


async def test_retry_that_would_pass_the_deadline_fails_fast(sleeps: SleepSpy) -> None:
    async def limited(_: web.Request) -> web.Response:
        return web.Response(status=429, headers={"Retry-After": "600"}, text="slow down")

    config = FAST.model_copy(update={"retry_after_cap_s": 600.0})  # 600 s to wait, 60 s left: give up now
    async with serve(web.post("/judge", limited)) as base:
        with pytest.raises(ServerRequestError, match="deadline") as info:
            await request("POST", f"{base}/judge", json={}, server_name="judge", config=config)
    assert sleeps.delays == []  # failed at once instead of sleeping toward a deadline it could not make
    assert info.value.status == 429
    assert info.value.attempts == 1


async def test_persistent_503_raises_after_last_attempt() -> None:
    hits = 0

    async def down(_: web.Request) -> web.Response:
        nonlocal hits
        hits += 1
        return web.Response(status=503, text="overloaded,\n try later")

    async with serve(web.post("/verify", down)) as base:
        with pytest.raises(ServerRequestError) as info:
            await request("POST", f"{base}/verify", json={}, server_name="math_resources", config=FAST)
    error = info.value
    assert hits == FAST.max_attempts == error.attempts
    assert error.status == 503
    assert error.url_path == "/verify"
    message = str(error)
    for part in ("math_resources", "/verify", "503", "3 attempts", "overloaded, try later"):
        assert part in message


@pytest.mark.parametrize("status", [400, 500])
async def test_non_retryable_status_is_returned_after_one_attempt(status: int) -> None:
    hits = 0

    async def broken(_: web.Request) -> web.Response:
        nonlocal hits
        hits += 1
        return web.Response(status=status, text='{"detail": "bad things"}')

    async with serve(web.post("/seed_session", broken)) as base:
        resp = await request("POST", f"{base}/seed_session", json={}, server_name="resources", config=FAST)
    assert hits == 1
    assert resp.status == status
    with pytest.raises(ServerRequestError) as info:
        raise_for_status(resp, "resources", "/seed_session")
    message = str(info.value)
    for part in ("resources", "/seed_session", str(status), "bad things"):
        assert part in message
    assert info.value.status == status


async def test_raise_for_status_returns_2xx_response() -> None:
    async def created(_: web.Request) -> web.Response:
        return web.Response(status=201)

    async with serve(web.get("/", created)) as base:
        resp = await request("GET", f"{base}/", config=FAST)
    assert raise_for_status(resp) is resp


async def test_retry_false_makes_one_attempt_and_returns_the_status() -> None:
    hits = 0

    async def down(_: web.Request) -> web.Response:
        nonlocal hits
        hits += 1
        return web.Response(status=503)

    async with serve(web.post("/x", down)) as base:
        resp = await request("POST", f"{base}/x", json={}, config=FAST, retry=False)
    assert (hits, resp.status) == (1, 503)


# ------------------------------------------------------------------------------------------------ connection failures


async def test_connection_refused_is_retried_then_raises(sleeps: SleepSpy) -> None:
    # A bound socket that never listens refuses connections and keeps the port from being reused meanwhile.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        with pytest.raises(ServerRequestError) as info:
            await request(
                "POST",
                f"http://127.0.0.1:{port}/run",
                json={},
                server_name="simple_agent",
                url_path="/run",
                config=FAST,
            )
    assert len(sleeps.delays) == FAST.max_attempts - 1 and max(sleeps.delays) <= FAST.backoff_cap_s  # short backoffs
    error = info.value
    assert error.attempts == FAST.max_attempts
    assert error.status is None
    assert isinstance(error.__cause__, aiohttp.ClientConnectorError)
    message = str(error)
    for part in ("simple_agent", f"127.0.0.1:{port}", "/run", "3 attempts", "ClientConnectorError"):
        assert part in message


async def test_server_disconnect_before_response_is_retried() -> None:
    connections = 0

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        await reader.readuntil(b"\r\n\r\n")
        if connections > 1:
            body = b'{"ok": true}'
            head = f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            writer.write(head.encode() + b"Connection: close\r\n\r\n" + body)
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        resp = await request("POST", f"http://127.0.0.1:{port}/verify", json={"a": 1}, config=FAST)
    assert connections == 2
    assert await response_json(resp) == {"ok": True}


async def test_connection_lost_mid_body_is_not_retried() -> None:
    connections = 0

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npartial")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        with pytest.raises(ServerRequestError, match="not retried") as info:
            await request("POST", f"http://127.0.0.1:{port}/verify", json={}, server_name="resources", config=FAST)
    assert connections == 1
    assert "resources" in str(info.value) and "/verify" in str(info.value)


# ----------------------------------------------------------------------------------------------------------- timeouts


async def test_total_timeout_raises_and_is_not_retried() -> None:
    hits = 0

    async def slow(_: web.Request) -> web.Response:
        nonlocal hits
        hits += 1
        await asyncio.sleep(10)
        return web.Response(text="late")

    config = FAST.model_copy(update={"total_timeout_s": 0.3})  # the handler would answer only after 10 s
    async with serve(web.post("/v1/responses", slow)) as base:
        with pytest.raises(ServerTimeoutError) as info:
            await request("POST", f"{base}/v1/responses", json={}, server_name="policy_model", config=config)
    assert hits == 1
    assert info.value.timeout_s == 0.3
    assert isinstance(info.value, TransportError)
    for part in ("policy_model", "/v1/responses", "0.3 s", "not retried"):
        assert part in str(info.value)


async def test_total_timeout_covers_reading_the_body() -> None:
    async def dribble(req: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Length": "100"})
        await resp.prepare(req)
        await resp.write(b"x" * 10)
        await asyncio.sleep(10)
        return resp

    config = FAST.model_copy(update={"total_timeout_s": 0.3})
    async with serve(web.get("/big", dribble)) as base:
        with pytest.raises(ServerTimeoutError):
            await request("GET", f"{base}/big", config=config)


# ------------------------------------------------------------------------------------------------------------ cookies


async def test_cookies_are_passed_explicitly_and_never_stored() -> None:
    session_value = "eyJzZXNzaW9uX2lkIjogIjEyMyJ9.Zx_y-Q=="

    async def login(_: web.Request) -> web.Response:
        resp = web.Response(text="ok")
        resp.headers.add("Set-Cookie", f"session={session_value}; path=/; HttpOnly; SameSite=lax")
        return resp

    async def whoami(req: web.Request) -> web.Response:
        return web.json_response({"cookie_header": req.headers.get("Cookie"), "trace": req.headers.get("X-Trace")})

    async with serve(web.post("/seed_session", login), web.get("/whoami", whoami)) as base:
        seeded = await request("POST", f"{base}/seed_session", config=FAST)
        assert seeded.cookies["session"].coded_value == session_value
        cookies = cookies_from(seeded)
        assert cookies == {"session": session_value}

        # The shared session keeps no jar: without cookies= nothing is sent.
        anonymous = await response_json(await request("GET", f"{base}/whoami", config=FAST))
        assert anonymous["cookie_header"] is None

        passed = await request(
            "GET", f"{base}/whoami", cookies={**cookies, "rollout": "7"}, headers={"X-Trace": "t1"}, config=FAST
        )
        assert await response_json(passed) == {"cookie_header": f"session={session_value}; rollout=7", "trace": "t1"}


async def test_a_responses_own_cookies_can_be_passed_on_as_they_are() -> None:
    """NeMo Gym's agents write ``cookies = resp.cookies`` and pass that on: only the values go out, never the
    ``Path``/``HttpOnly`` attributes (a server would read those as a cookie named '', which Starlette then refuses to
    set again)."""

    async def login(_: web.Request) -> web.Response:
        resp = web.Response(text="ok")
        resp.headers.add("Set-Cookie", "session=abc123; Path=/; HttpOnly; SameSite=Lax")
        return resp

    async def whoami(req: web.Request) -> web.Response:
        return web.json_response({"cookie_header": req.headers.get("Cookie")})

    async with serve(web.post("/seed_session", login), web.get("/whoami", whoami)) as base:
        seeded = await request("POST", f"{base}/seed_session", config=FAST)
        passed = await request("GET", f"{base}/whoami", cookies=seeded.cookies, config=FAST)
        assert await response_json(passed) == {"cookie_header": "session=abc123"}


async def test_cookie_that_would_break_the_header_is_refused() -> None:
    with pytest.raises(ValueError, match="bad"):
        await request("GET", "http://127.0.0.1:9/", cookies={"bad": "a;b"})


# ---------------------------------------------------------------------------------------------- session and the pool


async def test_session_and_connection_are_reused() -> None:
    peers: list[Any] = []

    async def peer(req: web.Request) -> web.Response:
        peers.append(req.transport.get_extra_info("peername") if req.transport else None)
        return web.Response(text="ok")

    async with serve(web.get("/", peer)) as base:
        first = get_session()
        for _ in range(3):
            await request("GET", f"{base}/", config=FAST)
        assert get_session() is first
    # The body is read inside request(), so the connection went back to the pool and was reused (keep-alive).
    assert len(peers) == 3 and len(set(peers)) == 1


async def test_each_event_loop_gets_its_own_session() -> None:
    async def session_in_fresh_loop() -> aiohttp.ClientSession:
        session = get_session()
        assert get_session() is session
        await close_session()
        return session

    here = get_session()
    in_thread_1 = await asyncio.to_thread(asyncio.run, session_in_fresh_loop())
    in_thread_2 = await asyncio.to_thread(asyncio.run, session_in_fresh_loop())
    assert len({id(here), id(in_thread_1), id(in_thread_2)}) == 3
    assert in_thread_1.closed and in_thread_2.closed
    assert get_session() is here


async def test_closed_session_is_replaced() -> None:
    first = get_session()
    await close_session()
    assert first.closed
    second = get_session()
    assert second is not first and not second.closed


async def test_500_concurrent_requests_complete() -> None:
    in_flight = 0
    peak = 0
    many_at_once = asyncio.Event()

    async def work(req: web.Request) -> web.Response:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        if in_flight > 100:
            many_at_once.set()
        await many_at_once.wait()  # nobody finishes before more than 100 are in flight together
        in_flight -= 1
        return web.json_response(await req.json())

    async with serve(web.post("/step", work)) as base:
        responses = await asyncio.gather(
            *(request("POST", f"{base}/step", json={"i": i}, config=FAST) for i in range(500))
        )
        bodies = [await response_json(resp) for resp in responses]
    assert [body["i"] for body in bodies] == list(range(500))
    assert all(resp.status == 200 for resp in responses)
    assert peak > 100  # they really ran concurrently, not one by one


async def test_pool_bounds_connections_per_host() -> None:
    in_flight = 0
    peak = 0
    two_at_once = asyncio.Event()

    async def work(_: web.Request) -> web.Response:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        if in_flight == 2:
            two_at_once.set()
        await two_at_once.wait()  # the first request stays until the pool has let a second one through
        in_flight -= 1
        return web.Response(text="ok")

    previous = http_client.get_default_config()
    await close_session()  # pool sizes are read when a loop's session is created
    http_client.set_default_config(previous.model_copy(update={"limit_per_host": 2}))
    try:
        async with serve(web.get("/", work)) as base:
            responses = await asyncio.gather(*(request("GET", f"{base}/", config=FAST) for _ in range(10)))
    finally:
        http_client.set_default_config(previous)
    assert [resp.status for resp in responses] == [200] * 10
    assert peak == 2  # the other requests queued in the pool instead of opening sockets


def test_sockets_get_tcp_keepalive() -> None:
    factory = http_client._keepalive_socket_factory(TransportConfig(tcp_keepalive_idle_s=42))
    with factory((socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", ("127.0.0.1", 0))) as sock:
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        if hasattr(socket, "TCP_KEEPIDLE"):
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 42


# ------------------------------------------------------------------------------------------------------------- errors


def test_errors_survive_pickling() -> None:
    error = ServerRequestError("boom", server="s", url_path="/p", status=503, attempts=4, body_snippet="x")
    copy = pickle.loads(pickle.dumps(error))
    assert (str(copy), copy.status, copy.attempts, copy.url_path) == ("boom", 503, 4, "/p")
    timeout = pickle.loads(pickle.dumps(ServerTimeoutError("late", server="s", url_path="/p", timeout_s=1.5)))
    assert (str(timeout), timeout.timeout_s) == ("late", 1.5)


def test_retry_after_accepts_seconds_and_http_dates(monkeypatch: pytest.MonkeyPatch) -> None:
    def parse(value: str) -> float | None:
        return http_client._retry_after_s(SimpleNamespace(headers={"Retry-After": value}))  # type: ignore[arg-type]

    assert parse("2") == 2.0
    assert parse("-5") == 0.0
    assert parse("nan") is None
    assert parse("soon") is None
    now = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)

    class FrozenClock(datetime):
        @classmethod
        def now(cls, tz: Any = None) -> datetime:
            return now

    monkeypatch.setattr(http_client, "datetime", FrozenClock)  # "now" does not move while the test runs
    assert parse(format_datetime(now + timedelta(seconds=10), usegmt=True)) == 10.0
    assert parse(format_datetime(now - timedelta(seconds=10), usegmt=True)) == 0.0
