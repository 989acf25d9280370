"""From a reply's text to a JSON value, for each output format, guided by the JSON schema where a format is untyped.

JSON, YAML and TOML carry their own types. XML and CSV carry only text, so their leaves are converted to the type the
schema asks for at that place (integer, number, boolean, null, string); text that fits none stays a string and schema
validation then reports it. The XML and CSV mappings are documented in this package's README.
"""

from __future__ import annotations

import csv
import datetime
import io
import json
import re
import tomllib
import xml.etree.ElementTree as ElementTree
from typing import Any, Literal

import yaml

from nemo_gym.verifiers.code_blocks import last_fenced_block

SchemaType = Literal["json", "yaml", "toml", "xml", "csv"]
FENCE_TAGS: dict[str, tuple[str, ...]] = {
    "json": ("json", "jsonc", "json5"),
    "yaml": ("yaml", "yml"),
    "toml": ("toml",),
    "xml": ("xml",),
    "csv": ("csv",),
}
_INTEGER = re.compile(r"[+-]?\d+")
_MAX_REF_DEPTH = 32


class PayloadError(ValueError):
    """The payload is not valid in its format (a ``parse_error``)."""


def extract_payload(text: str, schema_type: SchemaType) -> tuple[str, str]:
    """``(payload, source)``: the last fenced block tagged with the format (or untagged), else the whole reply."""
    block = last_fenced_block(text, FENCE_TAGS[schema_type])
    if block is not None:
        return block, "fenced_block"
    return text.strip(), "full_text"


def parse_payload(payload: str, schema_type: SchemaType, schema: dict[str, Any], coerce_types: bool = True) -> Any:
    """The payload as a JSON value; raises :class:`PayloadError` when it is not valid in ``schema_type``."""
    parser = {"json": _parse_json, "yaml": _parse_yaml, "toml": _parse_toml, "xml": _parse_xml, "csv": _parse_csv}
    return parser[schema_type](payload, SchemaGuide(schema, coerce_types))


# ----------------------------------------------------------------------------------------------------------------------
# Schema guidance for untyped formats
# ----------------------------------------------------------------------------------------------------------------------


class SchemaGuide:
    """Answers "which JSON types may this node have, and what are its children's schemas", following local $refs."""

    def __init__(self, root: dict[str, Any], coerce_types: bool = True) -> None:
        self.root = root
        self.coerce_types = coerce_types

    def resolve(self, schema: Any) -> dict[str, Any]:
        for _ in range(_MAX_REF_DEPTH):
            if not isinstance(schema, dict):
                return {}
            ref = schema.get("$ref")
            if not (isinstance(ref, str) and ref.startswith("#")):
                return schema
            target: Any = self.root
            for part in ref.lstrip("#").strip("/").split("/") if ref != "#" else []:
                part = part.replace("~1", "/").replace("~0", "~")
                target = target.get(part) if isinstance(target, dict) else None
            schema = target
        return {}

    def alternatives(self, schema: Any) -> list[dict[str, Any]]:
        """The schema and its anyOf/oneOf/allOf branches, resolved."""
        schema = self.resolve(schema)
        found = [schema]
        for key in ("anyOf", "oneOf", "allOf"):
            for branch in schema.get(key) or []:
                found.extend(self.alternatives(branch))
        return found

    def types(self, schema: Any) -> set[str]:
        types: set[str] = set()
        for branch in self.alternatives(schema):
            declared = branch.get("type")
            types.update([declared] if isinstance(declared, str) else declared or [])
            for value in branch.get("enum") or ([branch["const"]] if "const" in branch else []):
                types.add(_json_type(value))
        return types

    def property_schema(self, schema: Any, name: str) -> dict[str, Any]:
        for branch in self.alternatives(schema):
            properties = branch.get("properties") or {}
            if name in properties:
                return self.resolve(properties[name])
        for branch in self.alternatives(schema):
            if isinstance(branch.get("additionalProperties"), dict):
                return self.resolve(branch["additionalProperties"])
        return {}

    def items_schema(self, schema: Any) -> dict[str, Any]:
        for branch in self.alternatives(schema):
            if isinstance(branch.get("items"), dict):
                return self.resolve(branch["items"])
        return {}

    def coerce(self, text: str, schema: Any) -> Any:
        """A text leaf as the schema's type: null, boolean, integer, number, else the text itself."""
        if not self.coerce_types:
            return text
        types = self.types(schema)
        lowered = text.strip().lower()
        if "null" in types and lowered in ("", "null"):
            return None
        if "boolean" in types and lowered in ("true", "false"):
            return lowered == "true"
        if ("integer" in types or "number" in types) and _INTEGER.fullmatch(text.strip()):
            return int(text.strip())
        if "number" in types:
            try:
                number = float(text)
            except ValueError:
                return text
            if number == number and number not in (float("inf"), float("-inf")):
                return number
        return text


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    names: dict[type, str] = {str: "string", list: "array", dict: "object"}
    return names.get(type(value), "string")


