"""What NeMo Gym 0.7's agent folders need of our core: agents opted into training-token capture send their model calls
under the training-capture path, a finished rollout's observations are joined to its captured calls (with an agent's
own association step first), the request's TypedDict-shaped parts read as dicts, agent sessions answer 0.7's helper
names, usage and repeat metrics come as 0.7 reports them, and the module attributes 0.7's folders patch exist."""

from __future__ import annotations

import sys
import types
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from fastapi import HTTPException, Request
from fastapi.testclient import TestClient
from omegaconf import OmegaConf

from nemo_gym.base_responses_api_agent import (
    AgentCloseSessionRequest,
    AgentCloseSessionResponse,
    AgentSeedSessionRequest,
    AgentSessionState,
    AggregateMetricsRequest,
    BaseResponsesAPIAgentConfig,
    BaseRunRequest,
    SimpleResponsesAPIAgent,
)
from nemo_gym.base_responses_api_model import CaptureStore, merge_model_call_capture_into_record
from nemo_gym.config.server_models import BaseServerConfig
from nemo_gym.episode_types import EpisodeId, TaskId
from nemo_gym.metrics import numeric_fields
from nemo_gym.observability import trajectory
from nemo_gym.observability.capture import _client_session_id, build_model_call_record
from nemo_gym.openai_utils import (
    NeMoGymChatCompletionCreateParamsNonStreaming,
    NeMoGymFunctionTool,
    NeMoGymReasoning,
    NeMoGymResponse,
    NeMoGymResponseCreateParamsNonStreaming,
    NeMoGymResponseFunctionToolCallForTraining,
    NeMoGymResponseUsage,
    NeMoGymToolChoiceFunction,
    accumulate_response_usage,
)
from nemo_gym.rollout_correlation import current_rollout_id
from nemo_gym.rollout_observability import (
    AgentInvocation,
    AgentObservationBundle,
    ModelCallRef,
    ObservationGap,
    join_model_call_observations,
)
from nemo_gym.server_utils import ServerClient

_SERVER: dict[str, Any] = {"host": "127.0.0.1", "port": 1, "entrypoint": "app.py"}
_ROW = {"responses_create_params": {"input": "x"}, "_ng_task_index": 5, "_ng_rollout_index": 2}
_MODELS = {"policy": {"responses_api_models": {"m": {"host": "10.0.0.1", "port": 8000}}}}


def _client(config: dict[str, Any]) -> ServerClient:
    return ServerClient(
        head_server_config=BaseServerConfig(host="127.0.0.1", port=1), global_config_dict=OmegaConf.create(config)
    )


class _Agent(SimpleResponsesAPIAgent):
    async def run(self, request: Request, body: BaseRunRequest) -> Any:
        return {"path": self.url_path_for_run("/v1/responses", body), "current": current_rollout_id()}


def _agent(config: dict[str, Any], *, opted_in: bool = False) -> _Agent:
    settings = BaseResponsesAPIAgentConfig(name="agent", token_id_capture=opted_in, **_SERVER)
    return _Agent(config=settings, server_client=_client({**_MODELS, **config}))


# -- training-token capture on the agent side ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("config", "opted_in", "captures"),
    [
        ({}, True, False),
        ({"token_id_capture": {"enabled": False}}, True, False),
        ({"token_id_capture": {"enabled": True}}, False, False),
        ({"token_id_capture": {"enabled": True}}, True, True),
        ({"token_id_capture": {"enabled": True, "all_agents": True}}, False, True),
        ({"observability_enabled": True}, True, False),
    ],
)
def test_an_agent_captures_tokens_when_the_run_does_and_it_is_opted_in(
    config: dict[str, Any], opted_in: bool, captures: bool
) -> None:
    assert _agent(config, opted_in=opted_in)._token_id_capture_enabled() is captures


