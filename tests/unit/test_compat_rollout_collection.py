"""NeMo Gym's ``RolloutCollectionHelper`` seams: ``run_from_config`` collects in-process through the client that
``setup_server_client`` returns, aggregates through ``_call_aggregate_metrics``, and reads the config through the
face's own ``get_global_config_dict`` name, so tests (theirs and ours) can patch each of them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson
import pytest
from omegaconf import OmegaConf

import nemo_gym.rollout_collection
from nemo_gym.config.server_models import BaseServerConfig
from nemo_gym.errors import ConfigError, NeMoGymError
from nemo_gym.rollout_collection import (
    NG_FAILURE_CLASS_KEY,
    NG_TERMINAL_KEY,
    NoRolloutResultError,
    RolloutAggregationConfig,
    RolloutAggregationHelper,
    RolloutCollectionConfig,
    RolloutCollectionHelper,
    ServerClient,
)


class _Answer:
    """What a client's ``post`` returns, reduced to what the helper reads: ``status`` and ``read()``."""

    def __init__(self, status: int, body: Any) -> None:
        self.status = status
        self._body = orjson.dumps(body)

    async def read(self) -> bytes:
        return self._body


class _InProcessAgent:
    """A client in place of ServerClient: answers ``/run`` by the row's text, records every call."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, dict[str, Any]]] = []

    async def post(self, server_name: str, url_path: str, json: Any = None) -> _Answer:
        self.calls.append((server_name, url_path, json))
        text = json["responses_create_params"]["input"]
        if text == "crash":
            return _Answer(500, {"detail": "agent crashed"})
        if text == "remote failed":
            return _Answer(200, {"reward": 0.0, "error": "HTTP 500 from remote", NG_FAILURE_CLASS_KEY: "remote_error"})
        return _Answer(200, {"reward": 1.0, "echo": text})

    def server_base_url(self, server_name: str) -> str:
        raise ConfigError(f"no server named {server_name!r}")


def _config(tmp_path: Path, *texts: str, **fields: Any) -> RolloutCollectionConfig:
    data = tmp_path / "input.jsonl"
    data.write_text("".join(json.dumps({"responses_create_params": {"input": t}}) + "\n" for t in texts))
    output = tmp_path / "out" / "rollouts.jsonl"
    return RolloutCollectionConfig(
        input_jsonl_fpath=str(data), output_jsonl_fpath=str(output), agent_name="agent", **fields
    )


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture
def config_reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    reads: list[int] = []

    def empty_config() -> dict[str, Any]:
        reads.append(1)
        return {}

    monkeypatch.setattr(nemo_gym.rollout_collection, "get_global_config_dict", empty_config)
    return reads


async def test_run_from_config_goes_through_the_overridden_client_and_routes_each_outcome(
    tmp_path: Path, config_reads: list[int]
) -> None:
    agent = _InProcessAgent()
    aggregated: list[tuple[list[dict[str, Any]], list[dict[str, Any]], Path]] = []

    class InProcess(RolloutCollectionHelper):
        def setup_server_client(self, head_server_config: BaseServerConfig | None = None) -> Any:
            return agent

        async def _call_aggregate_metrics(self, results: Any, rows: Any, output_fpath: Path) -> Path | None:
            aggregated.append((results, rows, output_fpath))
            return None

    config = _config(tmp_path, "ok", "remote failed", "crash", num_repeats=2)
    returned = await InProcess().run_from_config(config)

    assert config_reads == [1]  # the face's own name was read, once
    assert {(name, path) for name, path, _ in agent.calls} == {("agent", "/run")} and len(agent.calls) == 6
    output = Path(config.output_jsonl_fpath)
    scored = _lines(output)
    assert [(r["_ng_task_index"], r["_ng_rollout_index"], r["echo"]) for r in returned] == [(0, 0, "ok"), (0, 1, "ok")]
    assert sorted(map(json.dumps, scored)) == sorted(map(json.dumps, returned))
    assert len(_lines(output.with_name("rollouts_materialized_inputs.jsonl"))) == 6
    failures = _lines(output.with_name("rollouts_failures.jsonl"))
    by_class = {row[NG_FAILURE_CLASS_KEY]: row for row in failures}
    assert sorted(row[NG_FAILURE_CLASS_KEY] for row in failures) == ["agent_error"] * 2 + ["remote_error"] * 2
    assert by_class["remote_error"]["error"] == "HTTP 500 from remote"  # the agent's own answer is kept
    [(results, rows, path)] = aggregated
    assert results == returned and path == output
    assert [row["responses_create_params"]["input"] for row in rows] == ["ok", "ok"]


async def test_default_aggregation_writes_metrics_locally_for_an_agent_outside_the_config(
    tmp_path: Path, config_reads: list[int]
) -> None:
    agent = _InProcessAgent()

    class InProcess(RolloutCollectionHelper):
        def setup_server_client(self, head_server_config: BaseServerConfig | None = None) -> Any:
            return agent

    config = _config(tmp_path, "ok", "ok again")
    await InProcess().run_from_config(config)
    metrics = json.loads(Path(config.output_jsonl_fpath).with_name("rollouts_aggregate_metrics.json").read_text())
    assert [entry["agent_ref"]["name"] for entry in metrics] == ["agent"]
    assert metrics[0]["agent_metrics"]["mean/reward"] == 1.0


async def test_run_examples_posts_through_the_overridden_client(tmp_path: Path) -> None:
    agent = _InProcessAgent()

    class InProcess(RolloutCollectionHelper):
        def setup_server_client(self, head_server_config: BaseServerConfig | None = None) -> Any:
            return agent

    rows = [{"agent_ref": {"name": "agent"}, "responses_create_params": {"input": t}} for t in ("ok", "crash")]
    results = {row["responses_create_params"]["input"]: r async for row, r in InProcess().run_examples(rows)}
    assert results["ok"]["reward"] == 1.0
    assert results["crash"][NG_FAILURE_CLASS_KEY] == "agent_error"


async def test_the_default_client_comes_from_the_faces_setup_server_client_utils(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """NeMo Gym's tests hand the helper a client by patching ``setup_server_client_utils`` on this module: the helper
    must look the name up when it needs a client (once, then keep it), not bind it at import."""
    agent = _InProcessAgent()
    heads: list[BaseServerConfig | None] = []

    def fake_setup(head_server_config: BaseServerConfig | None = None) -> Any:
        heads.append(head_server_config)
        return agent

    monkeypatch.setattr(nemo_gym.rollout_collection, "setup_server_client_utils", fake_setup)
    helper = RolloutCollectionHelper()
    rows = [{"agent_ref": {"name": "agent"}, "responses_create_params": {"input": "ok"}}]
    results = [r async for _, r in helper.run_examples(rows)]
    assert results[0]["reward"] == 1.0 and agent.calls[0][:2] == ("agent", "/run")
    assert helper.setup_server_client() is agent and heads == [None]


async def test_run_examples_reads_as_nemo_rl_reads_it_awaitables_in_completion_order() -> None:
    """NeMo RL: ``for task in helper.run_examples(examples=..., head_server_config=...): row, result = await task``."""
    agent = _InProcessAgent()

    class InProcess(RolloutCollectionHelper):
        def setup_server_client(self, head_server_config: BaseServerConfig | None = None) -> Any:
            return agent

    rows = [{"agent_ref": {"name": "agent"}, "responses_create_params": {"input": t}} for t in ("ok", "crash")]
    results = {}
    for task in InProcess().run_examples(examples=rows, head_server_config=None):
        row, result = await task
        results[row["responses_create_params"]["input"]] = result
    assert results["ok"]["reward"] == 1.0
    assert results["crash"][NG_FAILURE_CLASS_KEY] == "agent_error"


async def test_a_run_examples_batch_is_iterated_once() -> None:
    batch = RolloutCollectionHelper(_InProcessAgent()).run_examples([])  # type: ignore[arg-type]
    assert [pair async for pair in batch] == []
    with pytest.raises(RuntimeError, match="iterated once"):
        list(batch)


async def test_our_own_client_sends_run_once_with_the_rollout_deadline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, config_reads: list[int]
) -> None:
    sent: list[dict[str, Any]] = []

    async def request(self: ServerClient, method: str, server_name: str, url_path: str, **kwargs: Any) -> _Answer:
        sent.append({"path": url_path, **kwargs})
        return _Answer(200, {"reward": 0.5})

    monkeypatch.setattr(ServerClient, "request", request)
    client = ServerClient(head_server_config=BaseServerConfig(host="127.0.0.1", port=1),
                          global_config_dict=OmegaConf.create({}))  # fmt: skip
    config = _config(tmp_path, "ok", rollout_timeout_seconds=7.0, disable_aggregation=True)
    assert [r["reward"] for r in await RolloutCollectionHelper(client).run_from_config(config)] == [0.5]
    [call] = sent
    assert call["path"] == "/run" and call["retry"] is False
    assert call["config"].total_timeout_s == 7.0 and call["config"].max_attempts == 1


async def test_run_from_config_needs_an_input_file(tmp_path: Path, config_reads: list[int]) -> None:
    config = RolloutCollectionConfig(output_jsonl_fpath=str(tmp_path / "o.jsonl"))
    with pytest.raises(ConfigError, match="input_jsonl_fpath"):
        await RolloutCollectionHelper(_InProcessAgent()).run_from_config(config)  # type: ignore[arg-type]


async def test_resume_retries_terminal_timeouts_and_invalid_judge_answers_only_when_asked(
    tmp_path: Path, config_reads: list[int]
) -> None:
    """NeMo Gym 0.7's failure contract (GDPVal opts in): off, a terminal timeout and a 0 scored from an unreadable
    judge answer stay as they are on resume; on, both run again."""
    first = True
    runs: list[str] = []

    class Flaky:
        async def post(self, server_name: str, url_path: str, json: Any = None) -> _Answer:
            text = json["responses_create_params"]["input"]
            runs.append(text)
            if first and text == "slow":
                return _Answer(200, {NG_FAILURE_CLASS_KEY: "timeout_exceeded", NG_TERMINAL_KEY: True, "reward": 0.0})
            if first and text == "judged":
                return _Answer(200, {"reward": 0.0, "invalid_judge_response": True})
            return _Answer(200, {"reward": 1.0})

    class InProcess(RolloutCollectionHelper):
        def setup_server_client(self, head_server_config: BaseServerConfig | None = None) -> Any:
            return Flaky()

    config = _config(tmp_path, "slow", "judged", disable_aggregation=True)
    await InProcess().run_from_config(config)
    first = False
    runs.clear()
    resumed = config.model_copy(update={"resume_from_cache": True})
    await InProcess().run_from_config(resumed)
    assert runs == []  # default: the timeout was marked terminal, the judged row has its score

    opted_in = resumed.model_copy(update={"retry_terminal_timeouts": True, "retry_invalid_judge_responses": True})
    results = await InProcess().run_from_config(opted_in)
    assert sorted(runs) == ["judged", "slow"]
    assert [r["reward"] for r in results] == [1.0, 1.0]


class _Local(RolloutCollectionHelper):
    """The in-process agent as the client; metrics computed here (the agent is not in any config)."""

    def __init__(self) -> None:
        super().__init__(_InProcessAgent())  # type: ignore[arg-type]


async def test_a_run_where_no_rollout_produced_a_result_raises_and_writes_no_metrics(
    tmp_path: Path, config_reads: list[int]
) -> None:
    config = _config(tmp_path, "crash", "crash")
    with pytest.raises(RuntimeError, match="None of the 2 dispatched rollouts produced a result") as raised:
        await _Local().run_from_config(config)
    assert isinstance(raised.value, NoRolloutResultError) and isinstance(raised.value, NeMoGymError)
    output = Path(config.output_jsonl_fpath)
    assert output.read_bytes() == b""  # the files are there, empty: nothing was scored
    failures = _lines(output.with_name("rollouts_failures.jsonl"))
    assert [(row[NG_FAILURE_CLASS_KEY], row["failure_kind"]) for row in failures] == [
        ("agent_error", "agent_run_error")
    ] * 2
    assert all(row["_ng_failure_http_status"] == 500 and "agent crashed" in row["_ng_failure_response_body"]
               for row in failures)  # fmt: skip
    assert not output.with_name("rollouts_aggregate_metrics.json").exists()


async def test_failures_counted_as_zero_enter_the_metrics_only_and_aggregation_agrees(
    tmp_path: Path, config_reads: list[int]
) -> None:
    # by kind (agent_run_error: the agent crashed) and by class (remote_error: what the agent itself reported)
    config = _config(
        tmp_path, "ok", "crash", "remote failed", "ok",
        count_failure_classes_as_zero=["agent_run_error", "remote_error"],
    )  # fmt: skip
    returned = await _Local().run_from_config(config)
    output = Path(config.output_jsonl_fpath)
    assert [r["echo"] for r in returned] == ["ok", "ok"] and len(_lines(output)) == 2  # the files are unchanged
    assert len(_lines(output.with_name("rollouts_failures.jsonl"))) == 2
    online = json.loads(output.with_name("rollouts_aggregate_metrics.json").read_text())
    assert online[0]["agent_metrics"]["mean/reward"] == 0.5  # (1 + 0 + 0 + 1) / 4
    assert online[0]["agent_metrics"]["num_rollouts"] == 4

    merged = tmp_path / "merged" / "all.jsonl"
    metrics_path = await RolloutAggregationHelper(_InProcessAgent()).run_from_config(  # type: ignore[arg-type]
        RolloutAggregationConfig(
            input_glob=str(output), output_jsonl_fpath=str(merged),
            count_failure_classes_as_zero=config.count_failure_classes_as_zero,
        )
    )  # fmt: skip
    assert json.loads(metrics_path.read_text()) == online
    assert merged.read_bytes() == output.read_bytes()

    (tmp_path / "b").mkdir()
    only_crashes = _config(tmp_path / "b", "crash", count_failure_classes_as_zero=["agent_error"])
    assert await _Local().run_from_config(only_crashes) == []  # a counted failure is a score: no error
    metrics = json.loads(Path(only_crashes.output_jsonl_fpath).with_name("rollouts_aggregate_metrics.json").read_text())
    assert metrics[0]["agent_metrics"]["mean/reward"] == 0.0
