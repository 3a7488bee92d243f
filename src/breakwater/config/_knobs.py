"""Knobs: every tunable value, defined once.

A policy is a frozen, keyword-only dataclass whose fields are declared with `knob()`. The field
carries its default, its environment variable and a one-line description, so the README's table
(`breakwater config knobs --markdown`), the environment overrides and validation all read one
source. Precedence, lowest first: the code default, `[defaults]` in breakwater.toml, the
environment variable, then a server's (or tool's) own table.
"""

from __future__ import annotations

import dataclasses
import datetime
import difflib
import functools
import math
import os
import re
import types
import typing
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from breakwater.config._checks import OFF_WORDS
from breakwater.errors import ConfigError

__all__ = [
    "Knob",
    "Policy",
    "as_path",
    "build_policy",
    "check_knobs",
    "env_layer",
    "iter_knobs",
    "knob",
    "knob_range",
    "render_markdown",
]

T = TypeVar("T")
P = TypeVar("P")

_META_KEY = "breakwater.knob"
ENV_PREFIX = "BREAKWATER_"


@dataclass(frozen=True, kw_only=True)
class KnobInfo:
    doc: str
    env: str | None
    minimum: float | None
    maximum: float | None
    choices: tuple[str, ...] | None
    path: bool = False
    #: A path knob that `off` (any of `OFF_WORDS`) turns off.
    off: bool = False


def knob(
    default: T,
    doc: str,
    *,
    env: str | None = None,
    minimum: float | None = None,
    maximum: float | None = None,
    choices: tuple[str, ...] | None = None,
    path: bool = False,
    off: bool = False,
) -> T:
    """Declare a policy field: its default, a one-line description, its env variable and its range.

    Every number knob states `minimum` and `maximum` (a test holds every policy to it); a value
    outside them, or one that is not finite, is refused when the policy is constructed. A `path`
    knob's value is read as a path where one is written (`as_path`); with `off`, the off words turn it off, and
    without, they are refused (a folder named `off` was made).
    """
    info = KnobInfo(doc=doc, env=env, minimum=minimum, maximum=maximum, choices=choices, path=path, off=off)
    field: T = dataclasses.field(default=default, metadata={_META_KEY: info})
    return field


@dataclass(frozen=True, kw_only=True)
class Knob:
    """One knob as rendered for people: where it lives and what it does."""

    section: str
    name: str
    type_name: str
    default: Any
    env: str | None
    doc: str


def _info(f: dataclasses.Field[Any]) -> KnobInfo:
    info = f.metadata.get(_META_KEY)
    if not isinstance(info, KnobInfo):
        raise TypeError(f"field {f.name} is not declared with knob()")
    return info


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin in (types.UnionType, typing.Union):
        return " | ".join(_type_name(a) for a in typing.get_args(tp))
    if origin is typing.Literal:
        return " | ".join(repr(a) for a in typing.get_args(tp))
    if tp is type(None):
        return "none"
    return {float: "seconds/number", int: "integer", bool: "boolean", str: "string"}.get(tp, getattr(tp, "__name__", str(tp)))


def iter_knobs(section: str, policy_cls: type[Any]) -> Iterator[Knob]:
    """The knobs of one policy class, in declaration order."""
    hints = typing.get_type_hints(policy_cls)
    for f in dataclasses.fields(policy_cls):
        info = _info(f)
        yield Knob(
            section=section,
            name=f.name,
            type_name=_type_name(hints[f.name]),
            default=f.default,
            env=info.env,
            doc=info.doc,
        )


def _shown(value: Any) -> str:
    """A value as a config error quotes it: as written for text and numbers, in TOML's words for what Python's repr
    would show as its own (a TOML date-time read as `datetime.datetime(1979, 5, 27, ...)`)."""
    if isinstance(value, datetime.date | datetime.time):
        return f"a TOML date or time ({value.isoformat()})"
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list):
        return "a list"
    return repr(value)


