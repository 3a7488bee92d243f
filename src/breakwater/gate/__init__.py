"""Stage 4, the call gate: every tool call passes here, in the library and in the gateway.

Owns timeouts, breakers, the bulkhead, the turn budget, retries by side-effect class under a retry
budget, outcome classification and the error envelope the model reads. May import the core leaves,
`config`, `tasks`, `connect`, `catalog` and `journal`; never `state` or `observe` (they sit above it
and are handed in: a shared state store as `CallGate(state=...)`, telemetry as its tracer and
observer), the gateway or the CLI.

`_gate` (`CallGate`: resolution and the loop of a call's steps) runs `_admit` (budget, breakers,
bulkhead), `_attempt` (one attempt under its `AttemptDeadline`, classified), `_reconcile` (a lost
answer) over one `_call.Call`; `_health` keeps each tool's recent latency (slowness trips, cheap
probes, learned timeouts in time); `_breaker` (its vocabulary in `_breaker_types`) and `_window`, `_retry_budget`, `_turn_budget`,
`_classify`, `_envelope` and `_tasks` are the parts.
"""