# ----------------------------------------------------------------------------------------------------------------------
# Formats
# ----------------------------------------------------------------------------------------------------------------------


def _reject_constant(name: str) -> Any:
    raise PayloadError(f"{name} is not valid JSON")


def _parse_json(payload: str, guide: SchemaGuide) -> Any:
    try:
        return json.loads(payload, parse_constant=_reject_constant)
    except json.JSONDecodeError as e:
        raise PayloadError(f"invalid JSON: {e}") from e


class _JsonCompatibleLoader(yaml.SafeLoader):
    """PyYAML's safe loader, except that timestamps stay strings (JSON has no date type)."""


_JsonCompatibleLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def _parse_yaml(payload: str, guide: SchemaGuide) -> Any:
    try:
        value = yaml.load(payload, Loader=_JsonCompatibleLoader)  # a SafeLoader subclass
    except yaml.YAMLError as e:
        raise PayloadError(f"invalid YAML: {e}") from e
    return _json_compatible(value, "YAML")


def _json_compatible(value: Any, fmt: str) -> Any:
    """Dates become ISO strings; non-string mapping keys and other non-JSON values are a parse error."""
    if isinstance(value, dict):
        for key in value:
            if not isinstance(key, str):
                raise PayloadError(f"{fmt} mapping key {key!r} is not a string")
        return {key: _json_compatible(item, fmt) for key, item in value.items()}
    if isinstance(value, list):
        return [_json_compatible(item, fmt) for item in value]
    if isinstance(value, (datetime.date, datetime.time)):  # datetime is a date
        return value.isoformat()
    if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
        raise PayloadError(f"{fmt} value {value!r} has no JSON equivalent")
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    raise PayloadError(f"{fmt} value of type {type(value).__name__} has no JSON equivalent")


def _parse_toml(payload: str, guide: SchemaGuide) -> Any:
    try:
        value = tomllib.loads(payload)
    except tomllib.TOMLDecodeError as e:
        raise PayloadError(f"invalid TOML: {e}") from e
    return _json_compatible(value, "TOML")


def _parse_xml(payload: str, guide: SchemaGuide) -> Any:
    if "<!DOCTYPE" in payload or "<!ENTITY" in payload:
        raise PayloadError("XML document type declarations and entities are not accepted")
    try:
        root = ElementTree.fromstring(payload)
    except ElementTree.ParseError as e:
        raise PayloadError(f"invalid XML: {e}") from e
    return _xml_value(root, guide.resolve(guide.root), guide)


def _xml_value(element: ElementTree.Element, schema: dict[str, Any], guide: SchemaGuide) -> Any:
    children = list(element)
    types = guide.types(schema)
    if "array" in types and not ("object" in types and children and len({c.tag for c in children}) > 1):
        if children:
            return [_xml_value(child, guide.items_schema(schema), guide) for child in children]
        text = (element.text or "").strip()
        return [guide.coerce(text, guide.items_schema(schema))] if text else []
    if children and ("object" in types or not types):
        return _xml_object(children, schema, guide)
    return guide.coerce((element.text or "").strip(), schema)


def _xml_object(children: list[ElementTree.Element], schema: dict[str, Any], guide: SchemaGuide) -> dict[str, Any]:
    """Child elements by tag; a tag repeated (or any tag whose schema is an array) collects one item per element."""
    by_tag: dict[str, list[ElementTree.Element]] = {}
    for child in children:
        by_tag.setdefault(child.tag, []).append(child)
    value: dict[str, Any] = {}
    for tag, elements in by_tag.items():
        child_schema = guide.property_schema(schema, tag)
        if len(elements) > 1:
            item_schema = guide.items_schema(child_schema) if "array" in guide.types(child_schema) else child_schema
            value[tag] = [_xml_value(element, item_schema, guide) for element in elements]
        else:
            value[tag] = _xml_value(elements[0], child_schema, guide)
    return value


def _parse_csv(payload: str, guide: SchemaGuide) -> Any:
    """A header row, then one object per row; cells take the type of their column's schema."""
    rows = list(csv.reader(io.StringIO(payload.strip("\n"))))
    if not rows or not any(cell.strip() for cell in rows[0]):
        raise PayloadError("invalid CSV: no header row")
    header = [name.strip() for name in rows[0]]
    if len(set(header)) != len(header):
        raise PayloadError("invalid CSV: repeated column names in the header")
    item_schema = guide.items_schema(guide.root)
    records = []
    for number, row in enumerate(rows[1:], start=2):
        if not row:
            continue
        if len(row) != len(header):
            raise PayloadError(f"invalid CSV: row {number} has {len(row)} fields, the header has {len(header)}")
        records.append(
            {
                name: guide.coerce(cell.strip(), guide.property_schema(item_schema, name))
                for name, cell in zip(header, row, strict=True)
            }
        )
    return records
