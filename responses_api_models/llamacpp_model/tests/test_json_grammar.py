"""The tool-argument grammar: what the JSON Schema converter emits, and that llama.cpp's own parser takes it."""

from __future__ import annotations

import json
from typing import Any

import pytest

from responses_api_models.llamacpp_model.json_grammar import UnsupportedSchema, json_schema_to_gbnf

SCHEMAS: list[dict[str, Any]] = [
    {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    {
        "type": "object",
        "properties": {
            "a": {"type": "integer"},
            "b": {"type": "array", "items": {"type": "number"}},
            "c": {"enum": ["x", "y"]},
            "d": {"type": ["string", "null"]},
        },
        "required": ["a"],
    },
    {"type": "object", "properties": {"q": {"type": "string"}, "n": {"type": "boolean"}}},
    {"type": "object"},
    {
        "type": "object",
        "$defs": {"point": {"type": "object", "properties": {"x": {"type": "number"}}, "required": ["x"]}},
        "properties": {"p": {"$ref": "#/$defs/point"}, "k": {"const": "fixed"}, "u": {"anyOf": [{"type": "integer"}]}},
        "required": ["p", "k"],
    },
]


def _grammar(schema: dict[str, Any]) -> str:
    return json_schema_to_gbnf(json.dumps(schema))


def test_required_properties_in_order_then_optional_ones_each_behind_a_comma() -> None:
    grammar = _grammar(SCHEMAS[1])
    rule = next(line for line in grammar.splitlines() if '"\\"a\\""' in line)
    assert rule.index('"\\"a\\""') < rule.index('( "," ws "\\"b\\""') < rule.index('( "," ws "\\"c\\""')


def test_an_object_without_properties_accepts_any_object() -> None:
    assert _grammar({"type": "object"}).startswith("root ::= object\n")


@pytest.mark.parametrize("schema", [{"type": "object", "properties": {"f": {"type": "file"}}}, {"$ref": "http://x"}])
def test_unsupported_schemas_raise(schema: dict[str, Any]) -> None:
    with pytest.raises(UnsupportedSchema):
        _grammar(schema)


def test_llama_cpp_parses_every_grammar() -> None:
    pytest.importorskip("xllamacpp")
    from nemo_gym.embedded_model import find_default_gguf
    from responses_api_models.llamacpp_model.native import LlamaModel

    model = LlamaModel(str(find_default_gguf()), n_ctx=256, n_threads=1)
    try:
        assert not model.check_grammar("root ::= undefined-rule")
        for schema in SCHEMAS:
            assert model.check_grammar(_grammar(schema)), schema
    finally:
        model.close()
