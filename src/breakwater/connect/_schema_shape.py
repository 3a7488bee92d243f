"""Whether a tool's `inputSchema` (or `outputSchema`) is JSON Schema a model API takes; a tool whose schema is not
costs only itself.

MCP only asks that a schema be an object. The model APIs behind every client check it as JSON Schema
(2020-12) and refuse the whole request, every tool of the agent's, for one schema they cannot read:
`"type": "any"`, `"required": true` (draft 3's), `"exclusiveMinimum": true` (draft 4's), a property
that is a string. So a tool whose schema misuses a keyword is left out, with where and why, as one
whose schema is no object already is (`_tool_list.py`).

Why a walk of its own and not `jsonschema`'s `check_schema`: that validates against the 2020-12
metaschema at 0.8-1.3 ms per schema (draft 7's, 0.17 ms; measured on a three-property schema), so a
server of 10,000 tools took 12 s more to connect, and twenty servers' 400 tools half a second of every
session's first minute. This walk checks the keywords whose misuse the APIs refuse, each value's kind,
in microseconds; a keyword it does not know is left to the server and the client, as before.
May import the core leaves only.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

__all__ = ["schema_problem"]

_TYPES = frozenset({"string", "number", "integer", "boolean", "object", "array", "null"})
#: Keywords whose value is one subschema.
_ONE = (
    "additionalProperties",
    "additionalItems",
    "unevaluatedProperties",
    "unevaluatedItems",
    "not",
    "if",
    "then",
    "else",
    "contains",
    "propertyNames",
)
#: Keywords whose value is an object of subschemas.
_MAP = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
#: Keywords whose value is a non-empty list of subschemas.
_LIST = ("allOf", "anyOf", "oneOf", "prefixItems")
#: Keywords whose value is a number (2020-12: `exclusiveMinimum` is one, draft 4's boolean is not).
_NUMBERS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")
#: Keywords whose value is a count.
_COUNTS = ("minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties", "minContains", "maxContains")
#: Deeper than this is no tool's schema (and an API refuses it too).
_MAX_DEPTH = 64


def schema_problem(schema: Any, root: str) -> str | None:
    """What is wrong with `schema` as JSON Schema, and where under `root` (`inputSchema.properties.x.type: ...`);
    None when the keywords it uses are used as JSON Schema says."""
    # `items` as a list of schemas is draft 2019's and older's tuple form; 2020-12, the default, spells it prefixItems.
    dollar = schema.get("$schema") if isinstance(schema, Mapping) else None
    tuples_ok = isinstance(dollar, str) and "2020-12" not in dollar
    stack: list[tuple[str, Any, int]] = [(root, schema, 0)]
    while stack:
        where, node, depth = stack.pop()
        if isinstance(node, bool):
            continue
        if not isinstance(node, Mapping):
            return f"{where}: a schema must be an object or a boolean, not {_kind(node)}"
        if depth > _MAX_DEPTH:
            return f"{where}: nested deeper than {_MAX_DEPTH} levels"
        problem = _own_problem(node, where)
        if problem is None and isinstance(node.get("items"), list) and not tuples_ok:
            problem = f"{where}.items: a list of schemas is draft 2019's form; in 2020-12 (the default) write prefixItems"
        if problem is not None:
            return problem
        stack.extend((path, child, depth + 1) for path, child in _children(node, where))
    return None


def _own_problem(node: Mapping[str, Any], where: str) -> str | None:
    kind = node.get("type")
    if kind is not None:
        kinds = kind if isinstance(kind, list) else [kind]
        bad = next((k for k in kinds if not isinstance(k, str) or k not in _TYPES), None)
        if bad is not None or not kinds:
            shown = repr(bad) if kinds else "an empty list"
            return f"{where}.type: {shown} is not a JSON Schema type ({', '.join(sorted(_TYPES))})"
    required = node.get("required")
    if required is not None and not (isinstance(required, list) and all(isinstance(r, str) for r in required)):
        return f"{where}.required: must be a list of property names, not {_kind(required)}"
    if "enum" in node and not isinstance(node["enum"], list):
        return f"{where}.enum: must be a list, not {_kind(node['enum'])}"
    for key in _NUMBERS:
        value = node.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            return f"{where}.{key}: must be a number, not {_kind(value)}"
    for key in _COUNTS:
        value = node.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            return f"{where}.{key}: must be a whole number, 0 or more, not {_kind(value)}"
    for key in _MAP:
        value = node.get(key)
        if value is not None and not isinstance(value, Mapping):
            return f"{where}.{key}: must be an object of schemas, not {_kind(value)}"
    for key in _LIST:
        value = node.get(key)
        if value is not None and not (isinstance(value, list) and value):
            shown = "an empty list" if value == [] else _kind(value)
            return f"{where}.{key}: must be a non-empty list of schemas, not {shown}"
    return None


def _children(node: Mapping[str, Any], where: str) -> Iterator[tuple[str, Any]]:
    for key in _ONE:
        if key in node:
            yield f"{where}.{key}", node[key]
    for key in _MAP:
        for name, child in (node.get(key) or {}).items():
            yield f"{where}.{key}.{name}", child
    for key in _LIST:
        for i, child in enumerate(node.get(key) or ()):
            yield f"{where}.{key}[{i}]", child
    items = node.get("items")
    if isinstance(items, list):  # draft 2019's tuple form, which 2020-12 spells prefixItems: each is a schema
        yield from ((f"{where}.items[{i}]", child) for i, child in enumerate(items))
    elif items is not None:
        yield f"{where}.items", items


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"the boolean {str(value).lower()}"
    if isinstance(value, int | float):
        return f"the number {value!r}"
    if isinstance(value, str):
        return f"the string {value[:40]!r}"
    return "a list" if isinstance(value, list) else "an object"
