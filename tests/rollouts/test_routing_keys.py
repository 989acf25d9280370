"""The result fields an agent uses to route a failure (NeMo Gym's NG_*_KEY): a terminal failure is kept on the failure
row and never retried, a no-persist answer is written nowhere and run again on resume."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson
from fastapi import FastAPI

from nemo_gym.rollout_collection import NG_FAILURE_CLASS_KEY, NG_NO_PERSIST_KEY, NG_TERMINAL_KEY
from nemo_gym.rollouts.collector import CollectionOptions, RolloutCollector, failures_path
from nemo_gym.rollouts.materialize import Materialized
from nemo_gym.testing import serve_in_thread

_ROUTING = {
    0: {},
    1: {NG_FAILURE_CLASS_KEY: "bad_task", NG_TERMINAL_KEY: True},
    2: {NG_FAILURE_CLASS_KEY: "kill_shaped", NG_NO_PERSIST_KEY: True},
    3: {NG_FAILURE_CLASS_KEY: "flaky"},
}


def _agent(calls: list[int]) -> FastAPI:
    app = FastAPI()

    @app.post("/run")
    async def run(row: dict[str, Any]) -> dict[str, Any]:
        calls.append(row["_ng_task_index"])
        return {"reward": 0.0 if _ROUTING[row["_ng_task_index"]] else 1.0, **_ROUTING[row["_ng_task_index"]]}

    return app


def _collect(tmp_path: Path, url: str, resume: bool) -> Any:
    inputs = tmp_path / "inputs.jsonl"
    rows = [{"_ng_task_index": t, "_ng_rollout_index": 0, "agent_ref": {"name": "a"}} for t in _ROUTING]
    inputs.write_bytes(b"".join(orjson.dumps(row) + b"\n" for row in rows))
    materialized = Materialized(inputs, len(rows), len(rows), {"a": len(rows)}, "fingerprint")
    options = CollectionOptions(tmp_path / "out.jsonl", concurrency=2, resume=resume, show_progress=False)
    return asyncio.run(RolloutCollector(materialized, {"a": url}, options).run())


def _lines(path: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()] if path.exists() else []


def test_terminal_failures_stay_done_and_no_persist_answers_run_again(tmp_path: Path) -> None:
    calls: list[int] = []
    with serve_in_thread(_agent(calls)) as url:
        first = _collect(tmp_path, url, resume=False)
        assert (first.succeeded, first.failed, first.not_persisted) == (1, 3, 1)
        assert [row["_ng_task_index"] for row in _lines(tmp_path / "out.jsonl")] == [0]
        failures = {row["_ng_task_index"]: row for row in _lines(failures_path(tmp_path / "out.jsonl"))}
        assert sorted(failures) == [1, 3]  # the no-persist answer is in no file
        assert failures[1][NG_TERMINAL_KEY] is True and NG_TERMINAL_KEY not in failures[3]

        calls.clear()
        second = _collect(tmp_path, url, resume=True)
        assert sorted(calls) == [2, 3]  # terminal: never again; no-persist: no attempt was counted
        assert second.skipped_done == 1 and second.skipped_exhausted == 1
