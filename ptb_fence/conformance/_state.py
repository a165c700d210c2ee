"""Persisted bot state.

Each piece of state is a versioned row.
A write lands only on the version its writer read, and leaves it one higher.
So two writers from one version never both land.
An attempt's writes ride in the commit that completes it, all or none.
A moved version stops only that attempt's completion, never the others of the call.
That attempt stays claimed, told apart from a lost claim.
The rules run only for a store with every method of :class:`~ptb_fence.StateStore`.
"""

from __future__ import annotations

import threading
from typing import Any, Dict, List, Optional, Sequence, Tuple, cast

from ptb_fence._errors import StateConflictError
from ptb_fence._values import (
    AttemptEffects,
    AttemptIdentity,
    Completed,
    Failed,
    OutboxCall,
    Settlement,
    StateConflict,
    StateEntry,
    StateKey,
    StateWrite,
)
from ptb_fence.contract import OUTBOX_METHODS, STATE_METHODS, Batch, ClaimTerms
from ptb_fence.conformance._probe import (
    JOIN_TIMEOUT,
    L,
    T,
    THREADS,
    Abort,
    Probe,
    StoreRaised,
    claimed_identity,
    has_method,
    other_claim_id,
)
from ptb_fence.conformance._rule import rule

USER = StateKey("user", "", "42")
CHAT = StateKey("chat", "", "-100")
CONVERSATION = StateKey("conversation", "booking", "[-100, 42]")
BOT = StateKey("bot")


class _Rollback(Exception):
    """Raised inside ``transaction()`` by the check to see the writes made in it vanish."""


def _has_state(p: Probe) -> bool:
    return all(has_method(p.store, m) for m in STATE_METHODS + OUTBOX_METHODS)


def _read(p: Probe, keys: Sequence[StateKey]) -> Dict[StateKey, StateEntry]:
    value = p.call("read_state", list(keys))
    ok = isinstance(value, dict) and all(
        isinstance(k, StateKey) and isinstance(v, StateEntry) for k, v in value.items()
    )
    if not p.check_type("read_state", ok, "a dict of StateKey to StateEntry", value):
        raise Abort
    return cast(Dict[StateKey, StateEntry], value)


def _version(p: Probe, key: StateKey) -> Tuple[Optional[str], int]:
    entry = _read(p, [key]).get(key)
    return (None, 0) if entry is None else (entry.value, entry.version)


def _landings(p: Probe, method: str, value: object, count: int) -> List[object]:
    """Check a settle's per-item results: ``True``, ``False`` or a :class:`StateConflict`."""
    ok = isinstance(value, list) and len(value) == count and all(
        type(v) is bool or isinstance(v, StateConflict) for v in value
    )
    if not p.check_type(method, ok, f"a list of {count} results (True, False or "
                        "StateConflict), one per input", value):
        raise Abort
    return cast(List[object], value)


def _conflict_on(value: object, *keys: StateKey) -> bool:
    return isinstance(value, StateConflict) and not value and set(value.keys) == set(keys)


