"""Arguments checked against a tool's input schema before the call is sent.

A call whose arguments cannot fit the tool's `inputSchema` is answered INVALID_ARGUMENTS, naming the
field, instead of reaching the server and coming back as the tool's own error (which a model reads
as "fix the input" with no hint which). Uses `jsonschema`, which the MCP SDK already depends on (its
client validates structured results with it). A schema that is not valid JSON Schema is the server's
business: such a tool's arguments are not checked here. A number JSON cannot carry (NaN, an
infinity, or a literal such as `1e999` that overflows to one) is refused too, whatever the schema:
sent on, it would reach the server as `null`. May import the core leaves only.
"""

from __future__ import annotations

import functools
import importlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import mcp.types as types

from breakwater._wire import has_non_finite, non_finite_path

__all__ = ["ArgumentCheck", "ArgumentProblem", "argument_checker", "argument_problem", "fits_schema", "not_json_argument"]

_MAX_SHOWN = 80  # characters of a rejected value shown back to the model


@dataclass(frozen=True, kw_only=True)
class ArgumentProblem:
    """Why the arguments do not fit: the field (a dotted path, "" for the arguments object) and the rule."""

    field: str
    problem: str

    def sentence(self) -> str:
        """The problem as the model reads it."""
        where = f"argument '{self.field}'" if self.field else "the arguments"
        return f"The tool's input schema rejects {where}: {self.problem}."


class _Validators:
    """Compiled validators by schema (compiling costs far more than validating).

    Found first by the schema object's identity, which is what every call of a listed tool passes
    (the tool list is kept until the server re-lists): keying by the schema's JSON text cost ~8 µs
    per call, a third of the whole check (bench/proxy_overhead.py --profile). The text stays the key
    of the compiled validators, so a re-listed, unchanged schema is not compiled again.
    """

    _MAX_BY_ID = 4096  # schema objects remembered by identity (each entry also keeps its object alive)

    def __init__(self) -> None:
        self._by_schema: dict[str, tuple[Any, Callable[[dict[str, Any]], bool] | None]] = {}
        # id -> (the schema object, held so its id cannot be reused while cached; its validator; its quick check)
        self._by_id: dict[int, tuple[Mapping[str, Any], Any, Callable[[dict[str, Any]], bool] | None]] = {}

    def get(self, schema: Mapping[str, Any]) -> tuple[Any, Callable[[dict[str, Any]], bool] | None]:
        """The schema's compiled validator (None: not valid JSON Schema) and its quick check (None: none applies)."""
        known = self._by_id.get(id(schema))
        if known is not None and known[0] is schema:
            return known[1], known[2]
        key = json.dumps(schema, sort_keys=True, default=str)
        if key not in self._by_schema:
            jsonschema = _jsonschema()
            cls = jsonschema.validators.validator_for(schema)
            try:
                cls.check_schema(schema)
                self._by_schema[key] = (cls(schema), _quick_check(schema))
            except jsonschema.SchemaError:
                self._by_schema[key] = (None, None)
        if len(self._by_id) >= self._MAX_BY_ID:
            self._by_id.clear()
        validator, quick = self._by_schema[key]
        self._by_id[id(schema)] = (schema, validator, quick)
        return validator, quick


# The quick check. `jsonschema`'s `is_valid` takes ~10 µs for a one-property schema (its generic
# keyword dispatch; measured with bench/gate_overhead.py, half of the gate's own 20 µs budget), and
# most tools' schemas are a flat object of typed properties. For such a schema a few type checks
# say "fits" with certainty; anything they cannot vouch for (another keyword, a float for an
# integer, a missing required field, an unknown key under additionalProperties: false) goes to
# `jsonschema`, which alone decides what is wrong. So the answers are jsonschema's; only the cost of
# the common case changes (tests/gate/test_argument_check.py holds the two to the same answers).

