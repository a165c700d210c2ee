"""``connection=`` takes what users hold: a SQLAlchemy Session or Connection, a psycopg 3
connection (and a Django connection, run by tests/processes/test_examples.py through
examples/django_booking.py); anything else is a TypeError naming what is accepted.

Real stores (a SQLite file, the shared PostgreSQL) and real UpdateIntakes: the ORM writes,
the fenced ownership check and ``complete=True``'s settle land in one SQLAlchemy commit; a
stale attempt's ORM write is rolled back with ``OwnershipLost``.
"""

from __future__ import annotations

import sqlite3
import uuid
from typing import Any, Callable, Dict, Iterator, List, Tuple

import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from ptb_fence import (
    OwnershipLost,
    PostgresUpdateStore,
    SQLiteUpdateStore,
    TransactionEnded,
    UpdateIntake,
)
from runtime_support import FakeClock, body


class Env:
    """A store and a SQLAlchemy engine on the same database, with a ``bookings`` table."""

    def __init__(self, store: Any, engine: sa.engine.Engine, state: Callable[[int], str],
                 booking: Any, dsn: str = "") -> None:
        self.store, self.engine, self.state, self.Booking, self.dsn = (
            store, engine, state, booking, dsn)

    def bookings(self) -> List[Tuple[int, int]]:
        with Session(self.engine) as s:
            return sorted((b.update_id, b.attempt) for b in s.scalars(sa.select(self.Booking)))


def _model(table: str) -> Any:
    class Base(DeclarativeBase):
        pass

    class Booking(Base):
        __tablename__ = table
        id: Mapped[int] = mapped_column(primary_key=True)
        update_id: Mapped[int] = mapped_column(unique=True)
        attempt: Mapped[int]

    return Booking


# Not conftest's store: each kind is a user's connection (SQLAlchemy, psycopg 2 or 3) as well.
@pytest.fixture(params=["sqlite", "postgres+psycopg2", "postgres+psycopg"])
def env(request: Any, tmp_path: Any) -> Iterator[Env]:
    booking_table = "b_" + uuid.uuid4().hex[:12]
    Booking = _model(booking_table)
    if request.param == "sqlite":
        path = str(tmp_path / "bot.db")
        store: Any = SQLiteUpdateStore(path)
        engine = sa.create_engine(f"sqlite:///{path}", connect_args={"timeout": 10})

        def state(uid: int) -> str:
            check = sqlite3.connect(path, timeout=10)
            try:
                found = check.execute(
                    "SELECT state FROM telegram_updates WHERE update_id = ?", (uid,)).fetchall()
            finally:
                check.close()
            return str(found[0][0]) if found else "missing"

        dsn = ""
    else:
        dsn = request.getfixturevalue("pg_dsn")
        tables: List[str] = request.getfixturevalue("pg_tables")
        table = "t_" + uuid.uuid4().hex[:16]
        tables += [table, booking_table]
        store = PostgresUpdateStore(dsn, table)
        driver = request.param.split("+")[1]
        engine = sa.create_engine(dsn.replace("postgresql://", f"postgresql+{driver}://", 1))

        def state(uid: int) -> str:
            with psycopg.connect(dsn) as check:
                found = check.execute(
                    f"SELECT state FROM {table} WHERE update_id = %s", (uid,)).fetchall()
            return str(found[0][0]) if found else "missing"

    Booking.metadata.create_all(engine)
    try:
        yield Env(store, engine, state, Booking, dsn)
    finally:
        engine.dispose()
        store.close()


def _intake(env: Env, made: List[UpdateIntake],
            handle_attempt: Any) -> Tuple[UpdateIntake, FakeClock]:
    clock = FakeClock()
    intake = UpdateIntake(env.store, clock=clock, handle_attempt=handle_attempt)
    made.append(intake)
    intake.start()
    return intake, clock


