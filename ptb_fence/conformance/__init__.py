"""The public conformance check for update stores.

:func:`check_update_store` runs the rules of the ``ptb_fence`` store contract against any
store and returns what it violates. The three stores that ship with ``ptb_fence`` pass it; authors
of custom stores (another database, another driver, an ORM) run it in their own test suite::

    from ptb_fence.conformance import check_update_store

    def test_my_store_conforms(tmp_path):
        counter = iter(range(1_000_000))

        def make():
            # A FRESH, EMPTY store on every call: one table/file/schema per call.
            return MyUpdateStore(f"{tmp_path}/store-{next(counter)}.db")

        assert check_update_store(make) == []

How it works:

* ``make`` is called once per rule and must return a new, **empty** store each time (rows from
  an earlier rule would change what a later rule sees). After the rule the store's ``close()`` is
  called when it has one. The check does not clean up files or tables; do that in your fixture.
* The capability level is detected by duck typing on the first store (:func:`ptb_fence.is_fenced`,
  :func:`ptb_fence.is_durable`): base rules run for every store, fenced rules (and the fenced tails
  of base rules) only for a fenced store, durable rules only for a durable store. A base store is
  never blamed for lacking fenced or durable methods.
* Each violation is one string ``"<rule>: <what happened>"``. A rule stops at the first exception
  the store raises, reported as ``"<rule>: raised <ExcType>: <message> (from store.<method>)"``,
  and the check goes on with the next rule. An empty list means the store conforms.
* Besides the behaviour, every rule checks the returned types: booleans must be real
  :obj:`bool` objects (``type(x) is bool``; ``1`` or ``0`` are reported), attempt numbers and
  :meth:`~ptb_fence.UpdateStore.prune` counts :obj:`int`, claim ids non-empty :obj:`str`, and
  :meth:`~ptb_fence.UpdateStore.due`/``due_exhaustions``/``claim_owned`` return
  :class:`~ptb_fence.StoredUpdate`/:class:`~ptb_fence.Exhaustion`/
  :class:`~ptb_fence.AttemptIdentity` objects.
* Times are fixed epoch milliseconds around ``T = 1_700_000_000_000``; messages write them as
  ``T+60001``. The whole check takes well under a second for an in-memory store; the
  concurrency rules use 8 real threads released together by a :class:`threading.Barrier`.
* It imports nothing from ``telegram``: it can run wherever the store runs.

Rules (:data:`RULES`; the number is the item of the specification's list of ten rules):

``one-record-per-update`` (base, 1)
    A second ``add`` of the same update returns :obj:`False` in every state (pending, processing,
    failed, completed, abandoned — and, durable, an unacknowledged exhaustion) and leaves the row
    as it was (first body kept, lease not reset); so does a different body while the row is live
    (pending, processing, failed, an unacknowledged exhaustion). (A store may replace a
    *settled* row when a different update arrives with its id, SPEC §12; not checked here.)
``lease`` (base, 2)
    A live lease is not taken (``claim`` at ``now == due_at`` returns :obj:`None`), a lapsed one is
    (``now == due_at + 1``, attempt + 1); ``due`` does not list a live lease and lists a lapsed one
    with its body; ``renew`` with ``now`` works at ``now == due_at`` and never revives an expired
    lease. Fenced tail: the same for ``claim_owned`` / ``renew_owned``, with a new claim id.
``attempt-ownership`` (base, 3)
    Only the attempt holding the update renews or settles it: another attempt number is refused by
    ``renew`` and ``settle``; a settle at ``at == due_at`` lands, one at ``due_at + 1`` does not.
    Fenced tail: ``renew_owned``/``owns``/``settle_owned`` refuse a wrong attempt and a wrong claim
    id, an expired lease cannot ``settle_owned``, the settle at exactly ``due_at`` lands and
    returns :obj:`True`, a second one returns :obj:`False`.
``retry-and-spend`` (base, 4)
    A failed update is due exactly at its retry time (``due_at <= now``) and not 1 ms before;
    a claim with ``attempts >= max_attempts`` abandons it (returns :obj:`None`, never claimable
    or due again, ``settled_at`` = the spend's ``now`` so ``prune`` deletes it from ``now + 1``);
    a claim at a live lease never spends. Fenced tail: the same for ``claim_owned``; durable: a
    spend without ``durable_exhaustion`` is not an exhaustion.
``due-listing`` (base, 4)
    ``due`` lists by numeric ``update_id`` (``2**40`` included, bodies exact), at most ``limit``
    rows, pending rows only when ``received_at <= pending_before`` (exact boundary), failed rows
    from their retry time, processing rows after their lease, never completed rows. (A store
    with ``release_many`` also lists a released row at once: see ``release``.)
``prune`` (base, 5)
    ``prune(before)`` deletes completed and abandoned rows with ``settled_at < before`` only
    (``prune(settled_at)`` deletes nothing, ``prune(settled_at + 1)`` deletes it) and returns the
    count; pending, processing (live or lapsed) and failed rows are never pruned; a pruned
    ``update_id`` can be added again and starts at attempt 1 with its new body.
``concurrent-claim`` (base, 6)
    Of 8 concurrent ``claim`` calls on one update exactly one wins; repeated over fresh updates
    and over lapsed-lease takeovers.
``concurrent-claim-owned`` (fenced, 7)
    The same for ``claim_owned``; the winner's identity is owned.
``renewal-never-shortens`` (base, 8)
    ``renew`` with an earlier ``lease_until`` returns :obj:`True` and keeps the later lease
    (checked by claimability at the times in between), with and without ``now``; a later
    ``lease_until`` extends it. Fenced tail: the same with ``renew_owned``, checked with ``owns``.
``batch-renewal`` (base, 8; only for a store with ``renew_many`` / ``renew_owned_many``)
    A batched renewal equals the loop of single renewals position by position: a live lease
    (given twice) is renewed, a wrong attempt or claim id, an expired lease and an unknown id
    are refused, and the renewed lease holds while the refused ones are not revived. An entry
    may be :obj:`None` only for a row locked by another open transaction (the check holds no
    locks, so every entry here must be a real bool).
``batch-add`` (base, 1; only for a store with ``add_many``)
    ``add_many`` equals the loop of single ``add`` calls row by row: an existing id (pending or
    processing) and an id repeated in the batch return :obj:`False` and change nothing (the first
    body is kept, a live lease is not reset), new ids return :obj:`True` and are pending once;
    ``add_many([])`` returns ``[]``.
``bind-bot`` (base, -; only for a store with ``bind_bot``)
    ``bind_bot`` with the same bot id again is a no-op; another bot id raises
    :exc:`ptb_fence.TableBotMismatch` (the first binder wins) and the owner stays.
``batch-claim-at-ingest`` (fenced, 1 and 7; only for a store with ``add_claimed_many``)
    ``add_claimed_many(rows, lease_until=...)`` equals ``add`` + ``claim_owned`` for attempt 1
    per new id: a new id returns an identity with attempt 1, a fresh claim id and the given
    lease (owned up to and including ``lease_until``, not after); an existing id or one repeated
    in the batch returns :obj:`None` and stays unchanged.
``batch-claim`` (fenced, 7; only for a store with ``claim_owned_many``)
    ``claim_owned_many(ids, ...)`` equals the loop of ``claim_owned`` position by position: a
    pending row, a lapsed lease (attempt + 1) and a failed row at its retry time are taken with
    fresh, distinct claim ids and the given lease; a live lease, a lease held exactly at
    ``now``, a failed row 1 ms before its retry time, a completed row, an unknown id and an id
    repeated in the input give :obj:`None` and change nothing; a claimable row whose attempts
    are spent gives :obj:`None` and is abandoned (durable: an exhaustion with
    ``durable_exhaustion=True``). ``claim_owned_many([])`` returns ``[]``.
``batch-settle`` (fenced, 3 and 9; only for a store with ``settle_owned_many``)
    ``settle_owned_many`` equals the loop of ``settle_owned`` position by position: completed,
    failed and abandoned settlements of live claims land; a wrong claim id, an expired lease, the
    same completion repeated in the batch and an unknown id return :obj:`False` and change
    nothing; ``settle_owned_many([])`` returns ``[]``.
``combined-write`` (fenced, 9; only for a store with ``add_claimed_and_settle_many``)
    ``add_claimed_and_settle_many`` returns what ``add_claimed_many`` and ``settle_owned_many``
    return for the same input (the store makes both land in one commit).
``transaction`` (fenced, 9; only for a store with ``transaction()``)
    The block's exception is re-raised unchanged and, when ``settle_owned`` takes
    ``connection=``, a settle made in it is rolled back; a block that ends normally commits.
``connection-fence`` (fenced, 9; only with ``transaction()`` and ``connection=`` on ``owns``/``settle_owned``)
    Inside ``with store.transaction() as conn``: ``owns(identity, at, connection=conn)`` confirms
    the live claim; ``settle_owned(..., connection=conn)`` rolls back when the block raises and
    lands when it commits; and while the block holds the row (after ``owns(connection=conn)``), a
    ``claim_owned`` from another thread with the lease lapsed does not take it: it waits and,
    after the commit, returns :obj:`None`. A ``transaction()`` that yields :obj:`None` (no
    connection, like :class:`ptb_fence.MemoryUpdateStore`'s, which holds the store's lock) is
    checked for the competing claim only.
``completing`` (fenced, 9; only with ``transaction()``, ``complete_owned`` and ``reopen_completed``)
    Inside ``with store.transaction() as conn``: ``complete_owned(identity, at, connection=conn)``
    completes the live claim with ``at == due_at`` and is rolled back with the block (the claim is
    owned again, same lease); at ``due_at + 1`` or with a wrong claim id it returns :obj:`False`
    and changes nothing; while the block holds the completed row a ``claim_owned`` from another
    thread with the lease lapsed waits and, after the commit, returns :obj:`None`.
    ``reopen_completed(identity, at, connection=conn)`` turns back exactly that completion (same
    claim id and ``at``), once, with the claim's lease kept.
``fence`` (fenced, 9)
    ``owns`` is inclusive at ``due_at`` and :obj:`False` at ``due_at + 1``; a wrong claim id or
    attempt is refused by ``owns``/``renew_owned``/``settle_owned`` and changes nothing; no
    resurrection after expiry; a reclaim gets attempt + 1 and a different claim id and the old
    identity is refused; after ``prune`` and a new ``add`` of the same ``update_id`` the attempt
    restarts at 1 and the old identity ``(update_id, 1, old claim id)`` is refused.
``release`` (fenced, 3 and 9; only for a store with ``release_many``)
    ``release_many(identities, at=...)`` releases exactly the claims that are ``processing``
    with that attempt and claim id (a lapsed lease included) and returns one real bool per
    position: a wrong claim id, a completed row and an unknown id are not released. A released
    identity is refused at once by ``owns``/``renew_owned``/``settle_owned``; ``due`` lists the
    released rows at once whatever ``pending_before`` (a fresh pending row still waits for
    ``pending_before``); the next claim gets the same attempt number (even with
    ``max_attempts`` equal to it: the attempt was not spent) and a fresh claim id, after which
    the released identity is neither owned nor releasable. ``release_many([])`` returns ``[]``.
``liveness`` (fenced, -; only with ``hold_liveness``, ``release_liveness``, ``take_over_dead``)
    ``hold_liveness()`` returns a non-empty str and the same one again;
    ``take_over_dead(now=...)`` returns an int and never makes a live claim of the caller's own
    instance claimable; after ``release_liveness()`` (idempotent) the claims made before and a
    claim made without liveness keep their live leases. (Taking over a dead process's claims
    needs two processes: the shipped stores test it with real processes and signals.)
``isolation`` (fenced, -; only with ``claimed_suspect`` and ``mark_isolated``)
    ``claimed_suspect`` of a claim of a fresh row, of an unknown identity and of a claim already
    answered returns :obj:`False`. ``mark_isolated(identity, at=...)`` lands (:obj:`True`) for
    the exact live claim up to and including ``at == due_at``, and returns :obj:`False` at
    ``due_at + 1``, with a wrong claim id or attempt, for a completed row and for an unknown
    id; a landed mark changes nothing else (the claim is still owned and settles). The next
    claim of a marked row (after its lease) is suspect: ``claimed_suspect`` returns
    :obj:`True` for it, once. (A dead instance's rows becoming suspect needs two processes: the
    shipped stores test it with real processes and signals.)
``chat-order`` (fenced, -; only with ``add_many_in_chats``, ``claim_in_chat_order``, ``due_in_chat_order``)
    ``add_many_in_chats`` equals ``add_many`` position by position; of each chat key only the
    lowest unsettled update is claimed (``claim_in_chat_order``) or listed
    (``due_in_chat_order``): not while a lower update is pending, processing or failed waiting
    for its retry (listed from ``due_at`` on, inclusive), nor while another update of the chat
    holds a lease live at ``now`` (inclusive); an abandoned update releases its chat; rows
    without a chat key never wait; ``chat_key=`` lists one chat only.
``chat-keys`` (fenced, -; only with the chat-order methods and ``unkeyed_in_chats``, ``set_chat_keys``)
    ``unkeyed_in_chats`` lists the unsettled rows without a chat key by ``update_id`` (not a
    keyed or a settled one), after ``after_update_id``, at most ``limit``; ``set_chat_keys``
    keys only a row that has no key and holds exactly the given body, returns how many it
    keyed, and the keyed row then holds its chat like one recorded with the key.
``durable-exhaustion`` (durable, 10)
    A spent ``claim_owned(..., durable_exhaustion=True)`` becomes a visible exhaustion (listed with
    the last attempt and claim id, ``exhausted_at`` = the spend's ``now``, the body and
    ``'attempts spent'``), is not due and not prunable; acknowledgements with a wrong claim id or
    attempt are refused; the exact one returns :obj:`True` once, then :obj:`False`, and the row is
    then prunable (strict bound). ``exhaust`` works at ``at == due_at``, keeps its error and
    ``exhausted_at = at``; an expired attempt cannot exhaust and does not block a reclaim; wrong
    identities cannot exhaust; paging with ``limit`` and ``after_update_id`` sees every exhaustion
    once, in order; a base ``claim(..., durable_exhaustion=True)`` spend is visible too (with a
    non-empty claim id even when the earlier claims wrote none).
"""

from __future__ import annotations

import inspect
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple, cast

from ptb_fence._errors import TableBotMismatch
from ptb_fence._protocols import (
    BASE_METHODS,
    CHAT_KEYING_METHODS,
    CHAT_ORDER_METHODS,
    UpdateStore,
    is_durable,
    is_fenced,
    missing_methods,
)
from ptb_fence._values import (
    Abandoned,
    AttemptIdentity,
    Completed,
    Exhaustion,
    Failed,
    Settlement,
    StoredUpdate,
)

__all__ = ["RULES", "ConformanceRule", "check_update_store"]

