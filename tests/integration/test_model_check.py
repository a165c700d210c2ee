"""Model-based check: random operation sequences against every store, compared with a model.

A hypothesis :class:`~hypothesis.stateful.RuleBasedStateMachine` drives one store with random
sequences of every store operation (the durable contract plus ``add_many``, ``renew_many`` and
``renew_owned_many``; ``owns``/``settle_owned`` also on the caller's connection inside
``store.transaction()``, committed or rolled back) under a moving clock, and compares every answer
with :class:`store_model.StoreModel`, an independent statement of the data model and the store
contract. After every step it also compares the full ``due()`` list, the full ``due_exhaustions()``
list and, for the SQL stores, the whole table (its layout is public).

* the clock moves by small steps (including 0) and jumps exactly to a lease's or a retry's
  ``due_at``, a ``received_at`` or a ``settled_at``, and one millisecond either side, so every
  inclusive/strict boundary of the data model is hit;
* update ids come from a small pool, so prune-and-re-add (attempt restarting at 1) happens
  (``recycle`` prunes a settled row and records and claims its id again in one step);
* every identity the store ever returned is kept, so stale claims are retried, and identities
  are also forged (foreign claim id, attempt ± 1, claim id of another claim, other update);
* arguments are chosen from the state (mostly a row that exists, a claim that holds its lease,
  an exhaustion to acknowledge), so deep sequences are likely;
* claim ids differ between model and store: the check keeps a bijection between the model's
  tokens and the store's claim ids, built from what the store returns (a claim id must never be
  issued twice).

A failure message names the disagreeing operation and lists every store call before it (after
hypothesis has shrunk the sequence, that is the minimal reproduction). Deliberately broken
stores (tests/support/broken_variants.py) show that the machine finds bugs.

Examples per store: PTB_FENCE_MODEL_SCALE=<factor> multiplies them (e.g. 10 for a long hunt); with
the ``CI`` environment variable set the runs are derandomized.
"""

from __future__ import annotations

import copy
import os
import shutil
import sqlite3
import tempfile
import time
import uuid
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from ptb_fence import (
    Abandoned,
    AttemptIdentity,
    Completed,
    Exhaustion,
    Failed,
    MemoryUpdateStore,
    PostgresUpdateStore,
    SQLiteUpdateStore,
    StoredUpdate,
)
import broken_variants
from store_model import StoreModel


T0 = 1_700_000_000_000  # epoch ms (beyond 2**32: BIGINT times must round-trip exactly)
UPDATE_IDS = [0, 1, 2, 3, 4, 5, 2**63 - 1]  # 2**63 - 1: the largest BIGINT
BODIES = ['{"update_id": 1}', "ü €", "'; DROP TABLE x; --", ""]
ERRORS = ["boom", "ünïcode", ""]
BIG = 1000  # a limit larger than the pool

# Examples per store (steps per example: STEPS); PTB_FENCE_MODEL_SCALE multiplies them.
_SCALE = float(os.environ.get("PTB_FENCE_MODEL_SCALE", "1"))
STEPS = 40
MEMORY_EXAMPLES = max(1, int(300 * _SCALE))
SQLITE_EXAMPLES = max(1, int(100 * _SCALE))
POSTGRES_EXAMPLES = max(1, int(60 * _SCALE))

pytestmark = pytest.mark.timeout(max(240, int(240 * _SCALE)))


def _settings(examples: int, **extra: Any) -> settings:
    options: Dict[str, Any] = dict(
        max_examples=examples,
        stateful_step_count=STEPS,
        deadline=None,
        database=None,
        derandomize=bool(os.environ.get("CI")),
        print_blob=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )
    options.update(extra)
    return settings(**options)


# -- strategies --------------------------------------------------------------------------------
# Arguments that name rows are small integers the machine maps onto its current state (mostly an
# id that has a row, a live attempt, the latest identity), so that interesting sequences are
# likely; the failure message prints the concrete operations (see StoreMachine.fail).
update_ids = st.sampled_from(UPDATE_IDS)  # add / add_many: any id of the pool
targets = st.integers(min_value=0, max_value=255)  # StoreMachine.target
picks = st.integers(min_value=0, max_value=2**16)  # StoreMachine.pick
attempt_deltas = st.sampled_from([0, 0, 0, -1, 1])  # relative to the row's attempts
lease_offsets = st.sampled_from([-1, 0, 1, 2, 3, 5, 10, 30, 100, 1000])
renew_offsets = st.sampled_from([-3, -1, 0, 1, 2, 5, 10])
max_attempts = st.sampled_from([0, 1, 1, 2, 2, 3])  # 0: spent before the first attempt
# How a kept identity is passed back: mostly exact, sometimes forged.
forgeries = st.sampled_from(
    ["exact", "exact", "exact", "foreign_claim", "attempt+1", "attempt-1", "borrowed_claim",
     "other_update"]
)
settlements = st.one_of(
    st.just(("completed", 0, None)),
    st.tuples(st.just("failed"), st.sampled_from([-1, 0, 1, 2, 5]), st.sampled_from(ERRORS)),
    st.tuples(st.just("abandoned"), st.just(0), st.sampled_from(ERRORS)),
)

