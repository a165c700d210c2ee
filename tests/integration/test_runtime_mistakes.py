"""Handler mistakes are loud and distinct.

* ``run_in_transaction`` with an ``async def fn``: a ``TypeError`` naming the fix, the
  transaction rolled back, nothing settled.
* ``fn`` committing, rolling back or closing the fenced transaction itself: ``TransactionEnded``,
  nothing settled by ``complete=True``.
* A second ``complete=True``, or using the attempt after the handler returned:
  ``AttemptFinished`` with its own message, never an ``OwnershipLost`` or a takeover WARNING.

Real SQLite files and real PostgreSQL tables; nothing of ptb_fence is patched.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import threading
import uuid
import warnings
from typing import Any, Callable, Dict, Iterator, List, Tuple

import psycopg2
import pytest

from ptb_fence import (
    AttemptFinished,
    OwnershipLost,
    PostgresUpdateStore,
    SQLiteUpdateStore,
    TransactionEnded,
    UpdateIntake,
    UsageError,
)
from ptb_fence.testing import FakeBotApi
from runtime_support import (
    FakeClock,
    Recorder,
    StoreWrapper,
    body,
    row,
)


class Backend:
    """A real store plus a domain table ``notes(update_id, attempt)`` in the same database."""

    def __init__(self, kind: str, store: Any, insert: Callable[[Any, int, int], None],
                 query: Callable[[str], List[Tuple[Any, ...]]], table: str, notes: str) -> None:
        self.notes_table = notes
        self.kind = kind
        self.store = store
        self.insert = insert
        self.query = query
        self.table = table

    def notes(self) -> List[Tuple[int, int]]:
        return sorted((int(u), int(a)) for u, a in self.query(f"SELECT update_id, attempt FROM {self.notes_table}"))

    def state(self, update_id: int) -> str:
        found = self.query(f"SELECT state FROM {self.table} WHERE update_id = {int(update_id)}")
        return str(found[0][0]) if found else "missing"


def _sqlite_backend(tmp_path: Any) -> Backend:
    path = str(tmp_path / "mistakes.db")
    store = SQLiteUpdateStore(path)
    with store.transaction() as conn:
        conn.execute("CREATE TABLE notes_x (update_id INTEGER NOT NULL, attempt INTEGER NOT NULL)")

    def insert(conn: Any, uid: int, attempt: int) -> None:
        conn.execute("INSERT INTO notes_x VALUES (?, ?)", (uid, attempt))

    def query(sql: str) -> List[Tuple[Any, ...]]:
        check = sqlite3.connect(path, timeout=10)
        try:
            return list(check.execute(sql).fetchall())
        finally:
            check.close()

    return Backend("sqlite", store, insert, query, "telegram_updates", "notes_x")


def _pg_backend(dsn: str, tables: List[str]) -> Backend:
    table = "t_" + uuid.uuid4().hex[:16]
    notes = "n_" + uuid.uuid4().hex[:16]
    tables += [table, notes]
    setup = psycopg2.connect(dsn)
    setup.autocommit = True
    with setup.cursor() as cur:
        cur.execute(f"CREATE TABLE {notes} (update_id BIGINT NOT NULL, attempt INTEGER NOT NULL)")
    setup.close()
    store = PostgresUpdateStore(dsn, table)

    def insert(conn: Any, uid: int, attempt: int) -> None:
        with conn.cursor() as cur:
            cur.execute(f"INSERT INTO {notes} VALUES (%s, %s)", (uid, attempt))

    def query(sql: str) -> List[Tuple[Any, ...]]:
        check = psycopg2.connect(dsn)
        try:
            with check.cursor() as cur:
                cur.execute(sql)
                return list(cur.fetchall())
        finally:
            check.close()

    return Backend("postgres", store, insert, query, table, notes)


# Not conftest's store: a store plus a notes table in the same database, written in the fence.
@pytest.fixture(params=["sqlite", "postgres"])
def backend(request: Any, tmp_path: Any) -> Iterator[Backend]:
    if request.param == "sqlite":
        made = _sqlite_backend(tmp_path)
    else:
        made = _pg_backend(request.getfixturevalue("pg_dsn"), request.getfixturevalue("pg_tables"))
    try:
        yield made
    finally:
        made.store.close()


def _make(store: Any, intakes: List[UpdateIntake], clock: FakeClock, **kwargs: Any) -> UpdateIntake:
    intake = UpdateIntake(store, clock=clock, **kwargs)
    intakes.append(intake)
    intake.start()
    return intake


def _retry_now(intake: UpdateIntake, clock: FakeClock) -> None:
    assert intake.idle(10)
    clock.advance(3600)
    intake.sweep()
    assert intake.idle(10)


def _takeover_warnings(caplog: Any) -> List[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name.startswith("ptb_fence")
        and ("no longer owns" in r.getMessage() or "owner lost" in r.getMessage())
    ]


# -- an async fn ---------------------------------------------------------------------------------
def test_run_in_transaction_with_an_async_fn_raises_and_settles_nothing(
    backend: Backend, intakes: List[UpdateIntake]
) -> None:
    clock = FakeClock()
    seen: Dict[int, Any] = {}

    def handle_attempt(update: Dict[str, Any], attempt: Any) -> None:
        if attempt.attempt == 1:

            async def write_async(conn: Any) -> None:  # the mistake
                backend.insert(conn, update["update_id"], attempt.attempt)

            async def main() -> None:
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    try:
                        await attempt.run_in_transaction(write_async, complete=True)
                    except TypeError as exc:
                        seen["error"] = exc
                    seen["warnings"] = [str(w.message) for w in caught]

            asyncio.run(main())
            seen["completed"] = attempt.completed
            seen["lost"] = attempt.owner_lost.is_set()
            raise seen.get("error") or AssertionError("no TypeError")
        attempt_number = attempt.attempt
        asyncio.run(
            attempt.run_in_transaction(
                lambda conn: backend.insert(conn, update["update_id"], attempt_number),
                complete=True,
            )
        )

    failures = Recorder()
    intake = _make(backend.store, intakes, clock, handle_attempt=handle_attempt, on_failure=failures)
    intake.accept(body(7))
    assert intake.idle(10)
    error = seen["error"]
    assert isinstance(error, TypeError)
    assert "pass a plain function" in str(error) and "worker thread" in str(error)
    assert not any("never awaited" in w for w in seen["warnings"])
    assert seen["completed"] is False and seen["lost"] is False
    assert backend.notes() == []  # rolled back
    # a misuse of ptb_fence: failed for good at once, never retried
    assert backend.state(7) == "abandoned"
    assert [type(f[0]) for f in failures.snapshot()] == [UsageError]
    assert all(f[2] is False for f in failures.snapshot())  # not retrying
    _retry_now(intake, clock)
    assert backend.state(7) == "abandoned"
    assert backend.notes() == []


# -- fn ends the transaction itself --------------------------------------------------------------
def _end_transaction(conn: Any, how: str) -> None:
    getattr(conn, how)()


@pytest.mark.parametrize("how", ["commit", "rollback", "sql"])
@pytest.mark.parametrize("complete", [True, False])
def test_fn_ending_the_fenced_transaction_itself_is_refused_before_anything_commits(
    backend: Backend, intakes: List[UpdateIntake], how: str, complete: bool, caplog: Any
) -> None:
    """``conn.commit()``, ``conn.rollback()`` or a ``COMMIT`` statement on the connection the
    block got: refused before it reaches the database, so neither the write nor the outbox
    reply made before it lands; the attempt fails for good at once (logged once), so no
    retry repeats the mistake."""
    clock = FakeClock()
    seen: Dict[str, Any] = {}
    runs: List[int] = []

    def handle_attempt(update: Dict[str, Any], attempt: Any) -> None:
        uid = update["update_id"]
        runs.append(attempt.attempt)

        def write(conn: Any) -> None:
            backend.insert(conn, uid, attempt.attempt)
            attempt.outbox.send_message(5, "booked")
            if how == "sql":
                conn.execute("COMMIT")  # sqlite3's shortcut (psycopg2's have no execute())
            else:
                _end_transaction(conn, how)

        try:
            asyncio.run(attempt.run_in_transaction(write, complete=complete))
        except TransactionEnded as exc:
            seen["error"] = exc
            seen["state_inside"] = backend.state(uid)
            raise
        finally:
            seen["completed"] = attempt.completed

    if how == "sql" and backend.kind != "sqlite":
        pytest.skip("psycopg2 connections have no execute(): a cursor's COMMIT is below")
    failures = Recorder()
    with FakeBotApi() as fake, caplog.at_level(logging.WARNING, logger="ptb_fence"):
        intake = _make(backend.store, intakes, clock, handle_attempt=handle_attempt,
                       on_failure=failures, bot_token=fake.token, bot_base_url=fake.base_url)
        intake.accept(body(8))
        assert intake.idle(10)
        assert fake.sent_messages == []
    error = seen["error"]
    assert isinstance(error, TransactionEnded) and isinstance(error, RuntimeError)
    assert error.identity.update_id == 8
    assert "refused" in str(error) and "nothing was committed" in str(error)
    assert seen["completed"] is False
    assert seen["state_inside"] == "processing"
    assert backend.notes() == []  # refused before anything committed
    assert backend.store.list_calls(limit=10) == []  # the reply never committed
    assert backend.state(8) == "abandoned"  # not retried
    assert [type(f[0]) for f in failures.snapshot()] == [TransactionEnded]
    logged = [r.getMessage() for r in caplog.records if "update 8 attempt 1 failed" in
              r.getMessage()]
    assert len(logged) == 1 and "not retried" in logged[0] and "refused" in logged[0]
    _retry_now(intake, clock)
    assert runs == [1] and backend.state(8) == "abandoned"


def test_a_caught_refusal_still_fails_the_block(
    backend: Backend, intakes: List[UpdateIntake]
) -> None:
    """A refused ``commit()`` swallowed by the block: the block still fails (its author
    thought something committed), rolled back, the attempt not completed."""
    seen: Dict[str, Any] = {}

    def handle_attempt(update: Dict[str, Any], attempt: Any) -> None:
        try:
            with attempt.transaction(complete=True) as conn:
                backend.insert(conn, update["update_id"], attempt.attempt)
                try:
                    conn.commit()
                except TransactionEnded:
                    seen["caught"] = True
        except TransactionEnded as exc:
            seen["error"] = exc
        seen["completed"] = attempt.completed

    intake = _make(backend.store, intakes, FakeClock(), handle_attempt=handle_attempt)
    intake.accept(body(14))
    assert intake.idle(10)
    assert seen["caught"] is True and isinstance(seen.get("error"), TransactionEnded)
    assert seen["completed"] is False
    assert backend.notes() == []
    assert backend.state(14) == "completed"  # the handler returned normally afterwards


@pytest.mark.parametrize("statement", ["COMMIT", "ROLLBACK"])
@pytest.mark.parametrize("reply", ["before", "after"])
def test_a_commit_through_a_cursor_is_seen_at_the_end_and_not_retried(
    backend: Backend, intakes: List[UpdateIntake], reply: str, statement: str
) -> None:
    """A ``COMMIT`` through a cursor of the connection (which no guard sees) is found when
    the block ends: ``TransactionEnded``, and the attempt is not retried, so the escaped
    write lands once, not once per attempt. An outbox reply queued before it is dropped
    before any sender sees it, one queued after it is refused: nothing is sent. A
    ``ROLLBACK`` the same way: never a completion, nothing written."""
    clock = FakeClock()
    runs: List[int] = []
    errors: List[BaseException] = []

    def handle_attempt(update: Dict[str, Any], attempt: Any) -> None:
        runs.append(attempt.attempt)
        try:
            with attempt.transaction(complete=True) as conn:
                backend.insert(conn, update["update_id"], attempt.attempt)
                if reply == "before":
                    attempt.outbox.send_message(5, "booked")
                cur = conn.cursor()
                cur.execute(statement)
                cur.close()
                if reply == "after":
                    attempt.outbox.send_message(5, "booked")
        except TransactionEnded as exc:
            errors.append(exc)
            raise

    with FakeBotApi() as fake:
        intake = _make(backend.store, intakes, clock, handle_attempt=handle_attempt,
                       bot_token=fake.token, bot_base_url=fake.base_url)
        intake.accept(body(15))
        assert intake.idle(10)
        _retry_now(intake, clock)
        _retry_now(intake, clock)
        assert fake.sent_messages == []
    assert runs == [1] and len(errors) == 1
    assert ("before this outbox call" in str(errors[0])) == (reply == "after")
    # a COMMIT's write escaped once (the handler's mistake)
    assert backend.notes() == ([(15, 1)] if statement == "COMMIT" else [])
    assert backend.state(15) == "abandoned"
    assert backend.store.list_calls(limit=10) == []


def test_a_given_postgres_connection_closed_inside_the_block_is_loud(
    pg_dsn: str, pg_tables: List[str], intakes: List[UpdateIntake]
) -> None:
    backend = _pg_backend(pg_dsn, pg_tables)
    clock = FakeClock()
    seen: Dict[str, Any] = {}

    def handle_attempt(update: Dict[str, Any], attempt: Any) -> None:
        conn = psycopg2.connect(pg_dsn)
        try:
            with attempt.transaction(connection=conn, complete=True) as c:
                backend.insert(c, update["update_id"], attempt.attempt)
                c.close()
        except TransactionEnded as exc:
            seen["error"] = exc
        seen["completed"] = attempt.completed
        raise RuntimeError("stop here")

    try:
        intake = _make(backend.store, intakes, clock, handle_attempt=handle_attempt)
        intake.accept(body(9))
        assert intake.idle(10)
        assert isinstance(seen.get("error"), TransactionEnded), seen
        assert "refused close()" in str(seen["error"])  # before the connection closed
        assert seen["completed"] is False
        assert backend.state(9) == "failed"
        assert backend.notes() == []
    finally:
        backend.store.close()


# -- mistakes that read like a lost lease --------------------------------------------------------
def test_a_second_complete_and_use_after_the_handler_returned_are_attempt_finished(
    backend: Backend, intakes: List[UpdateIntake], caplog: Any
) -> None:
    caplog.set_level(logging.DEBUG)
    clock = FakeClock()
    seen: Dict[str, Any] = {}
    kept: List[Any] = []

    def handle_attempt(update: Dict[str, Any], attempt: Any) -> None:
        uid = update["update_id"]
        with attempt.transaction(complete=True) as conn:
            backend.insert(conn, uid, attempt.attempt)
        for name, action in (
            ("second_complete", lambda: attempt.transaction(complete=True).__enter__()),
            ("plain_after_complete", lambda: attempt.transaction().__enter__()),
            ("exhaust_after_complete", lambda: attempt.exhaust("too late")),
            (
                "run_after_complete",
                lambda: asyncio.run(attempt.run_in_transaction(lambda c: None, complete=True)),
            ),
        ):
            try:
                action()
            except Exception as exc:  # noqa: BLE001 - recorded and asserted below
                seen[name] = exc
        kept.append(attempt)

    intake = _make(backend.store, intakes, clock, handle_attempt=handle_attempt)
    intake.accept(body(10))
    assert intake.idle(10)
    attempt = kept[0]
    for name in ("second_complete", "plain_after_complete", "run_after_complete"):
        error = seen[name]
        assert type(error) is AttemptFinished, (name, error)
        assert not isinstance(error, OwnershipLost)
        assert error.identity == attempt.identity
        assert "attempt already completed" in str(error)
        assert "without complete=True" in str(error)
    assert type(seen["exhaust_after_complete"]) is AttemptFinished
    assert "attempt already completed" in str(seen["exhaust_after_complete"])

    # after the handler returned (e.g. from a thread it left behind)
    after: Dict[str, Any] = {}

    def late() -> None:
        for name, action in (
            ("transaction", lambda: attempt.transaction().__enter__()),
            ("exhaust", lambda: attempt.exhaust("late")),
        ):
            try:
                action()
            except Exception as exc:  # noqa: BLE001
                after[name] = exc

    thread = threading.Thread(target=late)
    thread.start()
    thread.join(10)
    # a completed attempt that ended: "already completed" is the more precise cause
    assert all(type(e) is AttemptFinished for e in after.values()), after
    assert not attempt.owner_lost.is_set()
    assert _takeover_warnings(caplog) == []
    assert backend.state(10) == "completed"
    assert backend.notes() == [(10, 1)]


def test_using_the_attempt_after_the_handler_returned_is_attempt_ended(
    backend: Backend, intakes: List[UpdateIntake], caplog: Any
) -> None:
    caplog.set_level(logging.DEBUG)
    clock = FakeClock()
    kept: List[Any] = []

    def handle_attempt(update: Dict[str, Any], attempt: Any) -> None:
        kept.append(attempt)  # returns without writing: the runtime settles it completed

    intake = _make(backend.store, intakes, clock, handle_attempt=handle_attempt)
    intake.accept(body(11))
    assert intake.idle(10)
    attempt = kept[0]
    errors: Dict[str, Any] = {}
    for name, action in (
        ("transaction", lambda: attempt.transaction(complete=True).__enter__()),
        ("exhaust", lambda: attempt.exhaust("late")),
        ("run", lambda: asyncio.run(attempt.run_in_transaction(lambda c: None))),
    ):
        try:
            action()
        except Exception as exc:  # noqa: BLE001
            errors[name] = exc
    for name, error in errors.items():
        assert type(error) is AttemptFinished, (name, error)
        assert "attempt ended: the handler returned" in str(error)
        assert "keep fenced writes inside the handler" in str(error)
    assert set(errors) == {"transaction", "exhaust", "run"}
    assert not attempt.owner_lost.is_set()
    assert _takeover_warnings(caplog) == []
    assert backend.state(11) == "completed"


def test_attempt_finished_is_raised_before_touching_the_store(intakes: List[UpdateIntake]) -> None:
    store, clock = StoreWrapper(), FakeClock()
    kept: List[Any] = []

    def handle_attempt(update: Dict[str, Any], attempt: Any) -> None:
        with attempt.transaction(complete=True):
            pass
        kept.append(attempt)

    intake = _make(store, intakes, clock, handle_attempt=handle_attempt)
    intake.accept(body(12))
    assert intake.idle(10)
    calls = {name: store.count(name) for name in ("owns", "transaction", "settle_owned", "exhaust")}
    for action in (lambda: kept[0].transaction().__enter__(), lambda: kept[0].exhaust("x")):
        with pytest.raises(AttemptFinished):
            action()
    assert {name: store.count(name) for name in calls} == calls
    assert row(store, 12).state == "completed"


# -- an async fn through a real PTB Application --------------------------------------------------
def test_ptb_handler_passing_an_async_fn_gets_a_type_error_and_the_update_is_not_completed(
    tmp_path: Any,
) -> None:
    from telegram.ext import MessageHandler, filters

    from ptb_fence.ptb import FencedUpdateProcessor
    from ptb_fence.testing import FakeBotApi
    from ptb_support import DOMAIN_DDL, FAST, build, domain_rows, polling, rows, run, wait_for

    path = str(tmp_path / "ptb.db")
    store = SQLiteUpdateStore(path)
    with store.transaction() as conn:
        conn.execute(DOMAIN_DDL)
    seen: List[Any] = []

    async def on_message(update: Any, context: Any) -> None:
        attempt = context.attempt

        async def write_async(conn: Any) -> None:
            conn.execute(
                "INSERT INTO domain (update_id, attempt, claim_id) VALUES (?, ?, ?)",
                (update.update_id, attempt.attempt, attempt.claim_id),
            )

        def write(conn: Any) -> None:
            conn.execute(
                "INSERT INTO domain (update_id, attempt, claim_id) VALUES (?, ?, ?)",
                (update.update_id, attempt.attempt, attempt.claim_id),
            )

        if attempt.attempt == 1:
            try:
                await attempt.run_in_transaction(write_async, complete=True)
            except TypeError as exc:
                seen.append(exc)
                raise
        await attempt.run_in_transaction(write, complete=True)

    failures = Recorder()

    async def scenario(fake: FakeBotApi) -> int:
        processor = FencedUpdateProcessor(
            store, **FAST, retry=lambda error, attempt: 0.0, on_failure=failures
        )
        app = build(processor, fake)
        app.add_handler(MessageHandler(filters.TEXT, on_message))
        update_id = fake.inject_message(chat_id=1, text="x")
        async with polling(app):
            await wait_for("settled", lambda: rows(path).get(update_id, ("",))[0] == "abandoned")
        return update_id

    try:
        with FakeBotApi() as fake:
            update_id = run(scenario(fake))
    finally:
        store.close()
    assert len(seen) == 1 and "pass a plain function" in str(seen[0])
    assert [type(f[0]) for f in failures.snapshot()] == [UsageError]
    assert rows(path)[update_id][1] == 1  # a misuse: failed for good, never retried
    assert domain_rows(path) == []


def test_ptb_second_complete_is_attempt_finished_not_a_takeover(tmp_path: Any, caplog: Any) -> None:
    from telegram.ext import MessageHandler, filters

    from ptb_fence.ptb import FencedUpdateProcessor
    from ptb_fence.testing import FakeBotApi
    from ptb_support import DOMAIN_DDL, FAST, build, domain_rows, polling, rows, run, wait_for

    caplog.set_level(logging.DEBUG)
    path = str(tmp_path / "ptb10.db")
    store = SQLiteUpdateStore(path)
    with store.transaction() as conn:
        conn.execute(DOMAIN_DDL)
    seen: List[Any] = []

    async def on_message(update: Any, context: Any) -> None:
        attempt = context.attempt

        def write(conn: Any) -> None:
            conn.execute(
                "INSERT INTO domain (update_id, attempt, claim_id) VALUES (?, ?, ?)",
                (update.update_id, attempt.attempt, attempt.claim_id),
            )

        await attempt.run_in_transaction(write, complete=True)
        try:
            await attempt.run_in_transaction(write, complete=True)
        except AttemptFinished as exc:
            seen.append(exc)
        seen.append(attempt)

    async def scenario(fake: FakeBotApi) -> int:
        app = build(FencedUpdateProcessor(store, **FAST), fake)
        app.add_handler(MessageHandler(filters.TEXT, on_message))
        update_id = fake.inject_message(chat_id=1, text="x")
        async with polling(app):
            await wait_for("settled", lambda: rows(path).get(update_id, ("",))[0] == "completed")
            await wait_for("the handler", lambda: len(seen) == 2)
        return update_id

    try:
        with FakeBotApi() as fake:
            update_id = run(scenario(fake))
    finally:
        store.close()
    error, attempt = seen
    assert type(error) is AttemptFinished and "attempt already completed" in str(error)
    assert not attempt.owner_lost.is_set()
    assert _takeover_warnings(caplog) == []
    assert rows(path)[update_id][:2] == ("completed", 1)
    assert [r[:2] for r in domain_rows(path)] == [(update_id, 1)]


def test_a_given_sqlite_connection_committed_inside_the_block_is_loud(
    tmp_path: Any, intakes: List[UpdateIntake]
) -> None:
    backend = _sqlite_backend(tmp_path)
    path = str(tmp_path / "mistakes.db")
    clock = FakeClock()
    seen: Dict[str, Any] = {}

    def handle_attempt(update: Dict[str, Any], attempt: Any) -> None:
        conn = sqlite3.connect(path, timeout=10)
        try:
            with attempt.transaction(connection=conn, complete=True) as c:
                backend.insert(c, update["update_id"], attempt.attempt)
                c.commit()
        except TransactionEnded as exc:
            seen["error"] = exc
        finally:
            conn.close()
        seen["completed"] = attempt.completed
        raise RuntimeError("stop here")

    try:
        intake = _make(backend.store, intakes, clock, handle_attempt=handle_attempt)
        intake.accept(body(13))
        assert intake.idle(10)
        assert isinstance(seen.get("error"), TransactionEnded), seen
        assert "refused commit()" in str(seen["error"])
        assert seen["completed"] is False
        assert backend.state(13) == "failed"  # the handler's own error: retried
        assert backend.notes() == []  # refused before it committed
    finally:
        intakes.remove(intake)
        intake.close()
        backend.store.close()


def test_a_misuse_is_delivered_to_handle_exhaustion_at_once(
    backend: Backend, intakes: List[UpdateIntake], caplog: Any
) -> None:
    """Bytes given to ``outbox.send_photo`` (a file to upload): ``UsageError``. With
    ``handle_exhaustion`` the attempt is exhausted at once (not retried, whatever
    ``max_attempts`` and the retry policy say) and delivered once, its error naming the fix;
    one ERROR line says so."""
    clock = FakeClock()
    runs: List[int] = []
    delivered: List[Any] = []

    def handle_attempt(update: Dict[str, Any], attempt: Any) -> None:
        runs.append(attempt.attempt)
        with attempt.transaction(complete=True) as conn:
            backend.insert(conn, update["update_id"], attempt.attempt)
            attempt.outbox.send_photo(5, b"\x89PNG...")

    with FakeBotApi() as fake, caplog.at_level(logging.WARNING, logger="ptb_fence"):
        intake = _make(backend.store, intakes, clock, handle_attempt=handle_attempt,
                       handle_exhaustion=delivered.append, max_attempts=5,
                       retry=lambda error, attempt: 0.0,
                       bot_token=fake.token, bot_base_url=fake.base_url)
        intake.accept(body(16))
        assert intake.idle(10)
        _retry_now(intake, clock)
        assert fake.sent_messages == []
    assert runs == [1]
    assert [(e.update_id, e.attempt) for e in delivered] == [(16, 1)]
    assert "UsageError" in delivered[0].error and "file to upload" in delivered[0].error
    assert backend.notes() == [] and backend.store.list_calls(limit=10) == []
    logged = [r for r in caplog.records if "update 16 attempt 1 failed" in r.getMessage()]
    assert len(logged) == 1 and logged[0].levelname == "ERROR"
    assert "not retried: a misuse of ptb_fence" in logged[0].getMessage()


def test_a_given_cursors_connection_refuses_its_commit_and_the_block_fails(
    tmp_path: Any, intakes: List[UpdateIntake]
) -> None:
    """A cursor given as ``connection=``: the block gets it guarded, and so is its
    ``.connection``; a refused ``commit()`` there that the block catches still fails it."""
    backend = _sqlite_backend(tmp_path)
    path = str(tmp_path / "mistakes.db")
    seen: Dict[str, Any] = {}

    def handle_attempt(update: Dict[str, Any], attempt: Any) -> None:
        conn = sqlite3.connect(path, timeout=10)
        try:
            with attempt.transaction(connection=conn.cursor(), complete=True) as cur:
                backend.insert(cur, update["update_id"], attempt.attempt)
                try:
                    cur.connection.commit()
                except TransactionEnded:
                    seen["caught"] = True
        except TransactionEnded as exc:
            seen["error"] = exc
        finally:
            conn.close()
        seen["completed"] = attempt.completed

    try:
        intake = _make(backend.store, intakes, FakeClock(), handle_attempt=handle_attempt)
        intake.accept(body(17))
        assert intake.idle(10)
        assert seen.get("caught") is True
        assert "refused commit()" in str(seen.get("error")), seen
        assert seen["completed"] is False and backend.notes() == []
    finally:
        intakes.remove(intake)
        intake.close()
        backend.store.close()