#: Keywords of the object schema that the quick check understands, or that assert nothing (annotations;
#: `format` is not asserted by the validators built here, which get no format checker).
_OBJECT_KEYWORDS = frozenset(
    {"type", "properties", "required", "additionalProperties", "$schema", "$id", "$comment", "title", "description", "examples"}
)
_PROPERTY_KEYWORDS = frozenset({"type", "$comment", "title", "description", "default", "examples", "format", "deprecated"})
_TYPE_CHECKS: dict[str, Callable[[Any], bool]] = {
    "string": lambda v: type(v) is str,
    "integer": lambda v: type(v) is int,  # a float such as 2.0 may be an integer too: jsonschema judges it
    "number": lambda v: type(v) is int or type(v) is float,
    "boolean": lambda v: type(v) is bool,
    "null": lambda v: v is None,
    "object": lambda v: type(v) is dict,
    "array": lambda v: type(v) is list,
}


def _accepts(spec: Any) -> Callable[[Any], bool] | None:
    """A check that a value certainly fits property schema `spec`, or None when `spec` is beyond the quick check."""
    if spec is True or spec == {}:
        return lambda _v: True
    if isinstance(spec, Mapping) and "anyOf" in spec and "type" not in spec:
        return _accepts_any_of(spec)
    if not isinstance(spec, Mapping) or spec.keys() - _PROPERTY_KEYWORDS:
        return None
    kind = spec.get("type")
    if kind is None:
        return lambda _v: True
    kinds = [kind] if isinstance(kind, str) else kind
    if not isinstance(kinds, list) or not kinds or not all(isinstance(k, str) and k in _TYPE_CHECKS for k in kinds):
        return None
    checks = tuple(_TYPE_CHECKS[k] for k in kinds)
    if len(checks) == 1:
        return checks[0]
    return lambda v: any(check(v) for check in checks)


def _accepts_any_of(spec: Mapping[str, Any]) -> Callable[[Any], bool] | None:
    """`anyOf` of quick-checkable branches: what a Python tool's optional argument looks like.

    pydantic (so FastMCP and the SDK's `MCPServer`) writes `x: str | None = None` as
    `{"anyOf": [{"type": "string"}, {"type": "null"}], "default": null}`; without this every such
    tool's call paid jsonschema's full pass (~40 µs: bench/proxy_overhead.py's own echo tool).
    """
    branches = spec.get("anyOf")
    if spec.keys() - _PROPERTY_KEYWORDS - {"anyOf"} or not isinstance(branches, list) or not branches:
        return None
    checks = [_accepts(branch) for branch in branches]
    if any(check is None for check in checks):
        return None
    ready = tuple(check for check in checks if check is not None)
    return lambda v: any(check(v) for check in ready)


def _quick_check(schema: Mapping[str, Any]) -> Callable[[dict[str, Any]], bool] | None:
    """For a flat object schema, `fits(arguments)`: True only when they certainly fit; None for any other schema."""
    if schema.keys() - _OBJECT_KEYWORDS or schema.get("type", "object") != "object":
        return None
    properties = schema.get("properties", {})
    required = schema.get("required", [])
    extra = schema.get("additionalProperties", True)
    if not isinstance(properties, Mapping) or not isinstance(required, list) or extra not in (True, False, {}):
        return None
    if not all(isinstance(name, str) for name in required):
        return None
    checks: dict[str, Callable[[Any], bool]] = {}
    for name, spec in properties.items():
        check = _accepts(spec)
        if check is None:
            return None
        checks[name] = check
    closed = extra is False
    needed = tuple(required)

    def fits(arguments: dict[str, Any]) -> bool:
        for name in needed:
            if name not in arguments:
                return False
        for name, value in arguments.items():
            check = checks.get(name)
            if check is None:
                if closed:
                    return False
            elif not check(value):
                return False
        return True

    return fits


@functools.cache
def _jsonschema() -> Any:
    # Loaded on first use, as the SDK does: its import tree costs every gateway that never checks a call.
    # (Through importlib: the package ships no type information.)
    module = importlib.import_module("jsonschema")
    importlib.import_module("jsonschema.validators")
    return module


@functools.cache
def _unresolvable() -> type[Exception]:
    cls: type[Exception] = importlib.import_module("referencing.exceptions").Unresolvable
    return cls


_VALIDATORS = _Validators()