@rule(
    "state-versions",
    "fenced",
    "read_state reads several keys at once; write_state lands all or none, each write only on "
    "the version its writer read (0: no row), leaving it one higher; a deleted state keeps "
    "its version; list_state pages in key order; prune keeps state, except the callback-data "
    "keyboards written before its bound.",
    applies="only with the state methods",
)
def rule_state_versions(p: Probe, fenced: bool, durable: bool) -> None:
    """Nothing is stored at first: ``read_state`` of three keys gives an empty dict.

    Writing ``USER`` and ``CHAT`` from version 0 lands.
    Both are then at version 1, with the text kept exactly, a non-ASCII one too.
    Take a batch of a good write (``CHAT`` at 1) and a stale one (``USER`` at 0).
    It returns the conflict naming ``USER`` only and applies neither write.
    ``USER`` at 1 with :obj:`None` deletes the state.
    It reads back as value :obj:`None` at version 2.
    A write from 0 on it now conflicts.
    A write from 2 lands, at version 3.
    ``list_state`` lists by ``(kind, name, key)``.
    It filters by kind and name, pages after a key and honours ``limit``.
    ``prune`` deletes no state but the callback-data keyboards (kind ``callback``).
    It deletes those written before its bound.
    """
    if not _has_state(p):
        return
    p.require(_read(p, [USER, CHAT, BOT]) == {}, "read_state of a fresh store found state")
    text = '{"name": "Zoë", "n": 1}'
    landed = p.call("write_state", [StateWrite(USER, text, 0), StateWrite(CHAT, "c1", 0)], T)
    p.require(landed is None, f"write_state of two new keys from version 0 returned {landed!r}; "
              "expected None (all landed)")
    got = _read(p, [USER, CHAT, BOT])
    p.expect(got == {USER: StateEntry(text, 1), CHAT: StateEntry("c1", 1)},
             f"read_state after writing two keys returned {got}; expected both at version 1 with "
             "the exact text, and no row for the key never written")
    stale = p.call("write_state", [StateWrite(CHAT, "c2", 1), StateWrite(USER, "lost", 0)], T + 1)
    p.expect(_conflict_on(stale, USER), f"write_state with a stale version for {USER} returned "
             f"{stale!r}; expected a StateConflict naming exactly that key")
    p.expect(_version(p, CHAT) == ("c1", 1) and _version(p, USER) == (text, 1),
             "write_state applied part of a batch that had a stale write (all or none)")
    p.require(p.call("write_state", [StateWrite(USER, None, 1)], T + 2) is None,
              "write_state deleting a key at its version did not land")
    p.expect(_version(p, USER) == (None, 2), f"a deleted state reads {_version(p, USER)}; "
             "expected (None, 2): the row stays with its version")
    again = p.call("write_state", [StateWrite(USER, "new", 0)], T + 3)
    p.expect(_conflict_on(again, USER), f"write_state from version 0 on a deleted state "
             f"returned {again!r}; the tombstone is at version 2, so it must conflict")
    p.expect(p.call("write_state", [StateWrite(USER, "new", 2)], T + 3) is None,
             "write_state at a tombstone's version did not land")
    p.require(p.call("write_state", [StateWrite(CONVERSATION, "3", 0), StateWrite(BOT, "b", 0)],
                     T + 4) is None, "write_state of two more new keys did not land")
    listed = p.call("list_state")
    want = sorted([BOT, CHAT, CONVERSATION, USER], key=lambda k: (k.kind, k.name, k.key))
    p.expect([k for k, _ in listed] == want, f"list_state listed {[k for k, _ in listed]}; "
             f"expected {want} (by kind, name, key)")
    p.expect(dict(listed).get(USER) == StateEntry("new", 3),
             f"list_state gives {USER} as {dict(listed).get(USER)}; expected ('new', 3)")
    chats = [k for k, _ in p.call("list_state", kind="chat")]
    p.expect(chats == [CHAT], f"list_state(kind='chat') listed {chats}")
    named = [k for k, _ in p.call("list_state", name="booking")]
    p.expect(named == [CONVERSATION], f"list_state(name='booking') listed {named}")
    page = [k for k, _ in p.call("list_state", after=want[0], limit=2)]
    p.expect(page == want[1:3], f"list_state(after={want[0]}, limit=2) listed {page}; "
             f"expected {want[1:3]}")
    keyboard = StateKey("callback", "", "0" * 32)
    p.require(p.call("write_state", [StateWrite(keyboard, "k", 0)], T + 5) is None,
              "write_state of a callback-data keyboard did not land")
    p.prune(T + 5)
    p.expect(_version(p, keyboard) == ("k", 1),
             "prune(before) deleted a callback-data keyboard written at before (it deletes "
             "those written earlier only)")
    p.prune(T + 10_000_000)
    p.expect(len(p.call("list_state")) == 4, "prune deleted persisted state (it deletes only "
             "callback-data keyboards)")
    p.expect(_read(p, [keyboard]) == {}, "prune kept a callback-data keyboard written before "
             "its bound (the keyboards are pruned with the updates' retain period)")


