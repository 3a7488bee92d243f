"""Test kit for people who test their own code against breakwater, and for breakwater's own tests.

- `FakeClock`: virtual time; pass it as `clock=` and backoffs, deadlines and budgets run at once.
- `in_memory(server)`: a transport factory (`Breakwater(transports=...)`) that connects to
  in-process SDK servers, so the real supervisor, gate and gateway run without subprocesses.
- `ScriptedServer(tools, handler)`: an in-process server that lists exactly `tools` and answers
  each call with the test's `handler`, recording what arrived (`calls`); run it with `in_memory`.
- `server`: the misbehaving MCP test server (`breakwater testserver`), a real process whose
  latency, errors, hangs and crashes are chosen by flags (imported on its own: `breakwater.testing.server`).

May import every stage below it; in `src/` only the package root (re-exporting `FakeClock`) imports it.

Every name is imported on first use (PEP 562), as the package root's are: a module of this package that
needs none of them (the fork server's launcher, which `python -m breakwater serve` may load before
anything else) does not pay for the SDK they import.
"""

from __future__ import annotations

import importlib
import typing

if typing.TYPE_CHECKING:
    from breakwater.testing._clock import FakeClock
    from breakwater.testing._memory import InProcessServer, in_memory
    from breakwater.testing._scripted import Progress, ScriptedCall, ScriptedServer

__all__ = ["FakeClock", "InProcessServer", "Progress", "ScriptedCall", "ScriptedServer", "in_memory"]

_HOMES = {
    "FakeClock": "breakwater.testing._clock",
    "InProcessServer": "breakwater.testing._memory",
    "in_memory": "breakwater.testing._memory",
    "Progress": "breakwater.testing._scripted",
    "ScriptedCall": "breakwater.testing._scripted",
    "ScriptedServer": "breakwater.testing._scripted",
}


def __getattr__(name: str) -> object:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
