"""The collector's circuit breakers: which failures point at a server, consecutive counting, probes, the deadline."""

from __future__ import annotations

import asyncio
import json
import resource
import subprocess
import sys
import time

import pytest
from aiohttp import web

from nemo_gym.rollouts.breaker import Breakers, Server, ServersDownError
from nemo_gym.rollouts.collector import RolloutFailure, judge_rollout
from nemo_gym.rollouts.fd_limit import RESERVE_FDS, fds_needed
from nemo_gym.transport import access
from nemo_gym.transport.types import STARTED_AT_HEADER, ServerRequestError, ServerTimeoutError

MODEL = Server("policy_model", "responses_api_models", "http://127.0.0.1:8001")
AGENT = Server("my_agent", "responses_api_agents", "http://127.0.0.1:8002")


class ScriptedProbe:
    """Answers probes from a script (None: alive; a string: why not), the last answer repeating; a gate holds them."""

    def __init__(self, *answers: str | None) -> None:
        self.answers = list(answers)
        self.calls: list[str] = []
        self.gate = asyncio.Event()
        self.gate.set()

    async def __call__(self, url: str) -> str | None:
        self.calls.append(url)
        await self.gate.wait()
        return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]


def breakers(probe: ScriptedProbe, lines: list[str], deadline_s: float = 60.0, threshold: int = 3) -> Breakers:
    return Breakers([MODEL, AGENT], deadline_s, threshold=threshold, probe=probe, probe_interval_s=0, say=lines.append)


# -- which failures point at a server ---------------------------------------------------------------------------------


async def _answer(status: int, body: dict | bytes) -> tuple[int, bytes]:
    return status, body if isinstance(body, bytes) else json.dumps(body).encode()


async def _raises(error: Exception) -> tuple[int, bytes]:
    raise error


def _502(upstream_status: int | None, timeout: bool = False) -> dict:
    return {
        "error": "x", "server": "my_agent", "upstream_server": "server 'policy_model' (127.0.0.1:8001)",
        "upstream_path": "/v1/responses", "upstream_status": upstream_status, "upstream_timeout": timeout,
    }  # fmt: skip


@pytest.mark.parametrize(
    ("answer", "server"),
    [
        (
            lambda: _raises(ServerRequestError("refused", server="server 'my_agent' (127.0.0.1:8002)")),
            "server 'my_agent' (127.0.0.1:8002)",
        ),
        (lambda: _raises(ServerTimeoutError("slow", server="127.0.0.1:8002")), "127.0.0.1:8002"),
        (lambda: _answer(502, _502(None)), "server 'policy_model' (127.0.0.1:8001)"),
        (lambda: _answer(502, _502(None, timeout=True)), "server 'policy_model' (127.0.0.1:8001)"),
        (lambda: _answer(502, _502(500)), ""),  # the model answered: its 500 belongs to this rollout
        (lambda: _answer(502, b"not json"), ""),
        (lambda: _answer(422, {"detail": "bad row"}), ""),
        (lambda: _answer(500, {"error": "agent crashed"}), ""),
    ],
    ids=["agent-refused", "agent-timeout", "model-refused", "model-timeout", "model-500", "502-not-json", "422", "500"],
)
def test_a_failure_points_at_a_server_only_when_it_could_not_be_reached_or_did_not_answer(answer, server) -> None:
    result = asyncio.run(judge_rollout(answer()))
    assert isinstance(result, RolloutFailure) and result.server == server


def test_a_failure_target_is_matched_by_name_then_by_address() -> None:
    board = breakers(ScriptedProbe(None), [])
    assert board.server_of("server 'policy_model' (127.0.0.1:8001)") == MODEL
    assert board.server_of("127.0.0.1:8002") == AGENT
    assert board.server_of("server 'judge' (10.0.0.9:9000)") == Server("judge", "", "http://10.0.0.9:9000")
    assert board.server_of("something else") is None


# -- the state machine ------------------------------------------------------------------------------------------------


