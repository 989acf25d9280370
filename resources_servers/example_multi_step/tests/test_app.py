"""The synonym server: its two tools, and how verify grades the last submission (right, wrong, malformed, edge cases)."""

from __future__ import annotations

import json
from pathlib import Path
from unittest.mock import MagicMock

import pytest
from fastapi.testclient import TestClient

from nemo_gym.openai_utils import NeMoGymResponse, NeMoGymResponseCreateParamsNonStreaming
from nemo_gym.server_utils import ServerClient
from resources_servers.example_multi_step.app import (
    ExampleMultiStepResourcesServer,
    ExampleMultiStepResourcesServerConfig,
    GetSynonymValueRequest,
    MultiStepVerifyRequest,
    synonym_value,
)

DATA = Path(__file__).resolve().parent.parent / "data" / "example.jsonl"
PARAMS = {"input": [{"role": "user", "content": "Why are desert afternoons so heated?"}]}
ROW = {
    "id": 0,
    "expected_synonyms": ["Scorching", "Warm"],
    "expected_synonym_values": [928, 407],
    "minefield_label": "Hot",
    "minefield_label_value": 299,
}
ANSWER = {"type": "message", "id": "m1", "role": "assistant", "status": "completed",
          "content": [{"type": "output_text", "text": "Submitted.", "annotations": []}]}  # fmt: skip


def make_server() -> ExampleMultiStepResourcesServer:
    config = ExampleMultiStepResourcesServerConfig(host="0.0.0.0", port=8080, entrypoint="", name="")
    return ExampleMultiStepResourcesServer(config=config, server_client=MagicMock(spec=ServerClient))


def _call(name: str, arguments: object, call_id: str) -> dict:
    text = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"type": "function_call", "call_id": call_id, "name": name, "arguments": text}


def _output(call_id: str, output: object) -> dict:
    return {"type": "function_call_output", "call_id": call_id, "output": json.dumps(output)}


def _submit(arguments: object, call_id: str = "s1") -> list[dict]:
    return [_call("extract_synonym_values", arguments, call_id), _output(call_id, {"success": True})]


LOOKUPS = [
    _call("get_synonym_value", {"synonym": "Scorching"}, "l1"),
    _output("l1", {"synonym_value": 928}),
    _call("get_synonym_value", {"synonym": "Warm"}, "l2"),
    _output("l2", {"synonym_value": 407}),
]


async def _verify(*output: dict, **row: object) -> dict:
    response = NeMoGymResponse.model_validate(
        {"id": "resp_1", "created_at": 0, "model": "m", "object": "response", "output": list(output),
         "parallel_tool_calls": False, "tool_choice": "auto", "tools": []}
    )  # fmt: skip
    params = NeMoGymResponseCreateParamsNonStreaming.model_validate(PARAMS)
    body = MultiStepVerifyRequest.model_validate(ROW | row | {"responses_create_params": params, "response": response})
    return (await make_server().verify(body)).model_dump()


def test_synonym_value_is_the_sum_of_code_points():
    assert synonym_value("Warm") == 87 + 97 + 114 + 109 == 407
    assert synonym_value("") == 0


async def test_get_synonym_value():
    result = await make_server().get_synonym_value(GetSynonymValueRequest(synonym="Scorching"))
    assert result.synonym_value == 928


def test_tool_routes():
    client = TestClient(make_server().setup_webserver())
    assert client.post("/get_synonym_value", json={"synonym": "Hushed"}).json() == {"synonym_value": 609}
    assert client.post("/extract_synonym_values", json={"synonym_values": [1, 2]}).json() == {"success": True}
    assert client.post("/extract_synonym_values", json={"synonym_values": []}).json() == {"success": True}
    assert client.post("/get_synonym_value", json={}).status_code == 422
    assert client.get("/reverify_mode").json() == "stateless"
    for bad in ({}, {"synonym_values": "1, 2"}, {"synonym_values": ["711"]}, {"synonym_values": [1.5]}):
        assert client.post("/extract_synonym_values", json=bad).status_code == 422, bad


async def test_correct_submission():
    result = await _verify(*LOOKUPS, *_submit({"synonym_values": [928, 407]}), ANSWER)
    assert result["reward"] == 1.0 and result["accuracy"] is True
    assert result["parsed_synonym_values"] == [928, 407] and result["submission_status"] == "ok"
    assert result["set_overlap"] == 1.0
    assert not result["original_term_minefield_hit"] and not result["order_instruction_following_failure"]
    assert (result["num_lookup_calls"], result["num_submit_calls"]) == (2, 1)
    assert result["expected_synonyms"] == ["Scorching", "Warm"] and result["id"] == 0


async def test_wrong_order_is_zero_and_flagged():
    result = await _verify(*LOOKUPS, *_submit({"synonym_values": [407, 928]}))
    assert (result["reward"], result["set_overlap"]) == (0.0, 1.0)
    assert result["order_instruction_following_failure"] is True


