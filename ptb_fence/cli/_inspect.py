"""TableInspector: direct SQL on the public table layout (status, health, list, show, retry),
on its outbox table (``ptb-fence outbox``, the outbox counts of ``status``) and on its steps
table (the steps of ``show``)."""

from __future__ import annotations

import sqlite3
from typing import Any, Callable, Dict, List, Optional, Set, Tuple, TypeVar

from ptb_fence._values import OutboxEntry, StepRecord
from ptb_fence.cli._errors import Refused, StoreFailure
from ptb_fence.cli._format import one_line
from ptb_fence.cli._rows import HealthFigures, Oldest, OldestCall, StatusReport, UpdateRow
from ptb_fence.cli._target import StoreTarget
from ptb_fence.stores import validate_table_name
from ptb_fence.stores._admin_sql import admin_statements
from ptb_fence.stores._outbox_sql import counts_of, entry_of, outbox_table_name
from ptb_fence.stores._steps_sql import record_of, steps_table_name
from ptb_fence.stores.postgres._sql import statements as postgres_statements
from ptb_fence.stores.sqlite._sql import REQUIRED_COLUMNS
from ptb_fence.stores.sqlite._sql import statements as sqlite_statements

__all__ = ["STATES", "TableInspector"]

_T = TypeVar("_T")

STATES: Tuple[str, ...] = ("pending", "processing", "failed", "completed", "abandoned")
"""The states of a row, in lifecycle order."""


