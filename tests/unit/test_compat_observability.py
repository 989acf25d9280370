"""NeMo Gym's rollout-observability names behave as theirs: rollout correlation, model-call capture (off unless a run
turns it on), the merge into a finished rollout and its ``ng_trajectory``."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from unittest.mock import MagicMock

from fastapi import FastAPI, Request
from fastapi.testclient import TestClient
from omegaconf import OmegaConf

from nemo_gym.base_responses_api_agent import BaseResponsesAPIAgentConfig, BaseRunRequest, SimpleResponsesAPIAgent
from nemo_gym.base_responses_api_model import (
    BaseResponsesAPIModelConfig,
    CaptureStore,
    SimpleResponsesAPIModel,
    _CaptureMiddleware,
    aggregate_model_call_metrics,
    merge_model_call_capture_into_record,
    read_model_call_records,
)
from nemo_gym.config.server_models import BaseServerConfig
from nemo_gym.errors import ConfigError
from nemo_gym.rollout_collection import NG_TRAJECTORY_KEY, _attach_trajectory_record
from nemo_gym.rollout_correlation import (
    RolloutContextMiddleware,
    current_rollout_id,
    maybe_rollout_id_from_run_body,
)
from nemo_gym.rollout_observability import (
    AgentInvocation,
    AgentObservationBundle,
    ModelCallRef,
    ToolCallObservation,
    TrajectoryRecord,
)
from nemo_gym.server_utils import ServerClient

_SERVER = {"host": "127.0.0.1", "port": 1, "entrypoint": "app.py"}
_USAGE = {"input_tokens": 7, "output_tokens": 3, "total_tokens": 10, "input_tokens_details": {"cached_tokens": 2}}


def _client(config: dict[str, Any]) -> ServerClient:
    return ServerClient(
        head_server_config=BaseServerConfig(host="127.0.0.1", port=1), global_config_dict=OmegaConf.create(config)
    )


def _capture_on(directory: Path) -> dict[str, Any]:
    return {"observability_enabled": True, "model_call_capture_dir": str(directory)}


class _Model(SimpleResponsesAPIModel):
    async def responses(self, body: dict[str, Any]) -> dict[str, Any]:  # type: ignore[override]
        return {"id": "resp_1", "model": "m", "status": "completed", "output": [], "usage": _USAGE}


def _model_app(config: dict[str, Any]) -> FastAPI:
    server = _Model(config=BaseResponsesAPIModelConfig(name="policy", **_SERVER), server_client=_client(config))
    return server.setup_webserver()


def test_a_rollout_id_is_explicit_or_task_rollout_with_the_attempt() -> None:
    assert maybe_rollout_id_from_run_body({"_ng_task_index": 3, "_ng_rollout_index": 1}) == "3-1"
    assert (
        maybe_rollout_id_from_run_body({"_ng_task_index": 3, "_ng_rollout_index": 1, "_ng_attempt_index": 2})
        == "3-1-a2"
    )
    assert maybe_rollout_id_from_run_body({"_ng_rollout_id": "run.7"}) == "run.7"
    assert maybe_rollout_id_from_run_body({"responses_create_params": {}}) is None
    try:
        maybe_rollout_id_from_run_body({"_ng_rollout_id": "../x"})
    except ValueError as e:
        assert "_ng_rollout_id" in str(e)
    else:
        raise AssertionError("a path-like rollout id must be refused")


def test_the_context_middleware_routes_a_prefixed_path_as_the_plain_one() -> None:
    app = FastAPI()
    app.add_middleware(RolloutContextMiddleware)

    @app.get("/echo")
    async def echo() -> dict[str, Any]:
        return {"rollout": current_rollout_id()}

    client = TestClient(app)
    assert client.get("/ng-rollout/4-0/echo").json() == {"rollout": "4-0"}
    assert client.get("/echo").json() == {"rollout": None}


def test_a_model_server_captures_only_when_the_run_turns_capture_on(tmp_path: Path) -> None:
    plain = _model_app({})
    assert all(m.cls is not _CaptureMiddleware for m in plain.user_middleware)  # nothing on the request path

    app = _model_app(_capture_on(tmp_path))
    assert app.user_middleware[0].cls is _CaptureMiddleware
    client = TestClient(app)
    assert client.post("/ng-rollout/0-1/v1/responses", json={"input": "hi", "model": "m"}).status_code == 200
    assert client.post("/v1/responses", json={"input": "unrelated"}).status_code == 200  # no rollout: not kept

    [call] = read_model_call_records(CaptureStore(tmp_path), "0-1")
    assert (call.dialect, call.response_id, call.status_code, call.error_category) == ("responses", "resp_1", 200, None)
    assert (call.tokens_in, call.tokens_out, call.tokens_total, call.cached_tokens, call.cache_hit) == (
        7,
        3,
        10,
        2,
        True,
    )
    assert call.model_ref is not None and call.model_ref.name == "policy"
    assert call.request == {"input": "hi", "model": "m"}
    assert aggregate_model_call_metrics(CaptureStore(tmp_path), "0-1")["num_calls"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["0-1.capture.jsonl"]


def test_capture_without_an_absolute_directory_is_a_config_error() -> None:
    try:
        _model_app({"observability_enabled": True, "model_call_capture_dir": "relative/dir"})
    except ConfigError as e:
        assert "absolute" in str(e)
    else:
        raise AssertionError("a relative capture directory must be refused")


class _Agent(SimpleResponsesAPIAgent):
    async def run(self, request: Request, body: BaseRunRequest) -> Any:  # type: ignore[override]
        return {"path": self.url_path_for_run("/v1/responses", body), "current": current_rollout_id()}


def test_an_agent_prefixes_model_paths_with_its_rollout_only_when_capture_is_on(tmp_path: Path) -> None:
    row = {"responses_create_params": {"input": "x"}, "_ng_task_index": 5, "_ng_rollout_index": 2}
    config = BaseResponsesAPIAgentConfig(name="agent", **_SERVER)
    off = _Agent(config=config, server_client=_client({}))
    assert off.url_path_for_run("/v1/responses", row) == "/v1/responses"
    assert TestClient(off.setup_webserver()).post("/run", json=row).json() == {"path": "/v1/responses", "current": None}

    on = _Agent(config=config, server_client=_client(_capture_on(tmp_path)))
    answer = TestClient(on.setup_webserver()).post("/run", json=row).json()
    assert answer == {"path": "/ng-rollout/5-2/v1/responses", "current": "5-2"}
    assert on.base_url_for_run("http://h:1/", row) == "http://h:1/ng-rollout/5-2"

    class _Request:
        path_params = {"rollout_id": "5-2"}

        class url:
            path = "/ng-rollout/5-2/v1/responses"

    assert on.url_path_for_request("/seed_session", _Request()) == "/ng-rollout/5-2/seed_session"  # type: ignore[arg-type]
    assert on.url_path_for_request("/seed_session", None) == "/seed_session"


def test_an_agent_resolves_a_model_base_url_with_the_rollout_prefix(tmp_path: Path) -> None:
    client = _client({"policy": {"responses_api_models": {"m": {"host": "10.0.0.1", "port": 8000}}}})
    agent = _Agent(config=BaseResponsesAPIAgentConfig(name="agent", **_SERVER), server_client=client)
    assert agent.resolve_model_base_url("policy") == "http://10.0.0.1:8000/v1"
    assert agent.resolve_model_base_url("policy", "3-0") == "http://10.0.0.1:8000/ng-rollout/3-0/v1"


def test_an_agent_builds_a_model_base_url_through_its_clients_hook() -> None:
    """Agents' tests hand over ``MagicMock(spec=ServerClient)`` with only ``_build_server_base_url`` wired up."""
    client = MagicMock(spec=ServerClient)
    client.global_config_dict = {"policy": {"responses_api_models": {"vllm": {"host": "model-host", "port": 9000}}}}
    client._build_server_base_url.side_effect = lambda settings: f"http://{settings['host']}:{settings['port']}"
    agent = _Agent(config=BaseResponsesAPIAgentConfig(name="agent", **_SERVER), server_client=client)
    assert agent.resolve_model_base_url("policy", "1-2") == "http://model-host:9000/ng-rollout/1-2/v1"
    client._build_server_base_url.assert_called_once_with({"host": "model-host", "port": 9000})


