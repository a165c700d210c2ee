#!/usr/bin/env python
"""Write your own update store and prove it right with ``check_update_store``.

ptb_fence ships SQLite, PostgreSQL and in-memory stores. For another database (MySQL, Redis,
DynamoDB, an ORM, ...) you write a store yourself: a plain class with the methods of
:class:`ptb_fence.DurableUpdateStore` (no base class needed; the levels are detected by duck
typing). This example writes one from scratch, :class:`DictUpdateStore`, and runs the public
conformance check, :func:`ptb_fence.conformance.check_update_store`, against it. The check runs
every rule of the store contract (one record per update, leases, fencing by claim id, retries,
pruning, concurrent claims from 8 threads, durable exhaustions, ...) and returns the violations.

The store keeps its rows in a dict, so it loses everything on restart; it is a template. The one
idea to carry over to a real database: **every rule is one atomic, conditional step on one row**.
Here that step runs under one lock. In SQL it is one ``UPDATE ... WHERE <precondition> RETURNING
...`` statement (see the SQL next to each method); in Redis one Lua script. Never read a row,
decide in Python, and write it back in a second step: two processes would both decide "free".

No outbox: this store is no :class:`ptb_fence.BatchStore` declaring ``outbox`` in its
:class:`ptb_fence.StoreFeatures`, so ``attempt.outbox`` raises with it and the handler below
sends nothing to Telegram. A handler of yours on such a store sends its replies
itself (``bot.send_message``, an HTTP call): after the completion's commit a reply may be lost
in a crash, before it a reply may be sent twice; ``attempt.outbox`` (sent iff the completion
committed, at least once) needs a batch store that declares the outbox and passes
``check_update_store`` with it, as the SQLite and PostgreSQL stores do.

Run it::

    python examples/custom_store.py               # exit code 0: the store conforms
    python examples/custom_store.py --break-fence # a store whose fence ignores the claim id:
                                                  # the check names the violations, exit code 1

Put the same check in your own test suite::

    def test_my_store_conforms():
        assert check_update_store(lambda: MyStore(...fresh, empty...)) == []
"""

from __future__ import annotations

import argparse
import logging
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from ptb_fence import (
    Abandoned,
    Attempt,
    AttemptIdentity,
    Completed,
    Exhaustion,
    Failed,
    Settlement,
    StoredUpdate,
    UpdateIntake,
    is_durable,
)
from ptb_fence.conformance import check_update_store


@dataclass
class _Row:
    """One row per update_id: the columns of the SPEC's table (times in epoch milliseconds)."""

    body: str
    received_at: int
    state: str = "pending"  # pending | processing | failed | completed | abandoned
    attempts: int = 0
    due_at: Optional[int] = None  # processing: lease end; failed: retry time; abandoned: end
    settled_at: Optional[int] = None  # NULL = not prunable (includes unacknowledged exhaustions)
    error: Optional[str] = None
    claim_id: Optional[str] = None


