"""The episode lifecycle every environment server shares (nemo_gym.base_environment_server), in process."""

from __future__ import annotations

import asyncio
from typing import Any
from unittest.mock import MagicMock

import pytest
from pydantic import BaseModel

from nemo_gym.base_environment_server import (
    BaseEnvironmentServer,
    BaseEnvironmentServerConfig,
    CleanupContext,
    HandledEpisodeError,
)
from nemo_gym.episode_types import BaseEpisodeRequest, BaseEpisodeResponse, EpisodeFailure, EpisodeId, TaskId
from nemo_gym.observability.correlation import current_rollout_id
from nemo_gym.server_utils import ServerClient


class Input(BaseModel):
    action: str


class Request(BaseEpisodeRequest[Input]):
    pass


class Response(BaseEpisodeResponse[dict[str, Any]]):
    pass


class Recorder(BaseEnvironmentServer[Request, Response]):
    """Registers two cleanups, then does what the task says."""

    request_model = Request
    response_model = Response
    log: list[str] = []
    gate: asyncio.Event | None = None

    async def run(self, request: Request, cleanup: CleanupContext) -> Response:
        log = type(self).log

        async def close(name: str) -> None:
            log.append(f"closed {name}")

        cleanup.register_cleanup("first", lambda: close("first"))
        early = cleanup.register_cleanup("second", lambda: close("second"))
        action = request.task.task_input.action
        log.append(f"rollout {current_rollout_id()}")
        if action == "close early":
            await early.close()
        if action == "wait":
            assert type(self).gate is not None
            await type(self).gate.wait()
        if action == "sleep":
            await asyncio.sleep(60)
        if action == "handled":
            raise HandledEpisodeError(EpisodeFailure(failure_reason="no", terminal=False, stage="seed",
                                                     failure_kind="session_lost"))  # fmt: skip
        if action == "crash":
            raise KeyError("boom")
        task_id = TaskId(taskset="other", task_id="x") if action == "wrong id" else request.task.task_id
        return Response(episode_id=request.episode_id, task_id=task_id, result={"reward": 1.0})


def _server(**limits: Any) -> Recorder:
    Recorder.log = []
    config = BaseEnvironmentServerConfig(host="127.0.0.1", port=0, entrypoint="app.py", name="env",
                                         cleanup_timeout_seconds=5, **limits)  # fmt: skip
    return Recorder(config=config, server_client=MagicMock(spec=ServerClient))


def _request(action: str, attempt: int = 0) -> Request:
    return Request.model_validate({"episode_id": {"rollout_id": "3-1", "attempt": attempt},
                                   "task": {"task_id": {"taskset": "t", "task_id": "3"},
                                            "task_input": {"action": action}}})  # fmt: skip


async def test_a_result_runs_the_cleanups_last_registered_first_once_each() -> None:
    server = _server()
    answer = await server.run_request(_request("close early", attempt=2))
    assert answer.result == {"reward": 1.0} and answer.failure is None
    assert Recorder.log == ["rollout 3-1-a2", "closed second", "closed first"]  # the early close is not repeated


async def test_a_handled_error_is_the_failure_as_raised() -> None:
    answer = await _server().run_request(_request("handled"))
    assert answer.failure is not None and answer.result is None
    assert (answer.failure.stage, answer.failure.failure_kind, answer.failure.terminal) == (
        "seed",
        "session_lost",
        False,
    )
    assert Recorder.log[-2:] == ["closed second", "closed first"]


async def test_an_unexpected_error_is_a_terminal_failure_naming_it() -> None:
    answer = await _server().run_request(_request("crash"))
    assert answer.failure is not None and answer.failure.terminal is True
    assert "KeyError" in answer.failure.failure_reason


async def test_the_deadline_is_a_retryable_failure_and_cleanups_still_run() -> None:
    answer = await _server(default_episode_timeout_seconds=0.05).run_request(_request("sleep"))
    assert answer.failure is not None and answer.failure.terminal is False
    assert Recorder.log[-2:] == ["closed second", "closed first"]


async def test_a_cancelled_episode_still_closes_what_it_opened() -> None:
    server = _server()
    Recorder.gate = asyncio.Event()
    task = asyncio.create_task(server.run_request(_request("wait")))
    while not Recorder.log:
        await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert Recorder.log[-2:] == ["closed second", "closed first"]


async def test_admission_waits_then_fails_retryably_at_the_admission_stage() -> None:
    server = _server(max_concurrent_episodes=1, queue_timeout_seconds=0.05)
    Recorder.gate = asyncio.Event()
    holder = asyncio.create_task(server.run_request(_request("wait")))  # holds the only slot until the gate opens
    while not Recorder.log:
        await asyncio.sleep(0.01)
    refused = await server.run_request(_request("close early"))
    assert refused.failure is not None and refused.failure.stage == "admission" and not refused.failure.terminal
    Recorder.gate.set()
    assert (await holder).result == {"reward": 1.0}
    assert (await server.run_request(_request("close early"))).result == {"reward": 1.0}  # the slot came back


async def test_an_answer_for_another_task_is_refused() -> None:
    with pytest.raises(ValueError, match="task_id"):
        await _server().run_request(_request("wrong id"))


def test_a_concurrency_limit_needs_a_queue_timeout() -> None:
    with pytest.raises(ValueError, match="queue_timeout_seconds"):
        BaseEnvironmentServerConfig(host="h", port=1, entrypoint="a", name="e", cleanup_timeout_seconds=1,
                                    max_concurrent_episodes=2)  # fmt: skip


def test_episode_ids_and_responses_keep_their_rules() -> None:
    assert EpisodeId(rollout_id="7-0", attempt=3).capture_key == "7-0-a3"
    with pytest.raises(ValueError, match="-a<N>"):
        EpisodeId(rollout_id="7-0-a1")
    with pytest.raises(ValueError, match="exactly one"):
        Response(episode_id=EpisodeId(rollout_id="x"), task_id=TaskId(taskset="t", task_id="1"))
    failure = EpisodeFailure(failure_reason="r", terminal=True)
    assert failure.model_dump() == {"failure_reason": "r", "terminal": True}  # unknown kind and stage left out


async def test_a_hanging_cleanup_does_not_keep_the_others_from_running() -> None:
    log: list[str] = []
    context = CleanupContext(EpisodeId(rollout_id="h"), cleanup_timeout_seconds=0.2)

    async def released() -> None:
        log.append("released")

    async def hangs() -> None:
        await asyncio.sleep(60)

    context.register_cleanup("resources", released)
    context.register_cleanup("dead agent", hangs)  # last registered: runs first, and hangs
    await context.aclose()
    assert log == ["released"]
