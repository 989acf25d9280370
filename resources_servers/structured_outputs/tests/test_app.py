"""structured_outputs' reward rule for every format, both response modes, and every error type."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from unittest.mock import MagicMock

import pytest
from fastapi.testclient import TestClient

from nemo_gym.config_types import AggregateMetricsRequest
from nemo_gym.openai_utils import NeMoGymResponse, NeMoGymResponseCreateParamsNonStreaming
from nemo_gym.server_utils import ServerClient
from resources_servers.structured_outputs.app import (
    StructuredOutputsResourcesServer,
    StructuredOutputsResourcesServerConfig,
    StructuredOutputsVerifyRequest,
)
from resources_servers.structured_outputs.schemas import strictify

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer", "minimum": 0},
        "member": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "nickname": {"type": ["string", "null"]},
    },
}
ROWS = {"type": "array", "items": {"type": "object", "properties": {"city": {"type": "string"},
        "population": {"type": "integer"}, "capital": {"type": "boolean"}, "area": {"type": ["number", "null"]}}}}  # fmt: skip


def make_server(**settings: Any) -> StructuredOutputsResourcesServer:
    config = StructuredOutputsResourcesServerConfig(host="127.0.0.1", port=0, entrypoint="", name="so", **settings)
    return StructuredOutputsResourcesServer(config=config, server_client=MagicMock(spec=ServerClient))


def response(*items: dict[str, Any], **fields: Any) -> NeMoGymResponse:
    return NeMoGymResponse(id="r1", created_at=0, model="m", output=list(items), **fields)


def message(text: str) -> dict[str, Any]:
    return {"type": "message", "id": "m", "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": []}]}  # fmt: skip


def call(name: str, arguments: Any) -> dict[str, Any]:
    raw = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"type": "function_call", "call_id": f"c_{name}", "name": name, "arguments": raw}


async def verify(output: NeMoGymResponse | str, schema: dict | None = PERSON, server=None, **row: Any):
    body = {"responses_create_params": NeMoGymResponseCreateParamsNonStreaming(input="go", tools=row.pop("tools", [])),
            "response": output if isinstance(output, NeMoGymResponse) else response(message(output)), **row}  # fmt: skip
    if schema is not None:
        body["schema_str"] = json.dumps(schema)
    return await (server or make_server()).verify(StructuredOutputsVerifyRequest(**body))


GOOD_JSON = '{"name": "Ada", "age": 36, "member": true, "tags": ["math"], "nickname": null}'


async def test_valid_json_in_a_fence_or_as_the_whole_reply_scores_one():
    fenced = await verify(f"Here you go:\n```json\n{GOOD_JSON}\n```\nAnything else?")
    bare = await verify(GOOD_JSON)
    assert (fenced.reward, fenced.payload_source, fenced.error_type) == (1.0, "fenced_block", None)
    assert (bare.reward, bare.payload_source) == (1.0, "full_text")
    assert fenced.parsed_output["tags"] == ["math"]


@pytest.mark.parametrize(
    ("text", "error_type", "message_part"),
    [
        ("", "empty_response", "no text"),
        ('```json\n{"name": "Ada",}\n```', "parse_error", "invalid JSON"),
        ('{"name": "Ada", "age": NaN, "member": true, "tags": [], "nickname": null}', "parse_error", "NaN"),
        ('{"name": "Ada", "age": "36", "member": true, "tags": [], "nickname": null}', "validation_error", "age"),
        ('{"name": "Ada", "age": -1, "member": true, "tags": [], "nickname": null}', "validation_error", "minimum"),
        ('{"name": "Ada", "age": 3, "member": true, "tags": []}', "validation_error", "nickname"),
        ('{"name": "Ada", "age": 3, "member": true, "tags": [], "nickname": null, "x": 1}', "validation_error", "x"),
        ("[1, 2]", "validation_error", "(at (root))"),
    ],
)
async def test_empty_malformed_and_invalid_json_score_zero_with_the_reason(text, error_type, message_part):
    result = await verify(text)
    assert (result.reward, result.error_type) == (0.0, error_type)
    assert message_part in result.error_message


async def test_strictness_follows_the_config_and_the_row():
    partial = '{"name": "Ada", "extra": 1}'
    assert (await verify(partial)).reward == 0.0
    assert (await verify(partial, strict_schema=False)).reward == 1.0
    assert (await verify(partial, server=make_server(strict_schema=False))).reward == 1.0


def test_strictify_reaches_nested_and_referenced_objects_but_keeps_explicit_choices():
    schema = {"type": "object", "properties": {"a": {"$ref": "#/$defs/inner"}, "b": {"type": "array", "items":
              {"type": "object", "properties": {"c": {}}}}}, "$defs": {"inner": {"type": "object", "properties":
              {"d": {}}, "additionalProperties": True}}}  # fmt: skip
    strict = strictify(schema)
    assert strict["required"] == ["a", "b"] and strict["additionalProperties"] is False
    assert strict["properties"]["b"]["items"]["required"] == ["c"]
    assert strict["$defs"]["inner"]["required"] == ["d"] and strict["$defs"]["inner"]["additionalProperties"] is True
    assert "required" not in schema  # the row's schema is not modified


async def test_formats_are_checked_where_possible():
    schema = {"type": "object", "properties": {"when": {"type": "string", "format": "date"}}}
    assert (await verify('{"when": "2024-02-30"}', schema)).error_type == "validation_error"
    assert (await verify('{"when": "2024-02-29"}', schema)).reward == 1.0
    assert (await verify('{"when": "2024-02-30"}', schema, server=make_server(check_formats=False))).reward == 1.0


async def test_broken_or_missing_schemas_are_schema_errors():
    assert (await verify(GOOD_JSON, {"type": "object", "properties": {"a": {"type": "no-such-type"}}})).error_type == (
        "schema_error"
    )
    assert (await verify(GOOD_JSON, schema=None)).error_type == "schema_error"
    body = await verify(GOOD_JSON, schema=None, json_schema={"type": "object"})
    assert body.reward == 1.0


async def test_yaml_keeps_dates_as_strings_and_rejects_bad_documents():
    schema = {"type": "object", "properties": {"day": {"type": "string", "format": "date"}, "n": {"type": "integer"}}}
    good = await verify("```yaml\nday: 2025-04-12\nn: 3\n```", schema, schema_type="yaml")
    assert (good.reward, good.parsed_output) == (1.0, {"day": "2025-04-12", "n": 3})
    bad = await verify("```yaml\nday: [unclosed\n```", schema, schema_type="yaml")
    assert bad.error_type == "parse_error"
    int_keys = await verify("```yaml\n1: a\n```", {"type": "object"}, schema_type="yaml")
    assert int_keys.error_type == "parse_error" and "not a string" in int_keys.error_message
    assert (await verify("day: 2025-04-12\nn: three", schema, schema_type="yaml")).error_type == "validation_error"


async def test_toml_tables_and_dates():
    schema = {"type": "object", "properties": {"server": {"type": "object", "properties": {"host": {"type": "string"},
              "port": {"type": "integer"}}}, "started": {"type": "string"}}}  # fmt: skip
    toml = '```toml\nstarted = 2024-05-01T08:00:00Z\n\n[server]\nhost = "db.local"\nport = 5432\n```'
    result = await verify(toml, schema, schema_type="toml")
    assert result.reward == 1.0 and result.parsed_output["started"].startswith("2024-05-01T08:00:00")
    assert (await verify("```toml\nport = = 1\n```", schema, schema_type="toml")).error_type == "parse_error"


XML_PERSON = """```xml
<person>
  <name>Ada</name>
  <age>36</age>
  <member>TRUE</member>
  <tags><item>math</item><item>engines</item></tags>
  <nickname/>
</person>
```"""


async def test_xml_maps_elements_to_the_schema_types():
    result = await verify(XML_PERSON, schema_type="xml")
    assert result.reward == 1.0, result.error_message
    assert result.parsed_output == {"name": "Ada", "age": 36, "member": True, "tags": ["math", "engines"],
                                    "nickname": None}  # fmt: skip


async def test_xml_repeated_elements_attributes_and_uncoercible_text():
    repeated = (
        "<p><name>Ada</name><age>3</age><member>false</member><tags>a</tags><tags>b</tags><nickname>x</nickname></p>"
    )
    result = await verify(repeated, schema_type="xml")
    assert result.reward == 1.0 and result.parsed_output["tags"] == ["a", "b"]
    wrong = "<p><name>Ada</name><age>three</age><member>no</member><tags/><nickname/></p>"
    assert (await verify(wrong, schema_type="xml")).error_type == "validation_error"
    raw = await verify(XML_PERSON, schema_type="xml", server=make_server(xml_coerce_types=False))
    assert raw.error_type == "validation_error"  # "36" stays a string


async def test_xml_parse_errors_and_entity_declarations_are_rejected():
    assert (await verify("<p><name>Ada</p>", schema_type="xml")).error_type == "parse_error"
    bomb = '<?xml version="1.0"?><!DOCTYPE p [<!ENTITY a "aaaa">]><p>&a;</p>'
    assert (await verify(bomb, schema_type="xml")).error_type == "parse_error"


async def test_csv_rows_become_typed_objects():
    text = '```csv\ncity,population,capital,area\nOslo,709000,true,454.0\n"Bergen, Vestland",291000,false,\n```'
    result = await verify(text, ROWS, schema_type="csv")
    assert result.reward == 1.0, result.error_message
    assert result.parsed_output[1] == {"city": "Bergen, Vestland", "population": 291000, "capital": False, "area": None}


@pytest.mark.parametrize(
    ("text", "error_type"),
    [
        ("city,population,capital,area\nOslo,709000,true\n", "parse_error"),
        ("city,city\nOslo,Oslo\n", "parse_error"),
        ("city,population,capital,area\nOslo,many,true,1\n", "validation_error"),
        ("city,population,capital\nOslo,1,true\n", "validation_error"),
    ],
)
async def test_malformed_csv(text, error_type):
    assert (await verify(text, ROWS, schema_type="csv")).error_type == error_type


TOOLS = [
    {"type": "function", "name": "submit", "parameters": {"type": "object", "properties": {"record": PERSON}}},
    {"type": "function", "name": "other", "parameters": {"type": "object", "properties": {}}},
]
RECORD = json.loads(GOOD_JSON)


async def test_tool_call_mode_validates_the_payload_argument():
    ok = await verify(response(call("submit", {"record": RECORD}), message("Submitted.")), response_mode="tool_call",
                      tool_name="submit", tool_payload_key="record")  # fmt: skip
    assert (ok.reward, ok.payload_source) == (1.0, "tool_call")
    from_tool = await verify(response(call("submit", {"record": RECORD})), schema=None, tools=TOOLS,
                             response_mode="tool_call", tool_name="submit", tool_payload_key="record")  # fmt: skip
    assert from_tool.reward == 1.0, from_tool.error_message
    whole = await verify(response(call("submit", RECORD)), response_mode="tool_call")
    assert whole.reward == 1.0


@pytest.mark.parametrize(
    ("output", "error_type"),
    [
        (response(message(GOOD_JSON)), "missing_tool_call"),
        (response(call("submit", {"record": RECORD}), call("submit", {"record": RECORD})), "multiple_tool_calls"),
        (response(call("other", {"record": RECORD})), "wrong_tool_name"),
        (response(call("submit", '{"record": ')), "tool_arguments_parse_error"),
        (response(call("submit", {"data": RECORD})), "missing_tool_payload_key"),
        (response(call("submit", {"record": {**RECORD, "age": "old"}})), "validation_error"),
        (response(error={"code": "server_error", "message": "model crashed"}, status="failed"), "api_error"),
    ],
)
async def test_tool_call_mode_failures(output, error_type):
    result = await verify(output, response_mode="tool_call", tool_name="submit", tool_payload_key="record")
    assert (result.reward, result.error_type) == (0.0, error_type)


def test_submission_tools_are_acknowledged_and_reserved_routes_still_work():
    client = TestClient(make_server().setup_webserver())
    assert client.post("/submit_contact", json={"contact": {}}).json()["status"] == "recorded"
    assert client.post("/verify", json={}).status_code == 422  # not swallowed by the catch-all


async def test_aggregate_metrics_break_down_by_format_and_error():
    rows = [{"_ng_task_index": 0, "reward": 1.0, "schema_type": "xml", "response_mode": "text", "error_type": None},
            {"_ng_task_index": 1, "reward": 0.0, "schema_type": "csv", "response_mode": "text",
             "error_type": "parse_error"}]  # fmt: skip
    metrics = (await make_server().aggregate_metrics(AggregateMetricsRequest(verify_responses=rows))).agent_metrics
    assert metrics["schema_type/xml/mean_reward"] == 1.0 and metrics["error_type/parse_error/share"] == 0.5


GOLD_REPLIES = [
    '```json\n{"title": "Salt and Lamplight", "author": "Ines Varga", "year": 1987, "genres": ["maritime fiction", "mystery"]}\n```',
    "```yaml\nname: Riverside Seed Swap\ndate: 2025-04-12\nattendees: 42\nonline: false\norganisers:\n  - Mara Olsen\n"
    "  - Deji Bello\n```",
    "```xml\n<recipe><name>Lentil soup</name><servings>6</servings><vegetarian>true</vegetarian><ingredients>"
    "<item><ingredient>onion</ingredient><grams>150</grams></item><item><ingredient>red lentils</ingredient>"
    "<grams>250</grams></item><item><ingredient>chopped tomatoes</ingredient><grams>400</grams></item></ingredients>"
    "</recipe>\n```",
    "```csv\nplanet,moons,ringed\nMars,2,false\nNeptune,16,true\nVenus,0,false\n```",
]


async def test_every_example_row_accepts_a_correct_answer():
    lines = (Path(__file__).parents[1] / "data" / "example.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    assert len(rows) == 5
    contact = {"full_name": "Priya Raman", "email": "priya.raman@halden-instruments.example", "phone": None,
               "company": "Halden Instruments"}  # fmt: skip
    outputs = [response(message(text)) for text in GOLD_REPLIES]
    outputs.append(response(call("submit_contact", {"contact": contact}), message("Done.")))
    server = make_server()
    for row, output in zip(rows, outputs, strict=True):
        result = await server.verify(StructuredOutputsVerifyRequest.model_validate(row | {"response": output}))
        assert result.reward == 1.0, (row["schema_type"], result.error_message)
