"""``connection=`` takes a Django connection: the fenced transaction is a Django
``transaction.atomic()`` block that Django commits (the happy path and a crash are run end to
end by tests/processes/test_examples.py with examples/django_booking.py).

Django is configured once in this process with two databases: ``default`` (a SQLite file,
also the SQLite store's file) and ``pg`` (the shared PostgreSQL, with Django's psycopg 3
driver). Real UpdateIntakes; every worker thread closes its Django connection.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any, Dict, Iterator, List, Tuple

import psycopg
import pytest

from ptb_fence import (
    OwnershipLost,
    PostgresUpdateStore,
    SQLiteUpdateStore,
    TransactionEnded,
    UpdateIntake,
)
from runtime_support import FakeClock, body

django = pytest.importorskip("django")

BOOKINGS = "dj_" + uuid.uuid4().hex[:12]
_MODEL: List[Any] = []


@pytest.fixture(scope="module")
def django_setup(tmp_path_factory: pytest.TempPathFactory,
                 pg_dsn: str) -> Iterator[Tuple[Any, str]]:
    from django.conf import settings

    sqlite_path = str(tmp_path_factory.mktemp("django") / "bot.sqlite3")
    if not settings.configured:
        url = psycopg.conninfo.conninfo_to_dict(pg_dsn)
        settings.configure(DATABASES={
            "default": {"ENGINE": "django.db.backends.sqlite3", "NAME": sqlite_path,
                        "OPTIONS": {"timeout": 30}},
            "pg": {"ENGINE": "django.db.backends.postgresql", "NAME": url.get("dbname", ""),
                   "USER": url.get("user", ""), "PASSWORD": url.get("password", ""),
                   "HOST": url.get("host", ""), "PORT": str(url.get("port", ""))},
        }, USE_TZ=True)
        django.setup()
    from django.db import connections, models

    if not _MODEL:
        class Booking(models.Model):
            update_id = models.BigIntegerField(unique=True)
            attempt = models.IntegerField()

            class Meta:
                app_label = "contrib_tests"
                db_table = BOOKINGS

        _MODEL.append(Booking)
    for alias in ("default", "pg"):
        with connections[alias].schema_editor() as editor:
            editor.create_model(_MODEL[0])
        connections[alias].close()
    yield _MODEL[0], sqlite_path
    with connections["pg"].schema_editor() as editor:
        editor.delete_model(_MODEL[0])
    connections.close_all()


class Env:
    def __init__(self, alias: str, store: Any, booking: Any, state: Any) -> None:
        self.alias, self.store, self.Booking, self.state = alias, store, booking, state

    def bookings(self) -> List[Tuple[int, int]]:
        from django.db import connections

        try:
            rows = self.Booking.objects.using(self.alias).values_list("update_id", "attempt")
            return sorted(rows)
        finally:
            connections[self.alias].close()


@pytest.fixture(params=["default", "pg"])
def env(request: Any, django_setup: Tuple[Any, str], pg_dsn: str,
        pg_tables: List[str]) -> Iterator[Env]:
    booking, sqlite_path = django_setup
    table = "t_" + uuid.uuid4().hex[:16]
    if request.param == "pg":
        pg_tables.append(table)
        store: Any = PostgresUpdateStore(pg_dsn, table)
    else:
        store = SQLiteUpdateStore(sqlite_path, table)

    def state(uid: int) -> str:
        from django.db import connections

        with connections[request.param].cursor() as cur:
            cur.execute(f"SELECT state FROM {table} WHERE update_id = %s", [uid])
            found = cur.fetchall()
        connections[request.param].close()
        return str(found[0][0]) if found else "missing"

    try:
        yield Env(request.param, store, booking, state)
    finally:
        store.close()


def _run(env: Env, made: List[UpdateIntake], handle: Any, update_id: int,
         clock: Any = None) -> None:
    from django.db import connections

    def handle_attempt(update: Dict[str, Any], attempt: Any) -> None:
        try:
            handle(update, attempt, connections[env.alias])
        finally:
            connections[env.alias].close()  # this worker thread's connection

    intake = UpdateIntake(env.store, clock=clock or FakeClock(), handle_attempt=handle_attempt)
    made.append(intake)
    intake.start()
    intake.accept(body(update_id))
    assert intake.idle(20)


def test_a_django_connection_commits_the_orm_write_and_the_completion_together(
    env: Env, intakes: List[UpdateIntake]
) -> None:
    seen: Dict[str, Any] = {}

    def handle(update: Dict[str, Any], attempt: Any, connection: Any) -> None:
        with attempt.transaction(connection=connection, complete=True) as tx:
            seen["same"] = tx is connection and connection.in_atomic_block
            env.Booking.objects.using(env.alias).create(update_id=update["update_id"],
                                                        attempt=attempt.attempt)
        seen["completed"] = attempt.completed

    _run(env, intakes, handle, 61)
    assert seen == {"same": True, "completed": True}
    assert (61, 1) in env.bookings() and env.state(61) == "completed"


def test_inside_another_atomic_block_is_refused(
    env: Env, intakes: List[UpdateIntake]
) -> None:
    from django.db import transaction

    seen: Dict[str, Any] = {}

    def handle(update: Dict[str, Any], attempt: Any, connection: Any) -> None:
        with transaction.atomic(using=env.alias):
            try:
                with attempt.transaction(connection=connection, complete=True):
                    raise AssertionError("not reached")
            except ValueError as exc:
                seen["error"] = str(exc)
        try:
            with attempt.transaction(connection=connection.cursor(), complete=True):
                raise AssertionError("not reached")
        except TypeError as exc:  # a Django cursor is not a Django connection
            seen["type_error"] = str(exc)

    _run(env, intakes, handle, 62)
    assert "inside another atomic() block" in seen["error"]
    assert "django.db.connection" in seen["type_error"]
    assert env.state(62) == "completed"  # the handler returned


def test_a_raw_commit_inside_the_block_is_transaction_ended(
    env: Env, intakes: List[UpdateIntake]
) -> None:
    seen: Dict[str, Any] = {}

    def handle(update: Dict[str, Any], attempt: Any, connection: Any) -> None:
        try:
            with attempt.transaction(connection=connection, complete=True):
                env.Booking.objects.using(env.alias).create(update_id=update["update_id"],
                                                            attempt=attempt.attempt)
                connection.connection.commit()  # behind Django's back
        except TransactionEnded as exc:
            seen["error"] = exc
        seen["completed"] = attempt.completed
        raise RuntimeError("stop here")

    _run(env, intakes, handle, 63)
    assert isinstance(seen.get("error"), TransactionEnded), seen
    assert seen["completed"] is False and env.state(63) == "failed"


def test_a_stale_attempts_django_write_is_rolled_back_with_ownership_lost(
    env: Env, intakes: List[UpdateIntake]
) -> None:
    clock = FakeClock()
    seen: Dict[str, Any] = {}

    def handle(update: Dict[str, Any], attempt: Any, connection: Any) -> None:
        if attempt.attempt > 1:
            return
        uid = update["update_id"]
        clock.advance(3600)
        now = clock.ms()
        seen["other"] = env.store.claim_owned(uid, now=now, lease_until=now + 600_000,
                                              max_attempts=5)
        try:
            with attempt.transaction(connection=connection, complete=True):
                env.Booking.objects.using(env.alias).create(update_id=uid,
                                                            attempt=attempt.attempt)
        except OwnershipLost as exc:
            seen["error"] = exc

    _run(env, intakes, handle, 64, clock)
    assert seen["other"] is not None and isinstance(seen.get("error"), OwnershipLost), seen
    assert all(uid != 64 for uid, _ in env.bookings())
    assert env.state(64) == "processing"


def test_a_block_marked_for_rollback_never_reads_as_a_completion(
    env: Env, intakes: List[UpdateIntake]
) -> None:
    """``transaction.set_rollback(True)`` inside the block: Django rolls the block back when
    it ends, the completion made at its start with it. The block fails with an error naming
    the cause; the attempt is not completed and not retried; nothing was written."""
    from django.db import transaction

    clock = FakeClock()
    seen: Dict[str, Any] = {}
    runs: List[int] = []

    def handle(update: Dict[str, Any], attempt: Any, connection: Any) -> None:
        runs.append(attempt.attempt)
        try:
            with attempt.transaction(connection=connection, complete=True):
                env.Booking.objects.using(env.alias).create(update_id=update["update_id"],
                                                            attempt=attempt.attempt)
                transaction.set_rollback(True, using=env.alias)
        except TransactionEnded as exc:
            seen["error"] = exc
            raise
        finally:
            seen["completed"] = attempt.completed

    _run(env, intakes, handle, 65, clock)
    clock.advance(3600)
    intakes[-1].sweep()
    assert intakes[-1].idle(20)
    error = seen.get("error")
    assert isinstance(error, TransactionEnded), seen
    assert "set_rollback(True)" in str(error) and "nothing of it was written" in str(error)
    assert seen["completed"] is False and runs == [1]
    assert env.state(65) == "abandoned"
    assert all(uid != 65 for uid, _ in env.bookings())


def test_a_django_commit_inside_the_block_is_final_not_retried(
    env: Env, intakes: List[UpdateIntake]
) -> None:
    """``transaction.commit()`` inside the block: Django refuses it inside ``atomic()``
    before anything commits; the block fails with ``TransactionEnded`` (a misuse: the
    attempt ends at once, not retried), nothing written."""
    from django.db import transaction

    clock = FakeClock()
    seen: Dict[str, Any] = {}
    runs: List[int] = []

    def handle(update: Dict[str, Any], attempt: Any, connection: Any) -> None:
        runs.append(attempt.attempt)
        try:
            with attempt.transaction(connection=connection, complete=True):
                env.Booking.objects.using(env.alias).create(update_id=update["update_id"],
                                                            attempt=attempt.attempt)
                transaction.commit(using=env.alias)
        except TransactionEnded as exc:
            seen["error"] = exc
            raise

    _run(env, intakes, handle, 66, clock)
    clock.advance(3600)
    intakes[-1].sweep()
    assert intakes[-1].idle(20)
    assert "Django forbids it inside atomic()" in str(seen.get("error")), seen
    assert runs == [1] and env.state(66) == "abandoned"
    assert all(uid != 66 for uid, _ in env.bookings())