def _coerce(value: Any, tp: Any, *, where: str, path: str | None, name: str, info: KnobInfo) -> Any:
    """Check (and gently convert) one value against its declared type; raise a ConfigError that says how to fix it."""
    origin = typing.get_origin(tp)
    if origin in (types.UnionType, typing.Union):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        tp = next(a for a in args if a is not type(None))
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("1", "true", "yes", "on", "0", "false", "no", "off"):
            return value.lower() in ("1", "true", "yes", "on")
        fix = f"set {name}=true or {name}=false" if path == ENV_LAYER else f"set {name} = true|false"
        raise ConfigError(f"expected true or false, got {_shown(value)}", path=path, key=where, fix=fix)
    if tp in (int, float):
        kind = "a whole number" if tp is int else "a number"
        if isinstance(value, bool):
            raise ConfigError(f"expected {kind}, got {_shown(value)}", path=path, key=where, fix=f"set {name} to {kind}")
        try:
            # A number written as text the way TOML and JSON write one: ASCII digits, no `_` (Python's int() and
            # float() read "1_000" and the Arabic-Indic "٥" too, neither of which a person meant as a number here).
            if isinstance(value, str) and not plain_number(value):
                raise ValueError(value)
            number = tp(value) if isinstance(value, str) else value
        except ValueError:
            raise ConfigError(
                f"expected {kind}, got {_shown(value)}", path=path, key=where, fix=f"set {name} to {kind}"
            ) from None
        if not isinstance(number, (int, float)) or (tp is int and isinstance(number, float) and not number.is_integer()):
            raise ConfigError(f"expected {kind}, got {_shown(value)}", path=path, key=where, fix=f"set {name} to {kind}")
        if isinstance(number, float) and not math.isfinite(number):
            raise ConfigError(f"must be a finite number, got {_shown(value)}", path=path, key=where, fix=_range_fix(name, info))
        return tp(number)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"expected a string, got {_shown(value)}", path=path, key=where, fix=f'set {name} = "..."')
        if info.choices is not None and value not in info.choices:
            raise ConfigError(
                f"expected one of {', '.join(info.choices)}, got {_shown(value)}",
                path=path,
                key=where,
                fix=f"set {name} to one of: {', '.join(info.choices)}",
            )
        return value
    return value


_SQLITE_URL = "sqlite:///"


def as_path(value: str, source: str | None) -> str:
    """A path knob's value as the user meant it, made absolute: `~` is their home, and a relative path written in a
    config file is read from that file's folder (as `servers_file` is); from the environment, from the working
    directory. Empty, off, a URL (`postgresql://`) or a connection string (`host=...`) is left as it is; a
    `sqlite:///` URL's path is read the same way.

    A config file or an agent's `env` block does not expand `~` (`catalog_dir = "~/bw"` made a folder named `~`
    wherever the agent started breakwater), and a relative path was read from there too: one journal per project.
    """
    text = value.strip()
    if not text or text.lower() in OFF_WORDS:  # off, for `protocol_memory_dir` and the journal's `url`
        return value
    prefix = ""
    if text.startswith(_SQLITE_URL):
        prefix, text = _SQLITE_URL, text[len(_SQLITE_URL) :]
    elif "://" in text or text.startswith(("host=", "dbname=")):
        return value
    where = Path(text).expanduser()
    if not where.is_absolute() and source is not None and source != ENV_LAYER:
        # The file's real folder: one file reached by several spellings (a symlink, `../`) is one config (its fingerprint).
        where = Path(source).expanduser().resolve().parent / where
    return prefix + os.path.normpath(where.absolute())


def build_policy(
    policy_cls: type[P],
    layers: list[tuple[Mapping[str, Any], str | None, str]],
) -> P:
    """Build a policy from layered mappings (lowest precedence first).

    Each layer is `(values, file_path, key_prefix)`. Unknown keys are refused with a suggestion.
    """
    hints = typing.get_type_hints(policy_cls)
    fields = {f.name: f for f in dataclasses.fields(policy_cls)}  # type: ignore[arg-type]
    values: dict[str, Any] = {}
    origin: dict[str, tuple[str | None, str]] = {}
    for mapping, path, prefix in layers:
        for key, raw in mapping.items():
            f = fields.get(key)
            # A value from the environment is named by its variable, in the error and in its fix: the
            # user set BREAKWATER_CALL_MAX_IN_FLIGHT, not a key called max_in_flight.
            env = _info(f).env if f is not None and path == ENV_LAYER else None
            where = env or (f"{prefix}.{key}" if prefix else key)
            origin[key] = (path, where)
            if f is None:
                close = difflib.get_close_matches(key, list(fields), n=1)
                fix = f"did you mean {close[0]!r}?" if close else f"known keys: {', '.join(fields)}"
                # `[call] max_attempts` was told "did you mean 'min_attempt_s'?": the key is another section's.
                if (home := _section_of(key, policy_cls)) is not None:
                    fix = f"{key} is a [{home}] key: move it there"
                raise ConfigError("unknown key", path=path, key=where, fix=fix)
            info = _info(f)
            value = _coerce(raw, hints[key], where=where, path=path, name=env or key, info=info)
            if info.path and isinstance(value, str):
                if not info.off and value.strip().lower() in OFF_WORDS:
                    fix = f"leave {env or key} empty for its default place, or name a directory"
                    raise ConfigError(f"{value.strip()!r} cannot turn this off: it is a directory", path=path, key=where, fix=fix)
                value = as_path(value, path)
            values[key] = value
    try:
        return policy_cls(**values)
    except ConfigError as exc:
        if exc.path is None:
            raise _sourced(exc, origin) from None
        raise


