"""Stage 2, connect: bring each configured server up and keep its state truthful.

Owns the supervisor (`_upstream.Upstream`: jittered, capped, budgeted connects and reconnects), the
transport seam (`_transports`: a `TransportFactory` per attempt; the default builds stdio, SSE and
streamable HTTP behind the cut-tolerant wrapper of `_http_cut`, with the exit-reporting stdio process
of `_stdio`), cross-process admission caps (`_admission`) and the classification of connect failures
into `status.Reason` codes (`_failures`). May import the core leaves, `config`
and `tasks._wire`; never the gate, the gateway or the CLI.
"""
