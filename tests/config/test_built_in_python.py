# mypy: disable-error-code="arg-type"
# (The wrong types are the point: a caller without a type checker passes them.)
"""A config built in Python is checked as a file's is: every field's type and shape, and the top-level policies reach
every server that sets none of its own (they were silently ignored: each server kept the built-in defaults)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from breakwater import Config, ServerSpec
from breakwater.config import CallPolicy, GatewayPolicy, JournalPolicy, RetryPolicy, TelemetryPolicy
from breakwater.errors import ConfigError


def stdio(name: str = "s", **more: Any) -> ServerSpec:
    return ServerSpec(name=name, transport="stdio", command="x", **more)


def test_the_configs_policies_reach_every_server_that_sets_none_of_its_own() -> None:
    own = CallPolicy(timeout_s=9)
    config = Config(servers=(stdio("a"), stdio("b", call=own)), call=CallPolicy(timeout_s=0.5), retry=RetryPolicy(max_attempts=1))
    a, b = config.servers
    assert (a.call.timeout_s, b.call.timeout_s) == (0.5, 9)
    assert a.retry.max_attempts == 1 and b.retry.max_attempts == 1
    assert Config(servers=[stdio()]).servers[0].call == CallPolicy()  # a list is taken too, as a tuple


@pytest.mark.parametrize(
    ("build", "said"),
    [
        (lambda: ServerSpec(name="x", transport="pigeon", command="x"), "servers.x.transport: expected stdio, http or sse"),
        (lambda: ServerSpec(name="x", transport="stdio"), "servers.x.command: a stdio server needs a command"),
        (lambda: ServerSpec(name="x", transport="http"), "servers.x.url: an HTTP server needs a url"),
        (lambda: ServerSpec(name="", transport="stdio", command="x"), "name: a server needs a name"),
        (lambda: ServerSpec(name=5, transport="stdio", command="x"), "name: a server needs a name"),
        (lambda: stdio(args="-v"), "servers.s.args: expected a sequence of strings"),
        (lambda: stdio(env={"K": 1}), "servers.s.env: expected a mapping of strings to strings"),
        (lambda: stdio(call={"timeout_s": 1}), "servers.s.call: expected a CallPolicy"),
        (lambda: Config(servers=("a",)), "servers: expected a sequence of ServerSpec"),
        (lambda: Config(servers=(stdio("d"), stdio("d"))), "servers.d: two servers are named 'd'"),
        (lambda: CallPolicy(timeout_s="5"), "timeout_s: expected a number, got '5'"),
        (lambda: CallPolicy(timeout_s=True), "timeout_s: expected a number, got True"),
        (lambda: CallPolicy(max_in_flight=1.5), "max_in_flight: expected a whole number (an int), got 1.5"),
        (lambda: GatewayPolicy(share="false"), "share: expected true or false (a bool), got 'false'"),
        # A true string: telemetry turned on by "no".
        (lambda: TelemetryPolicy(enabled="no"), "enabled: expected true or false (a bool), got 'no'"),
        (lambda: JournalPolicy(url=5), "url: expected a string, got 5"),
    ],
)
def test_a_field_that_cannot_be_used_is_refused_naming_it_and_the_fix(build: Callable[[], object], said: str) -> None:
    with pytest.raises(ConfigError) as refused:
        build()
    assert str(refused.value).startswith(said) and "\n  fix: pass " in str(refused.value), refused.value


def test_a_spec_keeps_its_own_copy_of_env() -> None:
    env = {"TOKEN": "a"}
    spec = stdio(env=env)
    env["TOKEN"] = "b"  # changed the frozen spec through the caller's dict
    assert spec.env == {"TOKEN": "a"}
