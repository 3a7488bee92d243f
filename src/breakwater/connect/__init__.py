"""Stage 2, connect: bring each configured server up and keep its state truthful.

Owns the supervisor (`Upstream`: jittered, capped, budgeted connects and reconnects), the transports
(stdio, SSE, streamable HTTP, the cut-tolerant HTTP variant), cross-process admission caps and the
classification of connect failures into `status.Reason` codes. May import the core leaves, `config`
and `tasks._wire`; never the gate, the gateway or the CLI.
"""
