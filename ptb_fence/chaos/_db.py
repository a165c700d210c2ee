"""ChaosDatabase: the chaos run's tables and connections (SQLite file or PostgreSQL)."""

from __future__ import annotations

import sqlite3
import urllib.parse
from typing import Any, List, Optional, Sequence, Tuple

from ptb_fence.stores._admin_sql import AdminStatements
from ptb_fence.stores._outbox_sql import outbox_table_name
from ptb_fence.stores._state_sql import state_table_name
from ptb_fence.stores.postgres._sql import postgres_admin_statements
from ptb_fence.stores.sqlite._sql import sqlite_admin_statements

__all__ = ["ChaosDatabase"]

_SQLITE_PREFIX = "sqlite:///"


class ChaosDatabase:
    """Where a chaos run keeps its rows, and how to reach them.

    A run uses five tables in one database, all named ``<prefix>_<name>``:

    - ``updates``: the :class:`~ptb_fence.SQLiteUpdateStore` /
      :class:`~ptb_fence.PostgresUpdateStore` table of the run;
    - ``domain``: the handlers' fenced domain writes, one row per write and **no unique key**, so
      a double write shows up as a second row of the same ``update_id``;
    - ``runs``: the handler-run log, one row per handler run (written before the handler does
      anything else);
    - ``events``: what the workers report (``fenced_out`` transactions, ``skip`` of an
      idempotent plain-transaction write, ``tx_error``, ``exhaustion_failed``);
    - ``exhaustions``: one row per exhaustion delivered to ``handle_exhaustion``;
    - ``claims``: every claim of the ``updates`` table, written by a trigger in the claim's own
      transaction (an instrument of the run: it shows claims whose handler never started).

    Args:
        url (:obj:`str`): ``sqlite:///absolute/path`` or a PostgreSQL DSN (URI or key/value).
        prefix (:obj:`str`): The table name prefix (letters, digits, underscores).

    Raises:
        ValueError: An empty SQLite path.
    """

    __slots__ = ("kind", "path", "prefix", "url")

    def __init__(self, url: str, prefix: str) -> None:
        self.url = url
        self.prefix = prefix
        if url.startswith(_SQLITE_PREFIX):
            self.kind = "sqlite"
            self.path: Optional[str] = url[len(_SQLITE_PREFIX) - 1 :]
            if self.path in ("", "/"):
                raise ValueError("sqlite:/// needs a file path, e.g. sqlite:////tmp/chaos.sqlite3")
        else:
            self.kind = "postgresql"
            self.path = None

    # -- names -----------------------------------------------------------------------------
    def table(self, name: str) -> str:
        """The full name of one of the run's tables (``updates``, ``domain``, …)."""
        return f"{self.prefix}_{name}"

    @property
    def is_sqlite(self) -> bool:
        """:obj:`bool`: Whether the run uses a SQLite file."""
        return self.kind == "sqlite"

    @property
    def placeholder(self) -> str:
        """:obj:`str`: The driver's placeholder (``?`` or ``%s``)."""
        return "?" if self.is_sqlite else "%s"

    def admin_sql(self) -> AdminStatements:
        """The store's admin statements for the run's ``updates`` table (no parameters used
        by the runner, so they run unchanged through :meth:`query`)."""
        table = self.table("updates")
        if self.is_sqlite:
            return sqlite_admin_statements(table)
        return postgres_admin_statements(table)

    def sql(self, text: str) -> str:
        """``text`` (written with ``?`` placeholders) in the driver's placeholder style."""
        return text if self.is_sqlite else text.replace("?", "%s")

    def dsn(self, application_name: str) -> str:
        """The PostgreSQL DSN with ``application_name`` set (for ``pg_terminate_backend``)."""
        import psycopg2.extensions

        return str(psycopg2.extensions.make_dsn(self.url, application_name=application_name))

    def describe(self) -> str:
        """A short description without any password."""
        if self.is_sqlite:
            return f"SQLite {self.path}"
        try:
            import psycopg2.extensions

            parts = psycopg2.extensions.parse_dsn(self.url)
        except Exception:
            return "PostgreSQL"
        host = parts.get("host", "local socket")
        port = parts.get("port", "5432")
        name = parts.get("dbname", "")
        return f"PostgreSQL {host}:{port}/{name}"

    def is_local_postgres(self) -> bool:
        """Whether the DSN points at this machine (a restart of the local cluster reaches it)."""
        if self.is_sqlite:
            return False
        try:
            import psycopg2.extensions

            host = psycopg2.extensions.parse_dsn(self.url).get("host", "")
        except Exception:
            host = urllib.parse.urlparse(self.url).hostname or ""
        return host in ("", "localhost", "127.0.0.1", "::1") or host.startswith("/")

    # -- connections -----------------------------------------------------------------------
    def connect(self, application_name: str, timeout: float = 5.0) -> Any:
        """A new autocommit connection for the runner (reads, DDL, ``pg_terminate_backend``)."""
        if self.is_sqlite:
            assert self.path is not None
            lite = sqlite3.connect(self.path, timeout=timeout, isolation_level=None)
            lite.execute(f"PRAGMA busy_timeout = {int(timeout * 1000)}")
            return lite
        import psycopg2

        conn = psycopg2.connect(
            self.dsn(application_name), connect_timeout=max(1, int(timeout))
        )
        conn.autocommit = True
        self.query(conn, "SET statement_timeout = ?", (int(timeout * 1000),))
        return conn

    def query(self, conn: Any, text: str, params: Sequence[Any] = ()) -> List[Tuple[Any, ...]]:
        """Run one statement on ``conn`` (``?`` placeholders) and return its rows."""
        cur = conn.cursor()
        try:
            cur.execute(self.sql(text), tuple(params))
            return [tuple(row) for row in cur.fetchall()] if cur.description is not None else []
        finally:
            cur.close()

    # -- schema ----------------------------------------------------------------------------
    def create_tables(self, conn: Any) -> None:
        """Create the run's own tables (the store creates ``updates`` itself)."""
        bigint = "INTEGER" if self.is_sqlite else "BIGINT"
        statements = [
            # no unique key anywhere: a double write must be visible as two rows
            f"CREATE TABLE IF NOT EXISTS {self.table('domain')} (update_id {bigint} NOT NULL, "
            f"attempt INTEGER NOT NULL, claim_id TEXT NOT NULL, pid INTEGER NOT NULL, "
            f"path TEXT NOT NULL, written_at {bigint} NOT NULL)",
            f"CREATE INDEX IF NOT EXISTS {self.table('domain')}_update_idx "
            f"ON {self.table('domain')} (update_id)",
            f"CREATE TABLE IF NOT EXISTS {self.table('runs')} (update_id {bigint} NOT NULL, "
            f"attempt INTEGER NOT NULL, claim_id TEXT NOT NULL, pid INTEGER NOT NULL, "
            f"started_at {bigint} NOT NULL)",
            f"CREATE TABLE IF NOT EXISTS {self.table('events')} (kind TEXT NOT NULL, "
            f"update_id {bigint} NOT NULL, attempt INTEGER NOT NULL, claim_id TEXT NOT NULL, "
            f"pid INTEGER NOT NULL, at {bigint} NOT NULL, detail TEXT)",
            f"CREATE TABLE IF NOT EXISTS {self.table('exhaustions')} (update_id {bigint} "
            f"NOT NULL, attempt INTEGER NOT NULL, claim_id TEXT NOT NULL, error TEXT, "
            f"pid INTEGER NOT NULL, delivered_at {bigint} NOT NULL)",
            f"CREATE TABLE IF NOT EXISTS {self.table('claims')} (update_id {bigint} NOT NULL, "
            f"attempt INTEGER NOT NULL, claim_id TEXT NOT NULL, due_at {bigint} NOT NULL)",
        ]
        for statement in statements:
            self.query(conn, statement)

    def create_claim_log(self, conn: Any) -> None:
        """Log every claim of the ``updates`` table into ``claims`` (triggers).

        A claim is a row that becomes (or is inserted as) ``processing`` with a new claim id;
        renewals and settlements do not change the claim id and are not logged.
        """
        updates, claims = self.table("updates"), self.table("claims")
        columns = f"{claims} (update_id, attempt, claim_id, due_at)"
        values = "(NEW.update_id, NEW.attempts, NEW.claim_id, NEW.due_at)"
        if self.is_sqlite:
            for event, condition in (
                ("UPDATE OF claim_id", "NEW.claim_id IS NOT OLD.claim_id AND "),
                ("INSERT", ""),
            ):
                name = f"{claims}_{event.split()[0].lower()}_trg"
                self.query(
                    conn,
                    f"CREATE TRIGGER IF NOT EXISTS {name} AFTER {event} ON {updates} "
                    f"WHEN {condition}NEW.state = 'processing' "
                    f"BEGIN INSERT INTO {columns} VALUES {values}; END",
                )
            return
        self.query(
            conn,
            f"CREATE OR REPLACE FUNCTION {claims}_fn() RETURNS trigger LANGUAGE plpgsql AS $$ "
            f"BEGIN IF NEW.state = 'processing' AND (TG_OP = 'INSERT' OR NEW.claim_id IS "
            f"DISTINCT FROM OLD.claim_id) THEN INSERT INTO {columns} VALUES {values}; END IF; "
            f"RETURN NULL; END $$",
        )
        self.query(conn, f"DROP TRIGGER IF EXISTS {claims}_trg ON {updates}")
        self.query(
            conn,
            f"CREATE TRIGGER {claims}_trg AFTER INSERT OR UPDATE ON {updates} "
            f"FOR EACH ROW EXECUTE FUNCTION {claims}_fn()",
        )

    def drop_tables(self, conn: Any) -> None:
        """Drop every table of the run."""
        for name in ("updates", "domain", "runs", "events", "exhaustions", "claims"):
            self.query(conn, f"DROP TABLE IF EXISTS {self.table(name)}")
        # the outbox and state tables the update store made beside its table
        self.query(conn, f"DROP TABLE IF EXISTS {outbox_table_name(self.table('updates'))}")
        self.query(conn, f"DROP TABLE IF EXISTS {state_table_name(self.table('updates'))}")
        if not self.is_sqlite:
            self.query(conn, f"DROP FUNCTION IF EXISTS {self.table('claims')}_fn()")
