"""The call journal: every attempt the gate makes, recorded off the call path.

Owns attempt records and the observer bus, the SQLite and PostgreSQL stores, per-minute rollups,
per-tool statistics and the timeouts learned from recorded latencies. May import the core leaves and
`config`.
"""
