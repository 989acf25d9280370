"""After a large request, a server hands the memory it freed back to the system (nemo_gym/transport/heap.py).

RSS itself is left to the benchmark (benchmarks/performance/rollout_overhead): these check that the release runs, when
it runs, and that the answer is the one FastAPI's own route gives.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient

from nemo_gym.metrics import AggregateMetrics, AggregateMetricsRequest, aggregate_verify_responses
from nemo_gym.transport import heap
from nemo_gym.transport.routes import BodyRoute
from tests.helpers import app_with_routes


@pytest.fixture
def releases(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The ``malloc_trim`` calls made, with releases never put off by an earlier one."""
    calls: list[int] = []

    def trim(pad: int) -> int:
        calls.append(pad)
        return 1

    monkeypatch.setattr(heap, "_trim", trim)
    monkeypatch.setattr(heap, "_last_release", -heap.MIN_INTERVAL_S)
    monkeypatch.setattr(heap, "_pending", None)
    return calls


def _app(route_class: type[APIRoute]) -> FastAPI:
    app = app_with_routes(route_class)

    @app.post("/aggregate_metrics")
    async def aggregate_metrics(body: AggregateMetricsRequest) -> AggregateMetrics:
        return aggregate_verify_responses(body.verify_responses)

    return app


def _rows(count: int) -> dict[str, Any]:
    row = {"reward": 1.0, "agent_ref": {"type": "responses_api_agents", "name": "agent"}, "note": "x" * 100}
    return {"verify_responses": [row | {"_ng_task_index": i % 50, "_ng_rollout_index": i // 50} for i in range(count)]}


def test_a_large_body_is_answered_as_fastapi_answers_it_and_then_memory_is_released(releases: list[int]) -> None:
    body = _rows(8_000)
    ours = TestClient(_app(BodyRoute)).post("/aggregate_metrics", json=body)
    assert len(ours.request.content) >= heap.RELEASE_AFTER_BYTES
    assert releases == [0]
    theirs = TestClient(_app(APIRoute)).post("/aggregate_metrics", json=body)
    assert (ours.status_code, ours.json()) == (theirs.status_code, theirs.json())


def test_a_small_body_releases_nothing(releases: list[int]) -> None:
    answer = TestClient(_app(BodyRoute)).post("/aggregate_metrics", json=_rows(10))
    assert answer.status_code == 200 and answer.json()["agent_metrics"]["num_rollouts"] == 10
    assert releases == []


def test_a_release_soon_after_another_is_put_off_and_runs_once(
    releases: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    now = [100.0]
    monkeypatch.setattr(heap.time, "monotonic", lambda: now[0])

    async def scenario() -> None:
        heap.release_soon()  # the first one runs at once
        assert releases == [0] and heap._pending is None
        now[0] += heap.MIN_INTERVAL_S / 4
        heap.release_soon()  # too soon: put off ...
        heap.release_soon()  # ... and this one joins it
        pending = heap._pending
        assert releases == [0] and pending is not None
        pending._run()  # what the loop does when its time comes
        assert releases == [0, 0] and heap._pending is None
        pending.cancel()

    asyncio.run(scenario())


def test_a_release_due_again_replaces_one_still_waiting(releases: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    now = [100.0]
    monkeypatch.setattr(heap.time, "monotonic", lambda: now[0])

    async def scenario() -> None:
        heap.release_soon()
        now[0] += heap.MIN_INTERVAL_S / 2
        heap.release_soon()
        waiting = heap._pending
        assert waiting is not None
        now[0] += heap.MIN_INTERVAL_S
        heap.release_soon()
        assert releases == [0, 0] and waiting.cancelled() and heap._pending is None

    asyncio.run(scenario())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")
def test_the_c_library_trims_on_linux(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(heap, "_trim", heap._UNLOADED)
    monkeypatch.setattr(heap, "_pending", None)
    assert heap.release_freed_memory() is True


def _read(pieces: list[bytes]) -> bytes:
    """``_read_body`` of a request whose body arrives in ``pieces``, as uvicorn hands a large one over."""
    from starlette.requests import Request

    from nemo_gym.transport.routes import _read_body

    messages = [
        {"type": "http.request", "body": piece, "more_body": i < len(pieces) - 1} for i, piece in enumerate(pieces)
    ]

    async def receive() -> dict[str, Any]:
        return messages.pop(0)

    return asyncio.run(_read_body(Request({"type": "http", "method": "POST", "headers": []}, receive)))


def test_the_pieces_of_a_large_body_are_handed_back_once_joined(releases: list[int]) -> None:
    pieces = [bytes([i]) * (heap.RELEASE_AFTER_BYTES // 4) for i in range(5)]
    assert _read(pieces) == b"".join(pieces)
    assert releases == [0]  # before the route's work on the body begins
    assert _read(pieces) == b"".join(pieces)
    assert releases == [0]  # spaced like every release: the next one waits MIN_INTERVAL_S


def test_a_small_body_hands_nothing_back(releases: list[int]) -> None:
    """Below RELEASE_AFTER_BYTES nothing is trimmed. (A large body read whole is trimmed too since the body is read
    through Starlette's public ``request.body()``, which does not say how many pieces it joined.)"""
    assert _read([b"x" * 1000, b"y" * 1000]) == b"x" * 1000 + b"y" * 1000
    assert _read([b"z" * (heap.RELEASE_AFTER_BYTES - 1)]) == b"z" * (heap.RELEASE_AFTER_BYTES - 1)
    assert releases == []