_T = 1_700_000_000_000
"""The check's time origin (epoch milliseconds)."""
_L = 60_000
"""The lease length the rules use (milliseconds)."""
_FAR = _T + 10**9
"""A time after everything the rules do."""
_THREADS = 8
_JOIN_TIMEOUT = 30.0

_LEVELS = ("base", "fenced", "durable")


@dataclass(frozen=True)
class ConformanceRule:
    """One rule of the conformance check.

    Args:
        name (:obj:`str`): The stable rule name that prefixes its violations, e.g. ``"lease"``.
        level (:obj:`str`): The capability level the rule needs: ``"base"``, ``"fenced"`` or
            ``"durable"``.
        description (:obj:`str`): What the rule checks, in one sentence.
    """

    name: str
    level: str
    description: str


def _at(t: int) -> str:
    """Write an epoch-ms time relative to the check's origin, e.g. ``T+60001``."""
    delta = t - _T
    return f"T{delta:+d}" if delta else "T"


def _other_claim_id(claim_id: str) -> str:
    other = uuid.uuid4().hex
    return other if other != claim_id else other + "x"


class _Abort(Exception):
    """Stops a rule after a violation that makes the rest of it meaningless."""


class _StoreRaised(Exception):
    """Carries an exception raised by a store method, with the method's name."""

    def __init__(self, method: str, error: BaseException) -> None:
        super().__init__(method, error)
        self.method = method
        self.error = error


class _Probe:
    """Calls the store for one rule, checks returned types and collects violations."""

    __slots__ = ("_lock", "_noted", "_out", "_rule", "store")

    def __init__(self, store: Any, rule: str, out: List[str]) -> None:
        self.store = store
        self._rule = rule
        self._out = out
        self._lock = threading.Lock()
        self._noted: Set[str] = set()

    # -- reporting -------------------------------------------------------------------------
    def fail(self, message: str) -> None:
        with self._lock:
            self._out.append(f"{self._rule}: {message}")

    def expect(self, ok: bool, message: str) -> bool:
        if not ok:
            self.fail(message)
        return ok

    def require(self, ok: bool, message: str) -> None:
        if not ok:
            self.fail(message + " (the rest of this rule was skipped)")
            raise _Abort

    def _type(self, method: str, ok: bool, expected: str, value: object) -> bool:
        if ok:
            return True
        with self._lock:
            if method in self._noted:
                return False
            self._noted.add(method)
        self.fail(f"{method} returned {type(value).__name__} {value!r}; it must return {expected}")
        return False

    def _bool(self, method: str, value: object) -> bool:
        self._type(method, type(value) is bool, "a real bool (True or False)", value)
        return bool(value)

    def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        try:
            return getattr(self.store, method)(*args, **kwargs)
        except Exception as exc:
            raise _StoreRaised(method, exc) from exc

    def _identity(self, method: str, value: object) -> bool:
        ok = (
            isinstance(value, AttemptIdentity)
            and type(value.update_id) is int
            and type(value.attempt) is int
            and isinstance(value.claim_id, str)
            and value.claim_id != ""
        )
        self._type(
            method,
            ok,
            "an AttemptIdentity with int update_id and attempt and a non-empty str claim_id",
            value,
        )
        return ok

    # -- base contract ---------------------------------------------------------------------
    def add(self, update_id: int, body: str, received_at: int) -> bool:
        return self._bool("add", self._call("add", update_id, body, received_at))

    def claim(
        self,
        update_id: int,
        *,
        now: int,
        lease_until: int,
        max_attempts: int = 5,
        durable_exhaustion: Optional[bool] = None,
    ) -> Optional[int]:
        kwargs: Dict[str, Any] = {
            "now": now,
            "lease_until": lease_until,
            "max_attempts": max_attempts,
        }
        if durable_exhaustion is not None:
            kwargs["durable_exhaustion"] = durable_exhaustion
        value = self._call("claim", update_id, **kwargs)
        self._type("claim", value is None or type(value) is int, "an int attempt or None", value)
        return cast(Optional[int], value)

    def renew(
        self, update_id: int, attempt: int, lease_until: int, now: Optional[int] = None
    ) -> bool:
        if now is None:
            value = self._call("renew", update_id, attempt, lease_until)
        else:
            value = self._call("renew", update_id, attempt, lease_until, now=now)
        return self._bool("renew", value)

    def settle(self, update_id: int, attempt: int, settlement: Settlement) -> None:
        self._call("settle", update_id, attempt, settlement)

    def due(self, *, now: int, pending_before: int, limit: int = 100) -> List[Tuple[int, str]]:
        value = self._call("due", now=now, pending_before=pending_before, limit=limit)
        ok = isinstance(value, list) and all(
            isinstance(item, StoredUpdate)
            and type(item.update_id) is int
            and isinstance(item.body, str)
            for item in value
        )
        if not self._type("due", ok, "a list of StoredUpdate (int update_id, str body)", value):
            raise _Abort
        return [(item.update_id, item.body) for item in value]

    def due_ids(self, *, now: int, pending_before: int, limit: int = 100) -> List[int]:
        return [u for u, _ in self.due(now=now, pending_before=pending_before, limit=limit)]

    def prune(self, before: int) -> int:
        value = self._call("prune", before)
        self._type("prune", type(value) is int, "an int count", value)
        return cast(int, value)

    # -- fenced contract -------------------------------------------------------------------
    def claim_owned(
        self,
        update_id: int,
        *,
        now: int,
        lease_until: int,
        max_attempts: int = 5,
        durable_exhaustion: Optional[bool] = None,
    ) -> Optional[AttemptIdentity]:
        kwargs: Dict[str, Any] = {
            "now": now,
            "lease_until": lease_until,
            "max_attempts": max_attempts,
        }
        if durable_exhaustion is not None:
            kwargs["durable_exhaustion"] = durable_exhaustion
        value = self._call("claim_owned", update_id, **kwargs)
        if value is not None and not self._identity("claim_owned", value):
            raise _Abort
        return cast(Optional[AttemptIdentity], value)

    def renew_owned(
        self, identity: AttemptIdentity, lease_until: int, now: Optional[int] = None
    ) -> bool:
        if now is None:
            value = self._call("renew_owned", identity, lease_until)
        else:
            value = self._call("renew_owned", identity, lease_until, now=now)
        return self._bool("renew_owned", value)

    def owns(self, identity: AttemptIdentity, at: int, **connection: Any) -> bool:
        return self._bool("owns", self._call("owns", identity, at, **connection))

    def settle_owned(
        self, identity: AttemptIdentity, settlement: Settlement, **connection: Any
    ) -> bool:
        value = self._call("settle_owned", identity, settlement, **connection)
        return self._bool("settle_owned", value)

    def release_many_one(self, identity: AttemptIdentity, at: int) -> bool:
        value = self._call("release_many", [identity], at=at)
        ok = isinstance(value, list) and len(value) == 1 and type(value[0]) is bool
        self._type("release_many", ok, "a list of 1 real bool", value)
        return bool(value[0]) if ok else False

    # -- durable contract ------------------------------------------------------------------
    def exhaust(self, identity: AttemptIdentity, *, at: int, error: str) -> bool:
        return self._bool("exhaust", self._call("exhaust", identity, at=at, error=error))

    def due_exhaustions(
        self, *, limit: int = 100, after_update_id: Optional[int] = None
    ) -> List[Exhaustion]:
        if after_update_id is None:
            value = self._call("due_exhaustions", limit=limit)
        else:
            value = self._call("due_exhaustions", limit=limit, after_update_id=after_update_id)
        ok = isinstance(value, list) and all(
            isinstance(item, Exhaustion)
            and type(item.update_id) is int
            and type(item.attempt) is int
            and isinstance(item.claim_id, str)
            and item.claim_id != ""
            and isinstance(item.body, str)
            and type(item.exhausted_at) is int
            and (item.error is None or isinstance(item.error, str))
            for item in value
        )
        expected = (
            "a list of Exhaustion (int update_id/attempt/exhausted_at, non-empty str claim_id, "
            "str body)"
        )
        if not self._type("due_exhaustions", ok, expected, value):
            raise _Abort
        return list(value)

    def exhaustion_ids(self) -> List[int]:
        return [e.update_id for e in self.due_exhaustions(limit=1000)]

    def acknowledge_exhaustion(self, identity: AttemptIdentity, at: int) -> bool:
        return self._bool(
            "acknowledge_exhaustion", self._call("acknowledge_exhaustion", identity, at)
        )


# ---------------------------------------------------------------------------------------------
# Rule 1
# ---------------------------------------------------------------------------------------------
def _rule_one_record(p: _Probe, fenced: bool, durable: bool) -> None:
    p.require(p.add(1, "first", _T), "add of a new update_id 1 returned False")
    p.expect(
        not p.add(1, "second", _T + 1),
        "a second add of update 1 while it is pending returned True",
    )
    listed = p.due(now=_T + 1, pending_before=_T + 1)
    p.expect(
        listed == [(1, "first")],
        f"after a refused duplicate add, due listed {listed}; expected update 1 once, with its "
        "first body 'first'",
    )
    p.expect(p.add(2, "two", _T), "add of a new update_id 2 next to update 1 returned False")

    attempt = p.claim(1, now=_T + 2, lease_until=_T + 2 + _L)
    p.require(attempt == 1, f"claim of pending update 1 returned {attempt!r}; expected attempt 1")
    p.expect(
        not p.add(1, "third", _T + 3),
        "a second add of update 1 while it is processing returned True",
    )
    again = p.claim(1, now=_T + 4, lease_until=_T + 4 + _L)
    p.expect(
        again is None,
        f"after a refused add of a processing update, claim at {_at(_T + 4)} returned {again!r}; "
        "the add must leave the row (and its live lease) untouched",
    )

    p.settle(1, 1, Failed(at=_T + 5, retry_at=_T + 100, error="boom"))
    p.expect(not p.add(1, "fourth", _T + 6), "a second add of a failed update returned True")
    attempt = p.claim(1, now=_T + 100, lease_until=_T + 100 + _L)
    p.require(
        attempt == 2,
        f"claim of failed update 1 at its retry time returned {attempt!r}; expected attempt 2 "
        "(the refused add must not reset the row)",
    )
    p.settle(1, 2, Completed(at=_T + 101))
    # the same update again (SPEC §12: a *different* update may replace a settled row)
    p.expect(not p.add(1, "first", _T + 102), "a second add of a completed update returned True")
    listed_ids = p.due_ids(now=_FAR, pending_before=_FAR)
    p.expect(
        1 not in listed_ids,
        "after a refused add of a completed update, due listed it again; the add must not "
        "revive a completed row",
    )

    p.require(p.claim(2, now=_T, lease_until=_T + _L) == 1, "claim of pending update 2 failed")
    p.settle(2, 1, Abandoned(at=_T + 1, error="given up"))
    p.expect(not p.add(2, "two", _T + 2), "a second add of an abandoned update returned True")

    p.require(p.add(3, "three", _T), "add of a new update_id 3 returned False")
    p.require(
        p.claim(3, now=_T, lease_until=_T + 10, max_attempts=1) == 1,
        "claim of pending update 3 failed",
    )
    spent = p.claim(3, now=_T + 11, lease_until=_T + 11 + _L, max_attempts=1)
    p.expect(spent is None, f"spending claim of update 3 returned {spent!r}; expected None")
    p.expect(
        not p.add(3, "three", _T + 12),
        "a second add of an update abandoned by spent attempts returned True",
    )

    if durable:
        p.require(p.add(4, "four", _T), "add of a new update_id 4 returned False")
        identity = p.claim_owned(4, now=_T, lease_until=_T + _L)
        p.require(identity is not None, "claim_owned of pending update 4 returned None")
        assert identity is not None
        p.require(
            p.exhaust(identity, at=_T + 1, error="terminal"),
            "exhaust of the live claim of update 4 returned False",
        )
        p.expect(
            not p.add(4, "again", _T + 2),
            "a second add of an unacknowledged exhaustion returned True",
        )


# ---------------------------------------------------------------------------------------------
# Rule 2
# ---------------------------------------------------------------------------------------------
def _rule_lease(p: _Probe, fenced: bool, durable: bool) -> None:
    unknown = p.claim(404, now=_T, lease_until=_T + _L)
    p.expect(unknown is None, f"claim of an unknown update_id returned {unknown!r}")
    p.require(p.add(1, "body-1", _T), "add of a new update_id returned False")
    attempt = p.claim(1, now=_T, lease_until=_T + _L)
    p.require(attempt == 1, f"claim of a pending update returned {attempt!r}; expected 1")
    due_at = _T + _L

    for now in (_T + 1, due_at - 1, due_at):
        taken = p.claim(1, now=now, lease_until=now + _L)
        p.expect(
            taken is None,
            f"claim at {_at(now)} took a live lease expiring at {_at(due_at)} (returned "
            f"{taken!r}); a lease is held while due_at >= now",
        )
    listed = p.due(now=due_at, pending_before=due_at)
    p.expect(
        listed == [],
        f"due(now={_at(due_at)}) listed {listed} while the lease (due_at {_at(due_at)}) is live",
    )
    p.expect(
        p.renew(1, 1, due_at, now=due_at),
        f"renew with now == due_at ({_at(due_at)}) returned False; the lease is still live then",
    )
    listed = p.due(now=due_at + 1, pending_before=due_at + 1)
    p.expect(
        listed == [(1, "body-1")],
        f"due(now={_at(due_at + 1)}) listed {listed}; expected the lapsed update 1 with its body "
        "'body-1'",
    )
    p.expect(
        not p.renew(1, 1, _T + 10 * _L, now=due_at + 1),
        f"renew with now={_at(due_at + 1)} after the lease expired at {_at(due_at)} returned "
        "True: a renewal with now must never revive an expired lease",
    )
    taken = p.claim(1, now=due_at + 1, lease_until=due_at + 1 + _L)
    p.expect(
        taken == 2,
        f"claim at {_at(due_at + 1)} of a lease lapsed at {_at(due_at)} returned {taken!r}; "
        "expected attempt 2 (a lapsed lease is taken over when due_at < now)",
    )

    if fenced:
        p.require(p.add(2, "body-2", _T), "add of a new update_id returned False")
        first = p.claim_owned(2, now=_T, lease_until=due_at)
        p.require(
            first is not None and first.attempt == 1 and first.update_id == 2,
            f"claim_owned of a pending update returned {first!r}; expected update 2, attempt 1",
        )
        assert first is not None
        taken_owned = p.claim_owned(2, now=due_at, lease_until=due_at + _L)
        p.expect(
            taken_owned is None,
            f"claim_owned at now == due_at ({_at(due_at)}) took a live lease ({taken_owned!r})",
        )
        p.expect(
            not p.renew_owned(first, _T + 10 * _L, now=due_at + 1),
            "renew_owned with now after the lease expired returned True (revived it)",
        )
        second = p.claim_owned(2, now=due_at + 1, lease_until=due_at + 1 + _L)
        p.expect(
            second is not None and second.attempt == 2 and second.claim_id != first.claim_id,
            f"claim_owned at {_at(due_at + 1)} of a lapsed lease returned {second!r}; expected "
            "attempt 2 with a new claim id",
        )


