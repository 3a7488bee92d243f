"""Observability beside the journal: OpenTelemetry spans and metrics (the gateway serves Prometheus text itself).

`Telemetry` is an `AttemptObserver` fed by the gate. May import the core leaves, `config`, `journal` and `gate`.
"""