async def test_partial_and_extra_values_are_zero():
    partial = await _verify(*_submit({"synonym_values": [928]}))
    assert (partial["reward"], partial["set_overlap"]) == (0.0, 0.5)
    assert not partial["order_instruction_following_failure"]
    extra = await _verify(*_submit({"synonym_values": [928, 407, 1]}))
    assert (extra["reward"], extra["set_overlap"]) == (0.0, 1.0)
    duplicated = await _verify(*_submit({"synonym_values": [928, 928, 407]}))
    assert duplicated["reward"] == 0.0 and not duplicated["order_instruction_following_failure"]


async def test_submitting_the_original_term_hits_the_minefield():
    result = await _verify(*_submit({"synonym_values": [299, 407]}))
    assert result["reward"] == 0.0 and result["original_term_minefield_hit"] is True
    assert result["set_overlap"] == 0.5


async def test_only_the_last_submission_counts():
    fixed = await _verify(*_submit({"synonym_values": [299]}, "s1"), *_submit({"synonym_values": [928, 407]}, "s2"))
    assert fixed["reward"] == 1.0 and fixed["num_submit_calls"] == 2
    broken = await _verify(*_submit({"synonym_values": [928, 407]}, "s1"), *_submit({"synonym_values": []}, "s2"))
    assert broken["reward"] == 0.0 and broken["parsed_synonym_values"] == []


@pytest.mark.parametrize(
    ("arguments", "status"),
    [
        ('{"synonym_values": [928, 407', "invalid_json"),
        ("", "invalid_json"),
        ("[928, 407]", "invalid_arguments"),
        ({"values": [928, 407]}, "invalid_arguments"),
        ({"synonym_values": "928, 407"}, "invalid_arguments"),
        ({"synonym_values": ["928", "407"]}, "invalid_arguments"),
        ({"synonym_values": [928.0, 407.0]}, "invalid_arguments"),
        ({"synonym_values": [True, 407]}, "invalid_arguments"),
        ({"synonym_values": None}, "invalid_arguments"),
    ],
)
async def test_malformed_submissions_are_zero(arguments: object, status: str):
    result = await _verify(*LOOKUPS, *_submit(arguments), ANSWER)
    assert (result["reward"], result["submission_status"], result["parsed_synonym_values"]) == (0.0, status, None)
    assert result["set_overlap"] == 0.0 and not result["order_instruction_following_failure"]


async def test_no_submission_is_zero():
    for output in ([], [ANSWER], [*LOOKUPS, ANSWER]):
        result = await _verify(*output)
        assert result["reward"] == 0.0 and result["submission_status"] == "missing"
        assert result["parsed_synonym_values"] is None
    # The values written in a message, not submitted through the tool, do not count.
    text = ANSWER | {"content": [{"type": "output_text", "text": "[928, 407]", "annotations": []}]}
    assert (await _verify(*LOOKUPS, text))["reward"] == 0.0


async def test_other_tool_names_are_not_submissions():
    result = await _verify(_call("extract_synonym_value", {"synonym_values": [928, 407]}, "x"))
    assert result["submission_status"] == "missing" and result["reward"] == 0.0


async def test_rows_without_optional_fields_and_with_empty_expectations():
    bare = {"expected_synonyms": [], "minefield_label": None, "minefield_label_value": None}
    empty = await _verify(*_submit({"synonym_values": []}), **bare, expected_synonym_values=[])
    assert (empty["reward"], empty["set_overlap"]) == (1.0, 1.0)
    not_empty = await _verify(*_submit({"synonym_values": [5]}), **bare, expected_synonym_values=[])
    assert (not_empty["reward"], not_empty["set_overlap"]) == (0.0, 0.0)
    assert not not_empty["original_term_minefield_hit"]


def test_verify_route_round_trip_and_requires_the_expected_values():
    client = TestClient(make_server().setup_webserver())
    response = {"id": "r", "created_at": 0, "model": "m", "output": _submit({"synonym_values": [928, 407]})}
    answer = client.post("/verify", json=ROW | {"responses_create_params": PARAMS, "response": response})
    assert answer.status_code == 200 and answer.json()["reward"] == 1.0
    row = {k: v for k, v in ROW.items() if k != "expected_synonym_values"}
    missing = client.post("/verify", json=row | {"responses_create_params": PARAMS, "response": response})
    assert missing.status_code == 422


async def test_example_rows_are_consistent_and_solvable():
    rows = [json.loads(line) for line in DATA.read_text().splitlines()]
    assert len(rows) == 5
    for row in rows:
        NeMoGymResponseCreateParamsNonStreaming.model_validate(row["responses_create_params"])
        assert row["expected_synonym_values"] == [synonym_value(s) for s in row["expected_synonyms"]]
        assert row["minefield_label_value"] == synonym_value(row["minefield_label"])
        system = row["responses_create_params"]["input"][0]["content"]
        assert all(f"'{s}'" in system for s in [row["minefield_label"], *row["expected_synonyms"]])
        params = NeMoGymResponseCreateParamsNonStreaming.model_validate(row["responses_create_params"])
        response = NeMoGymResponse.model_validate(
            {"id": "r", "created_at": 0, "model": "m",
             "output": _submit({"synonym_values": row["expected_synonym_values"]})}
        )  # fmt: skip
        body = MultiStepVerifyRequest.model_validate(row | {"responses_create_params": params, "response": response})
        assert (await make_server().verify(body)).reward == 1.0
