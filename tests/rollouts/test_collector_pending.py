"""The collector's light path: rows waiting their turn as the bytes ``/run`` gets, and a pool that starts at once.

The fast path (the materialized line sent as the body) and the general path (the parsed row sent with ``json=``, as
a caller's own sender does) must send the same bytes and write the same rows.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp import web

from nemo_gym.jsonl import iter_jsonl
from nemo_gym.rollouts.collector import CollectionOptions, RolloutCollector
from nemo_gym.rollouts.materialize import MaterializeOptions, materialize
from nemo_gym.rollouts.pool import START_BATCH, run_bounded
from nemo_gym.transport import http_client

ROWS = [
    {"responses_create_params": {"input": "plain", "temperature": 0.25}, "x": [1, 2.5, None, True]},
    {"responses_create_params": {"input": [{"role": "user", "content": 'ünïcödé ✓ "quoted" \\ back'}]}},
    {"responses_create_params": {"input": "big", "metadata": {"k": "v"}}, "n": 12345678901234, "f": 1e-07},
]


class Agent:
    """An agent on 127.0.0.1 that keeps each ``/run`` body as received and scores every row 1 (``fail``: the
    ``(task, rollout)`` keys it answers with a 500 the first time)."""

    def __init__(self, fail: set[tuple[int, int]] | None = None, extra: dict[str, Any] | None = None) -> None:
        self.extra = extra or {}
        self.bodies: list[bytes] = []
        self.content_types: list[str] = []
        self.fail = set(fail or ())
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def _run(self, request: web.Request) -> web.Response:
        body = await request.read()
        self.bodies.append(body)
        self.content_types.append(request.headers.get("Content-Type", ""))
        row = orjson.loads(body)
        key = (row["_ng_task_index"], row["_ng_rollout_index"])
        if key in self.fail:
            self.fail.discard(key)
            return web.json_response({"detail": "boom"}, status=500)
        answer = row | {"reward": 1.0} | self.extra
        return web.Response(body=orjson.dumps(answer), content_type="application/json")

    async def __aenter__(self) -> Agent:
        app = web.Application()
        app.router.add_post("/run", self._run)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._runner is not None
        await self._runner.cleanup()


def _materialize(tmp_path: Path, name: str, rows: list[dict[str, Any]] = ROWS) -> Any:
    data = tmp_path / "in.jsonl"
    data.write_bytes(b"".join(orjson.dumps(row) + b"\n" for row in rows))
    return materialize(
        MaterializeOptions(
            data, tmp_path / name / "out.jsonl", agent_name="a", num_repeats=2, num_repeats_add_seed=True
        )
    )


async def _collect(materialized: Any, agent: Agent, through_sender: bool, resume: bool = False) -> list[dict]:
    async def sender(name: str, row: dict[str, Any]) -> tuple[int, bytes]:  # the general path: json=row
        response = await http_client.request("POST", f"{agent.url}/run", json=row, retry=False)
        return response.status, await response.read()

    output = materialized.path.with_name("out.jsonl")
    options = CollectionOptions(output, concurrency=4, resume=resume, show_progress=False, rollout_timeout_s=60)
    try:
        await RolloutCollector(materialized, {"a": agent.url}, options, send=sender if through_sender else None).run()
    finally:
        await http_client.close_session()
    return sorted((row for _, row in iter_jsonl(output)), key=lambda r: (r["_ng_task_index"], r["_ng_rollout_index"]))


@pytest.mark.parametrize("through_sender", [False, True])
def test_run_gets_the_bytes_the_json_path_sends(tmp_path, through_sender):
    materialized = _materialize(tmp_path, "run")
    rows = [row for _, row in iter_jsonl(materialized.path)]

    async def main() -> Agent:
        async with Agent() as agent:
            await _collect(materialized, agent, through_sender)
        return agent

    agent = asyncio.run(asyncio.wait_for(main(), 60))
    assert sorted(agent.bodies) == sorted(http_client.dumps(row) for row in rows)
    assert set(agent.content_types) == {"application/json"}


def test_fast_path_and_sender_path_write_the_same_rows_and_retry_with_the_attempt_index(tmp_path):
    outputs = {}
    retried_bodies = {}
    for through_sender in (False, True):
        materialized = _materialize(tmp_path, f"p{through_sender}")

        async def main(materialized: Any = materialized, through_sender: bool = through_sender) -> list[dict]:
            async with Agent(fail={(1, 1)}) as agent:
                await _collect(materialized, agent, through_sender)
                agent.bodies.clear()
                rows = await _collect(materialized, agent, through_sender, resume=True)
                retried_bodies[through_sender] = list(agent.bodies)
            return rows

        outputs[through_sender] = asyncio.run(asyncio.wait_for(main(), 60))
    assert outputs[False] == outputs[True]
    assert len(outputs[False]) == 2 * len(ROWS)
    assert retried_bodies[False] == retried_bodies[True]
    assert [orjson.loads(b)["_ng_attempt_index"] for b in retried_bodies[False]] == [1]


def test_an_agents_trajectory_is_joined_with_the_row_on_both_paths(tmp_path):
    rows = [{"responses_create_params": {"input": "q"}, "task_id": "t-1"}]
    trajectories = {}
    for through_sender in (False, True):
        materialized = _materialize(tmp_path, f"t{through_sender}", rows)

        async def main(materialized: Any = materialized, through_sender: bool = through_sender) -> list[dict]:
            async with Agent(extra={"ng_trajectory": {"task_id": 1}}) as agent:  # an invalid producer trajectory
                return await _collect(materialized, agent, through_sender)

        written = asyncio.run(asyncio.wait_for(main(), 60))
        trajectories[through_sender] = [
            (
                r["ng_trajectory"]["task_id"],
                r["ng_trajectory"]["rollout_id"],
                {g["code"] for g in r["ng_trajectory"]["gaps"]},
            )
            for r in written
        ]
    assert trajectories[False] == trajectories[True]
    assert trajectories[False][0][0] == "t-1"  # taken from the row, which the fast path holds only as bytes
    assert "producer_trajectory_invalid" in trajectories[False][0][2]


def test_pool_takes_every_item_once_within_the_bound_and_starts_before_all_workers_exist():
    items = list(range(5 * START_BATCH))
    seen: list[int] = []
    in_flight = peak = 0
    started_when_first_resumed: list[int] = []

    async def handle(item: int) -> None:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        seen.append(item)
        await asyncio.sleep(0)
        if item == 0:
            started_when_first_resumed.append(len(seen))
        in_flight -= 1

    concurrency = 3 * START_BATCH
    asyncio.run(asyncio.wait_for(run_bounded(handle, iter(items), concurrency), 60))
    assert sorted(seen) == items
    assert peak <= concurrency
    assert started_when_first_resumed[0] < concurrency  # the first call went on before every worker was started


def test_pool_cancels_every_worker_when_one_fails():
    cancelled = 0

    async def handle(item: int) -> None:
        nonlocal cancelled
        if item == 1:
            raise ValueError("boom")
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled += 1
            raise

    async def main() -> int:
        with pytest.raises(ValueError):
            await run_bounded(handle, iter(range(3)), 1000)
        return sum(1 for task in asyncio.all_tasks() if task.get_coro().__qualname__.endswith(".worker"))

    assert asyncio.run(asyncio.wait_for(main(), 60)) == 0  # no worker left behind
    assert cancelled == 2