class TableInspector:
    """Reads (and, for ``retry``, changes) one existing update table with plain SQL.

    Opening never creates anything: a missing SQLite file or a missing table is refused.

    Args:
        target (:class:`StoreTarget`): The database.
        table (:obj:`str`): The table name (validated here before any SQL runs).
        conn (optional): A connection to ``target`` already opened by the caller (with
            :meth:`StoreTarget.connect_sqlite` or :meth:`StoreTarget.connect_postgres`).
            The inspector owns it from now on and closes it. By default it opens its own.

    Raises:
        ptb_fence.cli._errors.Refused: Bad table name, no such file or table, or a table
            without the columns of an update table.
        ptb_fence.cli._errors.StoreFailure: The database cannot be reached.
    """

    __slots__ = ("_conn", "_named", "_outbox", "_sql", "has_claim_id", "table", "target")

    def __init__(self, target: StoreTarget, table: str, *, conn: Any = None) -> None:
        self._conn: Any = conn
        try:
            self.table = validate_table_name(table)
        except ValueError as exc:
            self.close()
            raise Refused(str(exc)) from None
        self.target = target
        # the store's own statements of the table (admin_*, outbox_*), run by name
        self._named = (sqlite_statements if target.is_sqlite else postgres_statements)(self.table)
        self._outbox = outbox_table_name(self.table)
        if self._conn is None:
            self._conn = (
                target.connect_sqlite() if target.is_sqlite else target.connect_postgres()
            )
        try:
            columns = self._columns()
            if columns is None:
                raise Refused(self._missing_table())
            missing = [c for c in REQUIRED_COLUMNS if c not in columns]
            if missing:
                raise Refused(
                    f"table {self.table!r} in {target.display} is not a ptb_fence update table "
                    f"(it lacks {', '.join(missing)}); check --table"
                )
            self.has_claim_id = "claim_id" in columns
            self._sql = admin_statements(self._named, has_claim_id=self.has_claim_id)
        except BaseException:
            self.close()
            raise

    def _missing_table(self) -> str:
        where = self.target.display
        hint = (
            "check --table, or create it by opening the store (SQLiteUpdateStore creates its "
            "table)"
            if self.target.is_sqlite
            else "check --table, or create it with `ptb-fence migrate`"
        )
        return f"no table {self.table!r} in {where}: {hint}"

    # -- plumbing --------------------------------------------------------------------------
    def close(self) -> None:
        """Close the connection (idempotent)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception:  # pragma: no cover - closing is best effort
                pass

    def __enter__(self) -> "TableInspector":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _fail(self, exc: BaseException) -> StoreFailure:
        return StoreFailure(
            f"{self.target.display}: {type(exc).__name__}: {self.target.redact(one_line(exc))}"
        )

    def _query(self, sql: str, params: Optional[Dict[str, Any]] = None) -> List[Tuple[Any, ...]]:
        params = params or {}
        if self.target.is_sqlite:
            return list(self._conn.execute(sql, params).fetchall())
        with self._conn.cursor() as cur:
            cur.execute(sql, params)
            return list(cur.fetchall()) if cur.description is not None else []

    def _read(self, work: Any) -> Any:
        """Run ``work()`` in one read-only snapshot transaction."""
        try:
            if self.target.is_sqlite:
                self._conn.execute(self._sql.begin_read)
                try:
                    return work()
                finally:
                    if self._conn.in_transaction:
                        self._conn.execute(self._named["admin_rollback"])
            try:
                self._query(self._sql.begin_read)
                return work()
            finally:
                self._conn.rollback()
        except (sqlite3.Error, _pg_error()) as exc:
            raise self._fail(exc) from None

    def _columns(self) -> Optional[Set[str]]:
        try:
            named = self._named
            if self.target.is_sqlite:
                if not self._query(named["admin_table_exists"], {"table": self.table}):
                    return None
                return {str(r[1]) for r in self._query(named["table_info"])}
            quoted = {"quoted": f'"{self.table}"'}
            try:
                if not self._query(named["table_exists"], quoted)[0][0]:
                    return None
                return {str(r[0]) for r in self._query(named["table_columns"], quoted)}
            finally:
                self._conn.rollback()
        except (sqlite3.Error, _pg_error()) as exc:
            raise self._fail(exc) from None

    # -- reads -----------------------------------------------------------------------------
    def status(self, now: int) -> StatusReport:
        """Counts per state, the oldest pending row, and what is due at ``now``."""

        def work() -> StatusReport:
            counts = {state: 0 for state in STATES}
            for state, count in self._query(self._sql.counts):
                counts[str(state)] = int(count)
            oldest = self._query(self._sql.oldest_pending)
            retries, lapsed, exhaustions = self._query(self._sql.due_now, {"now": now})[0]
            return StatusReport(
                now=now,
                counts=counts,
                oldest_pending_update_id=int(oldest[0][0]) if oldest else None,
                oldest_pending_received_at=int(oldest[0][1]) if oldest else None,
                retries_due=int(retries),
                leases_lapsed=int(lapsed),
                unacknowledged_exhaustions=int(exhaustions),
            )

        result: StatusReport = self._read(work)
        return result

    def health(self, now: int) -> HealthFigures:
        """The figures ``ptb-fence health`` judges at ``now``.

        They are the oldest pending row, the oldest due retry, the oldest lapsed lease and the
        unacknowledged exhaustions. With an outbox table they include its oldest unsent call
        and its unacknowledged failed calls."""
        at = {"now": now}

        def oldest(sql: str, params: Optional[Dict[str, Any]] = None) -> Optional[Oldest]:
            found = self._query(sql, params)
            return Oldest(int(found[0][0]), int(found[0][1])) if found else None

        has_outbox = self.outbox_exists()

        def oldest_unsent() -> Optional[OldestCall]:
            found = self._query(self._sql.oldest_unsent_call)
            if not found:
                return None
            call_id, update_id, since = found[0]
            return OldestCall(int(call_id), int(update_id), int(since))

        def failed_calls() -> int:
            found = self._query(self._sql.failed_call_count)
            return int(found[0][0])

        def work() -> HealthFigures:
            return HealthFigures(
                now=now,
                oldest_pending=oldest(self._sql.oldest_pending),
                oldest_failed_due=oldest(self._sql.oldest_failed_due, at),
                oldest_lapsed_lease=oldest(self._sql.oldest_lapsed_lease, at),
                oldest_exhaustion=oldest(self._sql.oldest_exhaustion),
                unacknowledged_exhaustions=int(self._query(self._sql.exhaustion_count)[0][0]),
                has_outbox=has_outbox,
                oldest_unsent_call=oldest_unsent() if has_outbox else None,
                unacknowledged_failed_calls=failed_calls() if has_outbox else 0,
            )

        result: HealthFigures = self._read(work)
        return result

    def rows(
        self, *, state: Optional[str] = None, limit: int = 50, after: Optional[int] = None
    ) -> List[UpdateRow]:
        """At most ``limit`` rows by ``update_id``, optionally of one ``state``, after ``after``.

        Bodies are not read."""
        params = {"state": state, "limit": limit, "after": after}
        result: List[UpdateRow] = self._read(
            lambda: [UpdateRow.from_db(r) for r in self._query(self._sql.list_rows, params)]
        )
        return result

    def row(self, update_id: int) -> Optional[UpdateRow]:
        """The row of ``update_id`` with its body, or :obj:`None`."""

        def work() -> Optional[UpdateRow]:
            found = self._query(self._sql.select_row, {"update_id": update_id})
            return UpdateRow.from_db(found[0]) if found else None

        result: Optional[UpdateRow] = self._read(work)
        return result

    def steps(self, update_id: int) -> Optional[List[StepRecord]]:
        """The recorded steps of ``update_id``, by ``recorded_at`` and then by key.

        It is :obj:`None` when the table has no steps table. A PostgreSQL table made before
        steps, and not migrated since, has none. So does a SQLite file no store opened since.
        """
        name = steps_table_name(self.table)

        def work() -> Optional[List[StepRecord]]:
            param = name if self.target.is_sqlite else f'"{name}"'
            found = self._query(self._named["steps_exists"], {"steps": param})
            if not (found and found[0][0]):
                return None
            rows = self._query(self._named["steps_of"], {"update_id": update_id})
            return [record_of(r) for r in rows]

        result: Optional[List[StepRecord]] = self._read(work)
        return result

    def prune_bounds(self, before: int, every: int) -> Tuple[int, List[int]]:
        """How many update rows ``prune`` would delete before ``before``, and the
        ``settled_at`` of every ``every``-th of them (oldest first): the bounds of batches of
        about ``every`` rows."""
        params = {"before": before, "every": every}

        def work() -> Tuple[int, List[int]]:
            count = int(self._query(self._sql.prune_count, params)[0][0])
            bounds = [int(r[0]) for r in self._query(self._sql.prune_bounds, params)]
            return count, bounds

        result: Tuple[int, List[int]] = self._read(work)
        return result

    # -- retry -----------------------------------------------------------------------------
    def retry(self, update_id: int) -> Tuple[Optional[UpdateRow], bool]:
        """Make a failed or abandoned update claimable again (the ``admin_retry`` statement).

        In one write transaction: read the row (PostgreSQL: ``FOR UPDATE``), then run the one
        conditional ``UPDATE`` that matches only a failed/abandoned row as it was read.

        Returns:
            ``(row before, changed)``: the row as it was (:obj:`None` if unknown) and whether
            the ``UPDATE`` matched. Nothing is changed when ``changed`` is :obj:`False`.
        """
        key = {"update_id": update_id}
        try:
            if self.target.is_sqlite:
                conn = self._conn
                conn.execute(self._sql.begin_write)
                try:
                    found = self._query(self._sql.select_row_for_retry, key)
                    before = UpdateRow.from_db(found[0]) if found else None
                    changed = False
                    if before is not None and before.state in ("failed", "abandoned"):
                        params = dict(key, state=before.state, attempts=before.attempts)
                        changed = bool(self._query(self._sql.retry, params))
                    conn.execute(self._named["admin_commit" if changed else "admin_rollback"])
                except BaseException:
                    if conn.in_transaction:
                        conn.execute(self._named["admin_rollback"])
                    raise
                return before, changed
            try:
                self._query(self._sql.begin_write)
                found = self._query(self._sql.select_row_for_retry, key)
                before = UpdateRow.from_db(found[0]) if found else None
                changed = False
                if before is not None and before.state in ("failed", "abandoned"):
                    params = dict(key, state=before.state, attempts=before.attempts)
                    changed = bool(self._query(self._sql.retry, params))
                if changed:
                    self._conn.commit()
                else:
                    self._conn.rollback()
            except BaseException:
                self._conn.rollback()
                raise
            return before, changed
        except (sqlite3.Error, _pg_error()) as exc:
            raise self._fail(exc) from None


    # -- the outbox ------------------------------------------------------------------------
    @property
    def outbox_table(self) -> str:
        """:obj:`str`: The name of the table's outbox table (``<table>_outbox``)."""
        return self._outbox

    def outbox_exists(self) -> bool:
        """Whether the outbox table exists (a PostgreSQL table made before the outbox, and
        not migrated since, has none)."""
        name = self._outbox if self.target.is_sqlite else f'"{self._outbox}"'

        def work() -> bool:
            found = self._query(self._named["outbox_exists"], {"outbox": name})
            return bool(found and found[0][0])

        result: bool = self._read(work)
        return result

    def missing_outbox(self) -> str:
        """The message that refuses an outbox command on a table without an outbox."""
        where = self.target.display
        if self.target.is_sqlite:
            how = (
                "SQLiteUpdateStore creates it when it opens the file, so start the bot once "
                "with this version of ptb_fence (`ptb-fence migrate` has nothing to apply to "
                "SQLite)"
            )
        else:
            how = "create it with `ptb-fence migrate` (it keeps every row of the update table)"
        return (
            f"table {self.table!r} in {where} has no outbox table {self._outbox!r} (it "
            f"was made before the outbox): {how}"
        )

    def require_outbox(self) -> None:
        """Refuse (exit 2) when the outbox table does not exist.

        Raises:
            ptb_fence.cli._errors.Refused: No outbox table. The message says how to make it.
        """
        if not self.outbox_exists():
            raise Refused(self.missing_outbox())

    def outbox_counts(self) -> Optional[Tuple[Dict[str, int], Optional[int]]]:
        """The calls per state and the creation time of the oldest unsent call.

        The states are ``pending``, ``sending``, ``sent``, ``failed`` and
        ``failed_acknowledged``. An unsent call is pending or sending. The time is
        :obj:`None` when there is none. Both are read in one snapshot. The whole is
        :obj:`None` when the table has no outbox."""
        if not self.outbox_exists():
            return None

        def work() -> Tuple[Dict[str, int], Optional[int]]:
            counts = counts_of(self._query(self._named["outbox_counts"]))
            oldest = self._query(self._sql.oldest_unsent_at)
            since = oldest[0][0] if oldest else None
            return counts, None if since is None else int(since)

        result: Tuple[Dict[str, int], Optional[int]] = self._read(work)
        return result

    def calls(
        self, *, state: Optional[str] = None, limit: int = 50, after: Optional[int] = None
    ) -> List[OutboxEntry]:
        """Outbox calls by ``call_id`` (of ``state`` when given, after ``after``), at most
        ``limit``."""
        params: Dict[str, Any] = {"limit": limit, "after": -1 if after is None else after}
        sql = self._named["outbox_list_all"]
        if state is not None:
            sql, params["state"] = self._named["outbox_list_state"], state
        result: List[OutboxEntry] = self._read(
            lambda: [entry_of(r) for r in self._query(sql, params)]
        )
        return result

    def call(self, call_id: int) -> Optional[OutboxEntry]:
        """The outbox call ``call_id``, or :obj:`None`."""

        def work() -> Optional[OutboxEntry]:
            found = self._query(self._named["outbox_get"], {"call_id": call_id})
            return entry_of(found[0]) if found else None

        result: Optional[OutboxEntry] = self._read(work)
        return result

    def retry_call(self, call_id: int, now: int) -> Tuple[Optional[OutboxEntry], bool]:
        """A ``failed`` call goes back to ``pending``, due at ``now``.

        It runs the store's ``retry_failed_call`` statement. The error and tries are kept,
        and the call is no longer acknowledged.

        Returns:
            ``(call before, changed)``. Nothing is changed when ``changed`` is :obj:`False`.
        """
        return self._change_call(
            call_id, self._named["outbox_retry_failed"], {"at": now}, ("failed",)
        )

    def drop_call(self, call_id: int) -> Tuple[Optional[OutboxEntry], bool]:
        """Delete a ``pending`` or ``failed`` call (the store's ``drop_call`` statement).

        Returns:
            ``(call before, changed)``. Nothing is changed when ``changed`` is :obj:`False`.
        """
        return self._change_call(
            call_id, self._named["outbox_drop"], {}, ("pending", "failed")
        )

    def _change_call(
        self, call_id: int, sql: str, params: Dict[str, Any], states: Tuple[str, ...]
    ) -> Tuple[Optional[OutboxEntry], bool]:
        """In one write transaction: read the call, then run the one conditional statement
        (its ``WHERE`` is the rule) when the call was in one of ``states``."""
        key = {"call_id": call_id}

        def work() -> Tuple[Tuple[Optional[OutboxEntry], bool], bool]:
            found = self._query(self._named["outbox_get"], key)
            before = entry_of(found[0]) if found else None
            changed = False
            if before is not None and before.state in states:
                changed = bool(self._query(sql, dict(params, **key)))
            return (before, changed), changed

        return self._write(work)

    def _write(self, work: Callable[[], Tuple[_T, bool]]) -> _T:
        """Run ``work()`` in one write transaction.

        ``work()`` returns its result and whether to commit. Otherwise the transaction is
        rolled back."""
        try:
            if self.target.is_sqlite:
                conn = self._conn
                conn.execute(self._sql.begin_write)
                try:
                    result, commit = work()
                    conn.execute(self._named["admin_commit" if commit else "admin_rollback"])
                except BaseException:
                    if conn.in_transaction:
                        conn.execute(self._named["admin_rollback"])
                    raise
                return result
            try:
                self._query(self._sql.begin_write)
                result, commit = work()
                if commit:
                    self._conn.commit()
                else:
                    self._conn.rollback()
            except BaseException:
                self._conn.rollback()
                raise
            return result
        except (sqlite3.Error, _pg_error()) as exc:
            raise self._fail(exc) from None


def _pg_error() -> "type[BaseException]":
    import psycopg2

    return psycopg2.Error