def test_a_failure_of_a_server_that_answers_its_probe_is_the_rollouts_and_successes_reset_the_count() -> None:
    async def scenario() -> None:
        lines: list[str] = []
        probe = ScriptedProbe(None)
        board = breakers(probe, lines)
        assert await board.is_down(MODEL) is False
        assert await board.is_down(MODEL) is False
        assert board._breakers["policy_model"].failures == 2
        board.record_success()
        assert board._breakers["policy_model"].failures == 0
        await board.wait_until_closed()  # nothing paused
        assert lines == [] and probe.calls == [MODEL.url, MODEL.url]

    asyncio.run(scenario())


def test_consecutive_failures_reaching_the_threshold_pause_dispatch_until_the_probe_answers() -> None:
    async def scenario() -> None:
        probe = ScriptedProbe(None)
        probe.gate.clear()  # the probe is out
        board = breakers(probe, [], threshold=3)
        verdicts = [asyncio.ensure_future(board.is_down(MODEL)) for _ in range(2)]
        await asyncio.sleep(0)
        waiter = asyncio.ensure_future(board.wait_until_closed())
        await asyncio.sleep(0)
        assert waiter.done(), "2 failures of 3: dispatch goes on"
        verdicts.append(asyncio.ensure_future(board.is_down(MODEL)))
        await asyncio.sleep(0)
        waiter = asyncio.ensure_future(board.wait_until_closed())
        await asyncio.sleep(0)
        assert not waiter.done(), "the 3rd consecutive failure pauses dispatch"
        assert len(probe.calls) == 1, "failures waiting together share one probe"
        probe.gate.set()
        assert await asyncio.gather(*verdicts) == [False, False, False]
        await asyncio.wait_for(waiter, 5)

    asyncio.run(scenario())


def test_a_down_server_is_named_once_probed_until_back_and_its_failures_are_not_charged() -> None:
    async def scenario() -> None:
        lines: list[str] = []
        probe = ScriptedProbe("connection refused", "connection refused", "connection refused", None)
        board = breakers(probe, lines)
        assert await asyncio.gather(*(board.is_down(MODEL) for _ in range(64))) == [True] * 64
        assert len(lines) == 1 and lines[0].startswith(
            "model server 'policy_model' at http://127.0.0.1:8001 is down (connection refused): pausing rollouts"
        )
        await asyncio.wait_for(board.wait_until_closed(), 5)  # the watcher's probes: refused, refused, alive
        assert lines[1].startswith("model server 'policy_model' at http://127.0.0.1:8001 is back after")
        assert len(lines) == 2 and board._breakers["policy_model"].failures == 0
        await board.aclose()

    asyncio.run(scenario())


def test_a_server_down_past_the_deadline_stops_the_run_with_one_line_naming_it_and_resume() -> None:
    async def scenario() -> None:
        board = breakers(ScriptedProbe("no answer within 3 s"), [], deadline_s=0)
        assert await board.is_down(AGENT) is True
        with pytest.raises(ServersDownError) as stopped:
            await asyncio.wait_for(board.wait_until_closed(), 5)
        message = str(stopped.value)
        assert "agent server 'my_agent' at http://127.0.0.1:8002 is still down" in message
        assert "no answer within 3 s" in message and "--resume" in message and "\n" not in message
        await board.aclose()

    asyncio.run(scenario())


def test_the_real_probe_tells_refused_from_frozen_from_alive() -> None:
    import socket

    async def scenario() -> None:
        board = Breakers([], 60.0, probe_timeout_s=0.2)
        closed = socket.socket()
        closed.bind(("127.0.0.1", 0))
        refused_url = f"http://127.0.0.1:{closed.getsockname()[1]}"
        closed.close()
        frozen = socket.socket()  # listens, never accepts nor answers: a stopped process
        frozen.bind(("127.0.0.1", 0))
        frozen.listen(8)
        alive = await asyncio.start_server(_answer_401, "127.0.0.1", 0)
        try:
            assert await board._http_probe(refused_url) == "connection refused"
            frozen_url = f"http://127.0.0.1:{frozen.getsockname()[1]}"
            assert await board._http_probe(frozen_url) == "no answer within 0.2 s"
            port = alive.sockets[0].getsockname()[1]
            assert await board._http_probe(f"http://127.0.0.1:{port}") is None  # any HTTP answer: alive
        finally:
            frozen.close()
            alive.close()
            await board.aclose()

    asyncio.run(scenario())