class _Rollback(Exception):
    """Raised inside ``store.transaction()`` to roll it back."""


Peek = Optional[Callable[[], List[Tuple[Any, ...]]]]


class StoreMachine(RuleBasedStateMachine):
    """The rules, shared by every store kind (see :func:`machine_for`)."""

    # Set by machine_for(): open_store() -> (store, peek or None, cleanup).
    open_store: Callable[[], Tuple[Any, Peek, Callable[[], None]]]
    base_claim_writes_claim_id = True
    # Whether store.transaction() rolls back on an exception (the memory store has no undo).
    rolls_back = True

    def __init__(self) -> None:
        super().__init__()
        self.store, self.peek, self._cleanup = type(self).open_store()
        self.model = StoreModel(base_claim_writes_claim_id=self.base_claim_writes_claim_id)
        self.now = T0
        self.to_store: Dict[object, str] = {}  # model claim token -> store claim id
        self.to_model: Dict[str, object] = {}  # store claim id -> model claim token
        self.seen: List[AttemptIdentity] = []  # every identity the store returned, stale too
        self.trace: List[str] = []  # the store calls so far, for the failure message
        self.pruned: Set[int] = set()  # ids whose rows were pruned (to be recorded again)

    def teardown(self) -> None:
        self._cleanup()

    # -- reporting ------------------------------------------------------------------------------
    def show(self, value: object) -> str:
        """``repr`` with store claim ids written as the model's claim names (``claim:m3``)."""
        if isinstance(value, AttemptIdentity):
            claim = self.claim_name(value.claim_id)
            return f"AttemptIdentity({value.update_id}, {value.attempt}, {claim})"
        if isinstance(value, Exhaustion):
            return (f"Exhaustion({value.update_id}, {value.attempt}, "
                    f"{self.claim_name(value.claim_id)}, {value.body!r}, "
                    f"exhausted_at={self.show(value.exhausted_at)}, {value.error!r})")
        if isinstance(value, (Completed, Failed, Abandoned)):
            fields = ", ".join(f"{k}={self.show(v)}" for k, v in vars(value).items())
            return f"{type(value).__name__}({fields})"
        if isinstance(value, list):
            return "[" + ", ".join(self.show(v) for v in value) + "]"
        if isinstance(value, int) and not isinstance(value, bool) and abs(value - T0) < 10**9:
            return f"T0{value - T0:+d}"  # a time
        return repr(value)

    def claim_name(self, claim_id: str) -> str:
        token = self.to_model.get(claim_id)
        return f"claim:{token}" if token is not None else f"forged:{claim_id[:6]}"

    def call(self, text: str, result: Any) -> Any:
        self.trace.append(f"{text} -> {self.show(result)}")
        return result

    def fail(self, message: str) -> str:
        steps = "\n    ".join(self.trace) or "(none)"
        return (f"{message}\n  now = T0{self.now - T0:+d}; T0 = {T0}; store calls so far:\n"
                f"    {steps}")

    def agree(self, op: str, got: object, want: object) -> None:
        assert got == want, self.fail(
            f"{op}: store returned {self.show(got)}, model says {self.show(want)}")
        for g, w in zip(got if isinstance(got, list) else [got],
                        want if isinstance(want, list) else [want]):
            if isinstance(w, bool) or isinstance(w, int):
                assert type(g) is type(w), self.fail(f"{op}: returned {g!r}, not a {type(w)}")

    # -- claim ids: a bijection between model tokens and store claim ids ---------------------
    def bind(self, token: object, claim_id: Optional[str], where: str) -> None:
        """Record (or check) that the model's ``token`` is the store's ``claim_id``."""
        if token is None or claim_id is None:
            assert token is None and claim_id is None, self.fail(
                f"{where}: store claim id {claim_id!r}, model claim {token!r}")
            return
        assert type(claim_id) is str and claim_id, self.fail(f"{where}: claim id {claim_id!r}")
        known = self.to_store.get(token)
        if known is None:
            assert claim_id not in self.to_model, self.fail(
                f"{where}: store claim id {claim_id!r} was already issued for "
                f"{self.to_model[claim_id]!r}; the model expects a fresh claim ({token!r})")
            self.to_store[token] = claim_id
            self.to_model[claim_id] = token
        else:
            assert known == claim_id, self.fail(
                f"{where}: store claim id {claim_id!r}, model says {token!r} = {known!r}")

    def model_identity(self, identity: AttemptIdentity) -> Tuple[int, int, object]:
        # A claim id the store never returned (forged) matches no model claim.
        token = self.to_model.get(identity.claim_id, ("forged", identity.claim_id))
        return (identity.update_id, identity.attempt, token)

    # -- choosing arguments from the state ----------------------------------------------------
    def target(self, t: int, prefer: Optional[Callable[[Dict[str, Any]], bool]] = None) -> int:
        """An update id: ``t % 4`` 0 a row ``prefer`` likes, 1–2 any row, 3 any id of the pool."""
        rows = sorted(self.model.rows.items())
        liked = [u for u, r in rows if prefer is not None and prefer(r)]
        if liked and t % 4 == 0:
            return liked[(t >> 2) % len(liked)]
        if rows and t % 4 != 3:
            return rows[(t >> 2) % len(rows)][0]
        return UPDATE_IDS[(t >> 2) % len(UPDATE_IDS)]

    def claimable(self, row: Dict[str, Any]) -> bool:
        return StoreModel.claimable(row, self.now)

    @staticmethod
    def processing(row: Dict[str, Any]) -> bool:
        return bool(row["state"] == "processing")

    def attempt_of(self, update_id: int, delta: int) -> int:
        row = self.model.rows.get(update_id)
        return (int(row["attempts"]) if row else 1) + delta

    def remember(self, identity: AttemptIdentity) -> None:
        if identity not in self.seen:
            self.seen.append(identity)

    def current(self, where: Optional[Callable[[Dict[str, Any]], bool]] = None
                ) -> List[AttemptIdentity]:
        """Kept identities that are their row's current claim (and whose row is ``where``)."""
        rows = self.model.rows
        return [i for i in self.seen if i.update_id in rows
                and rows[i.update_id]["attempts"] == i.attempt
                and rows[i.update_id]["claim_id"] == self.to_model.get(i.claim_id)
                and (where is None or where(rows[i.update_id]))]

    def live(self, row: Dict[str, Any]) -> bool:
        return bool(row["state"] == "processing" and row["due_at"] >= self.now)

    @staticmethod
    def exhausted(row: Dict[str, Any]) -> bool:
        return bool(row["state"] == "abandoned" and row["settled_at"] is None)

    def pick(self, pick: int, how: str,
             prefer: Optional[Callable[[Dict[str, Any]], bool]] = None) -> AttemptIdentity:
        """A kept identity, passed back as ``how`` says.

        ``pick % 4``: 0–1 its row's current claim, on a row ``prefer`` likes (default: a lease
        held now); 2 (or if there is none) its row's current claim in any state; 3 any kept
        identity (stale ones included); the latest if none of these exists.
        """
        if not self.seen:  # nothing returned yet: an identity the store never issued
            return AttemptIdentity(self.target(pick), 1 + pick % 2, uuid.uuid4().hex)
        pool = self.seen
        if pick % 4 != 3:
            pool = (pick % 4 != 2 and self.current(prefer or self.live)) or self.current() \
                or self.seen[-1:]
        identity = pool[-1 - (pick >> 2) % len(pool)]
        return self.forge(identity, how, self.seen[-1 - (pick >> 9) % len(self.seen)])

    @staticmethod
    def forge(identity: AttemptIdentity, how: str, other: AttemptIdentity) -> AttemptIdentity:
        """``identity`` as it is ("exact") or with one part wrong."""
        u, a, c = identity.update_id, identity.attempt, identity.claim_id
        if how == "foreign_claim":
            return AttemptIdentity(u, a, uuid.uuid4().hex)
        if how == "attempt+1":
            return AttemptIdentity(u, a + 1, c)
        if how == "attempt-1":
            return AttemptIdentity(u, a - 1, c)
        if how == "borrowed_claim":
            return AttemptIdentity(u, a, other.claim_id)
        if how == "other_update":
            return AttemptIdentity(other.update_id, a, c)
        return identity

    def settlement(self, spec: Tuple[str, int, Any]) -> Tuple[Any, Tuple[Any, ...]]:
        """The store's settlement at ``now`` and the model's arguments for it."""
        kind, offset, error = spec
        at = self.now
        if kind == "completed":
            return Completed(at=at), ("completed", at)
        if kind == "failed":
            return (Failed(at=at, retry_at=at + offset, error=error),
                    ("failed", at, at + offset, error))
        return Abandoned(at=at, error=error), ("abandoned", at, None, error)

    # -- clock ----------------------------------------------------------------------------------
    @rule(by=st.sampled_from([0, 0, 1, 1, 2, 3, 5, 10, 50]))
    def advance(self, by: int) -> None:
        self.now += by
        self.trace.append(f"(clock +{by}: now = T0{self.now - T0:+d})")

    @rule(t=targets, field=st.sampled_from(["due_at", "due_at", "received_at", "settled_at"]),
          offset=st.sampled_from([-1, 0, 1]))
    def jump_to_boundary(self, t: int, field: str, offset: int) -> None:
        """Set the clock to a row's due_at (of a lease or a retry) / received_at / settled_at,
        or 1 ms either side."""
        candidates = [r[field] for _, r in sorted(self.model.rows.items())
                      if r[field] is not None
                      and (field != "due_at" or r["state"] in ("processing", "failed"))]
        if candidates:
            self.now = int(candidates[t % len(candidates)]) + offset
            self.trace.append(f"(clock jumps to a {field}{offset:+d}: now = T0{self.now - T0:+d})")

    # -- a few rows (and claims) to start from, whichever rules the example enables ---------------
    @initialize(ids=st.lists(update_ids, min_size=1, max_size=4, unique=True),
                claims=st.integers(min_value=0, max_value=3), lease=lease_offsets)
    def start(self, ids: List[int], claims: int, lease: int) -> None:
        for update_id in ids:
            self.do_add(update_id, BODIES[update_id % len(BODIES)], self.now)
        for update_id in ids[:claims]:
            self.do_claim_owned(update_id, self._claim_args(lease, 2, update_id % 2 == 0))

    # -- base -----------------------------------------------------------------------------------
    @rule(t=targets, body=st.sampled_from(BODIES), received=st.sampled_from([-2, 0, 1]))
    def add(self, t: int, body: str, received: int) -> None:
        """Add an id of the pool; for ``t % 4 == 0`` one that was pruned (recorded again)."""
        forgotten = sorted(self.pruned - set(self.model.rows))
        update_id = UPDATE_IDS[(t >> 2) % len(UPDATE_IDS)]
        if forgotten and t % 4 == 0:
            update_id = forgotten[(t >> 2) % len(forgotten)]
        self.do_add(update_id, body, self.now + received)

    def do_add(self, update_id: int, body: str, at: int) -> None:
        op = f"add({update_id}, {body!r}, {self.show(at)})"
        self.agree(op, self.call(op, self.store.add(update_id, body, at)),
                   self.model.add(update_id, body, at))

    @rule(rows=st.lists(st.tuples(update_ids, st.sampled_from(BODIES),
                                  st.sampled_from([-2, 0, 1])), max_size=4))
    def add_many(self, rows: List[Tuple[int, str, int]]) -> None:
        batch = [(u, body, self.now + off) for u, body, off in rows]
        op = f"add_many({[(u, b, self.show(at)) for u, b, at in batch]})"
        self.agree(op, self.call(op, self.store.add_many(batch)), self.model.add_many(batch))

    def _claim_args(self, lease: int, max_attempts: int, durable: bool) -> Dict[str, Any]:
        return dict(now=self.now, lease_until=self.now + lease, max_attempts=max_attempts,
                    durable_exhaustion=durable)

    def _show_kwargs(self, kwargs: Dict[str, Any]) -> str:
        return ", ".join(f"{k}={self.show(v)}" for k, v in kwargs.items())

    @rule(t=targets, lease=lease_offsets, max_attempts=max_attempts, durable=st.booleans())
    def claim(self, t: int, lease: int, max_attempts: int, durable: bool) -> None:
        update_id = self.target(t, self.claimable)
        kwargs = self._claim_args(lease, max_attempts, durable)
        op = f"claim({update_id}, {self._show_kwargs(kwargs)})"
        got = self.call(op, self.store.claim(update_id, **kwargs))
        self.agree(op, got, self.model.claim(update_id, **kwargs))

    @rule(t=targets, lease=lease_offsets, max_attempts=max_attempts, durable=st.booleans())
    def claim_owned(self, t: int, lease: int, max_attempts: int, durable: bool) -> None:
        self.do_claim_owned(self.target(t, self.claimable),
                            self._claim_args(lease, max_attempts, durable))

    def do_claim_owned(self, update_id: int, kwargs: Dict[str, Any]) -> Optional[AttemptIdentity]:
        op = f"claim_owned({update_id}, {self._show_kwargs(kwargs)})"
        got = self.store.claim_owned(update_id, **kwargs)
        want = self.model.claim_owned(update_id, **kwargs)
        if got is not None and want is not None:
            assert (type(got) is AttemptIdentity and type(got.update_id) is int
                    and type(got.attempt) is int), self.fail(f"{op}: returned {got!r}")
            self.agree(op, (got.update_id, got.attempt), want[:2])
            self.bind(want[2], got.claim_id, op)
            self.remember(got)
        self.call(op, got)
        self.agree(op, None if got is None else "an identity",
                   None if want is None else "an identity")
        return got  # type: ignore[no-any-return]

    @rule(t=targets, lease=lease_offsets, max_attempts=max_attempts, durable=st.booleans(),
          outcome=st.sampled_from(["completed", "failed", "abandoned", "exhaust", "crash"]),
          retry=st.sampled_from([-1, 0, 1, 5, 20]))
    def handle(self, t: int, lease: int, max_attempts: int, durable: bool, outcome: str,
               retry: int) -> None:
        """One whole attempt, as the runtime makes it: claim_owned, then its result at now."""
        kwargs = self._claim_args(lease, max_attempts, durable)
        identity = self.do_claim_owned(self.target(t, self.claimable), kwargs)
        if identity is None or outcome == "crash":  # crash: the lease is left to lapse
            return
        if outcome == "exhaust":
            self.do_exhaust(identity, ERRORS[t % len(ERRORS)])
        else:
            self.do_settle_owned(identity, (outcome, retry, ERRORS[t % len(ERRORS)]))

    @rule(t=targets, delta=attempt_deltas, lease=renew_offsets, with_now=st.booleans())
    def renew(self, t: int, delta: int, lease: int, with_now: bool) -> None:
        update_id = self.target(t, self.processing)
        attempt, now, lease_until = self.attempt_of(update_id, delta), None, self.now + lease
        if with_now:
            now = self.now
        op = f"renew({update_id}, {attempt}, {self.show(lease_until)}, now={self.show(now)})"
        self.agree(op, self.call(op, self.store.renew(update_id, attempt, lease_until, now)),
                   self.model.renew(update_id, attempt, lease_until, now))

    @rule(leases=st.lists(st.tuples(targets, attempt_deltas), max_size=4), lease=renew_offsets)
    def renew_many(self, leases: List[Tuple[int, int]], lease: int) -> None:
        pairs = [(u, self.attempt_of(u, d)) for u, d in
                 ((self.target(t, self.processing), d) for t, d in leases)]
        lease_until = self.now + lease
        op = f"renew_many({pairs}, {self.show(lease_until)}, now={self.show(self.now)})"
        self.agree(op, self.call(op, self.store.renew_many(pairs, lease_until, self.now)),
                   self.model.renew_many(pairs, lease_until, self.now))

    @rule(t=targets, delta=attempt_deltas, settlement=settlements)
    def settle(self, t: int, delta: int, settlement: Tuple[str, int, Any]) -> None:
        update_id = self.target(t, self.processing)
        attempt = self.attempt_of(update_id, delta)
        value, args = self.settlement(settlement)
        self.call(f"settle({update_id}, {attempt}, {self.show(value)})",
                  self.store.settle(update_id, attempt, value))
        self.model.settle(update_id, attempt, *args)

    @rule(grace=st.sampled_from([0, 1, 2, 5]), exact=st.one_of(st.none(), targets),
          limit=st.integers(min_value=0, max_value=7))
    def due(self, grace: int, exact: Optional[int], limit: int) -> None:
        pending_before = self.now - grace
        rows = sorted(self.model.rows.items())
        if exact is not None and rows:  # exactly a row's received_at
            pending_before = int(rows[exact % len(rows)][1]["received_at"])
        kwargs = dict(now=self.now, pending_before=pending_before, limit=limit)
        op = f"due({self._show_kwargs(kwargs)})"
        got = self.call(op, self.store.due(**kwargs))
        assert all(type(s) is StoredUpdate and type(s.update_id) is int for s in got), self.fail(
            f"{op}: {got!r}")
        self.agree(op, [(s.update_id, s.body) for s in got], self.model.due(**kwargs))

    @rule(t=targets, offset=st.sampled_from([-1, 0, 0, 1, 2]))
    def prune(self, t: int, offset: int) -> None:
        """prune at a settled row's settled_at + offset (the strict bound), or at now + offset."""
        before = self.now + offset
        settled = [int(r["settled_at"]) for _, r in sorted(self.model.rows.items())
                   if r["settled_at"] is not None]
        if settled and t % 4 != 3:
            before = settled[(t >> 2) % len(settled)] + offset
        self.do_prune(before)

    def do_prune(self, before: int) -> None:
        op = f"prune({self.show(before)})"
        rows = set(self.model.rows)
        self.agree(op, self.call(op, self.store.prune(before)), self.model.prune(before))
        self.pruned |= rows - set(self.model.rows)

    @rule(t=targets, lease=lease_offsets, how=forgeries)
    def recycle(self, t: int, lease: int, how: str) -> None:
        """In one step: prune a settled row, record its id again, claim it (attempt 1 again), then
        try an identity from the id's previous life (a fence never adopts a later claim)."""
        settled = [(u, int(r["settled_at"])) for u, r in sorted(self.model.rows.items())
                   if r["settled_at"] is not None]
        if not settled:
            return
        update_id, settled_at = settled[t % len(settled)]
        old = [i for i in self.seen if i.update_id == update_id]
        self.do_prune(settled_at + 1)
        self.do_add(update_id, BODIES[t % len(BODIES)], self.now)
        if self.do_claim_owned(update_id, self._claim_args(lease, 2, t % 2 == 0)) and old:
            stale = old[-1]
            if how == "attempt+1":  # the old claim id with the new attempt number
                stale = AttemptIdentity(update_id, 1, stale.claim_id)
            op = f"owns({self.show(stale)}, {self.show(self.now)}) [from before the prune]"
            self.agree(op, self.call(op, self.store.owns(stale, self.now)),
                       self.model.owns(self.model_identity(stale), self.now))

    # -- fenced ---------------------------------------------------------------------------------
    @rule(pick=picks, how=forgeries, lease=renew_offsets, with_now=st.booleans())
    def renew_owned(self, pick: int, how: str, lease: int, with_now: bool) -> None:
        ident, now, lease_until = self.pick(pick, how), None, self.now + lease
        if with_now:
            now = self.now
        op = f"renew_owned({self.show(ident)}, {self.show(lease_until)}, now={self.show(now)})"
        self.agree(op, self.call(op, self.store.renew_owned(ident, lease_until, now)),
                   self.model.renew_owned(self.model_identity(ident), lease_until, now))

    @rule(picked=st.lists(st.tuples(picks, forgeries), max_size=4), lease=renew_offsets)
    def renew_owned_many(self, picked: List[Tuple[int, str]], lease: int) -> None:
        idents = [self.pick(pick, how) for pick, how in picked]
        lease_until = self.now + lease
        op = (f"renew_owned_many({self.show(idents)}, {self.show(lease_until)}, "
              f"now={self.show(self.now)})")
        self.agree(op, self.call(op, self.store.renew_owned_many(idents, lease_until, self.now)),
                   self.model.renew_owned_many([self.model_identity(i) for i in idents],
                                               lease_until, self.now))

    @rule(picked=st.lists(st.tuples(picks, forgeries), max_size=3))
    def release_many(self, picked: List[Tuple[int, str]]) -> None:
        """Give claims back (attempt not spent; listed by due at once)."""
        idents = [self.pick(pick, how) for pick, how in picked]
        op = f"release_many({self.show(idents)}, at={self.show(self.now)})"
        self.agree(op, self.call(op, self.store.release_many(idents, at=self.now)),
                   self.model.release_many([self.model_identity(i) for i in idents], self.now))

    @rule(pick=picks, how=forgeries, offset=st.sampled_from([-1, 0, 0, 1]))
    def owns(self, pick: int, how: str, offset: int) -> None:
        ident, at = self.pick(pick, how), self.now + offset
        op = f"owns({self.show(ident)}, {self.show(at)})"
        self.agree(op, self.call(op, self.store.owns(ident, at)),
                   self.model.owns(self.model_identity(ident), at))

    @rule(pick=picks, how=forgeries, settlement=settlements)
    def settle_owned(self, pick: int, how: str, settlement: Tuple[str, int, Any]) -> None:
        self.do_settle_owned(self.pick(pick, how), settlement)

    def do_settle_owned(self, ident: AttemptIdentity, settlement: Tuple[str, int, Any]) -> None:
        value, args = self.settlement(settlement)
        op = f"settle_owned({self.show(ident)}, {self.show(value)})"
        self.agree(op, self.call(op, self.store.settle_owned(ident, value)),
                   self.model.settle_owned(self.model_identity(ident), *args))

    @rule(pick=picks, how=forgeries, settlement=st.one_of(st.none(), settlements),
          cursor=st.booleans(), rollback=st.booleans())
    def in_transaction(self, pick: int, how: str, settlement: Optional[Tuple[str, int, Any]],
                       cursor: bool, rollback: bool) -> None:
        """As ``Attempt.transaction(complete=...)``: owns and settle_owned on the caller's
        connection (or a cursor of it), inside ``store.transaction()``; commit or roll back."""
        ident = self.pick(pick, how)
        rollback = rollback and self.rolls_back
        model = copy.deepcopy(self.model) if rollback else self.model
        text = f"with transaction() as conn{' (cursor)' if cursor else ''}:"
        try:
            with self.store.transaction() as conn:
                on = conn.cursor() if cursor and conn is not None else conn
                op = f"{text} owns({self.show(ident)}, {self.show(self.now)}, connection=...)"
                self.agree(op, self.call(op, self.store.owns(ident, self.now, connection=on)),
                           model.owns(self.model_identity(ident), self.now))
                if settlement is not None:
                    value, args = self.settlement(settlement)
                    op = (f"{text} settle_owned({self.show(ident)}, {self.show(value)}, "
                          "connection=...)")
                    self.agree(op, self.call(op, self.store.settle_owned(ident, value,
                                                                         connection=on)),
                               model.settle_owned(self.model_identity(ident), *args))
                if rollback:
                    raise _Rollback
        except _Rollback:
            self.trace.append(f"{text} ... raised: rolled back")

    # -- durable --------------------------------------------------------------------------------
    @rule(pick=picks, how=forgeries, error=st.sampled_from(ERRORS))
    def exhaust(self, pick: int, how: str, error: str) -> None:
        self.do_exhaust(self.pick(pick, how), error)

    def do_exhaust(self, ident: AttemptIdentity, error: str) -> None:
        op = f"exhaust({self.show(ident)}, at={self.show(self.now)}, error={error!r})"
        self.agree(op, self.call(op, self.store.exhaust(ident, at=self.now, error=error)),
                   self.model.exhaust(self.model_identity(ident), at=self.now, error=error))

    @rule(limit=st.integers(min_value=0, max_value=7), cursor=st.one_of(st.none(), targets),
          deliver=st.one_of(st.none(), forgeries))
    def due_exhaustions(self, limit: int, cursor: Optional[int], deliver: Optional[str]) -> None:
        """A page after a cursor: mostly an exhausted row's own id (as a sweep pages), or any.
        With ``deliver``, the page's first exhaustion is then acknowledged (as a sweep does after
        ``handle_exhaustion``) with its identity passed back as ``deliver`` says."""
        after = cursor
        if cursor is not None:
            pages = [u for u, r in sorted(self.model.rows.items()) if self.exhausted(r)]
            after = (pages[(cursor >> 2) % len(pages)] if pages and cursor % 4 != 3
                     else ([-1] + UPDATE_IDS)[(cursor >> 2) % (len(UPDATE_IDS) + 1)])
        op = f"due_exhaustions(limit={limit}, after_update_id={after})"
        got = self.store.due_exhaustions(limit=limit, after_update_id=after)
        self.compare_exhaustions(op, got, self.model.due_exhaustions(limit=limit,
                                                                     after_update_id=after))
        self.call(op, got)
        if deliver is not None and got:
            self.do_acknowledge(self.forge(got[0].identity, deliver, self.seen[0]), self.now)

    @rule(pick=picks, how=forgeries, offset=st.sampled_from([0, 0, 1]))
    def acknowledge_exhaustion(self, pick: int, how: str, offset: int) -> None:
        self.do_acknowledge(self.pick(pick, how, self.exhausted), self.now + offset)

    def do_acknowledge(self, ident: AttemptIdentity, at: int) -> None:
        op = f"acknowledge_exhaustion({self.show(ident)}, {self.show(at)})"
        self.agree(op, self.call(op, self.store.acknowledge_exhaustion(ident, at)),
                   self.model.acknowledge_exhaustion(self.model_identity(ident), at))

    def compare_exhaustions(self, op: str, got: List[Exhaustion],
                            want: List[Tuple[object, ...]]) -> None:
        assert all(type(e) is Exhaustion and type(e.update_id) is int and type(e.attempt) is int
                   and type(e.exhausted_at) is int for e in got), self.fail(f"{op}: {got!r}")
        self.agree(op, [(e.update_id, e.attempt, e.body, e.exhausted_at, e.error) for e in got],
                   [(u, a, body, at, err) for u, a, _claim, body, at, err in want])
        for e, w in zip(got, want):
            self.bind(w[2], e.claim_id, f"{op} [update {e.update_id}]")
            self.remember(e.identity)

    # -- after every step -------------------------------------------------------------------------
    @invariant()
    def due_matches(self) -> None:
        got = self.store.due(now=self.now, pending_before=self.now, limit=BIG)
        self.agree("due(now, pending_before=now) after the step",
                   [(s.update_id, s.body) for s in got],
                   self.model.due(now=self.now, pending_before=self.now, limit=BIG))

    @invariant()
    def exhaustions_match(self) -> None:
        self.compare_exhaustions("due_exhaustions() after the step",
                                 self.store.due_exhaustions(limit=BIG),
                                 self.model.due_exhaustions(limit=BIG))

    @invariant()
    def table_matches(self) -> None:
        if self.peek is None:
            return
        got = self.peek()
        want = self.model.snapshot()
        self.agree("table rows after the step (update_id, body, state, attempts, due_at, "
                   "received_at, settled_at, error)", [r[:8] for r in got], [w[:8] for w in want])
        for r, w in zip(got, want):
            self.bind(w[8], r[8], f"claim_id of table row {r[0]} after the step")