class _Echo(_Agent):
    async def responses(self, request: Request, body: dict[str, Any]) -> dict[str, Any]:  # type: ignore[override]
        return {"path": request.url.path, "rollout_id": request.path_params.get("rollout_id")}


def test_an_agent_serves_the_prefixed_responses_routes_with_capture_off() -> None:
    """A caller may prefix its self-calls with the rollout even when this agent's config does not capture."""
    agent = _Echo(config=BaseResponsesAPIAgentConfig(name="agent", **_SERVER), server_client=_client({}))
    client = TestClient(agent.setup_webserver())
    assert client.post("/ng-rollout/1-2/v1/responses", json={}).json() == {
        "path": "/ng-rollout/1-2/v1/responses",
        "rollout_id": "1-2",
    }
    training = client.post("/ng-rollout/1-2/training-token-capture/v1/responses", json={})
    assert training.json()["rollout_id"] == "1-2"
    assert client.post("/v1/responses", json={}).json() == {"path": "/v1/responses", "rollout_id": None}


def _captured_rollout(tmp_path: Path) -> dict[str, Any]:
    TestClient(_model_app(_capture_on(tmp_path))).post("/ng-rollout/1-0/v1/responses", json={"input": "q"})
    return {"_ng_task_index": 1, "_ng_rollout_index": 0, "reward": 1.0, "response": {"output": []}}


