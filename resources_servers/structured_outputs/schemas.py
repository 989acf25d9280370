"""Loading, tightening and checking the JSON schema a row asks the model's output to follow."""

from __future__ import annotations

import copy
import json
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError, best_match
from jsonschema.validators import validator_for

_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SUBSCHEMA_MAPS = ("properties", "$defs", "definitions", "patternProperties")
_SUBSCHEMA_VALUES = ("items", "additionalProperties", "not", "if", "then", "else", "contains")


def load_schema(schema_str: str | None, schema: dict[str, Any] | None) -> dict[str, Any]:
    """The row's schema (an object, or JSON text); ValueError when it is missing or not a JSON object."""
    if schema is not None:
        return schema
    if schema_str is None:
        raise ValueError("the row has no schema (schema_str or json_schema)")
    loaded = json.loads(schema_str)
    if not isinstance(loaded, dict):
        raise ValueError(f"the schema must be a JSON object, got {type(loaded).__name__}")
    return loaded


def strictify(schema: Any) -> Any:
    """A copy where every object schema with ``properties`` requires all of them and, unless it says otherwise,
    allows no other keys. Models are asked to fill the whole form, so a missing or invented field is an error."""
    schema = copy.deepcopy(schema)
    _tighten(schema)
    return schema


def _tighten(node: Any) -> None:
    if not isinstance(node, dict):
        return
    properties = node.get("properties")
    if isinstance(properties, dict) and properties:
        node["required"] = list(dict.fromkeys([*node.get("required", []), *properties]))
        node.setdefault("additionalProperties", False)
    for key in _SUBSCHEMA_LISTS:
        for child in node.get(key) or []:
            _tighten(child)
    for key in _SUBSCHEMA_MAPS:
        for child in (node.get(key) or {}).values():
            _tighten(child)
    for key in _SUBSCHEMA_VALUES:
        _tighten(node.get(key))


def check_schema(schema: dict[str, Any]) -> str | None:
    """None when the schema itself is valid for its draft (2020-12 unless ``$schema`` says otherwise), else why."""
    try:
        validator_for(schema, default=Draft202012Validator).check_schema(schema)
    except SchemaError as e:
        return f"invalid schema: {e.message}"
    return None


def validation_error(value: Any, schema: dict[str, Any], check_formats: bool = True) -> str | None:
    """None when ``value`` conforms, else the most relevant error with its location in the value."""
    cls = validator_for(schema, default=Draft202012Validator)
    validator = cls(schema, format_checker=cls.FORMAT_CHECKER if check_formats else None)
    error = best_match(validator.iter_errors(value))
    if error is None:
        return None
    where = "/".join(str(part) for part in error.absolute_path) or "(root)"
    return f"{error.message} (at {where})"
