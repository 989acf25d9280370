"""What NeMo Gym 0.7's agent folders need of our core: agents opted into training-token capture send their model calls
under the training-capture path, a finished rollout's observations are joined to its captured calls (with an agent's
own association step first), and the request's TypedDict-shaped parts read as dicts."""

from __future__ import annotations

import sys
import types
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from fastapi import Request
from fastapi.testclient import TestClient
from omegaconf import OmegaConf

from nemo_gym.base_responses_api_agent import BaseResponsesAPIAgentConfig, BaseRunRequest, SimpleResponsesAPIAgent
from nemo_gym.base_responses_api_model import CaptureStore, merge_model_call_capture_into_record
from nemo_gym.config.server_models import BaseServerConfig
from nemo_gym.observability import trajectory
from nemo_gym.openai_utils import (
    NeMoGymFunctionTool,
    NeMoGymReasoning,
    NeMoGymResponse,
    NeMoGymResponseCreateParamsNonStreaming,
    NeMoGymResponseFunctionToolCallForTraining,
    NeMoGymToolChoiceFunction,
)
from nemo_gym.rollout_correlation import current_rollout_id
from nemo_gym.rollout_observability import (
    AgentInvocation,
    AgentObservationBundle,
    ModelCallRef,
    ObservationGap,
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