# ---------------------------------------------------------------------------------------------
# Rule 3
# ---------------------------------------------------------------------------------------------
def _rule_ownership(p: _Probe, fenced: bool, durable: bool) -> None:
    p.require(p.add(1, "b", _T), "add of a new update_id returned False")
    p.require(p.claim(1, now=_T, lease_until=_T + _L) == 1, "claim of a pending update failed")
    p.expect(
        not p.renew(1, 2, _T + 2 * _L, now=_T),
        "renew by attempt 2 while attempt 1 holds the update returned True",
    )
    p.expect(
        p.renew(1, 1, _T + 2 * _L, now=_T),
        "renew by the attempt holding the live lease returned False",
    )
    due_at = _T + 2 * _L
    p.settle(1, 2, Completed(at=_T + 1))
    p.settle(1, 2, Failed(at=_T + 1, retry_at=_T + 2, error="wrong attempt"))
    p.settle(1, 2, Abandoned(at=_T + 1, error="wrong attempt"))
    p.settle(1, 0, Completed(at=_T + 1))
    p.expect(
        p.renew(1, 1, due_at, now=due_at),
        "after settles by a wrong attempt number, attempt 1 no longer held its live lease: a "
        "settle by an attempt that does not hold the update landed",
    )
    p.settle(1, 1, Completed(at=due_at + 1))
    taken = p.claim(1, now=due_at + 1, lease_until=due_at + 1 + _L)
    p.expect(
        taken == 2,
        f"after attempt 1 settled at {_at(due_at + 1)}, 1 ms after its lease expired, claim "
        f"returned {taken!r}; expected attempt 2 (a settle lands only where due_at >= at)",
    )
    if taken != 2:
        return
    due_at2 = due_at + 1 + _L
    p.expect(
        not p.renew(1, 1, _T + 10 * _L, now=due_at + 1),
        "renew by the old attempt 1 after attempt 2 took the update returned True",
    )
    p.settle(1, 1, Completed(at=due_at + 2))
    p.expect(
        p.renew(1, 2, due_at2, now=due_at + 2),
        "a settle by the old attempt 1 landed on the update now held by attempt 2",
    )
    p.settle(1, 2, Failed(at=due_at2, retry_at=due_at2 + 10, error="boom"))
    retaken = p.claim(1, now=due_at2 + 9, lease_until=due_at2 + 9 + _L)
    p.expect(
        retaken is None,
        f"after attempt 2 settled Failed(at == due_at, retry 10 ms later), claim 1 ms before "
        f"the retry time returned {retaken!r}: a settle at exactly due_at must land",
    )
    if retaken is None:
        retaken = p.claim(1, now=due_at2 + 10, lease_until=due_at2 + 10 + _L)
        p.expect(
            retaken == 3,
            f"claim at the retry time of a failed update returned {retaken!r}; expected 3",
        )

    if not fenced:
        return
    p.require(p.add(2, "b2", _T), "add of a new update_id returned False")
    first = p.claim_owned(2, now=_T, lease_until=_T + _L)
    p.require(first is not None, "claim_owned of a pending update returned None")
    assert first is not None
    lease = _T + _L
    wrong_attempt = AttemptIdentity(2, first.attempt + 1, first.claim_id)
    wrong_claim = AttemptIdentity(2, first.attempt, _other_claim_id(first.claim_id))
    for label, wrong in (("a wrong attempt", wrong_attempt), ("a wrong claim id", wrong_claim)):
        p.expect(not p.owns(wrong, _T), f"owns with {label} returned True")
        p.expect(
            not p.renew_owned(wrong, lease + _L, now=_T),
            f"renew_owned with {label} returned True",
        )
        p.expect(
            not p.settle_owned(wrong, Completed(at=_T + 1)),
            f"settle_owned with {label} returned True",
        )
        p.expect(
            not p.settle_owned(wrong, Failed(at=_T + 1, retry_at=_T + 2, error="x")),
            f"settle_owned(Failed) with {label} returned True",
        )
    p.expect(
        p.owns(first, lease) and not p.owns(first, lease + 1),
        "after refused calls with wrong identities, the owner's lease changed or was lost",
    )
    p.expect(
        not p.settle_owned(first, Completed(at=lease + 1)),
        f"settle_owned at {_at(lease + 1)}, 1 ms after the lease expired, returned True",
    )
    second = p.claim_owned(2, now=lease + 1, lease_until=lease + 1 + _L)
    p.require(
        second is not None and second.attempt == 2,
        f"claim_owned of the lapsed update returned {second!r}; expected attempt 2 (did the "
        "expired settle_owned land?)",
    )
    assert second is not None
    lease2 = lease + 1 + _L
    p.expect(
        not p.settle_owned(first, Completed(at=lease + 2)),
        "settle_owned by the old attempt after a reclaim returned True",
    )
    p.expect(
        p.settle_owned(second, Failed(at=lease2, retry_at=lease2 + 10, error="boom")),
        "settle_owned at exactly due_at (the last live millisecond) returned False",
    )
    p.expect(
        not p.settle_owned(second, Completed(at=lease2)),
        "a second settle_owned of an already settled attempt returned True",
    )
    third = p.claim_owned(2, now=lease2 + 10, lease_until=lease2 + 10 + _L)
    p.expect(
        third is not None and third.attempt == 3,
        f"claim_owned at the retry time after a settle_owned(Failed) returned {third!r}; "
        "expected attempt 3",
    )


# ---------------------------------------------------------------------------------------------
# Rule 4
# ---------------------------------------------------------------------------------------------
def _rule_retry_and_spend(p: _Probe, fenced: bool, durable: bool) -> None:
    p.require(p.add(1, "b1", _T), "add of a new update_id returned False")
    p.require(
        p.claim(1, now=_T, lease_until=_T + _L, max_attempts=2) == 1,
        "claim of a pending update failed",
    )
    retry_at = _T + 1000
    p.settle(1, 1, Failed(at=_T + 1, retry_at=retry_at, error="boom"))
    early = p.claim(1, now=retry_at - 1, lease_until=retry_at - 1 + _L, max_attempts=2)
    p.expect(
        early is None,
        f"claim 1 ms before the retry time of a failed update returned {early!r}",
    )
    listed = p.due(now=retry_at - 1, pending_before=retry_at - 1)
    p.expect(listed == [], f"due 1 ms before the retry time listed {listed}")
    listed = p.due(now=retry_at, pending_before=retry_at)
    p.expect(
        listed == [(1, "b1")],
        f"due at exactly the retry time listed {listed}; expected the failed update 1 with its "
        "body (a failed row is due when due_at <= now)",
    )
    attempt = p.claim(1, now=retry_at, lease_until=retry_at + _L, max_attempts=2)
    p.require(
        attempt == 2,
        f"claim at exactly the retry time of a failed update returned {attempt!r}; expected 2",
    )
    retry2 = retry_at + 1000
    p.settle(1, 2, Failed(at=retry_at + 1, retry_at=retry2, error="boom"))
    spent = p.claim(1, now=retry2, lease_until=retry2 + _L, max_attempts=2)
    p.expect(
        spent is None,
        f"claim with attempts spent (2 of max_attempts=2) returned {spent!r}; expected None",
    )
    if durable:
        exhausted = p.exhaustion_ids()
        p.expect(
            1 not in exhausted,
            "a spend without durable_exhaustion was listed by due_exhaustions",
        )
    revived = p.claim(1, now=retry2 + 1, lease_until=retry2 + 1 + _L, max_attempts=10)
    p.expect(
        revived is None,
        f"after its attempts were spent, the update was claimable again (claim with a higher "
        f"max_attempts returned {revived!r}); a spend must abandon it",
    )
    ids = p.due_ids(now=_FAR, pending_before=_FAR)
    p.expect(1 not in ids, "due listed an update abandoned by spent attempts")
    pruned = p.prune(retry2)
    p.expect(
        pruned == 0,
        f"prune(before == the spend's now) deleted {pruned} row(s); a spend sets settled_at = "
        "now and prune deletes only settled_at < before",
    )
    pruned = p.prune(retry2 + 1)
    p.expect(
        pruned == 1,
        f"prune(the spend's now + 1) returned {pruned}; expected 1 (a spent update is settled "
        "at the spend's now when durable_exhaustion is off)",
    )

    p.require(p.add(2, "b2", _T), "add of a new update_id returned False")
    p.require(
        p.claim(2, now=_T, lease_until=_T + _L, max_attempts=1) == 1,
        "claim of a pending update failed",
    )
    lease = _T + _L
    live = p.claim(2, now=lease, lease_until=lease + _L, max_attempts=1)
    p.expect(live is None, f"claim of a live lease with attempts spent returned {live!r}")
    p.expect(
        p.renew(2, 1, lease, now=lease),
        "a claim at a live lease with attempts spent abandoned the update (the holder can no "
        "longer renew it); only a claimable row is spent",
    )
    spent = p.claim(2, now=lease + 1, lease_until=lease + 1 + _L, max_attempts=1)
    p.expect(spent is None, f"claim of a lapsed lease with attempts spent returned {spent!r}")
    p.expect(
        not p.renew(2, 1, lease + _L),
        "renew of an update abandoned by spent attempts returned True",
    )
    pruned = p.prune(lease + 1)
    p.expect(pruned == 0, f"prune(the spend's now) deleted {pruned} row(s); expected 0")
    pruned = p.prune(lease + 2)
    p.expect(pruned == 1, f"prune(the spend's now + 1) returned {pruned}; expected 1")

    if not fenced:
        return
    p.require(p.add(3, "b3", _T), "add of a new update_id returned False")
    first = p.claim_owned(3, now=_T, lease_until=_T + _L, max_attempts=1)
    p.require(first is not None, "claim_owned of a pending update returned None")
    spent_owned = p.claim_owned(3, now=lease + 1, lease_until=lease + 1 + _L, max_attempts=1)
    p.expect(
        spent_owned is None,
        f"claim_owned with attempts spent returned {spent_owned!r}; expected None",
    )
    if durable:
        p.expect(
            3 not in p.exhaustion_ids(),
            "a claim_owned spend without durable_exhaustion was listed by due_exhaustions",
        )
    p.expect(
        p.claim_owned(3, now=lease + 2, lease_until=lease + 2 + _L, max_attempts=10) is None,
        "after claim_owned spent its attempts, the update was claimable again",
    )
    pruned = p.prune(lease + 1)
    p.expect(pruned == 0, f"prune(the claim_owned spend's now) deleted {pruned} row(s)")
    pruned = p.prune(lease + 2)
    p.expect(pruned == 1, f"prune(the claim_owned spend's now + 1) returned {pruned}; expected 1")


# ---------------------------------------------------------------------------------------------
# Rule 4 (due)
# ---------------------------------------------------------------------------------------------
def _rule_due_listing(p: _Probe, fenced: bool, durable: bool) -> None:
    big = 2**40
    rows = [(100, _T), (7, _T + 10), (big, _T), (12, _T + 20), (9, _T + 10), (30, _T)]
    for update_id, received_at in rows:
        p.require(
            p.add(update_id, f"body-{update_id}", received_at),
            f"add of a new update_id {update_id} returned False",
        )

    def expect_ids(now: int, pending_before: int, limit: int, expected: List[int]) -> None:
        listed = p.due(now=now, pending_before=pending_before, limit=limit)
        wanted = [(u, f"body-{u}") for u in expected]
        p.expect(
            listed == wanted,
            f"due(now={_at(now)}, pending_before={_at(pending_before)}, limit={limit}) listed "
            f"{[u for u, _ in listed]}; expected {expected} (by update_id, bodies exact)"
            + ("" if [u for u, _ in listed] != expected else f"; bodies were {listed}"),
        )

    expect_ids(_T, _T + 20, 100, [7, 9, 12, 30, 100, big])
    expect_ids(_T, _T + 19, 100, [7, 9, 30, 100, big])
    expect_ids(_T, _T + 10, 100, [7, 9, 30, 100, big])
    expect_ids(_T, _T + 9, 100, [30, 100, big])
    expect_ids(_T, _T - 1, 100, [])
    expect_ids(_T, _T + 20, 2, [7, 9])
    expect_ids(_T, _T + 20, 1, [7])

    p.require(p.claim(9, now=_T + 30, lease_until=_T + 400) == 1, "claim of update 9 failed")
    p.require(p.claim(12, now=_T + 30, lease_until=_T + _L) == 1, "claim of update 12 failed")
    p.settle(12, 1, Failed(at=_T + 31, retry_at=_T + 500, error="boom"))
    p.require(p.claim(100, now=_T + 30, lease_until=_T + _L) == 1, "claim of update 100 failed")
    p.settle(100, 1, Completed(at=_T + 31))
    # pending rows 7, 30, big; processing 9 (lease T+400); failed 12 (retry T+500); 100 done.
    expect_ids(_T + 400, _T + 1000, 100, [7, 30, big])
    expect_ids(_T + 401, _T + 1000, 100, [7, 9, 30, big])
    expect_ids(_T + 500, _T + 1000, 100, [7, 9, 12, 30, big])
    expect_ids(_T + 500, _T + 1000, 3, [7, 9, 12])
    expect_ids(_T + 500, _T + 9, 100, [9, 12, 30, big])
    expect_ids(_T + 499, _T - 1, 100, [9])