class DictUpdateStore:
    """A durable, fenced update store over a dict (thread-safe, one process, not persistent).

    Implements the base contract (``add``, ``claim``, ``renew``, ``settle``, ``due``,
    ``prune``), the fenced one (``claim_owned``, ``renew_owned``, ``owns``, ``settle_owned``) and
    the durable one (``exhaust``, ``due_exhaustions``, ``acknowledge_exhaustion``), plus
    ``close()`` and the context manager protocol.
    """

    def __init__(self) -> None:
        self._rows: Dict[int, _Row] = {}
        self._lock = threading.Lock()  # "one statement": every method holds it throughout

    # -- preconditions (the WHERE clauses) ----------------------------------------------------
    @staticmethod
    def _claimable(row: _Row, now: int) -> bool:
        # WHERE state = 'pending' OR (state = 'failed' AND due_at <= :now)
        #       OR (state = 'processing' AND due_at < :now)
        # A lease is held while due_at >= t (inclusive); a retry is due when due_at <= now.
        return (
            row.state == "pending"
            or (row.state == "failed" and row.due_at is not None and row.due_at <= now)
            or (row.state == "processing" and row.due_at is not None and row.due_at < now)
        )

    @staticmethod
    def _live(row: _Row, attempt: int, at: Optional[int], claim_id: Optional[str] = None) -> bool:
        # WHERE state = 'processing' AND attempts = :attempt AND due_at >= :at
        #       [AND claim_id = :claim_id]     -- the fence
        return (
            row.state == "processing"
            and row.attempts == attempt
            and (at is None or (row.due_at is not None and row.due_at >= at))
            and (claim_id is None or row.claim_id == claim_id)
        )

    @staticmethod
    def _apply(row: _Row, settlement: Settlement) -> None:
        if isinstance(settlement, Completed):
            row.state, row.settled_at, row.error = "completed", settlement.at, None
        elif isinstance(settlement, Failed):
            row.state, row.due_at, row.error = "failed", settlement.retry_at, settlement.error
            row.settled_at = None
        elif isinstance(settlement, Abandoned):
            row.state, row.settled_at, row.error = "abandoned", settlement.at, settlement.error
        else:
            raise TypeError(f"not a settlement: {settlement!r}")

    def _take(self, update_id: int, now: int, lease_until: int, max_attempts: int,
              durable_exhaustion: bool) -> Optional[_Row]:
        """Claim the row for a new attempt, or spend it; caller holds the lock."""
        row = self._rows.get(update_id)
        if row is None or not self._claimable(row, now):
            return None  # unknown, final, or a live lease elsewhere
        if row.attempts < max_attempts:
            # UPDATE ... SET state = 'processing', attempts = attempts + 1, due_at = :lease_until,
            #   error = NULL, claim_id = :fresh WHERE update_id = :id AND <claimable>
            #   AND attempts < :max_attempts RETURNING attempts, claim_id
            row.state = "processing"
            row.attempts += 1
            row.due_at = lease_until
            row.error = None
            row.claim_id = uuid.uuid4().hex  # globally unique, opaque
            return row
        # Spend: UPDATE ... SET state = 'abandoned', due_at = :now, error = 'attempts spent',
        #   settled_at = CASE WHEN :durable THEN NULL ELSE :now END WHERE ... attempts >= :max
        row.state = "abandoned"
        row.due_at = now
        row.error = "attempts spent"
        row.settled_at = None if durable_exhaustion else now
        if durable_exhaustion and not row.claim_id:
            row.claim_id = uuid.uuid4().hex  # an exhaustion is acknowledged by its identity
        return None

    # -- base contract ------------------------------------------------------------------------
    def add(self, update_id: int, body: str, received_at: int) -> bool:
        """INSERT ... ON CONFLICT (update_id) DO NOTHING; True if inserted."""
        with self._lock:
            if update_id in self._rows:
                return False
            self._rows[update_id] = _Row(body=body, received_at=received_at)
            return True

    def claim(self, update_id: int, *, now: int, lease_until: int, max_attempts: int,
              durable_exhaustion: bool = False) -> Optional[int]:
        """Take the update for a new attempt; returns the attempt number or None."""
        with self._lock:
            row = self._take(update_id, now, lease_until, max_attempts, durable_exhaustion)
            return None if row is None else row.attempts

    def renew(self, update_id: int, attempt: int, lease_until: int,
              now: Optional[int] = None) -> bool:
        """due_at = MAX(due_at, :lease_until) WHERE <live at now>: never shortens, never revives."""
        with self._lock:
            row = self._rows.get(update_id)
            if row is None or not self._live(row, attempt, now):
                return False
            row.due_at = max(row.due_at or lease_until, lease_until)
            return True

    def settle(self, update_id: int, attempt: int, settlement: Settlement) -> None:
        """Record the attempt's result where it still holds its lease at ``settlement.at``."""
        with self._lock:
            row = self._rows.get(update_id)
            if row is not None and self._live(row, attempt, settlement.at):
                self._apply(row, settlement)

    def due(self, *, now: int, pending_before: int, limit: int) -> List[StoredUpdate]:
        """SELECT update_id, body WHERE (pending AND received_at <= :pending_before) OR failed
        and due OR lease lapsed ORDER BY update_id LIMIT :limit."""
        with self._lock:
            result: List[StoredUpdate] = []
            for update_id in sorted(self._rows):
                row = self._rows[update_id]
                if row.state == "pending":
                    wanted = row.received_at <= pending_before
                else:
                    wanted = row.state in ("failed", "processing") and self._claimable(row, now)
                if wanted:
                    result.append(StoredUpdate(update_id=update_id, body=row.body))
                    if len(result) >= limit:
                        break
            return result

    def prune(self, before: int) -> int:
        """DELETE WHERE state IN ('completed', 'abandoned') AND settled_at < :before."""
        with self._lock:
            doomed = [
                update_id
                for update_id, row in self._rows.items()
                if row.state in ("completed", "abandoned")
                and row.settled_at is not None
                and row.settled_at < before
            ]
            for update_id in doomed:
                del self._rows[update_id]
            return len(doomed)

    # -- fenced contract ------------------------------------------------------------------------
    def claim_owned(self, update_id: int, *, now: int, lease_until: int, max_attempts: int,
                    durable_exhaustion: bool = False) -> Optional[AttemptIdentity]:
        """As ``claim``; returns the identity with the claim id read back from the row."""
        with self._lock:
            row = self._take(update_id, now, lease_until, max_attempts, durable_exhaustion)
            if row is None:
                return None
            assert row.claim_id is not None
            return AttemptIdentity(update_id=update_id, attempt=row.attempts,
                                   claim_id=row.claim_id)

    def renew_owned(self, identity: AttemptIdentity, lease_until: int,
                    now: Optional[int] = None) -> bool:
        """As ``renew``, and the claim id must match."""
        with self._lock:
            row = self._rows.get(identity.update_id)
            if row is None or not self._live(row, identity.attempt, now, identity.claim_id):
                return False
            row.due_at = max(row.due_at or lease_until, lease_until)
            return True

    def owns(self, identity: AttemptIdentity, at: int, *, connection: Any = None) -> bool:
        """True only while this exact claim holds an unexpired lease at ``at``.

        A SQL store runs this on the caller's ``connection`` inside the caller's transaction
        (``SELECT ... FOR UPDATE``), so the domain write and the check commit together. This
        store has no connections; it answers from its rows.
        """
        with self._lock:
            row = self._rows.get(identity.update_id)
            return row is not None and self._live(row, identity.attempt, at, identity.claim_id)

    def settle_owned(self, identity: AttemptIdentity, settlement: Settlement) -> bool:
        """As ``settle``, and the claim id must match; returns whether it landed."""
        with self._lock:
            row = self._rows.get(identity.update_id)
            if row is None or not self._live(row, identity.attempt, settlement.at,
                                             identity.claim_id):
                return False
            self._apply(row, settlement)
            return True

    # -- durable contract -----------------------------------------------------------------------
    def exhaust(self, identity: AttemptIdentity, *, at: int, error: str) -> bool:
        """Turn the live claim into an unacknowledged exhaustion (abandoned, settled_at NULL)."""
        with self._lock:
            row = self._rows.get(identity.update_id)
            if row is None or not self._live(row, identity.attempt, at, identity.claim_id):
                return False
            row.state, row.due_at, row.settled_at, row.error = "abandoned", at, None, error
            return True

    def due_exhaustions(self, *, limit: int,
                        after_update_id: Optional[int] = None) -> List[Exhaustion]:
        """Abandoned rows with settled_at NULL and update_id > :after, by update_id."""
        with self._lock:
            result: List[Exhaustion] = []
            for update_id in sorted(self._rows):
                if after_update_id is not None and update_id <= after_update_id:
                    continue
                row = self._rows[update_id]
                if row.state != "abandoned" or row.settled_at is not None:
                    continue
                assert row.claim_id is not None and row.due_at is not None
                result.append(Exhaustion(update_id=update_id, attempt=row.attempts,
                                         claim_id=row.claim_id, body=row.body,
                                         exhausted_at=row.due_at, error=row.error))
                if len(result) >= limit:
                    break
            return result

    def acknowledge_exhaustion(self, identity: AttemptIdentity, at: int) -> bool:
        """Only the exact identity of an unacknowledged exhaustion sets settled_at = :at."""
        with self._lock:
            row = self._rows.get(identity.update_id)
            if (
                row is None
                or row.state != "abandoned"
                or row.settled_at is not None
                or row.attempts != identity.attempt
                or row.claim_id != identity.claim_id
            ):
                return False
            row.settled_at = at
            return True

    # -- lifecycle ------------------------------------------------------------------------------
    def close(self) -> None:
        """Nothing to release here (a database store closes its connections)."""

    def __enter__(self) -> "DictUpdateStore":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class FenceIgnoresClaimId(DictUpdateStore):
    """A deliberately broken store (``--break-fence``): ``owns`` and ``settle_owned`` check
    the attempt number but not the claim id, so a stale attempt whose number happens to match
    (after a prune and re-add of the same update_id) would be allowed to write."""

    def owns(self, identity: AttemptIdentity, at: int, *, connection: Any = None) -> bool:
        with self._lock:
            row = self._rows.get(identity.update_id)
            return row is not None and self._live(row, identity.attempt, at)

    def settle_owned(self, identity: AttemptIdentity, settlement: Settlement) -> bool:
        with self._lock:
            row = self._rows.get(identity.update_id)
            if row is None or not self._live(row, identity.attempt, settlement.at):
                return False
            self._apply(row, settlement)
            return True


