"""scripted_model replays its script by turn, through both APIs."""

from __future__ import annotations

from unittest.mock import MagicMock

import orjson
import pytest
from fastapi.testclient import TestClient

from nemo_gym.errors import ConfigError
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


def _answer(text: str) -> list[dict]:
    return [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}]


def _scripts_file(tmp_path, *lines: str):
    path = tmp_path / "scripts.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _line(match: str, *turns: list[dict]) -> str:
    return orjson.dumps({"match": match, "script": list(turns)}).decode()


def test_a_matching_request_replays_that_lines_script_on_every_turn(tmp_path):
    call = {"type": "function_call", "name": "lookup", "arguments": "{}", "call_id": "call_task7"}
    scripts = _scripts_file(tmp_path, _line("task 7", [call], _answer("seven")), "", _line("task 8", _answer("eight")))
    api = client(scripts_file=str(scripts))
    first = NeMoGymResponse.model_validate(
        api.post("/v1/responses", json={"input": [{"role": "user", "content": "solve task 7 now"}]}).json()
    )
    assert first.output[0].type == "function_call" and first.output[0].name == "lookup"
    follow_up = {
        "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "solve task 7 now"}]},
            first.output[0].model_dump(mode="json"),
            {"type": "function_call_output", "call_id": "call_task7", "output": "done"},
        ]
    }
    second = NeMoGymResponse.model_validate(api.post("/v1/responses", json=follow_up).json())
    assert second.output_text == "seven"
    eight = api.post("/v1/responses", json={"input": "task 8"}).json()
    assert NeMoGymResponse.model_validate(eight).output_text == "eight"


def test_a_request_that_matches_no_line_replays_the_default_script(tmp_path):
    api = client(scripts_file=str(_scripts_file(tmp_path, _line("task 7", _answer("seven")))))
    first = NeMoGymResponse.model_validate(api.post("/v1/responses", json={"input": "weather?"}).json())
    assert first.output[0].type == "function_call" and first.output[0].name == "get_weather"
    # Text outside message items (here a tool's output) is not matched.
    other = {
        "input": [
            {"role": "user", "content": "weather?"},
            {"type": "function_call_output", "call_id": "c", "output": "task 7"},
        ]
    }
    assert NeMoGymResponse.model_validate(api.post("/v1/responses", json=other).json()).output_text == (
        "It is cold there."
    )


def test_the_first_matching_line_wins(tmp_path):
    scripts = _scripts_file(tmp_path, _line("task", _answer("first")), _line("task 7", _answer("second")))
    answer = client(scripts_file=str(scripts)).post("/v1/responses", json={"input": "task 7"}).json()
    assert NeMoGymResponse.model_validate(answer).output_text == "first"


def test_a_line_can_make_its_responses_fail_or_stop_short(tmp_path):
    failing = orjson.dumps({"match": "task 7", "script": [_answer("")], "status": "failed"}).decode()
    short = orjson.dumps({"match": "task 8", "script": [_answer("eig")], "status": "incomplete"}).decode()
    api = client(scripts_file=str(_scripts_file(tmp_path, failing, short)))
    failed = NeMoGymResponse.model_validate(api.post("/v1/responses", json={"input": "task 7"}).json())
    assert failed.status == "failed" and failed.error is not None and failed.error.code == "server_error"
    cut = NeMoGymResponse.model_validate(api.post("/v1/responses", json={"input": "task 8"}).json())
    assert cut.status == "incomplete" and cut.incomplete_details is not None
    assert cut.incomplete_details.reason == "max_output_tokens"
    fine = api.post("/v1/responses", json={"input": "other"}).json()
    assert (fine["status"], fine["error"], fine["incomplete_details"]) == ("completed", None, None)
    bad = orjson.dumps({"match": "x", "script": [_answer("")], "status": "exploded"}).decode()
    with pytest.raises(ConfigError, match="line 1: 'status' must be one of completed, failed, incomplete"):
        client(scripts_file=str(_scripts_file(tmp_path, bad)))


def test_chat_completions_pick_scripts_by_match_too(tmp_path):
    call = {"type": "function_call", "name": "lookup", "arguments": "{}"}
    api = client(scripts_file=str(_scripts_file(tmp_path, _line("task 7", [call], _answer("seven")))))
    first = NeMoGymChatCompletion.model_validate(
        api.post(
            "/v1/chat/completions",
            json={"messages": [{"role": "user", "content": [{"type": "text", "text": "task 7"}]}]},
        ).json()
    )
    tool_call = first.choices[0].message.tool_calls[0]
    assert tool_call.function.name == "lookup"
    messages = [
        {"role": "user", "content": "task 7"},
        {"role": "assistant", "content": None, "tool_calls": [tool_call.model_dump(mode="json")]},
        {"role": "tool", "tool_call_id": tool_call.id, "content": "done"},
    ]
    second = NeMoGymChatCompletion.model_validate(api.post("/v1/chat/completions", json={"messages": messages}).json())
    assert second.choices[0].message.content == "seven"
    other = api.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "weather?"}]}).json()
    assert NeMoGymChatCompletion.model_validate(other).choices[0].message.tool_calls[0].function.name == "get_weather"


def test_a_bad_scripts_file_stops_the_server_naming_the_file_and_line(tmp_path):
    scripts = _scripts_file(tmp_path, _line("task 7", _answer("seven")), "{not json")
    with pytest.raises(ConfigError, match=r"scripts\.jsonl line 2: not JSON") as caught:
        client(scripts_file=str(scripts))
    assert str(scripts) in str(caught.value) and "\n" not in str(caught.value)
    for bad, problem in (
        ('{"script": [[{"type": "message"}]]}', "'match'"),
        ('{"match": "x", "script": []}', "'script'"),
        ('{"match": "x", "script": [[]]}', "'script'"),
        ('{"match": "x", "script": [["item"]]}', "'script'"),
        ("[1]", "'match'"),
    ):
        with pytest.raises(ConfigError, match=f"line 1: .*{problem}"):
            client(scripts_file=str(_scripts_file(tmp_path, bad)))
    with pytest.raises(ConfigError, match="missing.jsonl: cannot read it"):
        client(scripts_file=str(tmp_path / "missing.jsonl"))
