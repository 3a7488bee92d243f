"""The call journal: every attempt the gate makes, recorded off the call path.

Owns attempt records and the observer bus, the SQLite and PostgreSQL stores, per-minute rollups,
per-tool statistics and the timeouts learned from recorded latencies. May import the core leaves and
`config`.

The modules, from the bottom up: `_records` (what is recorded, the outcome vocabulary, the observer
bus), `_stats` (per-tool figures, percentiles, learned timeouts), `_rollups` (per-minute counts and
latency histograms), `_in_flight` (marks of mutating attempts as they are sent), `_sql` (the
`JournalStore` protocol and the SQL store both databases share), `_sqlite` and `_postgres` (their
dialects), `_writer` (`Journal`: the queue and its writer thread).
"""

from breakwater.journal._in_flight import InFlight
from breakwater.journal._postgres import PostgresJournalStore
from breakwater.journal._records import (
    ANSWERED_OUTCOMES,
    DOWNSTREAM_CLIENT,
    OUTCOMES,
    RECONCILED,
    REFUSAL_OUTCOMES,
    SENT,
    TRACE_ID,
    AttemptObserver,
    AttemptRecord,
    CallTracer,
    JournalError,
    arguments_digest,
    attempt_record,
    fan_out,
    new_call_id,
    new_record,
    outcome_of,
    sent_recorder,
)
from breakwater.journal._rollups import HISTOGRAM_ACCURACY, ROLLUP_BUCKET_S, histogram_quantiles
from breakwater.journal._sql import SCHEMA_VERSION, JournalStore
from breakwater.journal._sqlite import JOURNAL_DB_ENV, SQLiteJournalStore, default_journal_path
from breakwater.journal._stats import TIMEOUT_SOURCES, LearnInput, ToolStats, learned_value, percentile, timeout_in_force
from breakwater.journal._writer import Journal, open_journal_store

__all__ = [
    "ANSWERED_OUTCOMES",
    "DOWNSTREAM_CLIENT",
    "HISTOGRAM_ACCURACY",
    "JOURNAL_DB_ENV",
    "OUTCOMES",
    "RECONCILED",
    "REFUSAL_OUTCOMES",
    "ROLLUP_BUCKET_S",
    "SCHEMA_VERSION",
    "SENT",
    "TIMEOUT_SOURCES",
    "TRACE_ID",
    "AttemptObserver",
    "AttemptRecord",
    "CallTracer",
    "InFlight",
    "Journal",
    "JournalError",
    "JournalStore",
    "LearnInput",
    "PostgresJournalStore",
    "SQLiteJournalStore",
    "ToolStats",
    "arguments_digest",
    "attempt_record",
    "default_journal_path",
    "fan_out",
    "histogram_quantiles",
    "learned_value",
    "new_call_id",
    "new_record",
    "open_journal_store",
    "outcome_of",
    "percentile",
    "sent_recorder",
    "timeout_in_force",
]