def test_a_capturing_agent_sends_its_model_calls_under_the_training_capture_path() -> None:
    agent = _agent({"token_id_capture": {"enabled": True}}, opted_in=True)
    expected = "/ng-rollout/5-2/training-token-capture"
    assert agent.rollout_id_from_run(_ROW) == "5-2"  # correlation is on with token capture alone
    assert agent.url_path_for_run("/v1/responses", _ROW) == f"{expected}/v1/responses"
    assert agent.base_url_for_run("http://h:1/", _ROW) == f"http://h:1{expected}"
    assert agent.resolve_model_base_url("policy", "5-2") == f"http://10.0.0.1:8000{expected}/v1"
    answer = TestClient(agent.setup_webserver()).post("/run", json=_ROW).json()
    assert answer == {"path": f"{expected}/v1/responses", "current": "5-2"}


def test_an_agent_not_opted_in_keeps_the_evaluation_prefix() -> None:
    agent = _agent({"observability_enabled": True, "token_id_capture": {"enabled": True}})
    assert agent.url_path_for_run("/v1/responses", _ROW) == "/ng-rollout/5-2/v1/responses"
    assert agent.resolve_model_base_url("policy", "5-2") == "http://10.0.0.1:8000/ng-rollout/5-2/v1"
    assert _agent({}).url_path_for_run("/v1/responses", _ROW) == "/v1/responses"


# -- observations joined to the captured calls at merge time ------------------------------------------------------


def _call(call_id: str, response_id: str) -> dict[str, Any]:
    return {
        "model_call_id": call_id,
        "dialect": "responses",
        "status_code": 200,
        "model_ref": {"type": "responses_api_models", "name": "policy"},
        "response": {"id": response_id, "output": []},
    }


def _record(tmp_path: Path, source: str) -> dict[str, Any]:
    store = CaptureStore(tmp_path)
    for call in (_call("call-a", "resp-a"), _call("call-b", "resp-b")):
        store.record("0-0", call)
    model_ref = {"type": "responses_api_models", "name": "policy"}
    refs = [ModelCallRef.model_validate({"model_ref": model_ref, "response_id": rid}) for rid in ("resp-a", "resp-b")]
    bundle = AgentObservationBundle(source=source, records=[AgentInvocation(invocation_id="root", model_calls=refs)])
    return {"_ng_task_index": 0, "_ng_rollout_index": 0, "ng_agent_observations": bundle.model_dump(mode="json")}


def _joined(record: dict[str, Any]) -> tuple[list[str | None], set[str]]:
    bundle = AgentObservationBundle.model_validate(record["ng_agent_observations"])
    [invocation] = [item for item in bundle.records if isinstance(item, AgentInvocation)]
    return [ref.model_call_id for ref in invocation.model_calls], {gap.code for gap in bundle.gaps}


def test_the_merge_joins_an_agents_references_to_the_captured_calls(tmp_path: Path) -> None:
    record = merge_model_call_capture_into_record(_record(tmp_path, "some_agent"), [tmp_path])
    assert _joined(record) == (["call-a", "call-b"], set())


