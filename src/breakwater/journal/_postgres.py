"""A journal shared by a team: PostgreSQL through psycopg 3 (an optional extra), the same schema as SQLite.

Batches are written with `COPY`; migrations run under a transaction-scoped advisory lock, so
replicas that start together migrate once; rollups are merged by the database itself (`ON
CONFLICT DO UPDATE`, histograms as JSONB), so replicas writing the same minute never lose each
other's counts. A connection that failed is closed and replaced on its next use.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from breakwater.journal._records import _COLUMNS, AttemptRecord, JournalError, _as_row
from breakwater.journal._rollups import _Rollup, _RollupKey
from breakwater.journal._sql import Dialect, SQLJournalStore

if TYPE_CHECKING:
    import psycopg

__all__ = ["CONNINFO_FIX", "PostgresJournalStore", "conninfo_problem"]

_POSTGRES = Dialect(
    mark="%s",
    real="DOUBLE PRECISION",
    boolean="BOOLEAN",
    serial="BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY",
    big="BIGINT",
    json_type="JSONB",
    applied_at="TIMESTAMPTZ NOT NULL DEFAULT now()",
    exists_sql="SELECT to_regclass(%s)",
    percentile_disc=True,
    reconnects=True,
)

# Adds two JSONB histograms cell by cell: the stored row's (`r`) and the incoming one's (`EXCLUDED`).
_HISTOGRAM_SUM = (
    "(SELECT COALESCE(jsonb_object_agg(k, n), '{{}}'::jsonb) FROM (SELECT k, SUM(v) AS n FROM ("
    "SELECT key AS k, value::bigint AS v FROM jsonb_each_text(r.{0}) UNION ALL "
    "SELECT key, value::bigint FROM jsonb_each_text(EXCLUDED.{0})) u GROUP BY k) g)"
)


def _quote(identifier: str) -> str:
    if not identifier.replace("_", "a").isalnum():
        raise JournalError(f"not a plain SQL identifier: {identifier!r}")
    return f'"{identifier}"'


#: What to do about a PostgreSQL URL libpq cannot read.
CONNINFO_FIX = "keep only the options libpq reads in [journal] url (postgresql://USER@HOST:PORT/DB?sslmode=...)"


def conninfo_problem(url: str) -> str | None:
    """What psycopg refuses in a PostgreSQL URL before it connects (`?foo=bar`), or None; its password and query values
    left out. `config check` asks it: the journal then failed to open at every start, calls going on unrecorded."""
    import psycopg

    from breakwater.config._redact import Redactor, url_secrets

    try:
        psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.ProgrammingError as exc:
        return f"the PostgreSQL URL: {Redactor(url_secrets(url))(str(exc).strip())}"
    return None


class PostgresJournalStore(SQLJournalStore["psycopg.Connection[Any]"]):
    """A journal shared by a team: PostgreSQL through psycopg 3, the same schema as SQLite.

    `conninfo` is a libpq URL or string (`postgresql://user@host/db`). Tables live in `schema` when
    given (created if missing), else wherever the connection's `search_path` puts them. Batches are
    written with `COPY`; migrations run under a transaction-scoped advisory lock, so replicas that
    start together migrate once. Rollups are merged by the database itself (`ON CONFLICT DO
    UPDATE`, histograms as JSONB), so replicas writing the same minute never lose each other's counts.
    """

    dialect = _POSTGRES

    def __init__(self, conninfo: str, *, schema: str | None = None, connect_timeout_s: float = 5.0) -> None:
        self.conninfo = conninfo
        self.schema = schema
        self.connect_timeout_s = connect_timeout_s
        from breakwater.config._redact import display_url

        shown = display_url(conninfo) if "://" in conninfo else "postgresql (conninfo)"
        prefix = f"{_quote(schema)}." if schema else ""
        super().__init__(f"{shown} (schema {schema})" if schema else shown, lambda table: prefix + _quote(table))

    def _connect(self) -> psycopg.Connection[Any]:
        try:
            import psycopg
        except ImportError as exc:  # pragma: no cover - the dev extra installs it
            raise JournalError("a PostgreSQL journal needs psycopg 3: pip install 'mcp-breakwater[postgres]'") from exc
        return psycopg.connect(self.conninfo, autocommit=True, connect_timeout=max(1, round(self.connect_timeout_s)))

    def _alive(self, conn: psycopg.Connection[Any]) -> bool:
        return not conn.closed

    def fix_for(self, exc: BaseException) -> str | None:
        """Tables of another layout where the journal's should be, or a URL libpq cannot read (`SQLJournalStore.fix_for`)."""
        sqlstate = getattr(exc, "sqlstate", None) or ""
        if not sqlstate and type(exc).__name__ == "ProgrammingError":  # psycopg's reading of the URL, before any server
            return CONNINFO_FIX
        if sqlstate == "42501":  # insufficient_privilege
            return "grant the role the rights on the journal's tables, or point [journal] url at a database of its own"
        if sqlstate.startswith("42"):  # a column, a type, a table not as ours
            return (
                "its tables are not laid out as this breakwater's journal: point [journal] url at a database of its "
                "own, or at a schema of its own (?options=-csearch_path%3Dbreakwater)"
            )
        return None

    @contextmanager
    def _transaction(self, conn: psycopg.Connection[Any]) -> Iterator[None]:
        with conn.transaction():
            yield

    def _prepare_migration(self, conn: psycopg.Connection[Any]) -> None:
        # One migrator at a time across every replica; released at commit.
        conn.execute("SELECT pg_advisory_xact_lock(hashtext('breakwater_journal_migrate'))")
        if self.schema:
            conn.execute(f"CREATE SCHEMA IF NOT EXISTS {_quote(self.schema)}")

    def _record_version(self, conn: psycopg.Connection[Any], version: int, description: str) -> None:
        conn.execute(f"INSERT INTO {self._versions} (version, description) VALUES (%s, %s)", (version, description))

    def _insert_rows(self, conn: psycopg.Connection[Any], records: Sequence[AttemptRecord]) -> None:
        with conn.cursor() as cur, cur.copy(f"COPY {self._table} ({', '.join(_COLUMNS)}) FROM STDIN") as copy:
            for r in records:
                copy.write_row(_as_row(r))

    def _merge(self, conn: psycopg.Connection[Any], deltas: Mapping[_RollupKey, _Rollup]) -> None:
        # One statement per row, in key order: replicas merging the same minutes never deadlock.
        if not deltas:
            return
        counts = _Rollup.FIELDS
        sql = (
            f"INSERT INTO {self._rollups} AS r (server, tool, minute, {', '.join(counts)}, latency, cut) "
            f"VALUES ({', '.join('%s' for _ in range(len(counts) + 3))}, %s::jsonb, %s::jsonb) "
            f"ON CONFLICT (server, tool, minute) DO UPDATE SET {', '.join(f'{c} = r.{c} + EXCLUDED.{c}' for c in counts)}, "
            f"latency = {_HISTOGRAM_SUM.format('latency')}, cut = {_HISTOGRAM_SUM.format('cut')}"
        )
        params = [
            (*key, *deltas[key].counts, json.dumps(deltas[key].latency), json.dumps(deltas[key].cut)) for key in sorted(deltas)
        ]
        with conn.cursor() as cur:
            cur.executemany(sql, params)