def argument_problem(tool: types.Tool, arguments: Mapping[str, Any]) -> ArgumentProblem | None:
    """The first reason `arguments` do not fit `tool`'s input schema, or None when they fit (or it cannot be checked)."""
    schema = tool.input_schema
    if not isinstance(schema, Mapping) or not schema:
        return None
    validator, quick = _VALIDATORS.get(schema)
    if validator is None:
        return None
    instance = arguments if type(arguments) is dict else dict(arguments)
    if quick is not None and quick(instance):
        return None
    unresolvable = _unresolvable()
    try:
        # The common case, fitting arguments, costs one pass; the best error is looked for only when there is one.
        if validator.is_valid(instance):
            return None
        error = _jsonschema().exceptions.best_match(validator.iter_errors(instance))
    except unresolvable:  # a `$ref` the schema does not carry: let the server judge
        return None
    if error is None:
        return None
    path = ".".join(str(p) for p in error.absolute_path)
    if not path and error.validator == "required":
        # "'a' is a required property": the field is the missing one.
        missing = [name for name in error.validator_value if name not in arguments]
        path = str(missing[0]) if missing else ""
        return ArgumentProblem(field=path, problem="it is required and missing")
    message = _in_json_terms(error)
    if len(message) > _MAX_SHOWN * 2:
        message = message[: _MAX_SHOWN * 2] + "…"
    return ArgumentProblem(field=path, problem=message)


def _in_json_terms(error: Any) -> str:
    """jsonschema's message with the rejected value (and an enum's values) written as JSON, not as Python.

    Its messages show values by `repr`: a model that sent `null` read "None is not of type 'number'",
    `true` came back `True` and an object with single quotes, none of which it can send. The value
    leads every such message, so it is rewritten where it does.
    """
    message = str(error.message)
    shown = repr(error.instance)
    if message.startswith(shown):
        message = _json(error.instance) + message[len(shown) :]
    if error.validator == "enum" and isinstance(error.validator_value, list) and message.endswith(repr(error.validator_value)):
        message = message[: -len(repr(error.validator_value))] + _json(error.validator_value)
    return message


def _json(value: Any) -> str:
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):  # not JSON (a library caller's value): as jsonschema showed it
        return repr(value)


def fits_schema(schema: Mapping[str, Any], value: Any) -> bool:
    """Whether `value` is valid against the JSON Schema `schema` (True when the schema cannot be checked)."""
    validator, _ = _VALIDATORS.get(schema)
    if validator is None:
        return True
    try:
        return bool(validator.is_valid(value))
    except _unresolvable():  # a `$ref` the schema does not carry: no verdict
        return True


def not_json_argument(arguments: Mapping[str, Any]) -> ArgumentProblem | None:
    """The first argument that is NaN or infinite (JSON has neither; `1e999` parses to one), or None."""
    where = non_finite_path(arguments if type(arguments) is dict else dict(arguments))
    if where is None:
        return None
    return ArgumentProblem(field=where, problem="it is NaN or infinite, which JSON cannot carry; send a finite number or null")


#: `problem(arguments)`: the first reason a call's arguments cannot be sent, or None (see `argument_checker`).
ArgumentCheck = Callable[[dict[str, Any]], ArgumentProblem | None]


def argument_checker(tool: types.Tool) -> ArgumentCheck:
    """`argument_problem(tool, a) or not_json_argument(a)` as one function of the arguments, for a caller that keeps it.

    What is fixed per definition (the schema's validator, its quick check) is looked up once, here;
    per call, arguments that the quick check vouches for and that hold no NaN or infinity cost one
    pass each, and anything else takes the two checks in full, so the answers are theirs.
    """
    schema = tool.input_schema
    if not isinstance(schema, Mapping) or not schema:
        fits: Callable[[dict[str, Any]], bool] = _anything
    else:
        validator, quick = _VALIDATORS.get(schema)
        fits = _anything if validator is None else quick or _nothing

    def check(arguments: dict[str, Any]) -> ArgumentProblem | None:
        if fits(arguments) and not has_non_finite(arguments):
            return None
        return argument_problem(tool, arguments) or not_json_argument(arguments)

    return check


def _anything(_arguments: dict[str, Any]) -> bool:
    return True  # a schema that is not checked: only JSON's own limits apply


def _nothing(_arguments: dict[str, Any]) -> bool:
    return False  # no quick check for this schema: jsonschema decides every call