def machine_for(name: str, open_store: Callable[..., Any], *,
                base_claim_writes_claim_id: bool = True, rolls_back: bool = True) -> type:
    """A :class:`StoreMachine` subclass for one store kind."""
    return type(name, (StoreMachine,), {
        "open_store": staticmethod(open_store),
        "base_claim_writes_claim_id": base_claim_writes_claim_id,
        "rolls_back": rolls_back,
    })


def _memory(make: Callable[[], Any] = MemoryUpdateStore) -> Callable[..., Any]:
    def open_store() -> Any:
        store = make()
        return store, None, store.close
    return open_store


# -- the stores ---------------------------------------------------------------------------------
def _run(machine: type, conf: settings) -> None:
    run_state_machine_as_test(machine, settings=conf)  # type: ignore[no-untyped-call]


def _timed(name: str, machine: type, conf: settings) -> None:
    wall, cpu = time.monotonic(), time.process_time()
    _run(machine, conf)
    print(f"\n{name}: {conf.max_examples} examples x up to {STEPS} steps: "
          f"{time.monotonic() - wall:.1f} s wall, {time.process_time() - cpu:.1f} s CPU")


def test_memory_store_matches_model() -> None:
    _timed("memory", machine_for("MemoryMachine", _memory(), rolls_back=False),
           _settings(MEMORY_EXAMPLES))