def _retry_now(intake: UpdateIntake, clock: FakeClock) -> None:
    assert intake.idle(20)
    clock.advance(3600)
    intake.sweep()
    assert intake.idle(20)


def test_a_session_commits_the_orm_write_and_the_completion_together(
    env: Env, intakes: List[UpdateIntake]
) -> None:
    seen: Dict[str, Any] = {}

    def handle_attempt(update: Dict[str, Any], attempt: Any) -> None:
        uid = update["update_id"]
        with Session(env.engine) as session:
            session.scalars(sa.select(env.Booking)).all()  # a read first: the session autobegins
            with attempt.transaction(connection=session, complete=True) as tx:
                seen["yielded"] = tx
                session.add(env.Booking(update_id=uid, attempt=attempt.attempt))
                if attempt.attempt == 1:
                    session.flush()  # the write reached the database, then the handler crashes
                    raise RuntimeError("crash after the ORM write")
            seen["session"] = session
            seen["completed"] = attempt.completed

    intake, clock = _intake(env, intakes, handle_attempt)
    intake.accept(body(41))
    assert intake.idle(20)
    # the crash rolled back the flushed ORM write and the completion made at the start
    assert env.bookings() == [] and env.state(41) == "failed"
    _retry_now(intake, clock)
    assert seen["yielded"] is seen["session"] and seen["completed"] is True
    assert env.bookings() == [(41, 2)] and env.state(41) == "completed"


def test_a_connection_commits_its_core_write_and_the_completion_together(
    env: Env, intakes: List[UpdateIntake]
) -> None:
    seen: Dict[str, Any] = {}

    def handle_attempt(update: Dict[str, Any], attempt: Any) -> None:
        with env.engine.connect() as connection:
            with attempt.transaction(connection=connection, complete=True) as tx:
                seen["same"] = tx is connection
                tx.execute(sa.insert(env.Booking).values(update_id=update["update_id"],
                                                         attempt=attempt.attempt))
            seen["owns"] = attempt.owns(connection=connection)  # the completed update
            connection.rollback()

    intake, _ = _intake(env, intakes, handle_attempt)
    intake.accept(body(42))
    assert intake.idle(20)
    assert seen == {"same": True, "owns": False}
    assert env.bookings() == [(42, 1)] and env.state(42) == "completed"


def test_a_stale_attempts_orm_write_is_rolled_back_with_ownership_lost(
    env: Env, intakes: List[UpdateIntake]
) -> None:
    seen: Dict[str, Any] = {}
    holder: Dict[str, Any] = {}

    def handle_attempt(update: Dict[str, Any], attempt: Any) -> None:
        uid = update["update_id"]
        if attempt.attempt > 1:
            return
        clock: FakeClock = holder["clock"]
        clock.advance(3600)  # far past its lease: another process takes the update over
        now = clock.ms()
        seen["other"] = env.store.claim_owned(uid, now=now, lease_until=now + 600_000,
                                              max_attempts=5)
        with Session(env.engine) as session:
            try:
                with attempt.transaction(connection=session, complete=True):
                    session.add(env.Booking(update_id=uid, attempt=attempt.attempt))
            except OwnershipLost as exc:
                seen["error"] = exc
            seen["pending"] = list(session.new)

    intake, clock = _intake(env, intakes, handle_attempt)
    holder["clock"] = clock
    intake.accept(body(43))
    assert intake.idle(20)
    assert seen["other"] is not None and seen["other"].attempt == 2
    assert isinstance(seen.get("error"), OwnershipLost), seen
    assert seen["pending"] == []  # the session was rolled back
    assert env.bookings() == []
    assert env.state(43) == "processing"  # the takeover still holds it