def test_the_capture_merges_into_the_rollout_without_touching_its_answer(tmp_path: Path) -> None:
    record = merge_model_call_capture_into_record(_captured_rollout(tmp_path), [tmp_path])
    capture = record["ng_model_call_capture"]
    assert record["reward"] == 1.0 and capture["rollout_id"] == "1-0"
    assert capture["metrics"]["num_calls"] == 1 and capture["metrics"]["tokens_in"] == 7
    assert "request" not in capture["calls"][0]  # payloads stay in the store unless asked for
    assert "gaps" not in capture

    missing = merge_model_call_capture_into_record({"_ng_task_index": 9, "_ng_rollout_index": 0}, [tmp_path])
    assert missing["ng_model_call_capture"]["gaps"] == [{"code": "model_call_capture_no_records"}]
    untouched = {"_ng_task_index": 9, "_ng_rollout_index": 0}
    assert merge_model_call_capture_into_record(untouched, []) == {"_ng_task_index": 9, "_ng_rollout_index": 0}


class _CutOffModel(SimpleResponsesAPIModel):
    async def responses(self, body: dict[str, Any]) -> dict[str, Any]:  # type: ignore[override]
        cut = {"status": "incomplete", "incomplete_details": {"reason": "max_output_tokens"}}
        return {"id": "resp_2", "model": "m", "output": [], "usage": _USAGE} | cut


def test_a_call_cut_off_at_its_length_limit_keeps_its_response_for_the_health_checks(tmp_path: Path) -> None:
    """The runaway-generation check tells a cut answer from no answer by the response, so that payload stays."""
    config = BaseResponsesAPIModelConfig(name="policy", **_SERVER)
    app = _CutOffModel(config=config, server_client=_client(_capture_on(tmp_path))).setup_webserver()
    TestClient(app).post("/ng-rollout/1-0/v1/responses", json={"input": "q"})
    record = {"_ng_task_index": 1, "_ng_rollout_index": 0, "reward": 0.0, "response": {"output": []}}
    result = merge_model_call_capture_into_record(record, [tmp_path])
    [call] = result["ng_model_call_capture"]["calls"]
    assert call["finish_reason"] == "max_output_tokens" and call["response"]["status"] == "incomplete"
    assert "request" not in call  # the request stays in the store as for any call
    response = call["response"]
    _attach_trajectory_record({"_ng_task_index": 1, "_ng_rollout_index": 0}, result)
    [projected] = TrajectoryRecord.model_validate(result[NG_TRAJECTORY_KEY]).model_calls
    assert projected.response == response  # the trajectory keeps it; the capture copy is dropped as for any call


def test_the_trajectory_record_joins_capture_and_agent_observations(tmp_path: Path) -> None:
    row = {"_ng_task_index": 1, "_ng_rollout_index": 0, "task_id": "t-1"}
    result = merge_model_call_capture_into_record(_captured_rollout(tmp_path), [tmp_path], include_payloads=True)
    result["ng_agent_observations"] = AgentObservationBundle(
        source="test",
        records=[
            AgentInvocation(
                invocation_id="root",
                model_calls=[ModelCallRef(model_call_id="x")],
                conversation=[{"type": "function_call_output", "call_id": "c1", "output": "42"}],
            ),
            ToolCallObservation(invocation_id="root", tool_call_id="c1", tool_name="calc", status="completed"),
        ],
    ).model_dump(mode="json")

    _attach_trajectory_record(row, result)
    trajectory = TrajectoryRecord.model_validate(result[NG_TRAJECTORY_KEY])
    assert (trajectory.task_id, trajectory.rollout_id) == ("t-1", "1-0")
    assert [c.token_stats.prompt_tokens for c in trajectory.model_calls] == [7]
    assert trajectory.model_calls[0].response_metadata.response_status == "completed"
    assert [(t.tool_name, t.output) for t in trajectory.tool_calls] == [("calc", "42")]
    assert {gap.code for gap in trajectory.gaps} == {"turns_unavailable"}
    assert "request" not in result["ng_model_call_capture"]["calls"][0]  # the trajectory holds the payloads now


def test_an_invalid_producer_trajectory_is_a_gap_not_an_error() -> None:
    row = {"_ng_task_index": 0, "_ng_rollout_index": 0}
    result: dict[str, Any] = {NG_TRAJECTORY_KEY: {"task_id": 1}}
    _attach_trajectory_record(row, result)
    codes = {gap["code"] for gap in result[NG_TRAJECTORY_KEY]["gaps"]}
    assert "producer_trajectory_invalid" in codes and "model_calls_unavailable" in codes


def test_observation_bundles_refuse_duplicate_and_cyclic_invocations() -> None:
    for records in (
        [AgentInvocation(invocation_id="a"), AgentInvocation(invocation_id="a")],
        [
            AgentInvocation(invocation_id="a", parent_invocation_id="b"),
            AgentInvocation(invocation_id="b", parent_invocation_id="a"),
        ],
    ):
        try:
            AgentObservationBundle(source="s", records=records)
        except ValueError:
            continue
        raise AssertionError(f"accepted {records}")
    AgentObservationBundle(source="s", records=[AgentInvocation(invocation_id="a", parent_invocation_id="elsewhere")])