def test_sqlite_store_matches_model() -> None:
    root = tempfile.mkdtemp(prefix="ptb_fence_model_")
    counter = iter(range(10**9))

    def open_store() -> Any:
        path = os.path.join(root, f"model_{next(counter)}.sqlite3")
        store = SQLiteUpdateStore(path)
        reader = sqlite3.connect(path)

        def peek() -> List[Tuple[Any, ...]]:
            return reader.execute(
                "SELECT update_id, body, state, attempts, due_at, received_at, settled_at, "
                "error, claim_id FROM telegram_updates ORDER BY update_id").fetchall()

        def cleanup() -> None:
            reader.close()
            store.close()
            for suffix in ("", "-wal", "-shm"):
                if os.path.exists(path + suffix):
                    os.remove(path + suffix)

        return store, peek, cleanup

    try:
        _timed("sqlite", machine_for("SQLiteMachine", open_store), _settings(SQLITE_EXAMPLES))
    finally:
        shutil.rmtree(root, ignore_errors=True)


# PostgreSQL: the same skip/require rule as the pg_dsn fixture in conftest.py.
def _postgres_dsn() -> str:
    dsn = os.environ.get("PTB_FENCE_POSTGRES_DSN", "postgresql://postgres@127.0.0.1:5432/test")
    try:
        import psycopg2

        psycopg2.connect(dsn, connect_timeout=3).close()
    except Exception as exc:
        problem = (f"PostgreSQL not reachable at PTB_FENCE_POSTGRES_DSN: "
                   f"{type(exc).__name__}: {exc}")
        if os.environ.get("PTB_FENCE_REQUIRE_POSTGRES") == "1":
            pytest.fail(f"{problem} (required by PTB_FENCE_REQUIRE_POSTGRES=1)")
        pytest.skip(f"{problem}; set PTB_FENCE_POSTGRES_DSN to run PostgreSQL tests")
    return dsn