def test_a_sources_own_association_runs_first_and_its_failure_keeps_the_generic_join(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[int] = []

    def associate(bundle: AgentObservationBundle, calls: list[Any]) -> AgentObservationBundle:
        seen.append(len(calls))
        return bundle.model_copy(update={"gaps": [*bundle.gaps, ObservationGap(code="own_step_ran")]})

    module = types.ModuleType("_ng_test_association")
    module.associate = associate  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setitem(trajectory._SOURCE_CALL_ASSOCIATIONS, "mine", f"{module.__name__}:associate")
    record = merge_model_call_capture_into_record(_record(tmp_path / "ok", "mine"), [tmp_path / "ok"])
    assert seen == [2] and _joined(record) == (["call-a", "call-b"], {"own_step_ran"})

    monkeypatch.setitem(trajectory._SOURCE_CALL_ASSOCIATIONS, "mine", f"{module.__name__}:missing")
    record = merge_model_call_capture_into_record(_record(tmp_path / "bad", "mine"), [tmp_path / "bad"])
    assert _joined(record) == (["call-a", "call-b"], {"compaction_model_call_join_failed"})


# -- request parts that are TypedDicts in the SDK -------------------------------------------------------------------


def test_a_requests_reasoning_is_the_plain_dict_it_was_sent_as() -> None:
    params = NeMoGymResponseCreateParamsNonStreaming.model_validate({"input": "hi", "reasoning": {"summary": "auto"}})
    assert type(params.reasoning) is dict and params.reasoning == {"summary": "auto"}
    reasoning: Any = NeMoGymReasoning(effort="low")  # a response's settings, passed on to the next request
    from_model = NeMoGymResponseCreateParamsNonStreaming(input="hi", reasoning=reasoning)
    assert from_model.reasoning == {"effort": "low"}
    with pytest.raises(ValueError):
        NeMoGymResponseCreateParamsNonStreaming.model_validate({"input": "hi", "reasoning": {"effort": "x"}})
    with pytest.raises(ValueError):
        NeMoGymResponseCreateParamsNonStreaming.model_validate({"input": "hi", "reasoning": {"unknown": "x"}})
    response = NeMoGymResponse.model_validate(
        {"id": "r", "created_at": 0, "model": "m", "output": [], "reasoning": params.reasoning}
    )
    assert response.reasoning is not None and response.reasoning.summary == "auto"  # the response keeps a model


def test_a_tool_reads_as_the_mapping_it_stands_for() -> None:
    params = NeMoGymResponseCreateParamsNonStreaming.model_validate(
        {"input": "hi", "tools": [{"type": "function", "name": "f", "parameters": {}, "strict": False}]}
    )
    [tool] = params.tools
    assert isinstance(tool, NeMoGymFunctionTool) and isinstance(tool, Mapping)
    assert tool["name"] == "f" and tool.get("description") is None and list(tool) == list(tool.keys())
    assert dict(tool) == {"type": "function", "name": "f", "parameters": {}, "strict": False} == tool
    assert len(tool) == 4 and dict(tool.items()) == dict(tool)
    assert params.model_dump()["tools"][0]["description"] is None  # dumps keep every field


def test_a_model_is_never_equal_to_a_string() -> None:
    choice = NeMoGymToolChoiceFunction(name="f")
    assert choice != "none" and not (choice == "auto")
    assert choice == {"type": "function", "name": "f"}


def test_a_training_item_carries_routed_experts_when_given() -> None:
    tokens = {"prompt_token_ids": [1], "generation_token_ids": [2], "generation_log_probs": [-0.1]}
    call = {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}", **tokens}
    item = NeMoGymResponseFunctionToolCallForTraining.model_validate({**call, "routed_experts": [[[0, 3]]]})
    assert item.routed_experts == [[[0, 3]]] and item.model_dump()["routed_experts"] == [[[0, 3]]]
    assert "routed_experts" not in NeMoGymResponseFunctionToolCallForTraining.model_validate(call).model_dump()
    encoded = NeMoGymResponseFunctionToolCallForTraining.model_validate({**call, "routed_experts": "enc:1x1x2:AAAA"})
    assert encoded.routed_experts == "enc:1x1x2:AAAA"


# -- agent sessions under NeMo Gym 0.7's helper names -----------------------------------------------------------------


class _SessionAgent(_Agent):
    async def _seed_agent_session_state(self, body: AgentSeedSessionRequest) -> AgentSessionState:
        return AgentSessionState(request=body)

    async def _close_agent_session_state(self, state: AgentSessionState) -> AgentCloseSessionResponse:
        return AgentCloseSessionResponse(agent_session_id=state.request.agent_session_id)


def _session_agent(**settings: Any) -> _SessionAgent:
    config = BaseResponsesAPIAgentConfig(name="agent", **_SERVER, **settings)
    return _SessionAgent(config=config, server_client=_client(_MODELS))


def _seed(agent_session_id: str = "s") -> AgentSeedSessionRequest:
    return AgentSeedSessionRequest(
        agent_session_id=agent_session_id,
        episode_id=EpisodeId(rollout_id="r", attempt=0),
        task_id=TaskId(taskset="t", task_id="0"),
    )


def _request(cookie: str | None = "c1") -> Any:
    """What the session middleware hands a route: a fresh session dict per request, holding the cookie's id."""
    return types.SimpleNamespace(session={} if cookie is None else {"session_id": cookie})


async def test_a_seeded_cookie_names_its_session_until_after_the_close() -> None:
    agent, seed = _session_agent(), _seed()
    first = _request()
    await agent.seed_agent_session(first, seed)
    assert first.session["agent_session_id"] == "s"  # the marker NeMo Gym 0.7 leaves in the session
    later = _request()  # the same cookie on a later request
    assert agent._agent_session_id_from_request(later) == "s"
    assert agent._require_agent_session("s").request == seed and agent.agent_session_of(later) is not None
    assert agent._agent_session_id_from_request(_request("other")) is None
    assert agent._agent_session_id_from_request(None) is None and "s" in agent._session_records

    close = AgentCloseSessionRequest(agent_session_id="s", episode_id=seed.episode_id)
    with pytest.raises(HTTPException) as mismatch:
        await agent.close_agent_session(later, close.model_copy(update={"agent_session_id": "t"}))
    assert mismatch.value.status_code == 409
    assert await agent.close_agent_session(later, close) == await agent.close_agent_session(later, close)
    assert agent._agent_session_id_from_request(_request()) == "s"  # still named, so a late call is refused
    for refused in (lambda: agent._require_agent_session("s"), lambda: agent.agent_session_of(_request())):
        with pytest.raises(HTTPException) as closed:
            refused()
        assert closed.value.status_code == 409


async def test_a_request_without_a_cookie_is_bound_by_its_marker_and_sessions_need_one_worker() -> None:
    agent, request = _session_agent(), _request(cookie=None)
    assert await agent.seed_agent_session(request, _seed()) == await agent.seed_agent_session(request, _seed())
    with pytest.raises(HTTPException):
        await agent.seed_agent_session(request, _seed("another"))  # the marker names "s"
    with pytest.raises(ValueError, match="num_workers=1"):
        await _session_agent(num_workers=2).seed_agent_session(_request(), _seed())
    with pytest.raises(NotImplementedError):
        await _agent({}).close_agent_session(
            _request(), AgentCloseSessionRequest(agent_session_id="s", episode_id=_seed().episode_id)
        )


# -- request shapes, usage and metrics as 0.7's folders read them ---------------------------------------------------


def test_a_json_schema_format_reads_schema_as_an_attribute_and_dumps_its_wire_key() -> None:
    schema_format = {"type": "json_schema", "name": "a", "schema": {"type": "object"}, "strict": True}
    params = NeMoGymResponseCreateParamsNonStreaming.model_validate({"input": "x", "text": {"format": schema_format}})
    text_format: Any = params.text.format if params.text is not None else None
    assert text_format.schema_ == {"type": "object"} and text_format.name == "a" and text_format == schema_format
    assert params.model_dump(mode="json", exclude_unset=True)["text"]["format"] == schema_format
    with pytest.raises(AttributeError):
        text_format.description  # noqa: B018  # a key the format does not have


def test_a_replayed_assistant_turn_may_carry_its_reasoning_content() -> None:
    message = {"role": "assistant", "content": "", "reasoning_content": "thinking"}
    body = NeMoGymChatCompletionCreateParamsNonStreaming.model_validate({"model": "m", "messages": [message]})
    assert body.messages[0]["reasoning_content"] == "thinking"
    assert body.model_dump(exclude_unset=True)["messages"][0] == message


def test_an_unknown_detail_count_keeps_the_sum_unknown() -> None:
    def usage(reasoning: int | None) -> NeMoGymResponseUsage:
        details = {"reasoning_tokens": reasoning}
        return NeMoGymResponseUsage.model_validate(
            {"input_tokens": 1, "output_tokens": 2, "total_tokens": 3, "output_tokens_details": details}
        )

    total = accumulate_response_usage(usage(None), usage(5))
    assert total is not None and total.output_tokens == 4 and total.output_tokens_details.reasoning_tokens is None
    known = accumulate_response_usage(usage(1), usage(5))
    assert known is not None and known.output_tokens_details.reasoning_tokens == 6


def test_usage_counts_are_metrics_under_their_own_names_too() -> None:
    row = {"reward": 1.0, "output_tokens": 99, "response": {"usage": {"output_tokens": 7, "total_tokens": 9}}}
    fields = numeric_fields(row)
    assert fields["output_tokens"] == 7.0 and fields["total_tokens"] == 9.0  # the usage's count wins, as in 0.7
    assert fields["usage/output_tokens"] == 7.0 and fields["usage/total_tokens"] == 9.0


class _RepeatAgent(_Agent):
    def compute_repeat_metrics(self, tasks: list[list[dict[str, Any]]]) -> dict[str, Any]:
        rows = [row for task in tasks for row in task]
        return {"solved": sum(row["reward"] for row in rows) / len(rows), "unknown": None}


async def test_an_agents_repeat_metrics_go_into_each_repeat_and_across_them() -> None:
    rows = [
        {"_ng_task_index": task, "_ng_rollout_index": repeat, "reward": float(task == repeat)}
        for task in range(2)
        for repeat in range(2)
    ]
    settings = BaseResponsesAPIAgentConfig(name="agent", **_SERVER)
    agent = _RepeatAgent(config=settings, server_client=_client(_MODELS))
    metrics = await agent.aggregate_metrics(AggregateMetricsRequest(verify_responses=rows))
    assert [repeat["solved"] for repeat in metrics.repeat_level_metrics] == [0.5, 0.5]
    assert all("unknown" not in repeat for repeat in metrics.repeat_level_metrics)
    assert metrics.agent_metrics["mean_across_repeats/solved"] == 0.5


# -- what a sandboxed agent's folder patches ----------------------------------------------------------------------


def test_the_faces_0_7_folders_patch_are_module_attributes(monkeypatch: pytest.MonkeyPatch) -> None:
    from nemo_gym import openai_utils
    from nemo_gym.sandbox import agent_tools
    from nemo_gym.transport import passthrough

    assert openai_utils.request is passthrough.request
    monkeypatch.setattr(agent_tools, "get_server_url", lambda name: "http://0.0.0.0:9000")
    assert agent_tools.sandbox_server_url("any") == "http://127.0.0.1:9000"
    monkeypatch.setattr(agent_tools, "get_server_url", lambda name: "http://10.0.0.8:9000/base/")
    assert agent_tools.sandbox_server_url("any", require_reachable=True) == "http://10.0.0.8:9000/base"


def test_a_captured_call_keeps_the_clients_session_header() -> None:
    scope = {"headers": [(b"x-session-id", b"root"), (b"content-type", b"application/json")]}
    exchange = {"model_call_id": "c", "client_session_id": _client_session_id(scope), "status_code": 200}
    record = build_model_call_record(exchange, call_index=0)
    assert record.client_session_id == "root"
    twice = {"headers": [(b"x-session-id", b"a"), (b"X-Session-Id", b"b")]}
    assert _client_session_id(twice) is None and _client_session_id({}) is None
    bundle = AgentObservationBundle(source="s", records=[AgentInvocation(invocation_id="root")])
    [invocation] = join_model_call_observations(bundle, [record]).records
    assert isinstance(invocation, AgentInvocation) and [ref.model_call_id for ref in invocation.model_calls] == ["c"]
