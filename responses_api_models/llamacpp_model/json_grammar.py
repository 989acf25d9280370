"""JSON Schema to GBNF: the grammar that keeps a tool call's arguments inside the tool's parameter schema.

Covers what tool schemas use: objects with properties (required ones always, in declared order, optional ones after),
strings, numbers, integers, booleans, null, arrays, ``enum``, ``const``, ``anyOf`` / ``oneOf`` and local ``$ref``s.
Anything else raises :class:`UnsupportedSchema`, and the engine falls back to "any JSON object".
Objects without declared properties accept any JSON object. Whitespace is a single optional space, which is what
a small model writes anyway and keeps the grammar small.
"""

from __future__ import annotations

import json
import re
from typing import Any

__all__ = ["UnsupportedSchema", "json_schema_to_gbnf"]

_PRIMITIVES = {
    "ws": '" "?',
    "string": r'"\"" ( [^"\\\x7F\x00-\x1F] | "\\" ( ["\\/bfnrt] | "u" [0-9a-fA-F]{4} ) )* "\""',
    "number": r'"-"? ( [0-9] | [1-9] [0-9]{0,15} ) ( "." [0-9]+ )? ( [eE] [-+]? [0-9]+ )?',
    "integer": r'"-"? ( [0-9] | [1-9] [0-9]{0,15} )',
    "boolean": '"true" | "false"',
    "null": '"null"',
    "value": "object | array | string | number | boolean | null",
    "object": '"{" ws ( string ":" ws value ( "," ws string ":" ws value )* )? ws "}"',
    "array": '"[" ws ( value ( "," ws value )* )? ws "]"',
}


class UnsupportedSchema(ValueError):
    """The schema uses something this converter does not translate."""


def _literal(value: Any) -> str:
    """A GBNF string literal that matches ``value``'s JSON text exactly."""
    return json.dumps(json.dumps(value, ensure_ascii=False), ensure_ascii=False)


class _Converter:
    def __init__(self, root_schema: dict[str, Any]) -> None:
        self.root_schema = root_schema
        self.rules: dict[str, str] = {}
        self.used_primitives: set[str] = {"ws"}

    def _name(self, hint: str) -> str:
        base = re.sub(r"[^a-zA-Z0-9]+", "-", hint).strip("-").lower() or "rule"
        name, n = base, 1
        while name in self.rules or name in _PRIMITIVES or name == "root":
            n += 1
            name = f"{base}-{n}"
        return name

    def _primitive(self, name: str) -> str:
        self.used_primitives.add(name)
        if name in {"value", "object", "array"}:
            self.used_primitives.update(_PRIMITIVES)
        return name

    def _resolve(self, schema: dict[str, Any]) -> dict[str, Any]:
        ref = schema.get("$ref")
        if ref is None:
            return schema
        if not isinstance(ref, str) or not ref.startswith("#/"):
            raise UnsupportedSchema(f"only local $ref is supported, got {ref!r}")
        target: Any = self.root_schema
        for part in ref[2:].split("/"):
            if not isinstance(target, dict) or part not in target:
                raise UnsupportedSchema(f"$ref {ref!r} points nowhere")
            target = target[part]
        return self._resolve(target)

    def visit(self, schema: Any, hint: str) -> str:
        """A GBNF expression for ``schema`` (new rules are added for objects and arrays)."""
        if schema is True or schema == {}:
            return self._primitive("value")
        if not isinstance(schema, dict):
            raise UnsupportedSchema(f"schema must be an object, got {schema!r}")
        schema = self._resolve(schema)
        if "const" in schema:
            return _literal(schema["const"])
        if "enum" in schema:
            return "( " + " | ".join(_literal(v) for v in schema["enum"]) + " )"
        for key in ("anyOf", "oneOf"):
            if key in schema:
                return "( " + " | ".join(self.visit(s, f"{hint}-{i}") for i, s in enumerate(schema[key])) + " )"
        kind = schema.get("type")
        if isinstance(kind, list):
            return "( " + " | ".join(self.visit({**schema, "type": k}, hint) for k in kind) + " )"
        if kind == "object" or (kind is None and "properties" in schema):
            return self._object(schema, hint)
        if kind == "array":
            return self._array(schema, hint)
        if kind in {"string", "number", "integer", "boolean", "null"}:
            return self._primitive(kind)
        if kind is None:
            return self._primitive("value")
        raise UnsupportedSchema(f"unsupported type {kind!r}")

    def _object(self, schema: dict[str, Any], hint: str) -> str:
        properties: dict[str, Any] = schema.get("properties") or {}
        if not properties:
            return self._primitive("object")
        required = [k for k in properties if k in set(schema.get("required") or [])]
        optional = [k for k in properties if k not in required]
        pair = {k: f'{_literal(k)} ws ":" ws {self.visit(v, f"{hint}-{k}")}' for k, v in properties.items()}
        body = ' "," ws '.join(pair[k] for k in required)
        if optional and required:
            body += "".join(f' ( "," ws {pair[k]} )?' for k in optional)
        elif optional:
            # Nothing required: the first property written has no comma before it, so each later optional one
            # may only follow the one declared before it.
            chain = ""
            for key in reversed(optional):
                chain = f'{pair[key]} ( "," ws {chain} )?' if chain else pair[key]
            body = f"( {chain} )?"
        name = self._name(hint)
        self.rules[name] = f'"{{" ws {body} ws "}}"'
        return name

    def _array(self, schema: dict[str, Any], hint: str) -> str:
        items = self.visit(schema.get("items", True), f"{hint}-item")
        name = self._name(hint)
        self.rules[name] = f'"[" ws ( {items} ( "," ws {items} )* )? ws "]"'
        return name


def json_schema_to_gbnf(schema_text: str) -> str:
    """GBNF (root rule ``root``) for the JSON texts that ``schema_text`` (a JSON Schema, as JSON) allows."""
    schema = json.loads(schema_text)
    converter = _Converter(schema)
    root = converter.visit(schema, "root")
    lines = [f"root ::= {root}"]
    lines += [f"{name} ::= {rule}" for name, rule in converter.rules.items()]
    lines += [f"{name} ::= {_PRIMITIVES[name]}" for name in _PRIMITIVES if name in converter.used_primitives]
    return "\n".join(lines) + "\n"
