"""tool_call_match: every rule of the argument comparison and of the reward, on hand-built model turns."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from unittest.mock import MagicMock

import pytest
from fastapi.testclient import TestClient

from nemo_gym.openai_utils import NeMoGymResponse
from nemo_gym.server_utils import ServerClient
from resources_servers.tool_call_match import generate_data
from resources_servers.tool_call_match.app import (
    ToolCallMatchResourcesServer,
    ToolCallMatchResourcesServerConfig,
    ToolCallMatchVerifyRequest,
)

DATA = Path(__file__).parents[1] / "data" / "example.jsonl"
ROWS = [generate_data.build_row(task) for task in generate_data.TASKS]
CONVERT, FORECASTS, FOLDERS, BOOKING, NO_CALL = ROWS


def make_server(**config: Any) -> ToolCallMatchResourcesServer:
    settings = {"host": "127.0.0.1", "port": 0, "entrypoint": "", "name": "", "domain": "agent"} | config
    return ToolCallMatchResourcesServer(
        config=ToolCallMatchResourcesServerConfig(**settings), server_client=MagicMock(spec=ServerClient)
    )


def call(name: str, arguments: dict[str, Any] | str, index: int = 0) -> dict[str, Any]:
    raw = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"type": "function_call", "call_id": f"c{index}", "name": name, "arguments": raw}


def message(text: str) -> dict[str, Any]:
    return {"type": "message", "id": "m", "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": []}]}  # fmt: skip


async def verify(row: dict[str, Any], *items: dict[str, Any], **config: Any) -> dict[str, Any]:
    response = NeMoGymResponse.model_validate({"id": "r", "created_at": 0, "model": "m", "output": list(items)})
    request = ToolCallMatchVerifyRequest.model_validate(row | {"response": response.model_dump()})
    return (await make_server(**config).verify(request)).model_dump()


def expected_items(row: dict[str, Any]) -> list[dict[str, Any]]:
    return [call(c["name"], c["arguments"], i) for i, c in enumerate(row["expected_calls"])]


# --- full matches ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("row", ROWS[:4], ids=["single", "parallel", "sequence", "nested"])
async def test_the_expected_calls_score_one(row):
    result = await verify(row, *expected_items(row))
    assert (result["reward"], result["name_match"], result["args_match"]) == (1.0, 1.0, 1.0)
    assert result["num_matched"] == result["num_expected"] == result["num_predicted"]


async def test_parallel_calls_match_in_any_order():
    first, second = expected_items(FORECASTS)
    assert (await verify(FORECASTS, second, first))["reward"] == 1.0


async def test_a_row_can_require_order():
    create, move = expected_items(FOLDERS)
    result = await verify(FOLDERS, move, create)
    assert (result["reward"], result["name_match"], result["args_match"]) == (0.0, 0.0, 0.0)
    assert (await verify(FOLDERS | {"ordered": False}, move, create))["reward"] == 1.0
    assert (await verify(FORECASTS, *reversed(expected_items(FORECASTS)), ordered=True))["reward"] == 0.0


# --- normalisation ---------------------------------------------------------------------------------------------------


async def test_numbers_compare_by_value_even_when_quoted():
    for value in (12.5, "12.5", 12.5000000001):
        args = {"value": value, "from_unit": "mile", "to_unit": "kilometer"}
        assert (await verify(CONVERT, call("convert_units", args)))["reward"] == 1.0
    far = {"value": 12.6, "from_unit": "mile", "to_unit": "kilometer"}
    assert (await verify(CONVERT, call("convert_units", far)))["reward"] == 0.0
    booking = json.loads(json.dumps(BOOKING["expected_calls"][0]["arguments"]))
    assert (await verify(BOOKING, call("book_table", booking | {"party_size": 4.0})))["reward"] == 1.0


async def test_strings_are_normalised_unless_exact_matching_is_configured():
    args = {"value": 12.5, "from_unit": "  Mile ", "to_unit": "KILOMETER"}
    assert (await verify(CONVERT, call("convert_units", args)))["reward"] == 1.0
    assert (await verify(CONVERT, call("convert_units", args), string_match="exact"))["reward"] == 0.0


async def test_null_arguments_count_as_absent_and_extra_arguments_need_permission():
    lisbon, porto = (c["arguments"] for c in FORECASTS["expected_calls"])
    with_null = [call("get_forecast", lisbon | {"days": None}), call("get_forecast", porto, 1)]
    assert (await verify(FORECASTS, *with_null))["reward"] == 1.0
    with_extra = [call("get_forecast", lisbon | {"days": 1}), call("get_forecast", porto, 1)]
    assert (await verify(FORECASTS, *with_extra))["reward"] == 0.0
    assert (await verify(FORECASTS, *with_extra, allow_extra_args=True))["reward"] == 1.0


async def test_nested_objects_must_match_key_by_key():
    args = json.loads(json.dumps(BOOKING["expected_calls"][0]["arguments"]))
    args["slot"]["time"] = "19:00"
    assert (await verify(BOOKING, call("book_table", args)))["reward"] == 0.0
    args["slot"] = {"date": "2024-05-03", "time": "19:30", "timezone": "UTC"}  # extra keys inside are never allowed
    assert (await verify(BOOKING, call("book_table", args), allow_extra_args=True))["reward"] == 0.0


# --- wrong, missing, extra and malformed calls -----------------------------------------------------------------------


async def test_a_wrong_function_scores_zero_with_no_partial_credit():
    args = CONVERT["expected_calls"][0]["arguments"]
    result = await verify(CONVERT, call("get_forecast", args))
    assert (result["reward"], result["name_match"], result["args_match"]) == (0.0, 0.0, 0.0)


async def test_right_name_wrong_arguments_gets_name_credit_only():
    result = await verify(CONVERT, call("convert_units", {"value": 12.5, "from_unit": "km", "to_unit": "mile"}))
    assert (result["reward"], result["name_match"], result["args_match"]) == (0.0, 1.0, 0.0)


async def test_missing_and_extra_calls():
    lisbon, porto = expected_items(FORECASTS)
    missing = await verify(FORECASTS, lisbon)
    assert (missing["reward"], missing["args_match"]) == (0.0, 0.5)
    extra = [lisbon, porto, call("get_forecast", {"city": "Faro"}, 2)]
    assert (await verify(FORECASTS, *extra))["reward"] == 0.0
    assert (await verify(FORECASTS, *extra, allow_extra_calls=True))["reward"] == 1.0


async def test_fraction_mode_gives_partial_reward_diluted_by_extra_calls():
    lisbon, porto = expected_items(FORECASTS)
    assert (await verify(FORECASTS, lisbon, reward_mode="fraction"))["reward"] == 0.5
    extra = [lisbon, porto, call("get_forecast", {"city": "Faro"}, 2), call("convert_units", {}, 3)]
    assert (await verify(FORECASTS, *extra, reward_mode="fraction"))["reward"] == 0.5
    assert (await verify(FORECASTS, *extra, reward_mode="fraction", allow_extra_calls=True))["reward"] == 1.0


async def test_malformed_arguments_never_match_but_keep_name_credit():
    result = await verify(CONVERT, call("convert_units", '{"value": 12.5, "from_unit": "mile"'))
    assert (result["reward"], result["name_match"], result["num_malformed"]) == (0.0, 1.0, 1)
    assert "not valid JSON" in result["predicted_calls"][0]["error"]
    not_object = await verify(CONVERT, call("convert_units", "[12.5]"))
    assert (not_object["reward"], not_object["num_malformed"]) == (0.0, 1)


async def test_no_call_expected():
    assert (await verify(NO_CALL, message("You're welcome!")))["reward"] == 1.0
    result = await verify(NO_CALL, call("get_forecast", {"city": "Lisbon"}))
    assert (result["reward"], result["name_match"], result["args_match"]) == (0.0, 0.0, 0.0)


async def test_a_text_answer_when_calls_are_expected_scores_zero():
    result = await verify(CONVERT, message("12.5 miles is about 20.1 km."))
    assert (result["reward"], result["num_predicted"]) == (0.0, 0)


async def test_pairing_is_a_maximum_matching_not_greedy():
    """Both expected calls fit the first prediction; greedy pairing would then fail the second."""
    row = FORECASTS | {
        "expected_calls": [
            {"name": "get_forecast", "arguments": {"city": "Lisbon"}},
            {"name": "get_forecast", "arguments": {"city": "Lisbon", "days": 2}},
        ]
    }
    predicted = [call("get_forecast", {"city": "Lisbon", "days": 2}), call("get_forecast", {"city": "Lisbon"}, 1)]
    assert (await verify(row, *predicted, allow_extra_args=True))["reward"] == 1.0


async def test_expected_arguments_may_be_json_text():
    row = CONVERT | {
        "expected_calls": [
            {"name": "convert_units", "arguments": json.dumps(CONVERT["expected_calls"][0]["arguments"])}
        ]
    }
    assert (await verify(row, *expected_items(CONVERT)))["reward"] == 1.0


def test_rows_with_unusable_expected_calls_are_rejected():
    http = TestClient(make_server().setup_webserver())
    response = {"id": "r", "created_at": 0, "model": "m", "output": []}
    for bad in ([{"name": "f", "arguments": "[1]"}], [{"name": "", "arguments": {}}], None):
        assert http.post("/verify", json=CONVERT | {"expected_calls": bad, "response": response}).status_code == 422


def test_example_data_is_what_the_generator_writes(tmp_path):
    generate_data.main(["--output", str(tmp_path / "example.jsonl")])
    assert (tmp_path / "example.jsonl").read_text() == DATA.read_text()
    assert [json.loads(line) for line in DATA.read_text().splitlines()] == ROWS
