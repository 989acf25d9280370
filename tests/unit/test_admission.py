"""First-come, first-served connection slots: no newcomer overtakes a waiter, and no slot leaks on timeout or cancel."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web

from nemo_gym.transport import http_client
from nemo_gym.transport.admission import FairLimiter, HostGate, QueueTimeout, origin_of
from nemo_gym.transport.http_client import ServerTimeoutError, TransportConfig, close_session, request

pytestmark = pytest.mark.timeout(30)


async def test_waiters_are_served_in_arrival_order_and_newcomers_queue_behind_them() -> None:
    limiter = FairLimiter(1, asyncio.get_running_loop())
    assert limiter.try_acquire()
    order: list[int] = []

    async def waiter(i: int) -> None:
        await limiter.acquire()
        order.append(i)
        limiter.release()

    tasks = [asyncio.create_task(waiter(i)) for i in range(5)]
    await asyncio.sleep(0)
    assert limiter.waiting == 5
    limiter.release()  # the slot goes to waiter 0, not back to the pool ...
    assert not limiter.try_acquire()  # ... so a newcomer arriving now cannot take it
    await asyncio.gather(*tasks)
    assert order == [0, 1, 2, 3, 4]
    assert limiter.try_acquire()  # and the slot is free again at the end


async def test_a_timed_out_waiter_leaves_and_the_slot_still_circulates() -> None:
    loop = asyncio.get_running_loop()
    limiter = FairLimiter(1, loop)
    assert limiter.try_acquire()
    with pytest.raises(QueueTimeout) as raised:
        await limiter.acquire(loop.time() + 0.02)
    assert isinstance(raised.value, TimeoutError) and raised.value.slots == 1
    limiter.release()
    assert limiter.try_acquire()


async def test_a_cancelled_waiter_passes_a_slot_it_was_just_handed() -> None:
    limiter = FairLimiter(1, asyncio.get_running_loop())
    assert limiter.try_acquire()
    first = asyncio.create_task(limiter.acquire())
    second = asyncio.create_task(limiter.acquire())
    await asyncio.sleep(0)
    limiter.release()  # handed to `first` ...
    first.cancel()  # ... which is cancelled before it could run
    with pytest.raises(asyncio.CancelledError):
        await first
    await asyncio.wait_for(second, 30)  # the slot went on to the next waiter (30 s: a hang guard only)
    limiter.release()
    assert limiter.try_acquire()


def test_origins_group_urls_by_server() -> None:
    assert origin_of("http://127.0.0.1:8000/verify") == origin_of("http://127.0.0.1:8000/seed_session")
    assert origin_of("http://127.0.0.1:8000/verify") != origin_of("http://127.0.0.1:8001/verify")
    assert origin_of("http://example.com/x") == "http://example.com:80"
    assert origin_of("https://example.com/x") == "https://example.com:443"
    loop = asyncio.new_event_loop()
    try:
        gate = HostGate(3, loop)
        assert gate.limiter("a") is gate.limiter("a") and gate.limiter("a") is not gate.limiter("b")
    finally:
        loop.close()


async def run_with_pool(limit_per_host: int, handler: web.RequestHandler, calls: list[dict]) -> list:
    """Run ``calls`` (kwargs for request()) concurrently against one server with a pool of ``limit_per_host``."""
    previous = http_client.get_default_config()
    await close_session()  # pool sizes are read when a loop's session is created
    http_client.set_default_config(previous.model_copy(update={"limit_per_host": limit_per_host}))
    app = web.Application()
    app.router.add_post("/{tail:.*}", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        tasks = []
        for call in calls:
            tasks.append(asyncio.create_task(request("POST", f"http://127.0.0.1:{port}/{call.pop('path')}", **call)))
            # One loop iteration: the new task runs up to its place in the queue before the next one is created, so
            # arrival order is the order of `calls` (request() takes its place before its first real wait).
            await asyncio.sleep(0)
        return await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        http_client.set_default_config(previous)
        await close_session()
        await runner.cleanup()


async def test_requests_queued_for_a_busy_server_are_sent_in_arrival_order() -> None:
    served: list[str] = []

    async def handler(req: web.Request) -> web.Response:
        served.append(req.match_info["tail"])
        await asyncio.sleep(0.03)
        return web.Response(text="ok")

    calls = [{"path": f"r{i}", "data": b"{}"} for i in range(8)]
    results = await run_with_pool(1, handler, calls)
    assert [r.status for r in results] == [200] * 8
    assert served == [f"r{i}" for i in range(8)]


async def test_waiting_for_a_connection_counts_against_the_deadline() -> None:
    async def handler(req: web.Request) -> web.Response:
        await asyncio.sleep(0.5)
        return web.Response(text="ok")

    quick = TransportConfig(total_timeout_s=0.2, max_attempts=1)
    calls = [{"path": "slow", "data": b"{}"}, {"path": "queued", "data": b"{}", "config": quick}]
    slow, queued = await run_with_pool(1, handler, calls)
    assert slow.status == 200
    assert isinstance(queued, ServerTimeoutError)
    assert "before it was sent" in str(queued) and "limit_per_host" in str(queued)


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8000/verify",
        "HTTP://Example.COM:81/a?b=c",
        "https://api.openai.com/v1/responses",
        "http://[::1]:9000/run",
        "http://user:secret@host.internal:7000/x",
        "http://localhost",
    ],
)
def test_origins_read_without_yarl_match_yarl_s_reading(url: str) -> None:
    from yarl import URL

    parsed = URL(url)
    assert origin_of(url) == f"{parsed.scheme}://{parsed.host}:{parsed.port}"
    assert origin_of(parsed) == origin_of(url)  # aiohttp hands over its own URL objects


def test_an_unreadable_url_is_its_own_origin() -> None:
    assert origin_of("http://host:99999/") == "http://host:99999/"