# ---------------------------------------------------------------------------------------------
# Rule 5
# ---------------------------------------------------------------------------------------------
def _rule_prune(p: _Probe, fenced: bool, durable: bool) -> None:
    for update_id in range(1, 9):
        p.require(p.add(update_id, f"b{update_id}", _T), "add of a new update_id returned False")
    for update_id in (1, 2, 4, 5, 6, 7, 8):
        lease_until = _T + 1 if update_id == 6 else _T + _L
        p.require(
            p.claim(update_id, now=_T, lease_until=lease_until) == 1,
            f"claim of pending update {update_id} failed",
        )
    p.settle(1, 1, Completed(at=_T + 100))
    p.settle(2, 1, Abandoned(at=_T + 200, error="given up"))
    p.settle(5, 1, Failed(at=_T + 1, retry_at=_T + 10, error="boom"))
    p.settle(7, 1, Completed(at=_T + 300))
    p.settle(8, 1, Abandoned(at=_T + 300, error="given up"))
    # 3 pending, 4 processing (live), 5 failed, 6 processing (lapsed at T+1)

    pruned = p.prune(_T + 100)
    p.expect(
        pruned == 0,
        f"prune(before == settled_at of a completed update) deleted {pruned} row(s); prune "
        "deletes only settled_at < before",
    )
    pruned = p.prune(_T + 101)
    p.expect(pruned == 1, f"prune(settled_at + 1) of one completed update returned {pruned}")
    pruned = p.prune(_T + 200)
    p.expect(pruned == 0, f"prune(before == settled_at of an abandoned update) deleted {pruned}")
    pruned = p.prune(_T + 201)
    p.expect(pruned == 1, f"prune(settled_at + 1) of one abandoned update returned {pruned}")
    pruned = p.prune(_T + 301)
    p.expect(pruned == 2, f"prune of two settled updates returned {pruned}; expected the count 2")
    pruned = p.prune(_FAR)
    p.expect(
        pruned == 0,
        f"prune with a far-future bound deleted {pruned} pending/processing/failed row(s)",
    )
    for update_id, state in ((3, "pending"), (4, "processing"), (5, "failed"), (6, "lapsed")):
        p.expect(
            not p.add(update_id, "again", _T + 400),
            f"prune deleted the {state} update {update_id} (it could be added again)",
        )
    ids = p.due_ids(now=_FAR, pending_before=_FAR)
    p.expect(
        ids == [3, 4, 5, 6],
        f"after pruning, due listed {ids}; expected the unsettled updates [3, 4, 5, 6]",
    )
    p.expect(p.add(1, "again", _T + 500), "a pruned update_id could not be added again")
    listed = p.due(now=_T + 500, pending_before=_T + 500, limit=1)
    p.expect(
        listed == [(1, "again")],
        f"due listed {listed} for the re-added update 1; expected its new body 'again'",
    )
    attempt = p.claim(1, now=_T + 500, lease_until=_T + 500 + _L)
    p.expect(
        attempt == 1,
        f"claim of a re-added update returned {attempt!r}; its attempts must restart at 1",
    )