async def _answer_401(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await reader.readuntil(b"\r\n\r\n")
    writer.write(b"HTTP/1.1 401 Unauthorized\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
    await writer.drain()
    writer.close()


# -- the open-file limit ----------------------------------------------------------------------------------------------

CHECK = """
import resource, sys
from nemo_gym.rollouts.fd_limit import check_open_file_limit
check_open_file_limit(int(sys.argv[1]), serving=True)
print("soft", resource.getrlimit(resource.RLIMIT_NOFILE)[0])
"""


def _check_under(soft: int, hard: int, concurrency: int) -> subprocess.CompletedProcess:
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

    return subprocess.run(
        [sys.executable, "-c", CHECK, str(concurrency)], preexec_fn=limit, capture_output=True, text=True, timeout=60
    )


def test_the_estimate_is_three_sockets_per_rollout_in_the_agent() -> None:
    assert fds_needed(100, serving=False) == 100 + RESERVE_FDS
    assert fds_needed(100, serving=True) == 300 + RESERVE_FDS


def test_a_soft_limit_below_the_need_is_raised_when_the_hard_limit_allows() -> None:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < fds_needed(1024, serving=True):
        pytest.skip(f"this machine's hard limit ({hard}) is too low")
    done = _check_under(1024, hard, 1024)
    needed = fds_needed(1024, serving=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["soft", str(needed)]
    assert done.stderr.strip() == f"raised the open-file limit (ulimit -n) from 1024 to {needed} for --concurrency 1024"


def test_a_hard_limit_below_the_need_is_refused_with_a_line_naming_the_flag_and_the_fix() -> None:
    done = _check_under(1024, 1024, 1024)
    assert done.returncode != 0 and "OpenFileLimitError" in done.stderr
    message = done.stderr.strip().splitlines()[-1]
    assert "--concurrency 1024" in message and "ulimit -n" in message and "1024" in message


def test_a_probe_that_fails_unexpectedly_counts_as_no_answer_and_never_ends_the_run() -> None:
    async def broken(url: str) -> str | None:
        raise RuntimeError("boom")

    async def scenario() -> None:
        lines: list[str] = []
        board = Breakers([MODEL], 60.0, probe=broken, probe_interval_s=3600, say=lines.append)
        assert await board.is_down(MODEL) is True
        assert "is down (probe failed: RuntimeError: boom)" in lines[0]
        await board.aclose()

    asyncio.run(scenario())


# -- a server restarted under a rollout -------------------------------------------------------------------------------


async def _health_server(started_at: float, token: str) -> tuple[web.AppRunner, Server]:
    """A server whose health answer says when it started, to callers with the run's token only."""

    async def health(request: web.Request) -> web.Response:
        if request.headers.get(access.TOKEN_HEADER) != token:
            return web.Response(status=401)
        return web.json_response({"status": "ok"}, headers={STARTED_AT_HEADER: repr(started_at)})

    app = web.Application()
    app.router.add_get("/", health)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    return runner, Server("policy_model", "responses_api_models", f"http://127.0.0.1:{port}")


@pytest.mark.parametrize("restarted", [True, False])
async def test_a_server_that_started_after_the_rollout_was_restarted_under_it_and_the_failure_is_not_charged(
    restarted: bool,
) -> None:
    rollout_began = time.time()
    runner, server = await _health_server(rollout_began + (1.0 if restarted else -1.0), token="t0ken")
    access.register("t0ken", [server.url])
    lines: list[str] = []
    board = Breakers([server], 60.0, probe_interval_s=0, say=lines.append)
    try:
        assert await board.is_down(server, since=rollout_began) is restarted
        assert (await board.restarted_since(rollout_began) is server) is restarted
        assert not lines, "an answering server is never told as down"
    finally:
        access.forget([server.url])
        await board.aclose()
        await runner.cleanup()
