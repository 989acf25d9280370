"""The collector's rows for ``/aggregate_metrics`` held as bytes (rollouts/aggregate.py: EncodedRows) give the same
request body, order and rows as the parsed rows did."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

import orjson
import pytest

from nemo_gym.rollouts.aggregate import encoded_rows_by_agent, rows_by_agent
from nemo_gym.rollouts.config import RolloutCollectionConfig
from nemo_gym.transport import http_client


def _write(path: Path) -> Path:
    rows = []
    for i in range(40):
        agent = "b" if i % 3 else "a"
        rows.append(
            {
                "_ng_task_index": (i * 7) % 5,
                "_ng_rollout_index": (i * 11) % 4,
                "agent_ref": {"type": "responses_api_agents", "name": agent},
                "reward": float(i % 2),
                "extracted_answer": f"ans é {i}",
                "responses_create_params": {"input": [{"role": "user", "content": "q"}]},
                "response": {"output": [], "usage": {"input_tokens": i, "output_tokens": 1, "total_tokens": i + 1}},
            }
        )
    rows.append({"reward": 1.0, "agent_ref": "plain"})  # no indices, a bare agent name
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_encoded_rows_are_the_parsed_rows_and_their_exact_request_body(tmp_path: Path) -> None:
    path = _write(tmp_path / "out.jsonl")
    parsed, encoded = rows_by_agent([path]), encoded_rows_by_agent([path])
    assert list(encoded) == list(parsed)
    for agent, rows in parsed.items():
        assert len(encoded[agent]) == len(rows)
        assert encoded[agent].decoded() == rows
        assert encoded[agent].request_body() == http_client.dumps({"verify_responses": rows})
        assert orjson.loads(encoded[agent].request_body()) == {"verify_responses": rows}


def test_a_kept_row_costs_about_its_length() -> None:
    """orjson's own bytes keep a worst-case buffer (>= 4 KB); what the transport hands on is an exact-size copy."""
    row = {"reward": 1.0, "text": "x" * 300}
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        kept = [http_client.dumps(row) for _ in range(200)]
        per_row = (tracemalloc.get_traced_memory()[0] - before) / len(kept)
    finally:
        tracemalloc.stop()
    assert kept[0] == orjson.dumps(row)
    assert per_row < 2 * len(kept[0])


def test_the_metrics_are_the_same_from_the_server_and_computed_here_and_the_rows_are_held_once(
    tmp_path: Path,
) -> None:
    """An agent's rows become the ``/aggregate_metrics`` body (the EncodedRows are emptied, so a run's end holds them
    once); when its server cannot answer, the same rows are read back from that body and the metrics computed here."""
    import asyncio

    from aiohttp import web

    from nemo_gym.metrics import aggregate_verify_responses
    from nemo_gym.rollouts.aggregate import compute_metrics

    path = _write(tmp_path / "out.jsonl")
    expected = {agent: aggregate_verify_responses(rows).model_dump() for agent, rows in rows_by_agent([path]).items()}
    bodies: list[bytes] = []

    async def aggregate(request: web.Request) -> web.Response:
        bodies.append(await request.read())
        rows = orjson.loads(bodies[-1])["verify_responses"]
        return web.json_response(aggregate_verify_responses(rows).model_dump())

    async def main() -> tuple[list, list, list]:
        app = web.Application()
        app.router.add_post("/aggregate_metrics", aggregate)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        up = f"http://127.0.0.1:{runner.addresses[0][1]}"
        try:
            served = encoded_rows_by_agent([path])
            sent = {agent: rows.request_body() for agent, rows in served.items()}
            from_server = await compute_metrics(served, {agent: up for agent in served})
            assert all(len(rows) == 0 for rows in served.values())  # held once: as the bodies
            assert sorted(bodies) == sorted(sent.values())
        finally:
            await runner.cleanup()
        down = encoded_rows_by_agent([path])  # the same server, stopped: nothing answers there now
        computed_here = await compute_metrics(down, {agent: up for agent in down})
        no_server = await compute_metrics(encoded_rows_by_agent([path]))
        await http_client.close_session()
        return from_server, computed_here, no_server

    for metrics in asyncio.run(asyncio.wait_for(main(), 60)):
        assert {
            entry["agent_ref"]["name"]: {k: v for k, v in entry.items() if k != "agent_ref"} for entry in metrics
        } == (expected)


def test_what_observability_recorded_is_left_out_of_the_rows_as_nemo_gym_leaves_it_out() -> None:
    from nemo_gym.observability.capture import CAPTURE_KEY, OBSERVATIONS_KEY, TRAJECTORY_KEY
    from nemo_gym.rollouts.aggregate import strip_row

    usage = {"input_tokens": 3, "output_tokens": 2, "total_tokens": 5}
    row = {
        "reward": 1.0,
        "_ng_task_index": 0,
        "responses_create_params": {"input": "q"},
        "response": {"output": [{"type": "message"}], "usage": usage},
        CAPTURE_KEY: [{"request": "x" * 1000}],
        OBSERVATIONS_KEY: [{"step": 1}],
        TRAJECTORY_KEY: "runs/a/trajectory.jsonl",
        "extracted_answer": "42",
    }
    assert strip_row(row) == {
        "reward": 1.0,
        "_ng_task_index": 0,
        "extracted_answer": "42",
        "response": {"usage": usage},
    }


def test_a_run_hands_back_what_it_freed_before_it_asks_for_the_metrics(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The metrics' moment is the stack's memory peak: the collector trims its heap once its rows are the bodies."""
    import asyncio
    from types import SimpleNamespace

    from nemo_gym.rollouts import run as run_module

    path = _write(tmp_path / "out.jsonl")
    events: list[object] = []

    class Collector:
        def __init__(self, *args: object) -> None:
            pass

        async def run(self) -> str:
            events.append("collected")
            return "summary"

    async def compute_metrics(grouped: dict, urls: dict) -> list:
        events.append(("metrics", sorted(grouped)))
        return []

    monkeypatch.setattr(run_module, "RolloutCollector", Collector)
    monkeypatch.setattr(run_module, "compute_metrics", compute_metrics)
    monkeypatch.setattr(run_module, "write_metrics", lambda *args: None)
    monkeypatch.setattr(run_module.heap, "release_freed_memory", lambda: events.append("released"))
    options = SimpleNamespace(output_path=path)
    result = asyncio.run(
        run_module._collect_and_aggregate(None, {}, options, RolloutCollectionConfig(output_jsonl_fpath=str(path)))
    )  # type: ignore[arg-type]
    assert events == ["collected", "released", ("metrics", sorted(rows_by_agent([path])))]
    assert result.summary == "summary"