@rule(
    "state-effects",
    "fenced",
    "the state writes of a commit's effects land with each owned completion, all or none; a moved version returns a StateConflict, leaves that "
    "attempt claimed and stops none of the others; write_effects' writes land and vanish with "
    "the caller's transaction and raise StateConflictError on a moved version.",
    applies="only with the state and outbox methods",
)
def rule_state_effects(p: Probe, fenced: bool, durable: bool) -> None:
    """Five claims are settled in one ``commit``.

    A completes writing ``USER`` from 0 and ``CHAT`` from 0.
    It lands and both are at version 1.
    B completes writing ``CONVERSATION`` from 0 and ``USER`` from 0, with an outbox call.
    ``USER`` has moved, so B's result is a StateConflict naming ``USER``.
    B still owns its update.
    None of B's writes is written, nor its call.
    C is a wrong claim id writing ``BOT``. It gives ``False`` and writes nothing.
    D fails writing ``BOT``. The failure lands and nothing is written.
    E completes without writes and lands.
    B's completion then lands on a second call with fresh versions.
    A commit with a claimed record does the same for a conflicting and a landing completion.
    The rest needs ``transaction()``.
    ``write_effects`` writes land with the block's commit and vanish with its rollback.
    A moved version raises :exc:`~ptb_fence.StateConflictError`.
    Nothing of that call is written, even if the caller commits afterwards.
    """
    if not _has_state(p):
        return
    a, b, c_real, d, e = (claimed_identity(p, u, T + L) for u in (1, 2, 3, 4, 5))
    c = AttemptIdentity(c_real.update_id, c_real.attempt, other_claim_id(c_real.claim_id))
    call = OutboxCall("sendMessage", '{"text": "b"}', 7, 0)
    items: List[Tuple[AttemptIdentity, Settlement]] = [
        (a, Completed(T + 10)), (b, Completed(T + 10)), (c, Completed(T + 10)),
        (d, Failed(T + 10, T + 100, "x")), (e, Completed(T + 10)),
    ]
    effects = {
        a: AttemptEffects(state=(StateWrite(USER, "a", 0), StateWrite(CHAT, "a", 0))),
        b: AttemptEffects(calls=(call,), state=(StateWrite(CONVERSATION, "b", 0),
                                                 StateWrite(USER, "b", 0))),
        c: AttemptEffects(state=(StateWrite(BOT, "c", 0),)),
        d: AttemptEffects(state=(StateWrite(BOT, "d", 0),)),
    }
    got = _landings(p, "commit", p.settle_batch(Batch(settlements=tuple(items), effects=effects)),
                    5)
    p.expect(got[0] is True and got[3] is True and got[4] is True,
             f"commit landed {got}; the completion writing fresh state, the "
             "failure and the completion without writes must land (True)")
    p.expect(_conflict_on(got[1], USER), f"commit landed {got[1]!r} for a "
             f"completion whose write of {USER} was from a version that had moved; expected a "
             "StateConflict naming exactly that key")
    p.expect(got[2] is False, f"commit landed {got[2]!r} for a wrong claim id; "
             "expected False")
    state = _read(p, [USER, CHAT, CONVERSATION, BOT])
    p.expect(state == {USER: StateEntry("a", 1), CHAT: StateEntry("a", 1)},
             f"after the grouped settle the state is {state}; expected only the landed "
             "completion's writes (user and chat at version 1): a conflicting completion "
             "writes none of its writes, a refused settle and a failure write none")
    p.expect(p.owns(b, T + 11), "a completion stopped by a StateConflict no longer owns its "
             "update: it must stay claimed by the attempt (retried at once, not lost)")
    p.expect(not p.owns(a, T + 11), "a completion that landed still owns its update")
    calls = p.call("list_calls", limit=100)
    p.expect(calls == [], f"a completion stopped by a StateConflict wrote its outbox calls "
             f"{calls}")
    again = _landings(p, "commit", p.settle_batch(Batch(
        settlements=((b, Completed(T + 12)),),
        effects={b: AttemptEffects(calls=(call,), state=(StateWrite(CONVERSATION, "b", 0),
                                                          StateWrite(USER, "b", 1)))})), 1)
    p.expect(again == [True], f"the retried completion with fresh versions returned {again}")
    p.expect(_version(p, USER) == ("b", 2) and _version(p, CONVERSATION) == ("b", 1),
             "the retried completion's writes did not land as written")
    p.expect(len(p.call("list_calls", limit=100)) == 1, "the retried completion's call is "
             "not written once")

    # The combined write. The conflicting completion stays claimed and the other lands.
    f, g = claimed_identity(p, 6, T + L), claimed_identity(p, 7, T + L)
    value = p.settle_batch(Batch(
        ClaimTerms(T + 20, T + L, 5),
        claimed_records=((8, "s8", T + 20),),
        settlements=((f, Completed(T + 20)), (g, Completed(T + 20))),
        effects={f: AttemptEffects(state=(StateWrite(CHAT, "f", 0),)),
                 g: AttemptEffects(state=(StateWrite(CHAT, "g", 1),))},
    ))
    landed = _landings(p, "commit", value, 2)
    p.expect(_conflict_on(landed[0], CHAT) and landed[1] is True,
             f"commit with a claimed record landed {landed}; expected a StateConflict on "
             f"{CHAT} for the stale completion and True for the fresh one")
    p.expect(_version(p, CHAT) == ("g", 2), f"commit with a claimed record left {CHAT} at "
             f"{_version(p, CHAT)}; expected ('g', 2)")
    p.expect(p.owns(f, T + 21), "commit with a claimed record settled a completion stopped by "
             "a StateConflict")

    if not has_method(p.store, "transaction"):
        return
    h = AttemptIdentity(9, 1, "attempt-of-the-transaction")
    write = AttemptEffects(state=(StateWrite(BOT, "h", 0),))
    try:
        with p.call("transaction") as conn:
            p.call("write_effects", h, write, T + 30, connection=conn)
            raise _Rollback("raised inside the block by the check")
    except _Rollback:
        pass
    p.expect(_version(p, BOT) == (None, 0), "write_effects' state write stayed although the "
             "caller's transaction rolled back")
    with p.call("transaction") as conn:
        p.call("write_effects", h, write, T + 30, connection=conn)
    p.expect(_version(p, BOT) == ("h", 1), f"write_effects' state write committed with the "
             f"caller's transaction reads {_version(p, BOT)}; expected ('h', 1)")
    raised: Optional[BaseException] = None
    with p.call("transaction") as conn:
        try:
            p.call("write_effects", h, AttemptEffects(state=(
                StateWrite(CONVERSATION, "h", 1), StateWrite(BOT, "stale", 0))), T + 31,
                connection=conn)
        except StoreRaised as exc:  # the wrong error is reported below
            raised = exc.error
    p.expect(isinstance(raised, StateConflictError)
             and set(raised.keys) == {BOT},
             f"write_effects with a stale version raised {raised!r}; expected "
             f"StateConflictError naming {BOT}")
    p.expect(_version(p, CONVERSATION) == ("b", 1) and _version(p, BOT) == ("h", 1),
             "write_effects that raised StateConflictError applied some of its writes (the "
             "caller's transaction then committed them): it must apply none")