def _sourced(exc: ConfigError, origin: Mapping[str, tuple[str | None, str]]) -> ConfigError:
    """A policy's own check failed (`exc`, naming a knob but no file): the error naming the file and key (or variable)
    the offending value came from.

    A check across knobs (`status_tool` the same name as `search_tool`) names one of them, maybe one no layer set (its
    default): the error is then the set one's, the checked knob named before the words. Every other knob it names
    that a layer set is named with its source: `BREAKWATER_SEARCH_TOOL=breakwater_status` was
    `status_tool: the same name as search_tool`, without the variable that made it so.
    """

    def mentioned(key: str) -> bool:
        return re.search(rf"\b{re.escape(key)}\b", f"{exc.detail} {exc.fix or ''}") is not None

    involved = [key for key, (path, _) in origin.items() if path is not None and (key == exc.key or mentioned(key))]
    if exc.key in origin:
        culprit: str | None = exc.key
    else:
        culprit = involved[0] if involved else None
    if culprit is None:
        return exc
    path, where = origin[culprit]
    detail, advice = exc.detail, exc.fix
    if culprit != exc.key and exc.key and not re.search(rf"\b{re.escape(exc.key)}\b", detail):
        detail = f"{exc.key}: {detail}"
    for key in involved:
        other_path, other_where = origin[key]
        if other_path == ENV_LAYER and advice is not None:  # the user set the variable, not a key of that name
            advice = re.sub(rf"\b{re.escape(key)}\b", other_where, advice)
        if key != culprit:
            detail += f"; {key} is set by {other_where if other_path == ENV_LAYER else f'{other_where} in {other_path}'}"
    return ConfigError(detail, path=path, key=where, fix=advice)


def _num(value: float) -> str:
    """A bound as a person writes it: 1073741824, not 1.07374e+09 (`:g` keeps six digits); 0.5 stays 0.5."""
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def _range_fix(name: str, info: KnobInfo) -> str:
    low, high = info.minimum, info.maximum
    if low is not None and high is not None:
        return f"set {name} to {_num(low)} or more, up to {_num(high)}"
    if low is not None:
        return f"set {name} to {_num(low)} or more"
    if high is not None:
        return f"set {name} to {_num(high)} or less"
    return f"set {name} to a finite number"


def _range_text(info: KnobInfo) -> str:
    low, high = info.minimum, info.maximum
    if low is not None and high is not None:
        return f"must be at least {_num(low)} and at most {_num(high)}"
    if low is not None:
        return f"must be at least {_num(low)}"
    if high is not None:
        return f"must be at most {_num(high)}"
    return "must be a finite number"


def knob_range(policy_cls: type[Any], name: str) -> tuple[float | None, float | None]:
    """The `(minimum, maximum)` a number knob accepts."""
    info = _info(next(f for f in dataclasses.fields(policy_cls) if f.name == name))
    return info.minimum, info.maximum


#: A number as text, as TOML, JSON and a person write one: ASCII digits, no `_` (Python's int() and float() read "1_000"
#: and "٥" as well); nan and inf too, to refuse them with their own message. What `_coerce` reads from an environment
#: variable or a quoted value, and the command line's numbers (`cli._common`), through `plain_number`.
_PLAIN_NUMBER = re.compile(r"[+-]?(?:(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|nan|inf|infinity)", re.IGNORECASE)


def plain_number(text: str) -> bool:
    """Whether `text` is a number as a person writes one (ASCII digits, a sign, a point, an exponent, inf or nan)."""
    return _PLAIN_NUMBER.fullmatch(text.strip()) is not None


def _bad_text(value: str) -> bool:
    return any(ord(c) < 0x20 or ord(c) == 0x7F for c in value)


