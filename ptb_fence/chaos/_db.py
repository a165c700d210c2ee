"""ChaosDatabase: the chaos run's tables and connections (SQLite file or PostgreSQL)."""

from __future__ import annotations

import sqlite3
import urllib.parse
from typing import Any, List, Mapping, Optional, Tuple

from ptb_fence.stores._admin_sql import AdminStatements
from ptb_fence.stores._jobs_sql import jobs_table_name
from ptb_fence.stores._broadcasts import broadcast_tables
from ptb_fence.stores._pace import pace_table_name
from ptb_fence.stores._outbox_sql import outbox_table_name
from ptb_fence.stores._queries import Statements, load
from ptb_fence.stores._state_sql import state_table_name
from ptb_fence.stores._steps_sql import steps_table_name
from ptb_fence.stores.postgres._sql import postgres_admin_statements
from ptb_fence.stores.sqlite._sql import sqlite_admin_statements

__all__ = ["ChaosDatabase"]

_SQLITE_PREFIX = "sqlite:///"


class ChaosDatabase:
    """Where a chaos run keeps its rows, and how to reach them.

    A run uses these tables in one database, all named ``<prefix>_<name>``:

    - ``updates``: the :class:`~ptb_fence.SQLiteUpdateStore` /
      :class:`~ptb_fence.PostgresUpdateStore` table of the run.
    - ``domain``: the handlers' fenced domain writes, one row per write. It has **no unique
      key**, so a double write shows up as a second row of the same ``update_id``.
    - ``runs``: the handler-run log, one row per handler run. The row is written before the
      handler does anything else.
    - ``events``: what the workers report. These are ``fenced_out`` transactions, ``skip`` of
      an idempotent plain-transaction write, ``tx_error`` and ``exhaustion_failed``.
    - ``exhaustions``: one row per exhaustion delivered to ``handle_exhaustion``.
    - ``claims``: every claim of the ``updates`` table. A trigger writes it in the claim's own
      transaction. It is an instrument of the run, which shows claims whose handler never
      started.

    Args:
        url (:obj:`str`): ``sqlite:///absolute/path`` or a PostgreSQL DSN (URI or key/value).
        prefix (:obj:`str`): The table name prefix (letters, digits, underscores).

    Raises:
        ValueError: An empty SQLite path.
    """

    __slots__ = ("_statements", "kind", "path", "prefix", "url")

    def __init__(self, url: str, prefix: str) -> None:
        self.url = url
        self.prefix = prefix
        self._statements: Optional[Statements] = None
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

    def admin_sql(self) -> AdminStatements:
        """The store's admin statements for the run's ``updates`` table.

        The runner uses those without parameters, so they run unchanged through :meth:`query`.
        """
        table = self.table("updates")
        if self.is_sqlite:
            return sqlite_admin_statements(table)
        return postgres_admin_statements(table)

    def statements(self) -> Statements:
        """The runner's own statements (the dialect's ``chaos.sql``) on the run's tables.

        Their values are named parameters (``:name`` on SQLite, ``%(name)s`` on PostgreSQL).
        """
        # filled once: a worker reads them for every handler run
        if self._statements is not None:
            return self._statements
        names = {name: self.table(name) for name in
                 ("updates", "domain", "runs", "events", "exhaustions", "claims")}
        names.update(
            domain_index=self.table("domain") + "_update_idx",
            claims_function=self.table("claims") + "_fn",
            claims_trigger=self.table("claims") + "_trg",
            claims_update_trigger=self.table("claims") + "_update_trg",
            claims_insert_trigger=self.table("claims") + "_insert_trg",
            outbox=outbox_table_name(self.table("updates")),
            state=state_table_name(self.table("updates")),
            steps=steps_table_name(self.table("updates")),
            jobs=jobs_table_name(self.table("updates")),
            pace=pace_table_name(self.table("updates")),
            **broadcast_tables(self.table("updates")),
        )
        package = "ptb_fence.stores." + ("sqlite" if self.is_sqlite else "postgres")
        self._statements = load(self.kind, package, ("chaos.sql",)).fill(names, {})
        return self._statements

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
            # timeout= is SQLite's busy timeout
            return sqlite3.connect(self.path, timeout=timeout, isolation_level=None)
        import psycopg2

        conn = psycopg2.connect(
            self.dsn(application_name), connect_timeout=max(1, int(timeout))
        )
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(self.statements()["chaos_statement_timeout"], {"ms": int(timeout * 1000)})
        return conn

    def query(
        self, conn: Any, text: str, params: Optional[Mapping[str, Any]] = None
    ) -> List[Tuple[Any, ...]]:
        """Run the statement ``text`` on ``conn`` with named ``params`` and return its rows."""
        cur = conn.cursor()
        try:
            cur.execute(text, dict(params or {}))
            return [tuple(row) for row in cur.fetchall()] if cur.description is not None else []
        finally:
            cur.close()

    def run(
        self, conn: Any, name: str, params: Optional[Mapping[str, Any]] = None
    ) -> List[Tuple[Any, ...]]:
        """Run the statement ``name`` of the dialect's ``chaos.sql`` on ``conn``.

        Args:
            conn: A DB-API connection to the run's database.
            name: The statement's name.
            params: Its named parameters, if it has any.

        Returns:
            The statement's rows (none for a statement that returns no rows).
        """
        return self.query(conn, self.statements()[name], params)

    # -- schema ----------------------------------------------------------------------------
    def create_tables(self, conn: Any) -> None:
        """Create the run's own tables (the store creates ``updates`` itself)."""
        for name in ("chaos_create_domain", "chaos_create_domain_index", "chaos_create_runs",
                     "chaos_create_events", "chaos_create_exhaustions", "chaos_create_claims"):
            self.run(conn, name)

    def create_claim_log(self, conn: Any) -> None:
        """Log every claim of the ``updates`` table into ``claims`` (triggers).

        A claim is a row that becomes (or is inserted as) ``processing`` with a new claim id.
        Renewals and settlements do not change the claim id and are not logged.
        """
        names: Tuple[str, ...] = (
            ("chaos_claim_log_update_trigger", "chaos_claim_log_insert_trigger")
            if self.is_sqlite
            else ("chaos_claim_log_function", "chaos_drop_claim_log_trigger",
                  "chaos_claim_log_trigger")
        )
        for name in names:
            self.run(conn, name)

    def drop_tables(self, conn: Any) -> None:
        """Drop every table of the run (and the outbox, state, steps, jobs, pace, broadcasts and
        recipients tables the update store made beside its table)."""
        for name in ("updates", "domain", "runs", "events", "exhaustions", "claims", "outbox",
                     "state", "steps", "jobs", "pace", "broadcasts", "recipients"):
            self.run(conn, "chaos_drop_" + name)
        if not self.is_sqlite:
            self.run(conn, "chaos_drop_claim_log_function")
