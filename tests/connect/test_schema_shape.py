"""A tool whose schema misuses JSON Schema is left out with where and why: the model APIs refuse every tool for one."""

from __future__ import annotations

import enum
from typing import Any, Literal

import jsonschema  # type: ignore[import-untyped]
import pytest
from pydantic import BaseModel, Field

from breakwater.connect._schema_shape import schema_problem


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Address(BaseModel):
    street: str
    number: int = Field(ge=1)


class Order(BaseModel):
    """The shapes a Python tool's arguments take (the SDK's servers derive their schemas with pydantic)."""

    item: str = Field(min_length=1, max_length=80, pattern=r"^\w+$")
    count: int = Field(default=1, gt=0, le=100)
    price: float | None = None
    tags: list[str] = []
    extra: dict[str, int] = {}
    color: Color = Color.RED
    mode: Literal["fast", "safe"] = "safe"
    ship_to: Address | None = None
    pair: tuple[int, str] | None = None


VALID: list[Any] = [
    Order.model_json_schema(),
    {"type": "object"},
    {"type": "object", "properties": {}, "additionalProperties": False},
    {"type": ["string", "null"]},
    {"type": "object", "properties": {"x": True, "y": {}}},
    {"$schema": "https://json-schema.org/draft/2019-09/schema", "type": "array", "items": [{"type": "string"}]},
    {"$schema": "http://json-schema.org/draft-07/schema#", "type": "object", "definitions": {"a": {"type": "string"}}},
]

#: Each as servers publish them, and the key the reason names.
INVALID: list[tuple[Any, str]] = [
    ({"type": "object", "properties": {"x": {"type": "nonsense"}}}, "inputSchema.properties.x.type"),
    ({"type": "object", "properties": {"x": {"type": "any"}}}, "inputSchema.properties.x.type"),
    ({"type": "object", "properties": {"x": {"type": "string", "required": True}}}, "inputSchema.properties.x.required"),
    ({"type": "object", "properties": {"x": {"type": "number", "exclusiveMinimum": True}}}, "properties.x.exclusiveMinimum"),
    ({"type": "object", "properties": {"x": "string"}}, "inputSchema.properties.x"),
    ({"type": "object", "properties": ["x"]}, "inputSchema.properties"),
    ({"type": "object", "anyOf": []}, "inputSchema.anyOf"),
    ({"type": "array", "items": {"type": "date"}}, "inputSchema.items.type"),
    ({"type": "object", "properties": {"x": {"type": "string", "maxLength": -1}}}, "inputSchema.properties.x.maxLength"),
    ({"type": "object", "required": "x"}, "inputSchema.required"),
    ({"type": "array", "items": [{"type": "string"}]}, "inputSchema.items"),  # draft 2019's form, under 2020-12
]


@pytest.mark.parametrize("schema", VALID)
def test_json_schema_the_metaschema_takes_passes(schema: Any) -> None:
    jsonschema.validators.validator_for(schema).check_schema(schema)  # the reference says it is valid
    assert schema_problem(schema, "inputSchema") is None


@pytest.mark.parametrize(("schema", "where"), INVALID)
def test_a_misused_keyword_is_named_with_where(schema: Any, where: str) -> None:
    with pytest.raises(jsonschema.SchemaError):  # the reference agrees it is not JSON Schema
        jsonschema.Draft202012Validator.check_schema(schema)
    problem = schema_problem(schema, "inputSchema")
    assert problem is not None and where in problem, problem


def test_a_schema_nested_past_any_tools_is_refused_without_recursion() -> None:
    deep: dict[str, Any] = {"type": "object"}
    node = deep
    for _ in range(5000):
        node["properties"] = {"x": {"type": "object"}}
        node = node["properties"]["x"]
    assert "nested deeper" in (schema_problem(deep, "inputSchema") or "")