def test_a_session_commit_inside_the_block_is_refused_before_it_commits(
    env: Env, intakes: List[UpdateIntake]
) -> None:
    """``session.commit()`` in the block raises ``TransactionEnded`` before SQLAlchemy
    commits: neither the booking nor the outbox reply queued before it lands, nothing is
    sent, and the attempt fails for good (not retried)."""
    from ptb_fence.testing import FakeBotApi

    seen: Dict[str, Any] = {}
    runs: List[int] = []

    def handle_attempt(update: Dict[str, Any], attempt: Any) -> None:
        runs.append(attempt.attempt)
        with Session(env.engine) as session:
            try:
                with attempt.transaction(connection=session, complete=True):
                    session.add(env.Booking(update_id=update["update_id"],
                                            attempt=attempt.attempt))
                    attempt.outbox.send_message(7, "booked")
                    session.commit()
            except TransactionEnded as exc:
                seen["error"] = exc
                raise
            finally:
                seen["completed"] = attempt.completed

    with FakeBotApi() as fake:
        clock = FakeClock()
        intake = UpdateIntake(env.store, clock=clock, handle_attempt=handle_attempt,
                              bot_token=fake.token, bot_base_url=fake.base_url)
        intakes.append(intake)
        intake.start()
        intake.accept(body(44))
        _retry_now(intake, clock)
        _retry_now(intake, clock)
        assert fake.sent_messages == []
    assert isinstance(seen.get("error"), TransactionEnded), seen
    assert "refused session.commit()" in str(seen["error"])
    assert seen["completed"] is False and runs == [1]
    assert env.state(44) == "abandoned"  # a misuse: not retried
    assert env.bookings() == []  # refused before it committed
    assert env.store.list_calls(limit=10) == []


def test_a_connection_commit_inside_the_block_is_refused_before_it_commits(
    env: Env, intakes: List[UpdateIntake]
) -> None:
    """``connection.commit()`` on a SQLAlchemy Connection in the block: refused, nothing
    committed, the Connection usable afterwards."""
    seen: Dict[str, Any] = {}

    def handle_attempt(update: Dict[str, Any], attempt: Any) -> None:
        table = env.Booking.__table__
        with env.engine.connect() as connection:
            try:
                with attempt.transaction(connection=connection, complete=True):
                    connection.execute(table.insert().values(update_id=update["update_id"],
                                                             attempt=attempt.attempt))
                    connection.commit()
            except TransactionEnded as exc:
                seen["error"] = exc
            seen["after"] = connection.execute(sa.select(sa.func.count()).select_from(
                table)).scalar_one()
            connection.rollback()

    intake, _ = _intake(env, intakes, handle_attempt)
    intake.accept(body(49))
    assert intake.idle(20)
    assert "refused connection.commit()" in str(seen.get("error")), seen
    assert seen["after"] == 0 and env.bookings() == []
    assert env.state(49) == "completed"  # the handler returned after catching it


def test_a_failed_flush_caught_in_the_block_never_reads_as_a_completion(
    env: Env, intakes: List[UpdateIntake]
) -> None:
    """A flush error caught inside the block leaves the Session's transaction to be rolled
    back (SQLAlchemy rolled it back, the completion with it): the block fails with an error
    naming that, never a completion."""
    seen: Dict[str, Any] = {}

    def handle_attempt(update: Dict[str, Any], attempt: Any) -> None:
        with Session(env.engine) as session:
            session.add(env.Booking(update_id=-1, attempt=0))
            session.commit()
        with Session(env.engine) as session:
            try:
                with attempt.transaction(connection=session, complete=True):
                    session.add(env.Booking(update_id=-1, attempt=attempt.attempt))
                    try:
                        session.flush()  # the unique update_id: an IntegrityError
                    except sa.exc.IntegrityError:
                        seen["caught"] = True
            except TransactionEnded as exc:
                seen["error"] = exc
                raise
            finally:
                seen["completed"] = attempt.completed

    intake, _ = _intake(env, intakes, handle_attempt)
    intake.accept(body(50))
    assert intake.idle(20)
    assert seen.get("caught") is True
    assert "marked for rollback" in str(seen.get("error"))
    assert "flush error" in str(seen["error"]) and "nothing of it" in str(seen["error"])
    assert seen["completed"] is False
    assert env.state(50) == "abandoned"
    assert env.bookings() == [(-1, 0)]


