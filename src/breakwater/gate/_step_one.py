"""Step 1 of a call, off the ready path: a server still on its way up, and a tool its list lacks.

A call to a server that is `pending` or `connecting` waits for it (README: "within the call's own timeout"), and the
wait is part of the call: after a restart, a first call that waited 1.3 s for the connection and then gave its attempt
the whole learned 4.07 s took 5.36 s. So the wait is bounded by the timeout the call will have (the caller's, else the
configured one, else the learned one, as `CallGate._resolve_timeout` orders them), and the attempt gets what the wait
left of it, never less than `[call] min_attempt_s`, the least an attempt is started with (the turn budget's rule,
`Call.needed_s`): an attempt cut before it could answer costs the server work and tells nothing.

What is left becomes the attempt's timeout; its source is kept, so the journal still says whose timeout it was, and the
call keeps the wait (`Call.waited_s`) so a cut attempt's error says why its timeout was short. A retry after a lost
connection waits for the reconnect the same way (`wait_for_server`): before, it waited a whole timeout and then gave the
attempt another. Each later attempt starts from the whole timeout again. A ready server's first attempt never comes here
and pays nothing for this.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from breakwater._clock import Clock
from breakwater.connect._readiness import call_window, wait_until_ready
from breakwater.errors import UnknownToolError
from breakwater.gate._call import Call, ServerRecord, ToolRecord, seconds_text
from breakwater.status import ServerState

__all__ = ["MAX_LISTED_TOOLS", "spend_wait", "unknown_tool", "wait_for_server", "wait_window", "waited_note"]

_READY = ServerState.READY

#: The most names an UNKNOWN_TOOL (or unknown server) envelope lists.
MAX_LISTED_TOOLS = 50

#: `CallGate._resolve_timeout`: a known tool's timeout in force and its source.
Resolve = Callable[[ServerRecord, ToolRecord], tuple[float, str]]


def wait_window(
    srv: ServerRecord, tool: str, timeout: float | None, learned: Callable[[str, str], float | None], resolve: Resolve
) -> float:
    """How long a call of `tool` may wait for `srv`: the timeout the call will have, as far as it is known before the
    server lists its tools (a reconnecting server's last list knows the tool; a starting one's config and journal do)."""
    if timeout is not None:
        return timeout
    known = srv.tools.get(tool)
    if known is not None:
        return resolve(srv, known)[0]
    spec = srv.upstream.spec
    own = spec.tools.get(tool)
    if (own is not None and "timeout_s" in own.explicit) or "timeout_s" in spec.call_explicit:
        return call_window(spec, tool)
    value = learned(srv.name, tool)
    return value if value is not None and value > 0 else call_window(spec, tool)


def spend_wait(call: Call, waited: float, resolve: Resolve | None = None) -> None:
    """Take the `waited` seconds off `call`'s next attempt, leaving it at least its minimum (`needed_s`).

    A call an open breaker refuses is left alone: it sends nothing, and its timeout is never resolved. `resolve` is
    needed only for a first attempt, whose timeout may not be resolved yet."""
    if waited <= 0 or call.refusal is not None:
        return
    if math.isnan(call.timeout_s):
        assert resolve is not None, "a later attempt's timeout is resolved"
        call.timeout_s, call.timeout_source = resolve(call.srv, call.info)
    call.full_timeout_s, call.waited_s = call.timeout_s, waited
    call.timeout_s = max(call.timeout_s - waited, call.needed_s)


async def wait_for_server(clock: Clock, call: Call, until: float | None) -> bool:
    """Before a later attempt of `call` (a retry, a re-send of a lost answer): False if its server is not back within the
    call's timeout (nor by `until`); else True, and the attempt gets what the wait left of the timeout (`spend_wait`)."""
    if call.waited_s:  # the last attempt's timeout was shortened by its own wait: this one starts whole again
        call.timeout_s, call.waited_s = call.full_timeout_s, 0.0
    upstream = call.srv.upstream
    if upstream.state is _READY and upstream.client is not None:
        return True
    started = clock.monotonic()
    if not await wait_until_ready(upstream, clock=clock, seconds=call.timeout_s, deadline=until):
        return False
    spend_wait(call, clock.monotonic() - started)
    return True


def waited_note(call: Call, detail: dict[str, Any]) -> str:
    """The words a timed-out attempt's error adds when a wait for its server shortened its timeout (the wait goes in
    `detail`); "" when it did not wait."""
    if not call.waited_s:
        return ""
    detail["waited_for_server_s"] = round(call.waited_s, 3)
    whole, waited = seconds_text(call.full_timeout_s), seconds_text(call.waited_s)
    return f", what was left of its {whole} timeout after waiting {waited} for the server to connect"


def unknown_tool(srv: ServerRecord, tool: str) -> UnknownToolError:
    """No such tool on `srv`; or one it lists that is left out (an invalid definition, the entry's tool filter), and why."""
    detail: dict[str, Any] = {"tools": sorted(srv.tools)[:MAX_LISTED_TOOLS]}
    why = next((t.reason for t in srv.upstream.rejected_tools if t.name == tool), None)
    if why is None:
        return UnknownToolError(server=srv.name, tool=tool, detail=detail)
    return UnknownToolError(
        f"The server lists this tool, but breakwater leaves it out: {why}.", server=srv.name, tool=tool, detail=detail
    )
