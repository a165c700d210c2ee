"""Structured logging: the runtime's events carry update_id/attempt/claim_id, never secrets.

An :class:`~ptb_fence.UpdateIntake` over a real :class:`~ptb_fence.MemoryUpdateStore` is driven
through a failing handler (retry scheduled), an exhaustion (and its acknowledgement), a renewal
refusal (owner lost) and store errors; ``caplog`` must show each event under a ``ptb_fence.*``
logger with the identity as record attributes, and no record at INFO or above may contain the
update body, a secret or a DSN password.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import Any, Callable, Dict, List, Optional

import pytest

from ptb_fence import (
    Attempt,
    Completed,
    Exhaustion,
    MemoryUpdateStore,
    PostgresUpdateStore,
    UpdateIntake,
)

BODY_SECRET = "body-text-never-logged-91c2"
TOKEN = "123456:AAH-bot-token-never-logged"
PASSWORD = "DsnPassw0rdNeverLogged"
WAIT = 10.0


def update(update_id: int) -> str:
    return json.dumps(
        {
            "update_id": update_id,
            "message": {
                "message_id": 1,
                "date": 1_700_000_000,
                "chat": {"id": 99, "type": "private"},
                "text": f"{BODY_SECRET} {TOKEN}",
            },
        }
    )


def wait_for(predicate: Callable[[], bool], timeout: float = WAIT) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


def records(caplog: Any, text: str, level: Optional[int] = None) -> List[logging.LogRecord]:
    found = [
        r for r in caplog.records
        if r.name.startswith("ptb_fence.") and text in r.getMessage()
        and (level is None or r.levelno == level)
    ]
    return found


def assert_identity(record: logging.LogRecord, update_id: int, attempt: int, claim_id: str) -> None:
    assert (record.update_id, record.attempt, record.claim_id) == (update_id, attempt, claim_id), (
        record.getMessage()
    )


def assert_nothing_leaks(caplog: Any, *secrets: str) -> None:
    """No record at INFO or above mentions a secret: message, attributes or traceback."""
    formatter = logging.Formatter("%(name)s %(levelname)s %(message)s")
    checked = 0
    for record in caplog.records:
        if record.levelno < logging.INFO:
            continue
        checked += 1
        text = formatter.format(record) + " " + " ".join(
            repr(value) for value in vars(record).values()
        )
        for secret in secrets:
            assert secret not in text, (secret, record.name, record.getMessage())
    assert checked > 0


@pytest.fixture
def captured(caplog: Any) -> Any:
    caplog.set_level(logging.DEBUG, logger="ptb_fence")
    return caplog


def test_a_failing_handler_logs_claims_retries_and_the_exhaustion(captured: Any) -> None:
    store = MemoryUpdateStore()
    identities: List[Attempt] = []
    delivered: List[Exhaustion] = []

    def handle(update_dict: Dict[str, Any], attempt: Attempt) -> None:
        identities.append(attempt)
        raise RuntimeError("the handler failed on purpose")

    intake = UpdateIntake(
        store,
        handle_attempt=handle,
        handle_exhaustion=delivered.append,
        max_attempts=2,
        retry=lambda error, attempt: 0.001,
        sweep_every_seconds=3600,
        pending_grace_seconds=3600,
    )
    intake.start()
    try:
        assert intake.accept(update(501)) == "accepted"
        assert intake.idle(WAIT)
        assert len(identities) == 1
        # the retry (due in 1 ms, before the next sweep) runs at its time, without a sweep
        assert wait_for(lambda: len(identities) == 2)
        assert intake.idle(WAIT)
        assert wait_for(lambda: len(delivered) == 1)
    finally:
        intake.close()
    first, second = identities
    assert first.claim_id != second.claim_id

    claims = records(captured, "claimed update 501", logging.DEBUG)
    assert len(claims) == 2
    assert_identity(claims[0], 501, 1, first.claim_id)
    assert_identity(claims[1], 501, 2, second.claim_id)

    (retry,) = records(captured, "retry scheduled", logging.WARNING)
    assert retry.name == "ptb_fence.runtime"
    assert_identity(retry, 501, 1, first.claim_id)
    assert retry.outcome == "retrying"
    assert "RuntimeError: the handler failed on purpose" in retry.getMessage()

    (exhausted,) = records(captured, "failed (exhausted)", logging.ERROR)
    assert_identity(exhausted, 501, 2, second.claim_id)
    assert exhausted.outcome == "exhausted"

    (acknowledged,) = records(captured, "acknowledged", logging.INFO)
    assert_identity(acknowledged, 501, 2, second.claim_id)
    assert delivered[0].identity == second.identity
    assert store.due_exhaustions(limit=10) == []

    assert_nothing_leaks(captured, BODY_SECRET, TOKEN)


def test_a_handler_exhausting_itself_and_a_failing_exhaustion_handler(captured: Any) -> None:
    store = MemoryUpdateStore()
    seen: List[Attempt] = []

    def handle(update_dict: Dict[str, Any], attempt: Attempt) -> None:
        seen.append(attempt)
        attempt.exhaust("ValueError: cannot handle this kind of update")

    def handle_exhaustion(exhaustion: Exhaustion) -> None:
        raise ConnectionError("alerting is down")

    intake = UpdateIntake(
        store,
        handle_attempt=handle,
        handle_exhaustion=handle_exhaustion,
        sweep_every_seconds=3600,
        pending_grace_seconds=3600,
    )
    intake.start()
    try:
        assert intake.accept(update(502)) == "accepted"
        assert intake.idle(WAIT)
    finally:
        intake.close()
    (attempt,) = seen
    (record,) = records(captured, "exhausted by its handler", logging.ERROR)
    assert_identity(record, 502, 1, attempt.claim_id)
    (failed,) = records(captured, "exhaustion handler failed", logging.ERROR)
    assert_identity(failed, 502, 1, attempt.claim_id)
    assert "ConnectionError: alerting is down" in failed.getMessage()
    assert [e.update_id for e in store.due_exhaustions(limit=10)] == [502]  # stays due
    assert_nothing_leaks(captured, BODY_SECRET, TOKEN)


def test_a_refused_renewal_logs_owner_lost(captured: Any) -> None:
    store = MemoryUpdateStore()
    started = threading.Event()
    lost: List[bool] = []
    holder: List[Attempt] = []

    def handle(update_dict: Dict[str, Any], attempt: Attempt) -> None:
        holder.append(attempt)
        started.set()
        lost.append(attempt.owner_lost.wait(WAIT))

    intake = UpdateIntake(
        store,
        handle_attempt=handle,
        lease_seconds=0.4,  # the lease keeper renews every 0.1 s
        sweep_every_seconds=3600,
        pending_grace_seconds=3600,
    )
    intake.start()
    try:
        assert intake.accept(update(503)) == "accepted"
        assert started.wait(WAIT)
        (attempt,) = holder
        # another worker took the update over and completed it: the next renewal is refused
        assert store.settle_owned(attempt.identity, Completed(int(time.time() * 1000)))
        assert intake.idle(WAIT)
    finally:
        intake.close()
    assert lost == [True]
    (record,) = records(captured, "owner lost", logging.WARNING)
    assert record.name == "ptb_fence.lease"
    assert_identity(record, 503, 1, attempt.claim_id)
    assert record.reason == "its renewal was refused"
    assert_nothing_leaks(captured, BODY_SECRET, TOKEN)


class _FailingSettle(MemoryUpdateStore):
    """A memory store whose settle_owned fails like a lost database connection."""

    def settle_owned(self, identity: Any, settlement: Any, **kwargs: Any) -> bool:
        raise ConnectionError("server closed the connection unexpectedly")


def test_store_errors_carry_the_attempt(captured: Any) -> None:
    store = _FailingSettle()
    holder: List[Attempt] = []
    errors: List[str] = []
    intake = UpdateIntake(
        store,
        handle_attempt=lambda update_dict, attempt: holder.append(attempt),
        on_store_error=lambda error, step: errors.append(step),
        sweep_every_seconds=3600,
        pending_grace_seconds=3600,
    )
    intake.start()
    try:
        assert intake.accept(update(504)) == "accepted"
        assert intake.idle(WAIT)
    finally:
        intake.close()
    (attempt,) = holder
    assert errors == ["settle"]
    (record,) = records(captured, "store error during settle", logging.ERROR)
    assert_identity(record, 504, 1, attempt.claim_id)
    assert record.step == "settle"
    assert "of update 504" in record.getMessage()
    assert_nothing_leaks(captured, BODY_SECRET, TOKEN)


def test_a_store_error_never_logs_the_dsn_password(captured: Any) -> None:
    # nothing listens on port 1: every store call fails to connect
    store = PostgresUpdateStore(
        f"postgresql://ptb:{PASSWORD}@127.0.0.1:1/bot", pool_timeout=5
    )
    steps: List[str] = []
    intake = UpdateIntake(
        store, handle=lambda update_dict: None, on_store_error=lambda e, step: steps.append(step)
    )
    try:
        assert intake.sweep() == 0
    finally:
        intake.close()
        store.close()
    assert steps and set(steps) == {"sweep"}
    sweep_errors = records(captured, "store error during sweep", logging.ERROR)
    assert sweep_errors
    for record in sweep_errors:
        assert (record.update_id, record.attempt, record.claim_id) == (None, None, None)
        assert record.step == "sweep"
    assert_nothing_leaks(captured, PASSWORD)


def test_the_cli_logs_retry_and_ack_with_the_identity(tmp_path: Any, captured: Any,
                                                      capsys: Any) -> None:
    from ptb_fence import SQLiteUpdateStore
    from ptb_fence.cli import main

    path = tmp_path / "bot.sqlite3"
    now = int(time.time() * 1000)
    with SQLiteUpdateStore(str(path)) as store:
        for uid in (601, 602):
            assert store.add(uid, update(uid), now)
            identity = store.claim_owned(uid, now=now, lease_until=now + 60_000, max_attempts=5)
            assert store.exhaust(identity, at=now, error="gave up")
            if uid == 601:
                first = identity
            else:
                second = identity
    url = f"sqlite:///{path}"
    assert main(["--store", url, "retry", "601"]) == 0
    assert main(["--store", url, "ack", "602", "--attempt", "1", "--claim-id",
                 second.claim_id]) == 0
    capsys.readouterr()
    (retry,) = records(captured, "retry: update 601", logging.INFO)
    assert retry.name == "ptb_fence.cli"
    assert_identity(retry, 601, 1, first.claim_id)
    (ack,) = records(captured, "ack: exhaustion of update 602", logging.INFO)
    assert_identity(ack, 602, 1, second.claim_id)
    assert_nothing_leaks(captured, BODY_SECRET, TOKEN)


def test_redeliveries_dropped_at_ingest_are_logged_at_info_the_first_few_times(
    tmp_path: Any, captured: Any
) -> None:
    """An update whose id is already recorded is not handled again, and says so: the first
    few at INFO (a bot that drops every new message must be able to see why), then DEBUG."""
    from ptb_fence import SQLiteUpdateStore
    from ptb_fence.runtime._runtime import REDELIVERIES_AT_INFO

    store = SQLiteUpdateStore(str(tmp_path / "redeliveries.db"))
    handled: List[int] = []
    intake = UpdateIntake(store, handle=lambda u: handled.append(u["update_id"]))
    intake.start()
    try:
        assert intake.accept(update(1000)) == "accepted"
        assert intake.idle(WAIT)
        for _ in range(REDELIVERIES_AT_INFO + 2):
            assert intake.accept(update(1000)) == "duplicate"
        assert intake.idle(WAIT)
    finally:
        intake.close()
        store.close()
    assert handled == [1000]
    said = records(captured, "update 1000 is already recorded: not handled again")
    assert [r.levelno for r in said] == [logging.INFO] * REDELIVERIES_AT_INFO + [logging.DEBUG] * 2
    assert all(r.name == "ptb_fence.ingest" and r.update_id == 1000 for r in said)
    assert "further redeliveries are logged at DEBUG" in said[REDELIVERIES_AT_INFO - 1].getMessage()
    assert "test Bot API restarted against a kept database" in said[0].getMessage()
    assert_nothing_leaks(captured, BODY_SECRET, TOKEN)
