"""What NeMo Gym 0.7's model-server folders expect of the Chat -> Responses conversion and of a model server's routes:
the envelope id kept on request, the provider's own finish reason and refusal kept, LiteLLM's reasoning-item extras
tolerated, and the ``/ng-rollout/<id>`` prefix routed with capture off."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient
from omegaconf import OmegaConf
from pydantic import ValidationError

from nemo_gym.base_responses_api_model import BaseResponsesAPIModelConfig, SimpleResponsesAPIModel
from nemo_gym.config.server_models import BaseServerConfig
from nemo_gym.openai_responses import NeMoGymResponse, NeMoGymResponseReasoningItem
from nemo_gym.responses_converter import ResponsesConverter
from nemo_gym.rollout_correlation import current_rollout_id
from nemo_gym.server_utils import ServerClient


def _completion(message: dict[str, Any], **choice: Any) -> dict[str, Any]:
    return {
        "id": "chatcmpl-abc",
        "object": "chat.completion",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", **message}, **choice}],
    }


def _convert(completion: dict[str, Any], **kwargs: Any) -> NeMoGymResponse:
    return ResponsesConverter(uses_reasoning_parser=False).chat_completion_to_response(
        {"input": "hi", "model": "m"}, completion, **kwargs
    )


def test_the_response_id_is_minted_unless_the_envelope_id_is_asked_for() -> None:
    completion = _completion({"content": "ok"})
    assert _convert(completion).id.startswith("resp_")
    assert _convert(completion, preserve_envelope_id=True).id == "chatcmpl-abc"
    assert _convert({**completion, "id": ""}, preserve_envelope_id=True).id.startswith("resp_")
    with pytest.raises(TypeError):
        ResponsesConverter().chat_completion_to_response({"input": "hi"}, completion, True)  # type: ignore[call-arg]


def test_the_providers_own_finish_reason_is_kept_on_the_response() -> None:
    response = _convert(_completion({"content": "ok"}, native_finish_reason="refusal"))
    assert response.model_dump()["native_finish_reason"] == "refusal"
    assert "native_finish_reason" not in _convert(_completion({"content": "ok"})).model_dump()


def test_a_refusal_becomes_the_messages_refusal_part() -> None:
    [message] = _convert(_completion({"content": None, "refusal": "No."})).output
    assert message.model_dump()["content"] == [{"type": "refusal", "refusal": "No."}]

    [message] = _convert(_completion({"content": "Partly", "refusal": "No."})).output
    assert [part["type"] for part in message.model_dump()["content"]] == ["output_text", "refusal"]

    [message] = _convert(_completion({"content": None})).output  # nothing at all: still one (empty) text part
    assert message.model_dump()["content"][0]["text"] == ""


def test_a_reasoning_item_drops_litellms_role_and_output_text_fields() -> None:
    item = NeMoGymResponseReasoningItem.model_validate(
        {
            "id": "rs_1",
            "type": "reasoning",
            "role": "assistant",
            "status": "completed",
            "summary": [],
            "content": [{"type": "reasoning_text", "text": "steps", "annotations": [], "logprobs": []}],
        }
    )
    assert item.model_dump(exclude_none=True) == {
        "id": "rs_1",
        "type": "reasoning",
        "summary": [],
        "content": [{"type": "reasoning_text", "text": "steps"}],
    }
    with pytest.raises(ValidationError):  # other unknown keys are still refused
        NeMoGymResponseReasoningItem.model_validate({"id": "rs_1", "summary": [], "summry": []})


class _Model(SimpleResponsesAPIModel):
    async def responses(self, body: dict[str, Any]) -> dict[str, Any]:  # type: ignore[override]
        return {"id": "resp_1", "model": current_rollout_id() or "none", "status": "completed", "output": []}


def test_a_model_server_routes_the_rollout_prefix_with_capture_off() -> None:
    client = ServerClient(
        head_server_config=BaseServerConfig(host="127.0.0.1", port=1), global_config_dict=OmegaConf.create({})
    )
    server = _Model(
        config=BaseResponsesAPIModelConfig(name="policy", host="127.0.0.1", port=1, entrypoint="app.py"),
        server_client=client,
    )
    http = TestClient(server.setup_webserver())
    prefixed = http.post("/ng-rollout/task0-r1/v1/responses", json={"input": "hi"})
    assert (prefixed.status_code, prefixed.json()["model"]) == (200, "task0-r1")
    token_path = http.post("/ng-rollout/r2/training-token-capture/v1/responses", json={"input": "hi"})
    assert (token_path.status_code, token_path.json()["model"]) == (200, "r2")
    plain = http.post("/v1/responses", json={"input": "hi"})
    assert (plain.status_code, plain.json()["model"]) == (200, "none")