def test_an_explicit_session_begin_is_refused_before_anything_runs(
    env: Env, intakes: List[UpdateIntake]
) -> None:
    seen: Dict[str, Any] = {}

    def handle_attempt(update: Dict[str, Any], attempt: Any) -> None:
        with Session(env.engine) as session:
            with session.begin():
                try:
                    with attempt.transaction(connection=session, complete=True):
                        raise AssertionError("not reached")
                except ValueError as exc:
                    seen["error"] = str(exc)
        with env.engine.connect() as connection:
            connection.execute(sa.select(1))  # "commit as you go": a transaction is open
            try:
                with attempt.transaction(connection=connection, complete=True):
                    raise AssertionError("not reached")
            except ValueError as exc:
                seen["connection_error"] = str(exc)
        with Session(env.engine) as session:
            with attempt.transaction(connection=session, complete=True):
                session.add(env.Booking(update_id=update["update_id"], attempt=attempt.attempt))

    intake, _ = _intake(env, intakes, handle_attempt)
    intake.accept(body(45))
    assert intake.idle(20)
    assert "session.begin()" in seen["error"] and "outside" in seen["error"]
    assert "Connection is already in a transaction" in seen["connection_error"]
    assert env.bookings() == [(45, 1)] and env.state(45) == "completed"


def test_unknown_objects_are_a_type_error_naming_what_is_accepted(
    env: Env, intakes: List[UpdateIntake]
) -> None:
    errors: List[str] = []

    def handle_attempt(update: Dict[str, Any], attempt: Any) -> None:
        for wrong in (object(), env.engine, "dbname=test"):
            try:
                with attempt.transaction(connection=wrong, complete=True):
                    raise AssertionError("not reached")
            except TypeError as exc:
                errors.append(str(exc))
        try:
            attempt.owns(connection=object())
        except TypeError as exc:
            errors.append(str(exc))
        with Session(env.engine) as session:
            with attempt.transaction(connection=session, complete=True):
                pass  # writes nothing: not an ended transaction

    intake, _ = _intake(env, intakes, handle_attempt)
    intake.accept(body(46))
    assert intake.idle(20)
    assert len(errors) == 4, errors
    assert errors[3] == errors[0]  # owns(connection=...) says the same
    assert "SQLAlchemy Connection" in errors[0] and "Session" in errors[0]
    assert "Django" in errors[0] and "psycopg 3" in errors[0] and "builtins.object" in errors[0]
    assert "Engine" in errors[1] and "engine.connect()" in errors[1]
    assert all("UPDATE" not in e and "SELECT" not in e for e in errors)  # never the store's SQL
    assert env.state(46) == "completed"


