"""Step 1 of a call, off the ready path: a server still on its way up, and a tool its list lacks.

A call to a server that is `pending` or `connecting` waits for it (README: "within the call's own timeout"), and the
wait is part of the call: after a restart, a first call that waited 1.3 s for the connection and then gave its attempt
the whole learned 4.07 s took 5.36 s. So the wait is bounded by the timeout the call will have (the caller's, else the
configured one, else the learned one, as `CallGate._resolve_timeout` orders them), and the attempt gets what the wait
left of it, never less than `[call] min_attempt_s`, the least an attempt is started with (the turn budget's rule,
`Call.needed_s`): an attempt cut before it could answer costs the server work and tells nothing.

What is left becomes the call's per-attempt timeout (a retry of it, rare here, gets the same); its source is kept, so
the journal still says whose timeout it was. A ready server's call never comes here and pays nothing for this.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from breakwater.connect._readiness import call_window
from breakwater.errors import UnknownToolError
from breakwater.gate._call import Call, ServerRecord, ToolRecord

__all__ = ["MAX_LISTED_TOOLS", "spend_wait", "unknown_tool", "wait_window"]

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


def spend_wait(call: Call, waited: float, resolve: Resolve) -> None:
    """Take the `waited` seconds off `call`'s first attempt, leaving it at least its minimum (`needed_s`).

    A call an open breaker refuses is left alone: it sends nothing, and its timeout is never resolved."""
    if waited <= 0 or call.refusal is not None:
        return
    if math.isnan(call.timeout_s):
        call.timeout_s, call.timeout_source = resolve(call.srv, call.info)
    call.timeout_s = max(call.timeout_s - waited, call.needed_s)


def unknown_tool(srv: ServerRecord, tool: str) -> UnknownToolError:
    """No such tool on `srv`; or one it lists that is left out (an invalid definition, the entry's tool filter), and why."""
    detail: dict[str, Any] = {"tools": sorted(srv.tools)[:MAX_LISTED_TOOLS]}
    why = next((t.reason for t in srv.upstream.rejected_tools if t.name == tool), None)
    if why is None:
        return UnknownToolError(server=srv.name, tool=tool, detail=detail)
    return UnknownToolError(
        f"The server lists this tool, but breakwater leaves it out: {why}.", server=srv.name, tool=tool, detail=detail
    )
