"""Stage 4, the call gate: every tool call passes here, in the library and in the gateway.

Owns timeouts, breakers, the bulkhead, the turn budget, retries by side-effect class under a retry
budget, outcome classification and the error envelope the model reads. May import the core leaves,
`config`, `tasks`, `connect`, `catalog` and `journal`; never `state`, `observe`, the gateway or the CLI.
"""