# -- a block that writes nothing, and AUTOCOMMIT engines ---------------------------------------
def _dict_store() -> Any:
    import importlib.util
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "examples" / "custom_store.py"
    spec = importlib.util.spec_from_file_location("ptb_fence_example_custom_store", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module.DictUpdateStore()


@pytest.mark.parametrize("store_of", ["its-store", "dict-store"])
@pytest.mark.parametrize("isolation", ["default", "AUTOCOMMIT"])
@pytest.mark.parametrize("given", ["session", "connection"])
def test_a_block_that_writes_nothing_completes_through_sqlalchemy(
    env: Env, intakes: List[UpdateIntake], store_of: str, isolation: str, given: str
) -> None:
    """A Session's or Connection's block that only reads, only runs DDL or runs nothing
    completes on its first attempt like one that writes, whatever the store (SQLite or
    PostgreSQL, whose ``owns`` runs on the caller's connection, or one whose ``owns`` does not)
    and also on an engine in AUTOCOMMIT mode: the write is committed together with the
    completion, never left in a transaction nobody commits."""
    engine = env.engine
    if isolation == "AUTOCOMMIT":
        engine = engine.execution_options(isolation_level="AUTOCOMMIT")
    store = env.store if store_of == "its-store" else _dict_store()
    branches = {51: "select", 52: "ddl", 53: "nothing", 54: "write"}
    ddl = f"CREATE TABLE IF NOT EXISTS ddl_{env.Booking.__tablename__} (x INTEGER)"
    seen: Dict[int, Any] = {}

    def handle_attempt(update: Dict[str, Any], attempt: Any) -> None:
        uid = update["update_id"]
        branch = branches[uid]
        opened = Session(engine) if given == "session" else engine.connect()
        with opened as conn:
            try:
                with attempt.transaction(connection=conn, complete=True) as tx:
                    if branch == "select":
                        tx.execute(sa.select(1)).all()
                    elif branch == "ddl":
                        tx.execute(sa.text(ddl))
                    elif branch == "write":
                        tx.execute(sa.insert(env.Booking).values(update_id=uid,
                                                                 attempt=attempt.attempt))
            except Exception as exc:
                seen[uid] = f"{type(exc).__name__}: {exc}"
                raise
            seen[uid] = attempt.completed

    clock = FakeClock()
    intake = UpdateIntake(store, clock=clock, handle_attempt=handle_attempt)
    intakes.append(intake)
    intake.start()
    for uid in branches:
        intake.accept(body(uid))
    assert intake.idle(20)
    assert seen == {uid: True for uid in branches}, seen
    if store_of == "its-store":
        assert [env.state(uid) for uid in branches] == ["completed"] * 4
    else:
        assert [store._rows[uid].state for uid in branches] == ["completed"] * 4
    env.engine.dispose()  # a transaction left open on a pooled connection is rolled back
    assert env.bookings() == [(54, 1)]  # committed, seen from a new connection


# -- psycopg 3 --------------------------------------------------------------------------------
@pytest.mark.parametrize("autocommit", [False, True])
@pytest.mark.parametrize("how", ["commit", "rollback", "nothing"])
def test_a_psycopg3_connection_is_fenced_and_its_own_commit_is_refused(
    pg_dsn: str, pg_tables: List[str], intakes: List[UpdateIntake], how: str,
    autocommit: bool,
) -> None:
    table, notes = "t_" + uuid.uuid4().hex[:16], "n_" + uuid.uuid4().hex[:16]
    pg_tables += [table, notes]
    with psycopg.connect(pg_dsn, autocommit=True) as setup:
        setup.execute(f"CREATE TABLE {notes} (update_id BIGINT NOT NULL)")
    store = PostgresUpdateStore(pg_dsn, table)
    seen: Dict[str, Any] = {}

    def handle_attempt(update: Dict[str, Any], attempt: Any) -> None:
        with psycopg.connect(pg_dsn, autocommit=autocommit) as conn:
            if autocommit:
                conn.execute("BEGIN")  # as for psycopg2: the row lock needs a transaction
            try:
                with attempt.transaction(connection=conn, complete=True) as tx:
                    if how != "nothing":
                        tx.execute(f"INSERT INTO {notes} VALUES (%s)", (update["update_id"],))
                        getattr(tx, how)()
            except TransactionEnded as exc:
                seen["error"] = exc
                raise
            finally:
                seen["completed"] = attempt.completed

    try:
        no_engine: Any = None
        intake, _ = _intake(Env(store, no_engine, str, None), intakes, handle_attempt)
        intake.accept(body(47))
        assert intake.idle(20)
        with psycopg.connect(pg_dsn) as check:
            state = check.execute(f"SELECT state FROM {table}").fetchone()
            written = check.execute(f"SELECT count(*) FROM {notes}").fetchone()
        if how == "nothing":
            assert "error" not in seen and seen["completed"] is True
            assert state == ("completed",)
        else:
            assert isinstance(seen.get("error"), TransactionEnded), seen
            assert f"refused {how}()" in str(seen["error"])
            assert seen["completed"] is False and state == ("abandoned",)  # not retried
            assert written == (0,)  # refused before anything committed
    finally:
        for intake in intakes:
            intake.close()
        store.close()


def test_the_adapters_import_nothing_until_used(tmp_path: Any) -> None:
    """``import ptb_fence`` and a fenced transaction on a sqlite3 connection import neither
    SQLAlchemy, Django nor psycopg 3 (they are test-only dependencies)."""
    import json
    import subprocess
    import sys

    script = f"""
import json, sqlite3, sys
from ptb_fence import SQLiteUpdateStore, UpdateIntake
path = {str(tmp_path / "light.db")!r}
store = SQLiteUpdateStore(path)
done = []
def handle_attempt(update, attempt):
    conn = sqlite3.connect(path, timeout=10)
    with attempt.transaction(connection=conn, complete=True):
        pass
    conn.close()
    done.append(attempt.completed)
intake = UpdateIntake(store, handle_attempt=handle_attempt)
intake.start()
intake.accept({body(1)!r})
assert intake.idle(20)
intake.close(); store.close()
heavy = ("sqlalchemy", "django", "psycopg", "ptb_fence.contrib")
print(json.dumps([done, sorted(m for m in heavy if m in sys.modules)]))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=60, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [[True], []]


def test_run_in_transaction_takes_a_session(
    env: Env, intakes: List[UpdateIntake]
) -> None:
    """The asyncio form: ``fn`` runs on a worker thread with the Session, committed by
    SQLAlchemy together with the completion."""
    import asyncio

    seen: Dict[str, Any] = {}

    def handle_attempt(update: Dict[str, Any], attempt: Any) -> None:
        def write(session: Session) -> int:
            session.add(env.Booking(update_id=update["update_id"], attempt=attempt.attempt))
            return 7

        with Session(env.engine) as session:
            seen["result"] = asyncio.run(
                attempt.run_in_transaction(write, connection=session, complete=True))
        seen["completed"] = attempt.completed

    intake, _ = _intake(env, intakes, handle_attempt)
    intake.accept(body(48))
    assert intake.idle(20)
    assert seen == {"result": 7, "completed": True}
    assert env.bookings() == [(48, 1)] and env.state(48) == "completed"


def test_an_outbox_call_in_a_session_block_commits_with_the_booking(
    env: Env, intakes: List[UpdateIntake]
) -> None:
    """``attempt.outbox`` inside the block writes its call through the Session's transaction
    (SQLite, psycopg 2 and psycopg 3 under SQLAlchemy): the crashed attempt's call is rolled
    back with its flushed write, the retry's call commits with the booking and is sent once."""
    import time

    from ptb_fence.testing import FakeBotApi

    calls: Dict[int, Any] = {}

    def handle_attempt(update: Dict[str, Any], attempt: Any) -> None:
        uid = update["update_id"]
        with Session(env.engine) as session:
            with attempt.transaction(connection=session, complete=True):
                session.add(env.Booking(update_id=uid, attempt=attempt.attempt))
                calls[attempt.attempt] = attempt.outbox.send_message(7, f"booked {uid}")
                if attempt.attempt == 1:
                    session.flush()
                    raise RuntimeError("crash after the ORM write and the outbox call")

    with FakeBotApi() as fake:
        clock = FakeClock()
        intake = UpdateIntake(env.store, clock=clock, handle_attempt=handle_attempt,
                              bot_token=fake.token, bot_base_url=fake.base_url)
        intakes.append(intake)
        intake.start()
        intake.accept(body(61))
        assert intake.idle(20)
        assert env.bookings() == [] and env.store.list_calls(limit=10) == []  # rolled back
        _retry_now(intake, clock)
        assert env.bookings() == [(61, 2)] and env.state(61) == "completed"
        assert isinstance(calls[2], int)  # written inside the transaction: its id at once
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not fake.sent_messages:
            time.sleep(0.05)
        [entry] = env.store.list_calls(limit=10)
        assert entry.call_id == calls[2]
        assert [m["text"] for m in fake.sent_messages] == ["booked 61"], fake.sent_messages


# -- asyncio connections ------------------------------------------------------------------------
def test_asyncio_connections_are_refused_at_the_call_naming_the_recipe(
    pg_dsn: str, pg_tables: List[str], intakes: List[UpdateIntake]
) -> None:
    """A psycopg 3 ``AsyncConnection`` and a SQLAlchemy ``AsyncSession``/``AsyncConnection``
    as ``connection=``: a ``UsageError`` (a ``TypeError``) at the call, before anything opens
    or ``fn`` runs, naming what works; no coroutine is left un-awaited."""
    import asyncio
    import warnings

    from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

    from ptb_fence import UsageError

    table = "t_" + uuid.uuid4().hex[:16]
    pg_tables.append(table)
    store = PostgresUpdateStore(pg_dsn, table)
    errors: Dict[str, Any] = {}
    ran: List[str] = []

    def handle_attempt(update: Dict[str, Any], attempt: Any) -> None:
        async def main() -> None:
            engine = create_async_engine(pg_dsn.replace("postgresql://",
                                                        "postgresql+psycopg://", 1))
            aconn = await psycopg.AsyncConnection.connect(pg_dsn)
            try:
                async with AsyncSession(engine) as session, engine.connect() as core:
                    for name, given in (("psycopg", aconn), ("session", session),
                                        ("core", core)):
                        try:
                            await attempt.run_in_transaction(ran.append, connection=given,
                                                             complete=True)
                        except TypeError as exc:
                            errors[name] = exc
                        try:
                            with attempt.transaction(connection=given, complete=True):
                                ran.append(name)
                        except TypeError as exc:
                            errors[name + "-sync"] = exc
            finally:
                await aconn.close()
                await engine.dispose()

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            asyncio.run(main())
        errors["warnings"] = [str(w.message) for w in caught]

    try:
        no_engine: Any = None
        intake, _ = _intake(Env(store, no_engine, str, None), intakes, handle_attempt)
        intake.accept(body(70))
        assert intake.idle(20)
    finally:
        for made in intakes:
            made.close()
        store.close()
    assert ran == []
    assert all(isinstance(errors[k], UsageError) for k in
               ("psycopg", "psycopg-sync", "session", "session-sync", "core", "core-sync"))
    assert "psycopg.connect" in str(errors["psycopg"]) and "AsyncConnection" in str(
        errors["psycopg"])
    assert "run_sync" in str(errors["session"]) and "AsyncSession" in str(errors["session"])
    assert "run_sync" in str(errors["core-sync"])
    assert not any("never awaited" in w for w in errors["warnings"]), errors["warnings"]


def test_the_readme_asyncsession_recipe_completes_in_one_commit(
    pg_dsn: str, pg_tables: List[str], intakes: List[UpdateIntake]
) -> None:
    """The README's recipe for an ``AsyncSession``: ``await session.run_sync(write)`` with
    ``attempt.transaction(connection=sync_session, complete=True)`` inside ``write``: the
    ORM write and the completion commit together; a crashed attempt's flushed write is
    rolled back with the completion made at its start."""
    import asyncio

    from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

    table, bookings = "t_" + uuid.uuid4().hex[:16], "b_" + uuid.uuid4().hex[:12]
    pg_tables += [table, bookings]
    Booking = _model(bookings)
    store = PostgresUpdateStore(pg_dsn, table)
    url = pg_dsn.replace("postgresql://", "postgresql+psycopg://", 1)
    sync_engine = sa.create_engine(url)
    Booking.metadata.create_all(sync_engine)
    seen: Dict[int, Any] = {}

    def handle_attempt(update: Dict[str, Any], attempt: Any) -> None:
        async def book() -> None:  # as a PTB handler would, on the event loop
            async_engine = create_async_engine(url)

            def write(session: Session) -> None:  # the AsyncSession's sync Session
                with attempt.transaction(connection=session, complete=True):
                    session.add(Booking(update_id=update["update_id"],
                                        attempt=attempt.attempt))
                    if attempt.attempt == 1:
                        session.flush()
                        raise RuntimeError("crash after the flushed write")

            try:
                async with AsyncSession(async_engine) as session:
                    await session.run_sync(write)
            finally:
                await async_engine.dispose()
                seen[attempt.attempt] = attempt.completed

        asyncio.run(book())

    try:
        intake, clock = _intake(Env(store, sync_engine, str, Booking), intakes, handle_attempt)
        intake.accept(body(71))
        _retry_now(intake, clock)
        env = Env(store, sync_engine, str, Booking)
        assert seen == {1: False, 2: True}
        assert env.bookings() == [(71, 2)]
        with psycopg.connect(pg_dsn) as check:
            assert check.execute(f"SELECT state FROM {table}").fetchall() == [("completed",)]
    finally:
        for made in intakes:
            made.close()
        sync_engine.dispose()
        store.close()


@pytest.mark.parametrize("given", ["session", "connection"])
def test_a_rollback_inside_the_block_then_a_write_never_commits(
    env: Env, intakes: List[UpdateIntake], given: str
) -> None:
    """``session.rollback()`` (or ``connection.rollback()``) in the block, then another
    write: the rollback took the completion made at the start with it, and the write after
    it is in a transaction no fence checked. The block fails naming the rollback, the later
    write is rolled back too, nothing is completed, not retried."""
    seen: Dict[str, Any] = {}
    runs: List[int] = []

    def handle_attempt(update: Dict[str, Any], attempt: Any) -> None:
        runs.append(attempt.attempt)
        uid = update["update_id"]
        table = env.Booking.__table__
        opened = Session(env.engine) if given == "session" else env.engine.connect()
        with opened as target:
            try:
                with attempt.transaction(connection=target, complete=True):
                    target.execute(table.insert().values(update_id=uid, attempt=1))
                    target.rollback()
                    target.execute(table.insert().values(update_id=uid + 1000, attempt=1))
            except TransactionEnded as exc:
                seen["error"] = exc
                raise
            finally:
                seen["completed"] = attempt.completed

    intake, clock = _intake(env, intakes, handle_attempt)
    intake.accept(body(51))
    _retry_now(intake, clock)
    assert "rolled it back itself" in str(seen.get("error")), seen
    assert seen["completed"] is False and runs == [1]
    assert env.bookings() == []
    assert env.state(51) == "abandoned"


def test_a_savepoint_inside_a_session_block_is_no_refused_commit(
    env: Env, intakes: List[UpdateIntake]
) -> None:
    """``session.begin_nested()`` in the block: its release is no commit of the Session (the
    refusal lets it through), a rolled-back savepoint drops only its own write, and the block
    completes with the rest."""
    seen: Dict[str, Any] = {}

    def handle_attempt(update: Dict[str, Any], attempt: Any) -> None:
        uid = update["update_id"]
        with Session(env.engine) as session:
            with attempt.transaction(connection=session, complete=True):
                with session.begin_nested():
                    session.add(env.Booking(update_id=uid, attempt=attempt.attempt))
                nested = session.begin_nested()
                session.add(env.Booking(update_id=uid + 1000, attempt=attempt.attempt))
                session.flush()
                nested.rollback()
            seen["completed"] = attempt.completed

    intake, _ = _intake(env, intakes, handle_attempt)
    intake.accept(body(52))
    assert intake.idle(20)
    assert seen == {"completed": True}
    assert env.bookings() == [(52, 1)] and env.state(52) == "completed"
