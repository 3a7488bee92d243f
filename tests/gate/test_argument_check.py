"""The argument check's quick path says "fits" only where jsonschema does, and leaves every refusal to it."""

from __future__ import annotations

import math
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import mcp.types as types
from hypothesis import given, settings
from hypothesis import strategies as st

from breakwater.catalog._validate import _quick_check, argument_checker, argument_problem, not_json_argument

TYPES = ["string", "integer", "number", "boolean", "null", "object", "array"]
VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=3),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=2), st.integers(), max_size=2),
)
NAMES = st.sampled_from(["a", "b", "c"])
PROPERTY = st.one_of(
    st.just({}),
    st.just(True),
    st.builds(lambda t: {"type": t}, st.sampled_from(TYPES)),
    st.builds(lambda ts: {"type": ts}, st.lists(st.sampled_from(TYPES), min_size=1, max_size=3, unique=True)),
    st.builds(lambda t: {"type": t, "description": "d", "format": "uri"}, st.sampled_from(TYPES)),
    # pydantic's optional argument, and anyOf in general (a branch beyond the quick check spoils the whole).
    st.builds(lambda t: {"anyOf": [{"type": t}, {"type": "null"}], "default": None, "title": "T"}, st.sampled_from(TYPES)),
    st.builds(
        lambda ts, n: {"anyOf": [{"type": t} for t in ts] + ([{"type": "string", "minLength": n}] if n else [])},
        st.lists(st.sampled_from(TYPES), min_size=1, max_size=2),
        st.integers(0, 2),
    ),
    st.builds(lambda t: {"anyOf": [{"type": t}], "type": "string"}, st.sampled_from(TYPES)),
    # Beyond the quick check: it must step aside, not guess.
    st.builds(lambda n: {"type": "string", "minLength": n}, st.integers(0, 3)),
    st.builds(lambda t: {"enum": [t]}, st.sampled_from(["x", 1, None])),
)
SCHEMA = st.builds(
    lambda props, required, extra, draft: {
        "type": "object",
        "properties": props,
        "required": required,
        **({"additionalProperties": extra} if extra is not None else {}),
        **({"$schema": draft} if draft else {}),
    },
    st.dictionaries(NAMES, PROPERTY, max_size=3),
    st.lists(NAMES, max_size=2, unique=True),
    st.sampled_from([None, True, False, {}]),
    st.sampled_from(["", "http://json-schema.org/draft-07/schema#", "https://json-schema.org/draft/2020-12/schema"]),
)


@settings(max_examples=600, deadline=None)
@given(SCHEMA, st.dictionaries(st.sampled_from(["a", "b", "c", "d"]), VALUES, max_size=4))
def test_the_quick_check_never_passes_what_jsonschema_refuses(schema: dict[str, Any], arguments: dict[str, Any]) -> None:
    quick = _quick_check(schema)
    valid = jsonschema.validators.validator_for(schema)(schema).is_valid(arguments)
    if quick is not None and quick(arguments):
        assert valid, (schema, arguments)
    # And the check as a whole answers exactly as jsonschema does.
    tool = types.Tool(name="t", input_schema=schema)
    assert (argument_problem(tool, arguments) is None) == valid, (schema, arguments)


ODD_NUMBERS = st.sampled_from([math.nan, math.inf, -math.inf])
WITH_ODD = st.one_of(
    VALUES, ODD_NUMBERS, st.lists(ODD_NUMBERS, max_size=2), st.dictionaries(st.text(max_size=2), ODD_NUMBERS, max_size=2)
)
ANY_SCHEMA = st.one_of(SCHEMA, st.just({}), st.just({"type": "object", "minProperties": 1}))


@settings(max_examples=400, deadline=None)
@given(ANY_SCHEMA, st.dictionaries(st.sampled_from(["a", "b", "c", "d"]), WITH_ODD, max_size=4))
def test_the_kept_check_answers_as_the_two_checks_do(schema: dict[str, Any], arguments: dict[str, Any]) -> None:
    """The gate's per-tool check (the quick check and the NaN walk in one) gives the same answer, field and all,
    as the schema check followed by the NaN check."""
    tool = types.Tool(name="t", input_schema=schema)
    assert argument_checker(tool)(arguments) == (argument_problem(tool, arguments) or not_json_argument(arguments))


def test_the_quick_check_takes_the_common_flat_schemas_and_steps_aside_for_the_rest() -> None:
    flat = {
        "type": "object",
        "properties": {"text": {"type": "string", "description": "what to echo"}, "n": {"type": "integer"}},
        "required": ["text"],
        "additionalProperties": False,
    }
    quick = _quick_check(flat)
    assert quick is not None
    assert quick({"text": "hi", "n": 3})
    # Each of these is for jsonschema to judge (and name the field).
    assert not quick({"n": 3})  # the required field is missing
    assert not quick({"text": "hi", "extra": 1})  # closed object
    assert not quick({"text": "hi", "n": 2.0})  # an integer-valued float: jsonschema's call
    assert not quick({"text": True})
    assert _quick_check({"type": "object", "properties": {"x": {"type": "string", "pattern": "^a"}}}) is None
    assert _quick_check({"type": "object", "$defs": {}, "properties": {}}) is None
    assert _quick_check({"type": "array"}) is None
    problem = argument_problem(types.Tool(name="t", input_schema=flat), {"text": "hi", "extra": 1})
    assert problem is not None and "extra" in problem.problem


def test_the_quick_check_takes_pydantic_optional_arguments() -> None:
    # What FastMCP and the SDK's MCPServer list for `def echo(payload: str | None = None, a: float | None = None)`.
    schema = {
        "type": "object",
        "title": "echoArguments",
        "properties": {
            "payload": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None, "title": "Payload"},
            "a": {"anyOf": [{"type": "number"}, {"type": "null"}], "default": None, "title": "A"},
        },
    }
    quick = _quick_check(schema)
    assert quick is not None
    assert quick({"payload": "hi", "a": 1.5}) and quick({"payload": None})
    assert not quick({"payload": 3})  # jsonschema's to refuse, naming the field
    problem = argument_problem(types.Tool(name="t", input_schema=schema), {"payload": 3})
    assert problem is not None and problem.field == "payload"
    assert _quick_check({"type": "object", "properties": {"x": {"anyOf": [{"type": "string", "pattern": "^a"}]}}}) is None


def test_a_rejected_value_is_shown_as_json_the_way_the_model_wrote_it() -> None:
    """jsonschema shows values by Python's `repr` ("None", "True", single quotes); the model wrote JSON."""
    schema = {
        "type": "object",
        "properties": {"n": {"type": "number"}, "flag": {"type": "boolean"}, "unit": {"enum": ["kg", "lb"]}},
    }
    tool = types.Tool(name="t", input_schema=schema)
    cases = {
        "n": (None, "null is not of type 'number'"),
        "flag": ({"on": True, "note": "é"}, '{"on": true, "note": "é"} is not of type \'boolean\''),
        "unit": ("stone", '"stone" is not one of ["kg", "lb"]'),
    }
    for field, (value, expected) in cases.items():
        problem = argument_problem(tool, {field: value})
        assert problem is not None and (problem.field, problem.problem) == (field, expected), problem
