"""scripted_model replays its script by turn, through both APIs."""

from __future__ import annotations

from unittest.mock import MagicMock

from fastapi.testclient import TestClient

from nemo_gym.openai_utils import NeMoGymChatCompletion, NeMoGymResponse
from nemo_gym.server_utils import ServerClient
from responses_api_models.scripted_model.app import ScriptedModel, ScriptedModelConfig


def client(**config) -> TestClient:
    settings = ScriptedModelConfig(host="127.0.0.1", port=0, entrypoint="app.py", name="policy_model", **config)
    return TestClient(ScriptedModel(config=settings, server_client=MagicMock(spec=ServerClient)).setup_webserver())


def test_first_turn_calls_the_tool_and_second_turn_answers():
    api = client()
    first = NeMoGymResponse.model_validate(api.post("/v1/responses", json={"input": "weather?"}).json())
    call = first.output[0]
    assert call.type == "function_call" and call.name == "get_weather" and call.call_id
    follow_up = {
        "input": [
            {"role": "user", "content": "weather?"},
            call.model_dump(mode="json"),
            {"type": "function_call_output", "call_id": call.call_id, "output": "cold"},
        ]
    }
    second = NeMoGymResponse.model_validate(api.post("/v1/responses", json=follow_up).json())
    assert second.output_text == "It is cold there."


def test_invalid_requests_are_rejected():
    assert client().post("/v1/responses", json={"input": "x", "bogus": 1}).status_code == 422
    assert client().post("/v1/chat/completions", json={"messages": "not a list"}).status_code == 422


def test_chat_completions_follow_the_same_script():
    api = client(
        script=[[{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "hi"}]}]]
    )
    answer = NeMoGymChatCompletion.model_validate(
        api.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hello"}]}).json()
    )
    assert answer.choices[0].message.content == "hi"


def test_input_tokens_are_a_quarter_of_the_input_as_json():
    """The estimate counts the request's input in compact JSON: as sent, which for a request that validation keeps
    whole is the validated input dumped again."""
    import orjson

    from nemo_gym.openai_utils import NeMoGymResponseCreateParamsNonStreaming

    api = client()
    call = api.post("/v1/responses", json={"input": "weather? ünïcode"}).json()["output"][0]
    for body in (
        {"input": "weather? ünïcode"},
        {
            "input": [
                {"role": "user", "content": "weather? ünïcode", "type": "message"},
                call,
                {"type": "function_call_output", "call_id": call["call_id"], "output": '{"city": "Paris"}'},
            ],
            "tools": [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}, "strict": True}],
        },
    ):
        validated = NeMoGymResponseCreateParamsNonStreaming.model_validate(body)
        dumped = validated.model_dump(mode="json", exclude_unset=True, include={"input"})["input"]
        usage = api.post("/v1/responses", json=body).json()["usage"]
        assert usage["input_tokens"] == len(orjson.dumps(dumped)) // 4 == len(orjson.dumps(body["input"])) // 4