def check_knobs(policy: Any) -> None:
    """Refuse a policy whose values are out of their knobs' ranges: the one check every policy runs on construction.

    Numbers must be finite and within `minimum`..`maximum`; strings must be one of `choices` (when
    given) and free of control characters. The error names the knob; `build_policy` adds the file.
    """
    hints = _hints(policy.__class__)
    for f in dataclasses.fields(policy):
        info = _info(f)
        value = getattr(policy, f.name)
        if (wanted := _wrong_type(value, hints.get(f.name))) is not None:
            # Built in Python, a value is taken as it is: "5" was a timeout, 'no' turned telemetry on (a true string).
            raise ConfigError(f"expected {wanted}, got {_shown(value)}", key=f.name, fix=f"pass {f.name} as {wanted}")
        if value is None or isinstance(value, bool):
            continue
        if isinstance(value, (int, float)):
            bad = (
                not math.isfinite(value)
                or (info.minimum is not None and value < info.minimum)
                or (info.maximum is not None and value > info.maximum)
            )
            if bad:
                raise ConfigError(f"{_range_text(info)}, got {value!r}", key=f.name, fix=_range_fix(f.name, info))
        elif isinstance(value, str):
            if info.choices is not None and value not in info.choices:
                raise ConfigError(
                    f"expected one of {', '.join(info.choices)}, got {value!r}",
                    key=f.name,
                    fix=f"set {f.name} to one of: {', '.join(info.choices)}",
                )
            if _bad_text(value):
                raise ConfigError(f"contains a control character: {value!r}", key=f.name, fix=f"remove it from {f.name}")


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _wrong_type(value: Any, tp: Any) -> str | None:
    """What `value` should have been, when it is not of the knob's declared type `tp` (None: it is, or `tp` is unknown)."""
    if tp is None:
        return None
    if typing.get_origin(tp) in (types.UnionType, typing.Union):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        tp = next((a for a in args if a is not type(None)), None)
    if tp is bool:
        return None if isinstance(value, bool) else "true or false (a bool)"
    if tp is int:
        return None if isinstance(value, int) and not isinstance(value, bool) else "a whole number (an int)"
    if tp is float:
        return None if isinstance(value, (int, float)) and not isinstance(value, bool) else "a number"
    if tp is str:
        return None if isinstance(value, str) else "a string"
    return None


def _section_of(key: str, besides: type) -> str | None:
    """The section (`retry` for RetryPolicy) of another policy that has the knob `key`, if one has."""
    for cls in Policy.__subclasses__():
        if cls is not besides and key in {f.name for f in dataclasses.fields(cls)}:  # type: ignore[arg-type]
            return cls.__name__.removesuffix("Policy").lower()
    return None


class Policy:
    """Base of every policy dataclass: construction checks each knob against its range (`check_knobs`).

    A subclass with its own `__post_init__` (cross-knob rules) calls `super().__post_init__()` first.
    """

    def __post_init__(self) -> None:
        check_knobs(self)


#: Variables breakwater (or its tooling: the lab's pages, scripts/) reads that are no knob of a policy.
#: (CLAUDE_MANAGED_SETTINGS: `_claude_policy.MANAGED_SETTINGS_ENV`, a file the config reads before any policy exists.)
_OTHER_NAMES = (
    "TOKEN",
    "JOURNAL_DB",
    "TASKS_DB",
    "IDEMPOTENCY_DB",
    "LAB_TOKEN",
    "LAB_EXAMPLES",
    "LAB_SCREENSHOT_DIR",
    "CLAUDE_MANAGED_SETTINGS",
)
_OTHER_VARIABLES = frozenset(f"{ENV_PREFIX}{name}" for name in (*_OTHER_NAMES, "TOOLS_DIR", "WEB_SCREENSHOT_DIR"))
_TESTS = f"{ENV_PREFIX}TEST_"  # the test suite's own (BREAKWATER_TEST_POSTGRES, ...)


def unknown_variables(environ: Mapping[str, str] | None = None) -> list[str]:
    """Each `BREAKWATER_*` variable of `environ` that breakwater does not read, with the one it may have meant.

    A misspelt one (`BREAKWATER_CALL_TIMEOUTS=60`) changed nothing, and nothing said so.
    """
    environ = os.environ if environ is None else environ
    known = {_info(f).env for cls in Policy.__subclasses__() for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    known |= _OTHER_VARIABLES
    said = []
    for name in sorted(n for n in environ if n.startswith(ENV_PREFIX) and n not in known and not n.startswith(_TESTS)):
        close = difflib.get_close_matches(name, sorted(k for k in known if k), n=1)
        said.append(f"{name} is no setting of breakwater's" + (f" (did you mean {close[0]}?)" if close else ""))
    return said


#: The `path` of the layer `env_layer` makes: errors say "environment" where a file's name would be.
ENV_LAYER = "environment"


def env_layer(policy_cls: type[Any], environ: Mapping[str, str] | None = None) -> tuple[Mapping[str, Any], str | None, str]:
    """The values that environment variables set for one policy class, as a layer for `build_policy`."""
    environ = os.environ if environ is None else environ
    found: dict[str, Any] = {}
    for f in dataclasses.fields(policy_cls):
        info = _info(f)
        if info.env and info.env in environ:
            found[f.name] = environ[info.env]
    return found, ENV_LAYER, ""


def _fmt_default(value: Any) -> str:
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    return str(value)


def render_markdown(knobs: list[Knob]) -> str:
    """The knob table as Markdown, for the README."""
    lines = [
        "| key | default | environment | description |",
        "|---|---|---|---|",
    ]
    for k in knobs:
        env = f"`{k.env}`" if k.env else "—"
        lines.append(f"| `{k.section}.{k.name}` | `{_fmt_default(k.default)}` | {env} | {k.doc} |")
    return "\n".join(lines) + "\n"