def test_postgres_store_matches_model() -> None:
    import psycopg2

    dsn = _postgres_dsn()
    table = "t_model_" + uuid.uuid4().hex[:12]
    admin = psycopg2.connect(dsn)
    admin.autocommit = True
    try:
        with PostgresUpdateStore(dsn, table=table) as store:  # create the table once
            store.due(now=0, pending_before=0, limit=1)

        def open_store() -> Any:
            with admin.cursor() as cur:
                cur.execute(f'TRUNCATE "{table}"')
            store = PostgresUpdateStore(dsn, table=table, pool_size=2)

            def peek() -> List[Tuple[Any, ...]]:
                with admin.cursor() as cur:
                    cur.execute(
                        "SELECT update_id, body, state, attempts, due_at, received_at, "
                        f'settled_at, error, claim_id FROM "{table}" ORDER BY update_id')
                    return list(cur.fetchall())

            return store, peek, store.close

        _timed("postgres", machine_for("PostgresMachine", open_store,
                                       base_claim_writes_claim_id=False),
               _settings(POSTGRES_EXAMPLES))
    finally:
        with admin.cursor() as cur:
            cur.execute(f'DROP TABLE IF EXISTS "{table}" CASCADE')
            cur.execute(f'DROP TABLE IF EXISTS "{table}_outbox"')
        admin.close()


# -- the machine bites --------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("variant", "disagreement"),
    [(v.__name__, getattr(v, "DISAGREEMENT")) for v in broken_variants.VARIANTS],
)
def test_machine_finds_broken_store(variant: str, disagreement: str) -> None:
    make = getattr(broken_variants, variant)
    machine = machine_for(f"{variant}Machine", _memory(make), rolls_back=False)
    conf = _settings(1000, phases=[Phase.generate], derandomize=True)
    with pytest.raises(AssertionError, match=disagreement):
        _run(machine, conf)