def try_it(store: DictUpdateStore) -> bool:
    """Use the store: a blocking UpdateIntake handles two updates with fenced checks."""
    handled: List[int] = []
    exhausted: List[Exhaustion] = []
    refused: List[str] = []  # attempt.outbox with a store that has no outbox

    def handle_attempt(update: Dict[str, Any], attempt: Attempt) -> None:
        if update.get("message", {}).get("text") == "fail":
            attempt.exhaust("refusing on purpose")  # terminal: no retries, exhaustion handler
            return
        if not attempt.owns():  # advisory here; a SQL store checks inside your transaction
            return
        try:
            attempt.outbox  # noqa: B018 - this store is no OutboxStore: refused
        except TypeError as exc:
            refused.append(str(exc))
        handled.append(attempt.update_id)

    intake = UpdateIntake(store, handle_attempt=handle_attempt,
                          handle_exhaustion=exhausted.append, lease_seconds=5)
    intake.start()
    try:
        for update_id, text in ((1, "hello"), (2, "fail"), (1, "hello")):
            body = f'{{"update_id": {update_id}, "message": {{"text": "{text}"}}}}'
            print(f"  accept update {update_id}: {intake.accept(body)}")
        if not intake.idle(timeout=10):
            print("  the intake did not finish in 10 s")
            return False
    finally:
        intake.close()
    print(f"  handled: {handled}; exhaustions delivered: "
          f"{[(e.update_id, e.error) for e in exhausted]}")
    print(f"  attempt.outbox: refused ({refused[0] if refused else 'NOT refused'})")
    return handled == [1] and [e.update_id for e in exhausted] == [2] and len(refused) == 1


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--break-fence", action="store_true",
                        help="check a deliberately broken store (shows the check biting)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="  log: %(levelname)s %(name)s: %(message)s")
    store_class = FenceIgnoresClaimId if args.break_fence else DictUpdateStore

    print(f"{store_class.__name__}: durable = {is_durable(store_class())}")
    started = time.monotonic()
    # make() must return a FRESH, EMPTY store every time: one per rule.
    violations = check_update_store(store_class)
    elapsed = time.monotonic() - started
    if violations:
        print(f"check_update_store: {len(violations)} violation(s) in {elapsed:.2f} s")
        for violation in violations:
            print(f"  - {violation}")
        return 1
    print(f"check_update_store: no violations ({elapsed:.2f} s); the store conforms")

    print("using it with UpdateIntake:")
    with store_class() as store:
        if not try_it(store):
            print("unexpected result")
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