# ---------------------------------------------------------------------------------------------
# Rules 6 and 7
# ---------------------------------------------------------------------------------------------
def _race(p: _Probe, call: Callable[[], Any]) -> Optional[List[Any]]:
    """Run ``call`` in 8 threads released together; return the results (None on timeout)."""
    barrier = threading.Barrier(_THREADS, timeout=_JOIN_TIMEOUT)
    results: List[Any] = [None] * _THREADS
    errors: List[BaseException] = []

    def worker(index: int) -> None:
        try:
            barrier.wait()
            results[index] = call()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the checking thread
            errors.append(exc)

    threads = [
        threading.Thread(target=worker, args=(i,), daemon=True, name=f"ptb-fence-check-{i}")
        for i in range(_THREADS)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(_JOIN_TIMEOUT)
    if any(thread.is_alive() for thread in threads):
        p.fail(f"{_THREADS} concurrent claims did not finish within {_JOIN_TIMEOUT:.0f} s")
        return None
    for error in errors:
        if not isinstance(error, threading.BrokenBarrierError):
            raise error
    if errors:
        raise errors[0]
    return results


def _race_rounds(p: _Probe) -> Sequence[Tuple[int, int, int]]:
    """Record updates 1-4 and return the ``(update_id, now, expected attempt)`` races: four
    pending updates, then two lapsed leases."""
    for update_id in range(1, 5):
        p.require(p.add(update_id, f"b{update_id}", _T), "add of a new update_id returned False")
    return (
        (1, _T, 1),
        (2, _T, 1),
        (3, _T, 1),
        (4, _T, 1),
        (1, _T + _L + 1, 2),
        (2, _T + _L + 1, 2),
    )


def _rule_concurrent_claim(p: _Probe, fenced: bool, durable: bool) -> None:
    for update_id, now, expected in _race_rounds(p):

        def call(update_id: int = update_id, now: int = now) -> Optional[int]:
            return p.claim(update_id, now=now, lease_until=now + _L)

        results = _race(p, call)
        if results is None:
            return
        winners = [r for r in results if r is not None]
        what = "pending update" if expected == 1 else "lapsed lease"
        p.expect(
            winners == [expected],
            f"{_THREADS} concurrent claims of the {what} {update_id} at {_at(now)} returned "
            f"{sorted(results, key=repr)}; expected exactly one winner with attempt {expected}",
        )


def _rule_concurrent_claim_owned(p: _Probe, fenced: bool, durable: bool) -> None:
    for update_id, now, expected in _race_rounds(p):

        def call(update_id: int = update_id, now: int = now) -> Optional[AttemptIdentity]:
            return p.claim_owned(update_id, now=now, lease_until=now + _L)

        results = _race(p, call)
        if results is None:
            return
        winners = [r for r in results if r is not None]
        what = "pending update" if expected == 1 else "lapsed lease"
        ok = len(winners) == 1 and getattr(winners[0], "attempt", None) == expected
        p.expect(
            ok,
            f"{_THREADS} concurrent claim_owned of the {what} {update_id} at {_at(now)} had "
            f"{len(winners)} winner(s) {winners}; expected exactly one, attempt {expected}",
        )
        if ok:
            p.expect(
                p.owns(winners[0], now + _L),
                f"the winner of the concurrent claim_owned of update {update_id} does not own it",
            )


# ---------------------------------------------------------------------------------------------
# Rule 8
# ---------------------------------------------------------------------------------------------
def _rule_renewal(p: _Probe, fenced: bool, durable: bool) -> None:
    p.require(p.add(1, "b", _T), "add of a new update_id returned False")
    p.require(p.claim(1, now=_T, lease_until=_T + _L) == 1, "claim of a pending update failed")
    lease = _T + _L
    p.expect(
        p.renew(1, 1, _T + 10, now=_T + 5),
        "renew with an earlier lease_until returned False; a matching renewal returns True even "
        "when the lease stays as it was",
    )
    p.expect(
        p.renew(1, 1, _T + 20),
        "renew (without now) with an earlier lease_until returned False",
    )
    for now in (_T + 11, _T + 21, lease):
        taken = p.claim(1, now=now, lease_until=now + _L)
        p.require(
            taken is None,
            f"after renewals with earlier lease_until values, claim at {_at(now)} took the "
            f"update (returned {taken!r}); the lease until {_at(lease)} was shortened",
        )
    longer = _T + 2 * _L
    p.expect(p.renew(1, 1, longer, now=lease), "renew extending a live lease returned False")
    p.expect(
        p.renew(1, 1, lease, now=lease + 5),
        "renew with an earlier lease_until after an extension returned False",
    )
    for now in (lease + 1, longer):
        taken = p.claim(1, now=now, lease_until=now + _L)
        p.require(
            taken is None,
            f"claim at {_at(now)} took a lease extended to {_at(longer)} (returned {taken!r}); "
            "renewal must set due_at = max(due_at, lease_until)",
        )
    taken = p.claim(1, now=longer + 1, lease_until=longer + 1 + _L)
    p.expect(
        taken == 2,
        f"claim at {_at(longer + 1)} after the extended lease lapsed returned {taken!r}; "
        "expected 2",
    )

    if not fenced:
        return
    p.require(p.add(2, "b2", _T), "add of a new update_id returned False")
    identity = p.claim_owned(2, now=_T, lease_until=lease)
    p.require(identity is not None, "claim_owned of a pending update returned None")
    assert identity is not None
    p.expect(
        p.renew_owned(identity, _T + 10, now=_T + 5),
        "renew_owned with an earlier lease_until returned False",
    )
    p.expect(
        p.renew_owned(identity, _T + 20),
        "renew_owned (without now) with an earlier lease_until returned False",
    )
    p.expect(
        p.owns(identity, lease),
        f"after renew_owned with earlier lease_until values, owns at {_at(lease)} returned "
        "False: the lease was shortened",
    )
    p.expect(not p.owns(identity, lease + 1), "owns returned True after the lease's due_at")
    p.expect(p.renew_owned(identity, longer, now=lease), "renew_owned extending returned False")
    p.expect(
        p.renew_owned(identity, lease, now=lease + 5),
        "renew_owned with an earlier lease_until after an extension returned False",
    )
    p.expect(
        p.owns(identity, longer),
        f"owns at {_at(longer)} returned False after renew_owned extended the lease to it",
    )
    p.expect(not p.owns(identity, longer + 1), "owns returned True after the extended due_at")
    taken_owned = p.claim_owned(2, now=longer, lease_until=longer + _L)
    p.expect(
        taken_owned is None,
        f"claim_owned at {_at(longer)} took a lease extended to it ({taken_owned!r})",
    )


def _batch(p: _Probe, method: str, keys: List[Any], lease_until: int, now: int) -> List[Any]:
    value = p._call(method, keys, lease_until, now)
    ok = (
        isinstance(value, list)
        and len(value) == len(keys)
        and all(type(item) is bool for item in value)
    )
    p._type(
        method,
        ok,
        f"a list of {len(keys)} real bools, one per input (None only for a row locked by "
        "another open transaction; this check holds no locks)",
        value,
    )
    return list(value) if isinstance(value, list) else []


def _rule_batch_renewal(p: _Probe, fenced: bool, durable: bool) -> None:
    has_many = callable(getattr(p.store, "renew_many", None))
    has_owned_many = fenced and callable(getattr(p.store, "renew_owned_many", None))
    if not (has_many or has_owned_many):
        return
    for update_id in (1, 2, 3):
        p.require(p.add(update_id, "b", _T), "add of a new update_id returned False")
    longer, now = _T + 2 * _L, _T + 20
    if has_many:
        p.require(p.claim(1, now=_T, lease_until=_T + _L) == 1, "claim of a pending update failed")
        p.require(p.claim(2, now=_T, lease_until=_T + 10) == 1, "claim of a pending update failed")
        keys = [(1, 1), (2, 1), (1, 2), (3, 1), (99, 1), (1, 1)]
        got = _batch(p, "renew_many", keys, longer, now)
        want = [p.renew(u, a, longer, now=now) for u, a in keys]
        p.expect(
            got == want == [True, False, False, False, False, True],
            f"renew_many({keys}, lease_until={_at(longer)}, now={_at(now)}) returned {got}; the "
            f"single renew calls return {want}; expected [True, False, False, False, False, "
            "True] (live; expired; wrong attempt; pending; unknown; live again)",
        )
        taken = p.claim(1, now=_T + _L + 1, lease_until=_FAR)
        p.expect(taken is None, f"claim at {_at(_T + _L + 1)} took a lease renew_many extended "
                 f"to {_at(longer)} (returned {taken!r})")
        taken = p.claim(2, now=now + 1, lease_until=_FAR)
        p.expect(taken == 2, f"claim at {_at(now + 1)} of the lease that expired at "
                 f"{_at(_T + 10)} returned {taken!r}; renew_many must not revive it (expected 2)")
    if has_owned_many:
        live = p.claim_owned(3, now=_T, lease_until=_T + _L)
        p.require(live is not None, "claim_owned of a pending update returned None")
        assert live is not None
        p.require(p.add(4, "b", _T), "add of a new update_id returned False")
        expired = p.claim_owned(4, now=_T, lease_until=_T + 10)
        p.require(expired is not None, "claim_owned of a pending update returned None")
        assert expired is not None
        wrong = AttemptIdentity(3, live.attempt, _other_claim_id(live.claim_id))
        identities = [live, expired, wrong, AttemptIdentity(99, 1, "x"), live]
        got = _batch(p, "renew_owned_many", identities, longer, now)
        want = [p.renew_owned(i, longer, now=now) for i in identities]
        p.expect(
            got == want == [True, False, False, False, True],
            f"renew_owned_many(lease_until={_at(longer)}, now={_at(now)}) returned {got}; the "
            f"single renew_owned calls return {want}; expected [True, False, False, False, True] "
            "(live; expired; wrong claim id; unknown; live again)",
        )
        p.expect(p.owns(live, longer), f"owns at {_at(longer)} returned False after "
                 "renew_owned_many extended the lease to it")
        p.expect(not p.owns(expired, now), "renew_owned_many revived an expired lease")


# ---------------------------------------------------------------------------------------------
# Optional capabilities (run only when the store has them)
# ---------------------------------------------------------------------------------------------
class _Rollback(Exception):
    """Raised inside ``transaction()`` by the check to see the block roll back."""


def _has(store: Any, method: str) -> bool:
    return callable(getattr(store, method, None))


def _takes_connection(store: Any, method: str) -> bool:
    """Whether ``store.method`` accepts the ``connection=`` keyword (duck typing)."""
    try:
        parameters = inspect.signature(getattr(store, method)).parameters
    except (TypeError, ValueError):  # pragma: no cover - builtins without a signature
        return False
    return "connection" in parameters or any(
        p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()
    )


def _bools(p: _Probe, method: str, value: object, count: int) -> List[bool]:
    ok = isinstance(value, list) and len(value) == count and all(type(v) is bool for v in value)
    p._type(method, ok, f"a list of {count} real bools, one per input", value)
    return list(value) if isinstance(value, list) else []


def _identities(p: _Probe, method: str, value: object, count: int) -> List[Any]:
    ok = (
        isinstance(value, list)
        and len(value) == count
        and all(v is None or isinstance(v, AttemptIdentity) for v in value)
    )
    p._type(method, ok, f"a list of {count} AttemptIdentity-or-None, one per input", value)
    items = list(value) if isinstance(value, list) else []
    for item in items:
        if item is not None:
            p._identity(method, item)
    return items


def _rule_batch_add(p: _Probe, fenced: bool, durable: bool) -> None:
    if not _has(p.store, "add_many"):
        return
    p.require(p.add(1, "b1", _T), "add of a new update_id returned False")
    p.require(p.add(2, "b2", _T), "add of a new update_id returned False")
    p.require(p.claim(2, now=_T, lease_until=_T + _L) == 1, "claim of a pending update failed")
    rows = [(1, "b1", _T + 1), (3, "b3", _T), (2, "b2", _T + 1), (3, "b3", _T + 2), (4, "b4", _T)]
    got = _bools(p, "add_many", p._call("add_many", rows), len(rows))
    want = [False, True, False, False, True]
    p.expect(
        got == want,
        f"add_many({[(u, b) for u, b, _ in rows]}) returned {got}; the loop of single add calls "
        f"returns {want} (existing pending; new; existing processing; repeated in the batch; new)",
    )
    listed = p.due(now=_T + 1, pending_before=_FAR)
    p.expect(
        listed == [(1, "b1"), (3, "b3"), (4, "b4")],
        f"after add_many, due(now={_at(_T + 1)}) returned {listed}; expected [(1, 'b1'), "
        "(3, 'b3'), (4, 'b4')]: existing rows unchanged (update 2 keeps its live lease), each "
        "new row pending once with its first body",
    )
    taken = p.claim(2, now=_T + _L, lease_until=_FAR)
    p.expect(taken is None, f"claim of update 2 at {_at(_T + _L)} returned {taken!r}: add_many "
             "of an existing id reset its live lease")
    p.expect(
        _bools(p, "add_many", p._call("add_many", []), 0) == [],
        "add_many([]) must return []",
    )


def _rule_batch_claim_at_ingest(p: _Probe, fenced: bool, durable: bool) -> None:
    if not _has(p.store, "add_claimed_many"):
        return
    p.require(p.add(1, "b1", _T), "add of a new update_id returned False")
    rows = [(1, "b1", _T), (2, "b2", _T), (2, "b2", _T), (3, "b3", _T)]
    value = p._call("add_claimed_many", rows, lease_until=_T + _L)
    got = _identities(p, "add_claimed_many", value, len(rows))
    shape = [None if i is None else (i.update_id, i.attempt) for i in got]
    p.require(
        shape == [None, (2, 1), None, (3, 1)],
        f"add_claimed_many({[(u, b) for u, b, _ in rows]}, lease_until={_at(_T + _L)}) "
        f"returned {shape} as (update_id, attempt); the loop of add + claim_owned gives "
        "[None, (2, 1), None, (3, 1)] (existing id untouched; new id claimed for attempt 1; "
        "repeated in the batch; new id claimed)",
    )
    two, three = got[1], got[3]
    p.expect(two.claim_id != three.claim_id, "add_claimed_many gave two rows the same claim id")
    for identity in (two, three):
        p.expect(p.owns(identity, _T + _L), f"owns({identity}) at {_at(_T + _L)} returned False "
                 "right after add_claimed_many")
        p.expect(not p.owns(identity, _T + _L + 1), f"owns({identity}) at {_at(_T + _L + 1)} "
                 f"returned True; add_claimed_many was given lease_until={_at(_T + _L)}")
    taken = p.claim_owned(2, now=_T + _L, lease_until=_FAR)
    p.expect(taken is None, f"claim_owned of update 2 at {_at(_T + _L)} took the live lease "
             f"add_claimed_many gave it (returned {taken!r})")
    first = p.claim_owned(1, now=_T, lease_until=_T + _L)
    p.expect(
        first is not None and first.attempt == 1,
        f"claim_owned of the existing pending update 1 returned {first!r}; add_claimed_many "
        "must leave an existing id unchanged (expected attempt 1)",
    )


def _claim_scene(p: _Probe, now: int) -> None:
    """Rows 1-8 for the batch-claim rules, seen at ``now`` with ``max_attempts=2``: 1 pending,
    2 live lease, 3 lease held exactly at ``now``, 4 lapsed lease (attempt 1), 5 failed and due
    at ``now``, 6 failed and due at ``now + 1``, 7 lapsed lease with its attempts spent, 8
    completed."""
    for update_id in range(1, 9):
        p.require(p.add(update_id, f"b{update_id}", _T), "add of a new update_id returned False")
    for update_id, lease_until in ((2, _T + _L), (3, now), (4, now - 1), (5, now), (6, now),
                                   (7, _T + 1), (8, now)):
        identity = p.claim_owned(update_id, now=_T, lease_until=lease_until)
        p.require(identity is not None, "claim_owned of a pending update returned None")
        assert identity is not None
        if update_id in (5, 6):
            retry = Failed(at=_T + 1, retry_at=now + (update_id - 5), error="e")
            p.require(p.settle_owned(identity, retry), "settle_owned of a live claim failed")
        elif update_id == 8:
            p.require(p.settle_owned(identity, Completed(at=_T + 1)), "settle_owned failed")
    again = p.claim_owned(7, now=_T + 2, lease_until=now - 1)
    p.require(again is not None and again.attempt == 2, "claim_owned of a lapsed lease failed")


def _rule_batch_claim(p: _Probe, fenced: bool, durable: bool) -> None:
    if not _has(p.store, "claim_owned_many"):
        return
    now = _T + 10
    _claim_scene(p, now)
    ids = [1, 2, 3, 4, 5, 6, 7, 8, 99, 1]
    kwargs: Dict[str, Any] = {"now": now, "lease_until": now + _L, "max_attempts": 2}
    got = _identities(p, "claim_owned_many", p._call("claim_owned_many", ids, **kwargs), len(ids))
    shape = [None if i is None else (i.update_id, i.attempt) for i in got]
    want = [(1, 1), None, None, (4, 2), (5, 2), None, None, None, None, None]
    p.require(
        shape == want,
        f"claim_owned_many({ids}, now={_at(now)}, lease_until={_at(now + _L)}, max_attempts=2) "
        f"returned {shape} as (update_id, attempt); the loop of claim_owned gives {want} "
        "(pending; live lease; lease held at now; lapsed lease; failed due at now; failed due "
        "at now + 1; attempts spent; completed; unknown; repeated)",
    )
    taken = [i for i in got if i is not None]
    p.expect(len({i.claim_id for i in taken}) == len(taken),
             "claim_owned_many gave two rows the same claim id")
    for identity in taken:
        p.expect(p.owns(identity, now + _L) and not p.owns(identity, now + _L + 1),
                 f"{identity} taken by claim_owned_many does not own its row exactly up to "
                 f"lease_until={_at(now + _L)}")
    listed = p.due_ids(now=now + 1, pending_before=_FAR)
    p.expect(
        listed == [3, 6],
        f"after claim_owned_many, due(now={_at(now + 1)}) returned {listed}; expected [3, 6] "
        "(3's lease lapsed, 6 due; 1, 4, 5 claimed, 2 leased, 7 spent: abandoned, 8 completed)",
    )
    p.expect(
        _identities(p, "claim_owned_many", p._call("claim_owned_many", [], **kwargs), 0) == [],
        "claim_owned_many([]) must return []",
    )
    if durable:
        p.require(p.add(9, "b9", _T), "add of a new update_id returned False")
        p.require(p.claim_owned(9, now=_T, lease_until=_T + 1) is not None, "claim failed")
        kwargs.update(max_attempts=1, durable_exhaustion=True)
        spent = p._call("claim_owned_many", [9, 99], **kwargs)
        p.expect(spent == [None, None], f"claim_owned_many of a spent row returned {spent!r}")
        p.expect(9 in p.exhaustion_ids(), "claim_owned_many(durable_exhaustion=True) of a "
                 "spent row did not leave an exhaustion")


def _claimed(p: _Probe, update_id: int, lease_until: int) -> AttemptIdentity:
    p.require(p.add(update_id, "b", _T), "add of a new update_id returned False")
    identity = p.claim_owned(update_id, now=_T, lease_until=lease_until)
    p.require(identity is not None, "claim_owned of a pending update returned None")
    assert identity is not None
    return identity


def _rule_batch_settle(p: _Probe, fenced: bool, durable: bool) -> None:
    if not _has(p.store, "settle_owned_many"):
        return
    a, b, c, d = (_claimed(p, u, _T + _L) for u in (1, 2, 3, 4))
    e = _claimed(p, 5, _T + 10)
    wrong = AttemptIdentity(2, b.attempt, _other_claim_id(b.claim_id))
    at = _T + 20
    items: List[Tuple[AttemptIdentity, Settlement]] = [
        (a, Completed(at=at)),
        (wrong, Completed(at=at)),
        (c, Failed(at=at, retry_at=_T + 100, error="boom")),
        (d, Abandoned(at=at, error="gave up")),
        (e, Completed(at=at)),
        (a, Completed(at=at)),
        (AttemptIdentity(99, 1, "x"), Completed(at=at)),
    ]
    got = _bools(p, "settle_owned_many", p._call("settle_owned_many", items), len(items))
    want = [True, False, True, True, False, False, False]
    p.expect(
        got == want,
        f"settle_owned_many returned {got}; the loop of settle_owned gives {want} (completed; "
        "wrong claim id; failed; abandoned; lease expired at T+10; the same completion again; "
        "unknown id)",
    )
    p.expect(p.owns(b, at), "settle_owned_many with a wrong claim id changed the real claim's row")
    p.expect(not p.owns(a, at), "a completion landed by settle_owned_many left the lease owned")
    listed = p.due_ids(now=_T + 100, pending_before=_FAR)
    p.expect(
        listed == [3, 5],
        f"after settle_owned_many, due(now={_at(_T + 100)}) returned {listed}; expected [3, 5] "
        "(3 failed and due at its retry time, 5 lapsed; 1 completed, 4 abandoned, 2 still "
        "leased)",
    )
    p.expect(
        _bools(p, "settle_owned_many", p._call("settle_owned_many", []), 0) == [],
        "settle_owned_many([]) must return []",
    )


def _rule_combined_write(p: _Probe, fenced: bool, durable: bool) -> None:
    if not _has(p.store, "add_claimed_and_settle_many"):
        return
    a = _claimed(p, 1, _T + _L)
    wrong = AttemptIdentity(1, a.attempt, _other_claim_id(a.claim_id))
    rows = [(2, "b2", _T), (1, "b", _T)]
    settlements: List[Tuple[AttemptIdentity, Settlement]] = [
        (wrong, Completed(at=_T + 5)),
        (a, Completed(at=_T + 5)),
    ]
    value = p._call(
        "add_claimed_and_settle_many", rows, lease_until=_T + _L, settlements=settlements
    )
    ok = isinstance(value, tuple) and len(value) == 2
    p._type("add_claimed_and_settle_many", ok, "a tuple (identities, landed)", value)
    p.require(ok, "add_claimed_and_settle_many did not return (identities, landed)")
    added = _identities(p, "add_claimed_and_settle_many", value[0], len(rows))
    landed = _bools(p, "add_claimed_and_settle_many", value[1], len(settlements))
    shape = [None if i is None else (i.update_id, i.attempt) for i in added]
    p.expect(
        shape == [(2, 1), None] and landed == [False, True],
        f"add_claimed_and_settle_many returned {shape} (as (update_id, attempt)) and {landed}; "
        "add_claimed_many + settle_owned_many give [(2, 1), None] and [False, True]",
    )
    if added and added[0] is not None:
        p.expect(p.owns(added[0], _T + _L), "the row claimed by add_claimed_and_settle_many is "
                 "not owned by the identity it returned")
    p.expect(not p.owns(a, _T + 5), "the completion of add_claimed_and_settle_many did not land")


def _rule_bind_bot(p: _Probe, fenced: bool, durable: bool) -> None:
    if not _has(p.store, "bind_bot"):
        return
    p._call("bind_bot", 4242)
    p._call("bind_bot", 4242)  # the same bot again: a no-op
    try:
        p.store.bind_bot(4343)
    except TableBotMismatch:
        pass
    except Exception as exc:
        p.fail(f"bind_bot(4343) after bind_bot(4242) raised {type(exc).__name__}: {exc}; it "
               "must raise ptb_fence.TableBotMismatch")
    else:
        p.fail("bind_bot(4343) after bind_bot(4242) returned; the first binder wins, so it must "
               "raise ptb_fence.TableBotMismatch")
    p._call("bind_bot", 4242)  # the owner is unchanged


def _rule_transaction(p: _Probe, fenced: bool, durable: bool) -> None:
    if not _has(p.store, "transaction"):
        return
    with_connection = _takes_connection(p.store, "settle_owned")
    a = _claimed(p, 1, _T + _L)
    error = _Rollback("raised inside the block by the check")
    try:
        with p._call("transaction") as conn:
            if with_connection and conn is not None:
                p.settle_owned(a, Completed(at=_T + 5), connection=conn)
            raise error
    except _Rollback as exc:
        p.expect(exc is error, "transaction() replaced the exception raised inside its block")
    else:
        p.fail("transaction() swallowed the exception raised inside its block; it must roll "
               "back and re-raise it")
    if with_connection:
        p.expect(p.owns(a, _T + 5), "a settle_owned(connection=conn) inside a transaction() "
                 "block that raised was not rolled back: the row is no longer owned")
    with p._call("transaction") as conn:
        landed = p.settle_owned(a, Completed(at=_T + 5), connection=conn) if with_connection \
            else p.settle_owned(a, Completed(at=_T + 5))
        p.expect(landed, "settle_owned inside transaction() returned False for the live claim")
    p.expect(not p.owns(a, _T + 5), "the settle_owned of a transaction() block that ended "
             "normally was not committed: the row is still owned")
    taken = p.claim_owned(1, now=_FAR, lease_until=_FAR + _L)
    p.expect(taken is None, f"the update completed in a transaction() block was claimed again "
             f"({taken!r})")


def _rule_connection_fence(p: _Probe, fenced: bool, durable: bool) -> None:
    if not (
        _has(p.store, "transaction")
        and _takes_connection(p.store, "owns")
        and _takes_connection(p.store, "settle_owned")
    ):
        return
    a = _claimed(p, 1, _T + _L)
    # 1. a settle on the caller's connection rolls back with the caller's transaction (a
    # transaction() that yields None has no connection to roll back: only its lock is checked)
    yielded: List[Any] = []
    try:
        with p._call("transaction") as conn:
            yielded.append(conn)
            if conn is not None:
                p.expect(p.owns(a, _T + 5, connection=conn), "owns(connection=conn) returned "
                         "False for the live claim inside transaction()")
                p.settle_owned(a, Completed(at=_T + 5), connection=conn)
            raise _Rollback("raised inside the block by the check")
    except _Rollback:
        pass
    if yielded and yielded[0] is not None:
        p.require(
            p.owns(a, _T + 5) and p.due_ids(now=_T + _L + 1, pending_before=_T - 1) == [1],
            "settle_owned(connection=conn) landed although the caller's transaction rolled "
            "back (it must run on the caller's connection and never commit by itself)",
        )
    # 2. while the caller's transaction holds the row, a competing claim does not take it
    started = threading.Event()
    result: List[Any] = []

    def compete() -> None:
        started.set()
        try:
            result.append(p.claim_owned(1, now=_T + _L + 1, lease_until=_FAR))
        except BaseException as exc:  # reported below
            result.append(exc)

    thread = threading.Thread(target=compete, name="conformance-competing-claim", daemon=True)
    with p._call("transaction") as conn:
        p.require(p.owns(a, _T + 5, connection=conn), "owns(connection=conn) returned False for "
                  "the live claim inside transaction()")
        thread.start()
        started.wait(_JOIN_TIMEOUT)
        time.sleep(0.2)  # let the competing claim reach the store while the row is held
        landed = p.settle_owned(a, Completed(at=_T + 5), connection=conn)
        p.expect(landed, "settle_owned(connection=conn) returned False for the claim that "
                 "owns(connection=conn) had just confirmed")
    thread.join(_JOIN_TIMEOUT)
    p.require(not thread.is_alive(), f"a competing claim_owned did not return within "
              f"{_JOIN_TIMEOUT:g} s after the transaction committed")
    competitor = result[0] if result else None
    if isinstance(competitor, _Abort):
        raise competitor
    if isinstance(competitor, BaseException):
        raise _StoreRaised("claim_owned", competitor)
    p.expect(
        competitor is None,
        f"a competing claim_owned (lease lapsed) from another thread took the update while the "
        f"caller's transaction held it after owns(connection=conn) (returned {competitor!r}); "
        "the ownership check must lock the row until the caller's transaction ends",
    )
    p.expect(not p.owns(a, _T + 5), "the settle_owned(connection=conn) of a committed "
             "transaction did not land")


def _rule_completing(p: _Probe, fenced: bool, durable: bool) -> None:
    if not (
        _has(p.store, "transaction")
        and _has(p.store, "complete_owned")
        and _has(p.store, "reopen_completed")
    ):
        return

    def complete(identity: AttemptIdentity, at: int, conn: Any) -> bool:
        return p._bool("complete_owned", p._call("complete_owned", identity, at, connection=conn))

    def reopen(identity: AttemptIdentity, at: int, conn: Any) -> bool:
        value = p._call("reopen_completed", identity, at, connection=conn)
        return p._bool("reopen_completed", value)

    a = _claimed(p, 1, _T + _L)
    # 1. a lease ending exactly at the check holds; the caller's rollback restores the claim
    try:
        with p._call("transaction") as conn:
            p.require(complete(a, _T + _L, conn), "complete_owned returned False for the live "
                      f"claim at {_at(_T + _L)}, the end of its lease (due_at == at still holds)")
            raise _Rollback("raised inside the block by the check")
    except _Rollback:
        pass
    p.require(p.owns(a, _T + _L), "complete_owned landed although the caller's transaction "
              "rolled back: the rollback must restore the claim (owned, same lease)")
    # 2. refusals change nothing: the lease ended 1 ms before the check; a stale claim id
    stale = AttemptIdentity(1, a.attempt, _other_claim_id(a.claim_id))
    with p._call("transaction") as conn:
        p.expect(not complete(a, _T + _L + 1, conn), f"complete_owned at {_at(_T + _L + 1)} "
                 f"returned True for a lease that ended at {_at(_T + _L)}")
        p.expect(not complete(stale, _T + 5, conn), "complete_owned returned True for a wrong "
                 "claim id")
    p.require(p.owns(a, _T + _L), "a refused complete_owned changed the row: the claim is no "
              "longer owned")
    # 3. the row stays held against a competing claim until the caller's commit
    result: List[Any] = []
    started = threading.Event()

    def compete() -> None:
        started.set()
        try:
            result.append(p.claim_owned(1, now=_T + _L + 1, lease_until=_FAR))
        except BaseException as exc:  # reported below
            result.append(exc)

    thread = threading.Thread(target=compete, name="conformance-completing-claim", daemon=True)
    with p._call("transaction") as conn:
        p.require(complete(a, _T + 5, conn), "complete_owned returned False for the live claim")
        thread.start()
        started.wait(_JOIN_TIMEOUT)
        time.sleep(0.2)  # let the competing claim reach the store while the row is held
    thread.join(_JOIN_TIMEOUT)
    p.require(not thread.is_alive(), "a competing claim_owned did not return within "
              f"{_JOIN_TIMEOUT:g} s after the transaction committed")
    competitor = result[0] if result else None
    if isinstance(competitor, _Abort):
        raise competitor
    if isinstance(competitor, BaseException):
        raise _StoreRaised("claim_owned", competitor)
    p.expect(competitor is None, f"a competing claim_owned (lease lapsed) took the update "
             f"completed by complete_owned in the caller's transaction ({competitor!r}): the "
             "row must stay held until the caller's transaction ends")
    p.require(not p.owns(a, _T + 5), "the complete_owned of a committed transaction did not land")
    # 4. reopen_completed undoes exactly that completion, once
    with p._call("transaction") as conn:
        p.expect(not reopen(a, _T + 6, conn), "reopen_completed undid a completion made at "
                 f"another time ({_at(_T + 6)}, completed at {_at(_T + 5)})")
        p.expect(not reopen(stale, _T + 5, conn), "reopen_completed undid the completion of "
                 "another claim id")
    with p._call("transaction") as conn:
        p.expect(reopen(a, _T + 5, conn), "reopen_completed returned False for the completion "
                 "complete_owned made")
    p.expect(p.owns(a, _T + _L), "after reopen_completed the claim is not owned with its lease")
    with p._call("transaction") as conn:
        p.expect(not reopen(a, _T + 5, conn), "reopen_completed undid the same completion twice")


# ---------------------------------------------------------------------------------------------
# Rule 9
# ---------------------------------------------------------------------------------------------
def _rule_fence(p: _Probe, fenced: bool, durable: bool) -> None:
    p.require(p.add(1, "b", _T), "add of a new update_id returned False")
    first = p.claim_owned(1, now=_T, lease_until=_T + _L)
    p.require(
        first is not None and first.update_id == 1 and first.attempt == 1,
        f"claim_owned of a pending update returned {first!r}; expected update 1, attempt 1",
    )
    assert first is not None
    lease = _T + _L
    p.expect(p.owns(first, _T), "owns right after claim_owned returned False")
    p.expect(
        p.owns(first, lease),
        f"owns at exactly due_at ({_at(lease)}) returned False; the fence is inclusive",
    )
    p.expect(not p.owns(first, lease + 1), f"owns at due_at + 1 ({_at(lease + 1)}) returned True")

    wrong_claim = AttemptIdentity(1, 1, _other_claim_id(first.claim_id))
    wrong_attempt = AttemptIdentity(1, 2, first.claim_id)
    for label, wrong in (("a wrong claim id", wrong_claim), ("a wrong attempt", wrong_attempt)):
        p.expect(not p.owns(wrong, _T), f"owns with {label} returned True")
        p.expect(
            not p.renew_owned(wrong, lease + 5 * _L, now=_T),
            f"renew_owned with {label} returned True",
        )
        p.expect(
            not p.renew_owned(wrong, lease + 5 * _L),
            f"renew_owned (without now) with {label} returned True",
        )
        p.expect(
            not p.settle_owned(wrong, Completed(at=_T + 1)),
            f"settle_owned with {label} returned True",
        )
    p.expect(
        p.owns(first, lease) and not p.owns(first, lease + 1),
        "refused calls with a wrong identity changed the owner's lease or settled the update",
    )
    p.expect(
        p.renew_owned(first, lease, now=lease),
        f"renew_owned at now == due_at ({_at(lease)}) returned False; the lease is live then",
    )
    p.expect(
        not p.renew_owned(first, lease + 5 * _L, now=lease + 1),
        "renew_owned with now after expiry returned True: an expired fence was resurrected",
    )
    p.expect(
        not p.owns(first, lease + 1) and not p.owns(first, lease + 5 * _L),
        "owns returned True after the lease expired (resurrected by a late renew_owned?)",
    )
    p.expect(
        not p.settle_owned(first, Completed(at=lease + 1)),
        "settle_owned after the lease expired returned True",
    )

    second = p.claim_owned(1, now=lease + 1, lease_until=lease + 1 + _L)
    p.require(
        second is not None and second.update_id == 1 and second.attempt == 2,
        f"reclaim of the lapsed update returned {second!r}; expected attempt 2",
    )
    assert second is not None
    lease2 = lease + 1 + _L
    p.expect(
        second.claim_id != first.claim_id,
        "a reclaim returned the same claim id as the previous attempt; every claim needs a "
        "fresh one",
    )
    old_with_new_attempt = AttemptIdentity(1, 2, first.claim_id)
    olds = (("old identity", first), ("old claim id with the new attempt", old_with_new_attempt))
    for label, old in olds:
        p.expect(not p.owns(old, lease + 1), f"after a reclaim, owns with the {label} was True")
        p.expect(
            not p.renew_owned(old, lease2 + _L, now=lease + 1),
            f"after a reclaim, renew_owned with the {label} returned True",
        )
        p.expect(
            not p.renew_owned(old, lease2 + _L),
            f"after a reclaim, renew_owned (without now) with the {label} returned True",
        )
        p.expect(
            not p.settle_owned(old, Completed(at=lease + 2)),
            f"after a reclaim, settle_owned with the {label} returned True",
        )
    p.expect(
        p.owns(second, lease2) and not p.owns(second, lease2 + 1),
        "the new owner's lease changed after refused calls by the old attempt",
    )
    p.expect(
        p.settle_owned(second, Completed(at=lease2)),
        "settle_owned(Completed) at exactly due_at returned False",
    )
    p.expect(not p.owns(second, lease2), "owns returned True for a completed attempt")
    p.expect(
        not p.settle_owned(second, Completed(at=lease2)),
        "a second settle_owned of the completed attempt returned True",
    )

    pruned = p.prune(lease2 + 1)
    p.require(pruned == 1, f"prune after the completion returned {pruned}; expected 1")
    p.require(p.add(1, "again", lease2 + 2), "the pruned update_id could not be added again")
    now = lease2 + 2
    third = p.claim_owned(1, now=now, lease_until=now + _L)
    p.require(
        third is not None and third.update_id == 1,
        f"claim_owned of the re-added update returned {third!r}",
    )
    assert third is not None
    lease3 = now + _L
    p.expect(
        third.attempt == 1,
        f"claim_owned of a re-added update returned attempt {third.attempt}; it restarts at 1",
    )
    p.expect(
        third.claim_id not in (first.claim_id, second.claim_id),
        "claim_owned of a re-added update returned a claim id used before",
    )
    stale = AttemptIdentity(1, 1, first.claim_id)
    p.expect(
        not p.owns(stale, now),
        "after prune and re-add, owns accepted the old identity (same update_id, attempt 1, "
        "old claim id)",
    )
    p.expect(
        not p.renew_owned(stale, lease3 + 5 * _L, now=now),
        "after prune and re-add, renew_owned accepted the old identity",
    )
    p.expect(
        not p.settle_owned(stale, Completed(at=now)),
        "after prune and re-add, settle_owned accepted the old identity",
    )
    p.expect(
        p.owns(third, lease3) and not p.owns(third, lease3 + 1),
        "after refused calls by the old identity, the new attempt's lease changed or was lost",
    )
    p.expect(
        p.settle_owned(third, Completed(at=now + 1)),
        "settle_owned of the new attempt after the refused old identity returned False",
    )


# ---------------------------------------------------------------------------------------------
# Rule 10
# ---------------------------------------------------------------------------------------------
# ---------------------------------------------------------------------------------------------
# Optional recovery capabilities: release (ReleasingUpdateStore), liveness (LivenessStore)
# ---------------------------------------------------------------------------------------------
def _rule_release(p: _Probe, fenced: bool, durable: bool) -> None:
    if not _has(p.store, "release_many"):
        return
    a = _claimed(p, 1, _T + _L)
    b = _claimed(p, 2, _T + _L)
    c = _claimed(p, 3, _T + _L)
    p.require(p.settle_owned(c, Completed(at=_T + 1)), "settle_owned of a live claim failed")
    d = _claimed(p, 4, _T + 5)  # its lease lapses before the release: still releasable
    p.require(p.add(5, "b5", _T + 100), "add of a new update_id returned False")
    wrong = AttemptIdentity(2, b.attempt, _other_claim_id(b.claim_id))
    at = _T + 10
    items = [a, wrong, c, AttemptIdentity(99, 1, "x"), b, d]
    got = _bools(p, "release_many", p._call("release_many", items, at=at), len(items))
    want = [True, False, False, False, True, True]
    p.expect(
        got == want,
        f"release_many returned {got}; expected {want} (live claim; wrong claim id; completed "
        "row; unknown id; live claim; processing row with a lapsed lease)",
    )
    p.expect(not p.owns(a, at), f"owns({a}) returned True right after its release")
    p.expect(not p.renew_owned(a, _FAR, now=at), "renew_owned of a released identity returned "
             "True")
    p.expect(not p.settle_owned(a, Completed(at=at)), "settle_owned of a released identity "
             "returned True")
    listed = p.due_ids(now=at, pending_before=_T - 1)
    p.expect(
        listed == [1, 2, 4],
        f"after release_many, due(now={_at(at)}, pending_before={_at(_T - 1)}) returned "
        f"{listed}; expected [1, 2, 4]: released rows are listed at once whatever "
        "pending_before (3 is completed, 5 is a fresh pending row received after "
        "pending_before)",
    )
    again = p.claim_owned(1, now=at + 1, lease_until=_T + _L, max_attempts=1)
    p.require(
        again is not None,
        "claim_owned(max_attempts=1) of a row released after its first attempt returned None: "
        "the release counted the attempt as spent",
    )
    assert again is not None
    p.expect(
        again.attempt == a.attempt and again.claim_id != a.claim_id,
        f"the claim after a release returned {again}; expected the same attempt number "
        f"{a.attempt} (not counted as spent) with a fresh claim id (released: {a.claim_id!r})",
    )
    p.expect(not p.owns(a, at + 1), "the released identity is owned again after a new claim")
    p.expect(p.owns(again, at + 1), "the claim after a release is not owned")
    p.expect(not p.release_many_one(a, at + 2), "release_many of an identity released before "
             "(the row was claimed again since) returned True")
    p.expect(
        _bools(p, "release_many", p._call("release_many", [], at=at), 0) == [],
        "release_many([]) must return []",
    )


def _rule_liveness(p: _Probe, fenced: bool, durable: bool) -> None:
    if not all(_has(p.store, m) for m in ("hold_liveness", "release_liveness", "take_over_dead")):
        return
    first = p._call("hold_liveness")
    p.require(
        isinstance(first, str) and first != "",
        f"hold_liveness() returned {first!r}; it must return a non-empty str instance id",
    )
    second = p._call("hold_liveness")
    p.expect(second == first, f"hold_liveness() again returned {second!r}, not {first!r}: it "
             "must be idempotent")
    a = _claimed(p, 1, _T + _L)
    taken = p._call("take_over_dead", now=_T + 10)
    p._type("take_over_dead", type(taken) is int, "an int count", taken)
    p.expect(p.owns(a, _T + 10), "take_over_dead made a claim of the caller's own, live "
             "instance claimable")
    p.expect(p.claim_owned(1, now=_T + 10, lease_until=_FAR) is None, "after take_over_dead "
             "another claim took a live lease of the caller's own instance")
    p._call("release_liveness")
    p._call("release_liveness")  # idempotent
    b = _claimed(p, 2, _T + _L)
    p._call("take_over_dead", now=_T + 20)
    p.expect(p.owns(a, _T + 20), "take_over_dead after release_liveness took over a claim "
             "whose lease is live (a gracefully stopped instance is not dead)")
    p.expect(p.owns(b, _T + 20), "take_over_dead took over a live claim made without "
             "liveness")


def _rule_isolation(p: _Probe, fenced: bool, durable: bool) -> None:
    if not all(_has(p.store, m) for m in ("claimed_suspect", "mark_isolated")):
        return

    def suspect(identity: AttemptIdentity) -> bool:
        return p._bool("claimed_suspect", p._call("claimed_suspect", identity))

    def mark(identity: AttemptIdentity, at: int) -> bool:
        return p._bool("mark_isolated", p._call("mark_isolated", identity, at=at))

    lease = _T + _L
    a = _claimed(p, 1, lease)
    p.expect(not suspect(a), f"claimed_suspect({a}) of a fresh row's claim returned True")
    p.expect(not suspect(AttemptIdentity(99, 1, "x")), "claimed_suspect of an identity the "
             "store never returned returned True")
    wrong = AttemptIdentity(1, a.attempt, _other_claim_id(a.claim_id))
    p.expect(not mark(wrong, _T + 1), "mark_isolated with a wrong claim id returned True")
    p.expect(not mark(AttemptIdentity(1, a.attempt + 1, a.claim_id), _T + 1),
             "mark_isolated with a wrong attempt returned True")
    p.expect(not mark(AttemptIdentity(99, 1, "x"), _T + 1), "mark_isolated of an unknown id "
             "returned True")
    p.expect(not mark(a, lease + 1), f"mark_isolated at {_at(lease + 1)}, after the lease "
             f"(due_at {_at(lease)}), returned True")
    p.expect(mark(a, lease), f"mark_isolated of the live claim at {_at(lease)} (= due_at: the "
             "lease still holds) returned False")
    p.expect(p.owns(a, lease), "the claim is no longer owned after mark_isolated")
    b = _claimed(p, 2, lease)
    p.require(p.settle_owned(b, Completed(at=_T + 1)), "settle_owned of a live claim failed")
    p.expect(not mark(b, _T + 2), "mark_isolated of a completed row returned True")
    # a marked row stays suspect: its next claim (after the lease) runs alone again
    again = p.claim_owned(1, now=lease + 1, lease_until=_FAR)
    p.require(again is not None, "claim_owned of a lapsed lease returned None")
    assert again is not None
    p.expect(suspect(again), f"claimed_suspect({again}) returned False: the row was marked "
             "isolated, so it is suspect")
    p.expect(not suspect(again), f"claimed_suspect({again}) returned True twice: each claim "
             "is answered once")
    p.expect(p.settle_owned(again, Completed(at=lease + 2)), "settle_owned of the claim of a "
             "marked row failed")


# ---------------------------------------------------------------------------------------------
# Optional chat order (ChatOrderedUpdateStore)
# ---------------------------------------------------------------------------------------------
def _chat_claim(p: _Probe, update_id: int, now: int, lease_until: int) -> Optional[AttemptIdentity]:
    value = p._call(
        "claim_in_chat_order", update_id, now=now, lease_until=lease_until, max_attempts=5
    )
    if value is not None and not p._identity("claim_in_chat_order", value):
        raise _Abort
    return cast(Optional[AttemptIdentity], value)


def _chat_due(p: _Probe, now: int, pending_before: int, chat_key: Optional[int] = None) -> List[int]:
    kwargs: Dict[str, Any] = {"now": now, "pending_before": pending_before, "limit": 100}
    if chat_key is not None:
        kwargs["chat_key"] = chat_key
    value = p._call("due_in_chat_order", **kwargs)
    ok = isinstance(value, list) and all(
        isinstance(item, StoredUpdate) and type(item.update_id) is int for item in value
    )
    if not p._type("due_in_chat_order", ok, "a list of StoredUpdate", value):
        raise _Abort
    return [item.update_id for item in value]


def _rule_chat_order(p: _Probe, fenced: bool, durable: bool) -> None:
    if not all(_has(p.store, m) for m in CHAT_ORDER_METHODS):
        return
    rows = [(1, "c1", _T, 7), (2, "c2", _T, 7), (3, "c3", _T, None), (4, "c4", _T, 8),
            (1, "c1", _T, 7)]
    got = _bools(p, "add_many_in_chats", p._call("add_many_in_chats", rows), len(rows))
    p.require(got == [True, True, True, True, False], f"add_many_in_chats returned {got}; "
              "expected [True, True, True, True, False] (the last repeats update_id 1)")
    p.require(p.add(5, "c5", _T), "add of a new update_id returned False")  # no chat key
    at = _T + 1
    listed = _chat_due(p, at, _T)
    p.expect(listed == [1, 3, 4, 5], f"due_in_chat_order(now={_at(at)}) returned {listed}; "
             "expected [1, 3, 4, 5]: 2 waits for 1 (same chat, lower and unsettled)")
    p.expect(_chat_claim(p, 2, at, _T + _L) is None, "claim_in_chat_order(2) returned an "
             "identity while update 1 of the same chat is pending")
    a = _chat_claim(p, 1, at, _T + 50)
    p.require(a is not None and a.attempt == 1, f"claim_in_chat_order(1) returned {a}; "
              "expected attempt 1 (the lowest unsettled update of its chat)")
    assert a is not None
    p.expect(p.owns(a, _T + 50), "a claim_in_chat_order claim is not owned up to its lease")
    p.expect(_chat_claim(p, 3, at, _T + _L) is not None, "claim_in_chat_order of an update "
             "without a chat key returned None")
    listed = _chat_due(p, _T + 2, _T)
    p.expect(listed == [4, 5], f"due_in_chat_order while 1 is processing returned {listed}; "
             "expected [4, 5] (2 waits; 1 and 3 hold live leases)")
    p.require(p.settle_owned(a, Failed(at=_T + 3, retry_at=_T + 100, error="x")),
              "settle_owned(Failed) of a live claim returned False")
    p.expect(_chat_claim(p, 2, _T + 99, _T + _L) is None, "claim_in_chat_order(2) returned an "
             "identity while update 1 of its chat failed and waits for its retry")
    for now, want in ((_T + 99, [4, 5]), (_T + 100, [1, 4, 5])):
        listed = _chat_due(p, now, _T)
        p.expect(listed == want, f"due_in_chat_order(now={_at(now)}) returned {listed}; "
                 f"expected {want} (1 failed, due at {_at(_T + 100)} inclusive; 2 waits)")
    p.expect(_chat_due(p, _T + 100, _T, chat_key=8) == [4], "due_in_chat_order(chat_key=8) "
             "must list only the rows of chat 8")
    b = _chat_claim(p, 1, _T + 100, _T + 200)
    p.require(b is not None and b.attempt == 2, f"claim_in_chat_order(1) at its retry time "
              f"returned {b}; expected attempt 2")
    assert b is not None
    p.require(p.settle_owned(b, Abandoned(at=_T + 101, error="x")), "settle_owned(Abandoned) "
              "of a live claim returned False")
    c = _chat_claim(p, 2, _T + 102, _T + 300)
    p.expect(c is not None, "claim_in_chat_order(2) returned None after update 1 of its chat "
             "was abandoned (a settled update releases its chat)")
    # a lower update recorded after a higher one was claimed waits while that attempt's lease
    # is live (inclusive), not after it lapsed
    p.require(_bools(p, "add_many_in_chats", p._call("add_many_in_chats", [(20, "c20", _T, 9)]),
                     1) == [True], "add_many_in_chats of a new update_id returned [False]")
    d = _chat_claim(p, 20, _T + 1, _T + 400)
    p.require(d is not None, "claim_in_chat_order(20) of an idle chat returned None")
    p.require(_bools(p, "add_many_in_chats", p._call("add_many_in_chats", [(19, "c19", _T, 9)]),
                     1) == [True], "add_many_in_chats of a new update_id returned [False]")
    p.expect(_chat_claim(p, 19, _T + 400, _FAR) is None, "claim_in_chat_order(19) returned an "
             "identity while update 20 of its chat holds a lease live at now (due_at == now)")
    p.expect(_chat_claim(p, 19, _T + 401, _FAR) is not None, "claim_in_chat_order(19) returned "
             "None after the lease of update 20 (higher) lapsed")


def _unkeyed(p: _Probe, **kwargs: Any) -> List[int]:
    value = p._call("unkeyed_in_chats", **kwargs)
    ok = isinstance(value, list) and all(isinstance(row, StoredUpdate) for row in value)
    if not p._type("unkeyed_in_chats", ok, "a list of StoredUpdate", value):
        return []
    return [row.update_id for row in value]


def _rule_chat_keys(p: _Probe, fenced: bool, durable: bool) -> None:
    if not all(_has(p.store, m) for m in CHAT_ORDER_METHODS + CHAT_KEYING_METHODS):
        return
    for update_id in (1, 2, 4):
        p.require(p.add(update_id, f"c{update_id}", _T), "add of a new update_id returned False")
    keyed = p._call("add_many_in_chats", [(3, "c3", _T, 7)])
    p.require(_bools(p, "add_many_in_chats", keyed, 1) == [True],
              "add_many_in_chats of a new update_id returned [False]")
    done = p.claim_owned(4, now=_T, lease_until=_T + _L, max_attempts=5)
    p.require(done is not None, "claim_owned of a pending update returned None")
    assert done is not None
    p.require(p.settle_owned(done, Completed(at=_T + 1)),
              "settle_owned(Completed) of a live claim returned False")
    listed = _unkeyed(p, limit=10)
    p.expect(listed == [1, 2], f"unkeyed_in_chats(limit=10) returned {listed}; expected [1, 2] "
             "(3 has a chat key, 4 is settled)")
    listed = _unkeyed(p, after_update_id=1, limit=10)
    p.expect(listed == [2], f"unkeyed_in_chats(after_update_id=1) returned {listed}; "
             "expected [2]")
    listed = _unkeyed(p, limit=1)
    p.expect(listed == [1], f"unkeyed_in_chats(limit=1) returned {listed}; expected [1]")
    count = p._call("set_chat_keys", [(1, "c1", 7), (2, "not its body", 7), (4, "c4", 7)])
    p.expect(type(count) is int and count == 1, f"set_chat_keys returned {count!r}; expected "
             "1 (2 holds another body, 4 is settled)")
    listed = _unkeyed(p, limit=10)
    p.expect(listed == [2], f"unkeyed_in_chats after set_chat_keys returned {listed}; "
             "expected [2]")
    p.expect(_chat_claim(p, 3, _T + 2, _T + _L) is None, "claim_in_chat_order(3) returned an "
             "identity while update 1, keyed into its chat by set_chat_keys, is pending")
    p.expect(_chat_due(p, _T + 2, _T) == [1, 2], "due_in_chat_order must list 1 (the lowest of "
             "chat 7, keyed by set_chat_keys) and 2 (no chat key), not 3")


def _describe(exhaustion: Exhaustion) -> str:
    return (
        f"Exhaustion(update_id={exhaustion.update_id}, attempt={exhaustion.attempt}, "
        f"claim_id={exhaustion.claim_id!r}, body={exhaustion.body!r}, "
        f"exhausted_at={_at(exhaustion.exhausted_at)}, error={exhaustion.error!r})"
    )


def _find(p: _Probe, update_id: int) -> Optional[Exhaustion]:
    for item in p.due_exhaustions(limit=1000):
        if item.update_id == update_id:
            return item
    return None


def _rule_durable_exhaustion(p: _Probe, fenced: bool, durable: bool) -> None:
    lease = _T + _L
    # A: a spent claim_owned(durable_exhaustion=True) after the owner was lost.
    p.require(p.add(1, "body-1", _T), "add of a new update_id returned False")
    first = p.claim_owned(1, now=_T, lease_until=lease, max_attempts=1, durable_exhaustion=True)
    p.require(first is not None, "claim_owned of a pending update returned None")
    assert first is not None
    spent = p.claim_owned(
        1, now=lease + 1, lease_until=lease + 1 + _L, max_attempts=1, durable_exhaustion=True
    )
    p.expect(spent is None, f"a spending claim_owned returned {spent!r}; expected None")
    found = _find(p, 1)
    p.require(
        found is not None,
        "a claim_owned(durable_exhaustion=True) spend is not listed by due_exhaustions",
    )
    assert found is not None
    wanted = Exhaustion(
        update_id=1,
        attempt=1,
        claim_id=first.claim_id,
        body="body-1",
        exhausted_at=lease + 1,
        error="attempts spent",
    )
    p.expect(
        found == wanted,
        f"the spent update was listed as {_describe(found)}; expected {_describe(wanted)} (the "
        "last attempt and claim id, exhausted_at = the spend's now)",
    )
    ids = p.due_ids(now=_FAR, pending_before=_FAR)
    p.expect(1 not in ids, "due listed an unacknowledged exhaustion")
    again = p.claim_owned(1, now=_FAR, lease_until=_FAR + _L, max_attempts=10)
    p.expect(again is None, f"an exhausted update was claimable again ({again!r})")
    pruned = p.prune(_FAR)
    p.expect(pruned == 0, f"prune deleted {pruned} row(s) with an unacknowledged exhaustion")
    p.expect(_find(p, 1) is not None, "an unacknowledged exhaustion disappeared after prune")

    identity = found.identity
    wrong_claim = AttemptIdentity(1, identity.attempt, _other_claim_id(identity.claim_id))
    wrong_attempt = AttemptIdentity(1, identity.attempt + 1, identity.claim_id)
    p.expect(
        not p.acknowledge_exhaustion(wrong_claim, lease + 10),
        "acknowledge_exhaustion with a wrong claim id returned True",
    )
    p.expect(
        not p.acknowledge_exhaustion(wrong_attempt, lease + 10),
        "acknowledge_exhaustion with a wrong attempt returned True",
    )
    p.expect(
        _find(p, 1) is not None,
        "a refused acknowledgement removed the exhaustion from due_exhaustions",
    )
    ack_at = lease + 20
    p.expect(
        p.acknowledge_exhaustion(identity, ack_at),
        "acknowledge_exhaustion with the exact identity returned False",
    )
    p.expect(
        not p.acknowledge_exhaustion(identity, ack_at + 1),
        "a second acknowledge_exhaustion of the same exhaustion returned True",
    )
    p.expect(_find(p, 1) is None, "an acknowledged exhaustion is still listed")
    pruned = p.prune(ack_at)
    p.expect(pruned == 0, f"prune(before == the acknowledgement time) deleted {pruned} row(s)")
    pruned = p.prune(ack_at + 1)
    p.expect(
        pruned == 1,
        f"prune(acknowledgement time + 1) returned {pruned}; an acknowledged exhaustion is "
        "prunable history (settled_at = the acknowledgement's at)",
    )

    # B: a handler-terminal exhaust at the last live millisecond.
    p.require(p.add(2, "body-2", _T), "add of a new update_id returned False")
    owner = p.claim_owned(2, now=_T, lease_until=lease)
    p.require(owner is not None, "claim_owned of a pending update returned None")
    assert owner is not None
    for label, wrong in (
        ("a wrong claim id", AttemptIdentity(2, owner.attempt, _other_claim_id(owner.claim_id))),
        ("a wrong attempt", AttemptIdentity(2, owner.attempt + 1, owner.claim_id)),
    ):
        p.expect(
            not p.exhaust(wrong, at=_T + 1, error="wrong"),
            f"exhaust with {label} returned True",
        )
    p.expect(
        _find(p, 2) is None and p.owns(owner, lease),
        "a refused exhaust changed the update (listed as exhausted or the owner lost it)",
    )
    p.expect(
        p.exhaust(owner, at=lease, error="handler gave up"),
        "exhaust at exactly due_at (the last live millisecond) returned False",
    )
    found = _find(p, 2)
    wanted = Exhaustion(
        update_id=2,
        attempt=owner.attempt,
        claim_id=owner.claim_id,
        body="body-2",
        exhausted_at=lease,
        error="handler gave up",
    )
    p.expect(
        found == wanted,
        f"the exhausted update was listed as {None if found is None else _describe(found)}; "
        f"expected {_describe(wanted)} (error kept, exhausted_at = exhaust's at)",
    )
    p.expect(not p.owns(owner, lease), "owns returned True after the attempt exhausted")
    p.expect(
        not p.exhaust(owner, at=lease, error="again"),
        "a second exhaust of the same attempt returned True",
    )
    p.expect(
        p.claim_owned(2, now=_FAR, lease_until=_FAR + _L) is None,
        "an update exhausted by exhaust was claimable again",
    )
    p.expect(p.prune(_FAR) == 0, "prune deleted an update exhausted by exhaust")

    # C: an expired attempt cannot exhaust, and does not block a reclaim.
    p.require(p.add(3, "body-3", _T), "add of a new update_id returned False")
    stale = p.claim_owned(3, now=_T, lease_until=lease)
    p.require(stale is not None, "claim_owned of a pending update returned None")
    assert stale is not None
    p.expect(
        not p.exhaust(stale, at=lease + 1, error="too late"),
        "exhaust 1 ms after the attempt's lease expired returned True",
    )
    p.expect(_find(p, 3) is None, "an expired attempt's refused exhaust listed the update")
    fresh = p.claim_owned(3, now=lease + 1, lease_until=lease + 1 + _L)
    p.expect(
        fresh is not None and fresh.attempt == 2,
        f"reclaim after an expired attempt's exhaust returned {fresh!r}; expected attempt 2",
    )

    # D: cursor paging over 7 exhaustions (plus update 2 from B).
    page_ids = [10, 20, 30, 40, 50, 60, 70]
    for update_id in page_ids:
        p.require(p.add(update_id, f"body-{update_id}", _T), "add of a new update_id failed")
        claimed = p.claim_owned(update_id, now=_T, lease_until=lease)
        p.require(claimed is not None, f"claim_owned of update {update_id} returned None")
        assert claimed is not None
        p.require(
            p.exhaust(claimed, at=_T + update_id, error=f"e{update_id}"),
            f"exhaust of the live claim of update {update_id} returned False",
        )
    expected = [2] + page_ids
    seen: List[int] = []
    cursor: Optional[int] = None
    for _ in range(len(expected) + 2):
        page = p.due_exhaustions(limit=3, after_update_id=cursor)
        p.expect(len(page) <= 3, f"due_exhaustions(limit=3) returned {len(page)} rows")
        if not page:
            break
        ids_page = [e.update_id for e in page]
        p.expect(
            cursor is None or all(u > cursor for u in ids_page),
            f"due_exhaustions(after_update_id={cursor}) returned {ids_page}; only ids above the "
            "cursor belong on the page",
        )
        seen.extend(ids_page)
        cursor = ids_page[-1]
    p.expect(
        seen == expected,
        f"paging due_exhaustions with limit=3 and after_update_id saw {seen}; expected "
        f"{expected} (every exhaustion once, by update_id)",
    )

    # E: a base claim(..., durable_exhaustion=True) spend is visible too.
    base_spends: List[Tuple[str, Exhaustion]] = []
    for update_id, first_flag in ((80, True), (90, None)):
        p.require(p.add(update_id, f"body-{update_id}", _T), "add of a new update_id failed")
        got = p.claim(
            update_id, now=_T, lease_until=lease, max_attempts=1, durable_exhaustion=first_flag
        )
        p.require(got == 1, f"claim of pending update {update_id} returned {got!r}")
        spent_base = p.claim(
            update_id,
            now=lease + 1,
            lease_until=lease + 1 + _L,
            max_attempts=1,
            durable_exhaustion=True,
        )
        p.expect(spent_base is None, f"a spending base claim returned {spent_base!r}")
        how = (
            "claim(..., durable_exhaustion=True)"
            if first_flag
            else "claim() then a spending claim(..., durable_exhaustion=True)"
        )
        found = _find(p, update_id)
        if not p.expect(found is not None, f"a base {how} spend is not listed"):
            continue
        assert found is not None
        p.expect(
            found.attempt == 1
            and found.body == f"body-{update_id}"
            and found.exhausted_at == lease + 1
            and found.error == "attempts spent"
            and isinstance(found.claim_id, str)
            and found.claim_id != "",
            f"a base {how} spend was listed as {_describe(found)}; expected attempt 1, its body, "
            f"exhausted_at {_at(lease + 1)}, error 'attempts spent' and a non-empty claim id",
        )
        base_spends.append((how, found))
    pruned = p.prune(_FAR)
    p.expect(pruned == 0, f"prune deleted {pruned} base claim spend exhaustion(s)")
    for how, found in base_spends:
        p.expect(
            p.acknowledge_exhaustion(found.identity, lease + 2),
            f"acknowledge_exhaustion of the base {how} exhaustion's identity returned False",
        )


# ---------------------------------------------------------------------------------------------
# The check
# ---------------------------------------------------------------------------------------------
_RuleFn = Callable[[_Probe, bool, bool], None]

_TABLE: Tuple[Tuple[ConformanceRule, _RuleFn], ...] = (
    (
        ConformanceRule(
            "one-record-per-update",
            "base",
            "A second add of an update_id returns False in every state and changes nothing.",
        ),
        _rule_one_record,
    ),
    (
        ConformanceRule(
            "lease",
            "base",
            "A live lease (due_at >= now) is not taken, a lapsed one (due_at < now) is; due "
            "lists it with its body; renew with now never revives an expired lease.",
        ),
        _rule_lease,
    ),
    (
        ConformanceRule(
            "attempt-ownership",
            "base",
            "Only the attempt holding the update renews or settles it; a settle lands up to "
            "and including due_at; fenced: wrong identities and expired leases cannot "
            "settle_owned.",
        ),
        _rule_ownership,
    ),
    (
        ConformanceRule(
            "retry-and-spend",
            "base",
            "A failed update is due exactly at its retry time; spent attempts abandon it "
            "(settled at the spend's now, prunable).",
        ),
        _rule_retry_and_spend,
    ),
    (
        ConformanceRule(
            "due-listing",
            "base",
            "due lists by update_id, at most limit rows, pending rows only when "
            "received_at <= pending_before.",
        ),
        _rule_due_listing,
    ),
    (
        ConformanceRule(
            "prune",
            "base",
            "prune deletes settled rows with settled_at < before only and returns the count; "
            "the id can be added again and restarts at attempt 1.",
        ),
        _rule_prune,
    ),
    (
        ConformanceRule(
            "concurrent-claim",
            "base",
            "Of 8 concurrent claims of one update exactly one wins.",
        ),
        _rule_concurrent_claim,
    ),
    (
        ConformanceRule(
            "concurrent-claim-owned",
            "fenced",
            "Of 8 concurrent claim_owned calls of one update exactly one wins.",
        ),
        _rule_concurrent_claim_owned,
    ),
    (
        ConformanceRule(
            "renewal-never-shortens",
            "base",
            "renew/renew_owned with an earlier lease_until returns True and keeps the later "
            "lease.",
        ),
        _rule_renewal,
    ),
    (
        ConformanceRule(
            "batch-renewal",
            "base",
            "renew_many/renew_owned_many (when present) equal the loop of single renewals, "
            "refusals included; None only for a row locked by another open transaction.",
        ),
        _rule_batch_renewal,
    ),
    (
        ConformanceRule(
            "batch-add",
            "base",
            "add_many (when present) equals the loop of add calls row by row: existing and "
            "repeated ids are refused and left unchanged, new ids are pending once.",
        ),
        _rule_batch_add,
    ),
    (
        ConformanceRule(
            "bind-bot",
            "base",
            "bind_bot (when present) accepts the same bot id again and raises "
            "TableBotMismatch for another one.",
        ),
        _rule_bind_bot,
    ),
    (
        ConformanceRule(
            "batch-claim-at-ingest",
            "fenced",
            "add_claimed_many (when present) equals add + claim_owned for attempt 1 per new id; "
            "existing and repeated ids give None and stay unchanged.",
        ),
        _rule_batch_claim_at_ingest,
    ),
    (
        ConformanceRule(
            "batch-claim",
            "fenced",
            "claim_owned_many (when present) equals the loop of claim_owned calls: live and "
            "exact-boundary leases, early retries, settled, unknown and repeated ids give None; "
            "spent rows are abandoned.",
        ),
        _rule_batch_claim,
    ),
    (
        ConformanceRule(
            "batch-settle",
            "fenced",
            "settle_owned_many (when present) equals the loop of settle_owned calls, refusals "
            "(wrong claim id, expired lease, repeated, unknown) included.",
        ),
        _rule_batch_settle,
    ),
    (
        ConformanceRule(
            "combined-write",
            "fenced",
            "add_claimed_and_settle_many (when present) equals add_claimed_many plus "
            "settle_owned_many.",
        ),
        _rule_combined_write,
    ),
    (
        ConformanceRule(
            "transaction",
            "fenced",
            "transaction() (when present) commits on normal exit and rolls back and re-raises "
            "on an exception.",
        ),
        _rule_transaction,
    ),
    (
        ConformanceRule(
            "connection-fence",
            "fenced",
            "owns/settle_owned(connection=) run inside the caller's transaction: the settle "
            "rolls back and commits with it, and the row stays held against a competing claim.",
        ),
        _rule_connection_fence,
    ),
    (
        ConformanceRule(
            "completing",
            "fenced",
            "complete_owned/reopen_completed (when present): complete_owned is inclusive at "
            "due_at, refuses wrong claim ids and changes nothing then, rolls back with the "
            "caller's transaction and holds the row against a competing claim until its commit; "
            "reopen_completed undoes exactly that completion, once.",
        ),
        _rule_completing,
    ),
    (
        ConformanceRule(
            "fence",
            "fenced",
            "owns is inclusive at due_at; wrong claim ids, expired and reclaimed attempts and "
            "identities from before a prune and re-add are refused.",
        ),
        _rule_fence,
    ),
    (
        ConformanceRule(
            "release",
            "fenced",
            "release_many (when present) gives exact claims back at once without spending the "
            "attempt: listed by due, reclaimed with the same attempt and a fresh claim id, the "
            "released identity refused.",
        ),
        _rule_release,
    ),
    (
        ConformanceRule(
            "liveness",
            "fenced",
            "hold_liveness/release_liveness/take_over_dead (when present): the instance id is "
            "stable, and take_over_dead never touches the caller's own or a released "
            "instance's live claims.",
        ),
        _rule_liveness,
    ),
    (
        ConformanceRule(
            "isolation",
            "fenced",
            "claimed_suspect/mark_isolated (when present): mark_isolated lands only for the "
            "exact live claim (inclusive at due_at) and changes nothing else; claimed_suspect "
            "is False for fresh and unknown claims, True once for the next claim of a marked "
            "row.",
        ),
        _rule_isolation,
    ),
    (
        ConformanceRule(
            "chat-order",
            "fenced",
            "add_many_in_chats/claim_in_chat_order/due_in_chat_order (when present): only the "
            "lowest unsettled update of a chat (pending, processing or failed) is claimed or "
            "listed, none while an attempt of the chat holds a live lease; settled updates and "
            "rows without a chat key do not wait.",
        ),
        _rule_chat_order,
    ),
    (
        ConformanceRule(
            "chat-keys",
            "fenced",
            "unkeyed_in_chats/set_chat_keys (when present, with chat order): the unsettled "
            "rows without a chat key are listed, and keyed only while they have none and hold "
            "the given body; a keyed row then holds its chat.",
        ),
        _rule_chat_keys,
    ),
    (
        ConformanceRule(
            "durable-exhaustion",
            "durable",
            "Spent and exhausted updates stay listed and unprunable until the exact identity "
            "acknowledges them; cursor paging sees each once.",
        ),
        _rule_durable_exhaustion,
    ),
)

RULES: Tuple[ConformanceRule, ...] = tuple(rule for rule, _ in _TABLE)
"""Tuple[:class:`ConformanceRule`, ...]: The rules of :func:`check_update_store`, in the order
they run. Their names prefix the violations."""


def _close(store: Any) -> None:
    close = getattr(store, "close", None)
    if callable(close):
        close()


def _raised(rule: str, error: BaseException, where: str) -> str:
    return f"{rule}: raised {type(error).__name__}: {error} ({where})"


def check_update_store(make: Callable[[], UpdateStore]) -> List[str]:
    """Check a store against the rules of the store contract (see the module docstring).

    Args:
        make (Callable[[], :class:`ptb_fence.UpdateStore`]): Returns a new, empty store on every
            call. It is called once per rule that runs; each store is closed (when it has
            ``close()``) after its rule.

    Returns:
        List[:obj:`str`]: The violations, each ``"<rule>: <what happened>"`` with a rule name from
        :data:`RULES`; an empty list means the store conforms. A rule that raises is reported as
        ``"<rule>: raised <ExcType>: <message> (from store.<method>)"`` and the check goes on with
        the next rule. Fenced rules run only for a fenced store and durable rules only for a
        durable store (detected on the first store).
    """
    violations: List[str] = []
    level: Optional[int] = None
    for rule, function in _TABLE:
        needed = _LEVELS.index(rule.level)
        if level is not None and needed > level:
            continue
        try:
            store: Any = make()
        except Exception as exc:
            violations.append(_raised(rule.name, exc, "from make()"))
            continue
        try:
            if level is None:
                missing = missing_methods(store, BASE_METHODS)
                if missing:
                    violations.append(
                        f"{rule.name}: the store lacks the base method(s) {', '.join(missing)}; "
                        "it is not an UpdateStore (see ptb_fence.UpdateStore)"
                    )
                    return violations
                level = 2 if is_durable(store) else 1 if is_fenced(store) else 0
                if needed > level:  # pragma: no cover - the first rule is a base rule
                    continue
            probe = _Probe(store, rule.name, violations)
            try:
                function(probe, level >= 1, level >= 2)
            except _Abort:
                pass
            except _StoreRaised as exc:
                violations.append(_raised(rule.name, exc.error, f"from store.{exc.method}"))
            except Exception as exc:
                violations.append(_raised(rule.name, exc, "in the check"))
        finally:
            try:
                _close(store)
            except Exception as exc:
                violations.append(_raised(rule.name, exc, "from store.close"))
    return violations