@rule(
    "state-concurrent",
    "fenced",
    "8 threads completing attempts that change one key from the same version at once: "
    "exactly one lands per round, the others get a StateConflict and retry from fresh "
    "versions; no change is lost or applied twice.",
    applies="only with the state methods",
)
def rule_state_concurrent(p: Probe, fenced: bool, durable: bool) -> None:
    """8 threads hold 3 claimed updates each and run in rounds of two barriers.

    In a round every thread with an update left reads a counter.
    All threads wait at the first barrier.
    Then each such thread completes its current update.
    It writes counter + 1 at the version it read.
    The other threads do nothing meanwhile.
    All threads wait at the second barrier.
    All read one version, so exactly one completion lands per round.
    The others return a StateConflict and keep their claims for the next round.
    After 24 rounds every completion landed exactly once.
    The counter is then 24 at version 24.
    """
    if not _has_state(p):
        return
    counter = StateKey("bot", "", "counter")
    per = 3
    total = THREADS * per
    identities = [[claimed_identity(p, 100 + t * per + i, T + L) for i in range(per)]
                  for t in range(THREADS)]
    barrier = threading.Barrier(THREADS, timeout=JOIN_TIMEOUT)
    errors: List[BaseException] = []
    landed_per_round = [0] * total
    results: List[List[object]] = [[] for _ in range(THREADS)]
    lock = threading.Lock()

    def worker(index: int) -> None:
        try:
            left = list(identities[index])
            for round_ in range(total):
                read: Optional[Tuple[int, int]] = None
                if left:
                    entry = p.call("read_state", [counter]).get(counter)
                    read = (0, 0) if entry is None else (int(entry.value), entry.version)
                barrier.wait()
                if left and read is not None:
                    identity = left[0]
                    got = p.call("commit", Batch(
                        settlements=((identity, Completed(T + 1)),), effects={
                            identity: AttemptEffects(state=(StateWrite(counter, str(read[0] + 1),
                                                                       read[1]),))})).landed[0]
                    if not isinstance(got, StateConflict):
                        results[index].append(got)
                        left.pop(0)
                        with lock:
                            landed_per_round[round_] += 1
                barrier.wait()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=worker, args=(i,), daemon=True,
                                name=f"ptb-fence-check-state-{i}") for i in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(JOIN_TIMEOUT * 4)
    if any(thread.is_alive() for thread in threads):
        p.fail(f"{THREADS} concurrent completions with state did not finish within "
               f"{JOIN_TIMEOUT * 4:.0f} s")
        return
    for error in errors:
        if not isinstance(error, threading.BrokenBarrierError):
            raise error
    flat: List[Any] = [r for rs in results for r in rs]
    p.expect(flat == [True] * total, f"{total} completions ended {flat}; each must land "
             "(True) once, after its conflicts")
    many = [n for n in landed_per_round if n > 1]
    p.expect(not many, f"rounds of {THREADS} completions writing one key from one version "
             f"landed {landed_per_round}; at most one may land per round (the others must "
             "return a StateConflict)")
    got = _version(p, counter)
    p.expect(got == (str(total), total),
             f"{total} read-modify-write completions left the counter at {got}; expected "
             f"({str(total)!r}, {total}): a change was lost or applied twice")
