"""The outbox.

The Bot API calls an attempt queued are written only with its landed completion.
They may also be written inside the attempt's own transaction, and its rollback undoes them.
A sender claims them when due, under a lease.
It claims one call per chat, in order.
Only the claiming sender records what became of them.
The rules run only for a store with every method of :class:`~ptb_fence.OutboxStore`.
"""

from __future__ import annotations

import threading
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple, cast

from ptb_fence._values import (
    AttemptEffects,
    CallClaim,
    AttemptIdentity,
    Completed,
    Failed,
    OutboxCall,
    OutboxEntry,
    Settlement,
)
from ptb_fence.contract import (
    CLAIMED_INSERT_METHODS,
    OUTBOX_METHODS,
    RECORD_AND_CLAIM_METHODS,
    Batch,
    ClaimTerms,
)
from ptb_fence.conformance._probe import (
    JOIN_TIMEOUT,
    L,
    T,
    THREADS,
    Abort,
    Probe,
    bool_list,
    has_method,
    other_claim_id,
    stamp,
)
from ptb_fence.conformance._rule import rule


class _Rollback(Exception):
    """Raised inside ``transaction()`` by the check to see the calls written in it vanish."""


def _has_outbox(p: Probe) -> bool:
    return all(has_method(p.store, method) for method in OUTBOX_METHODS)


def _call(method: str, chat_key: Optional[int], seq: int, at_most_once: bool = False) -> OutboxCall:
    return OutboxCall(method, '{"text": "%s %d"}' % (method, seq), chat_key, seq, at_most_once)


def _entries(p: Probe, method: str, value: object) -> List[OutboxEntry]:
    ok = isinstance(value, list) and all(isinstance(v, OutboxEntry) for v in value)
    if not p.check_type(method, ok, "a list of OutboxEntry", value):
        raise Abort
    return cast(List[OutboxEntry], value)


def _all(p: Probe) -> Dict[int, OutboxEntry]:
    """Every call in the store, by call id."""
    listed = _entries(p, "list_calls", p.call("list_calls", limit=10_000))
    return {entry.call_id: entry for entry in listed}


def _claim(p: Probe, now: int, sender: str, limit: int = 100, lease: int = 100) -> List[int]:
    """``claim_calls`` at ``now`` for ``sender``, with the lease ``now + lease``.

    Returns:
        The call ids.
    """
    got = _entries(p, "claim_calls", p.call(
        "claim_calls", now=now, lease_until=now + lease, limit=limit, sender=sender
    ))
    ids = [entry.call_id for entry in got]
    p.expect(ids == sorted(ids), f"claim_calls returned the calls {ids}: not lowest call_id "
             "first")
    for entry in got:
        p.expect(entry.state == "sending" and entry.due_at == now + lease,
                 f"claim_calls returned call {entry.call_id} as {entry.state!r} due at "
                 f"{stamp(entry.due_at)}; a claimed call is 'sending' until its lease end "
                 f"{stamp(now + lease)}")
    return ids


def _completed(
    p: Probe, update_id: int, calls: Sequence[OutboxCall], at: int
) -> AttemptIdentity:
    """Record ``update_id``, claim it and complete it at ``at`` with ``calls``.

    Returns:
        The identity.
    """
    p.require(p.add(update_id, f"o{update_id}", T), "add of a new update_id returned False")
    identity = p.claim_owned(update_id, now=T, lease_until=T + L)
    p.require(identity is not None, "claim_owned of a pending update returned None")
    assert identity is not None
    landed = bool_list(p, "commit", p.settle_batch(Batch(
        settlements=((identity, Completed(at=at)),),
        effects={identity: AttemptEffects(tuple(calls))},
    )), 1)
    p.require(landed == [True], f"commit of a live claim's completion with effects landed {landed}")
    return identity


@rule(
    "outbox-effects",
    "fenced",
    "the calls of a commit's effects are written with each completion that landed and no "
    "other settlement, and write_effects' calls land and "
    "vanish with the caller's transaction.",
    applies="only with the outbox methods",
)
def rule_outbox_effects(p: Probe, fenced: bool, durable: bool) -> None:
    """A live claim completed with two calls writes both.

    Each is ``pending`` with ``tries`` 0.
    Its ``due_at`` and ``created_at`` are the completion's ``at``.
    Each has the attempt's identity and the call's fields.
    They are in ``seq`` order, with increasing call ids.
    ``get_call`` returns the same entry.
    One ``commit`` then settles four identities with effects for five.
    Only the completion that lands writes calls.
    A completion with a wrong claim id writes none.
    Neither does one after its lease ended (``at`` past ``due_at``).
    Neither does a :class:`~ptb_fence.Failed` settlement.
    Neither does an identity that is not settled in the commit.
    A commit with a claimed record and two settlements writes the calls of its landed
    completion only.
    The rest needs ``transaction()``.
    ``write_effects(identity, effects, at, connection=conn)`` returns the new call ids.
    A block that raises leaves no call.
    A block that ends normally leaves them ``pending`` at ``at``.
    """
    if not _has_outbox(p):
        return
    a_calls = (_call("sendMessage", 7, 0), _call("sendPhoto", None, 1, at_most_once=True))
    a = _completed(p, 1, a_calls, T + 10)
    stored = sorted(_all(p).values(), key=lambda entry: entry.call_id)
    p.require(len(stored) == 2, f"a completion with 2 calls wrote {len(stored)} call(s)")
    for entry, call in zip(stored, a_calls):
        want = (a.update_id, a.attempt, a.claim_id, call.seq, call.chat_key, call.method,
                call.params_json, call.at_most_once, "pending", 0, T + 10, T + 10, None, None,
                None, False)
        got = (entry.update_id, entry.attempt, entry.claim_id, entry.seq, entry.chat_key,
               entry.method, entry.params_json, entry.at_most_once, entry.state, entry.tries,
               entry.due_at, entry.created_at, entry.sent_at, entry.error, entry.result_json,
               entry.acknowledged)
        p.expect(got == want, f"the call {call.seq} of a completion at {stamp(T + 10)} was "
                 f"stored as {got}; expected {want}")
        p.expect(p.call("get_call", entry.call_id) == entry,
                 f"get_call({entry.call_id}) differs from list_calls' entry")
    p.expect(p.call("get_call", max(e.call_id for e in stored) + 1000) is None,
             "get_call of an unknown call id did not return None")

    # Four settlements with effects. Only the live completion (update 5) lands its calls.
    identities = []
    for update_id in (2, 3, 4, 5):
        p.require(p.add(update_id, f"o{update_id}", T), "add of a new update_id returned False")
        identity = p.claim_owned(update_id, now=T, lease_until=T + 100)
        p.require(identity is not None, "claim_owned of a pending update returned None")
        identities.append(identity)
    two, three, four, five = cast(List[AttemptIdentity], identities)
    stranger = AttemptIdentity(6, 1, "never-claimed")
    wrong = AttemptIdentity(two.update_id, two.attempt, other_claim_id(two.claim_id))
    items: List[Tuple[AttemptIdentity, Settlement]] = [
        (wrong, Completed(at=T + 50)),  # not this claim
        (three, Completed(at=T + 101)),  # the lease ended at T+100
        (four, Failed(at=T + 50, retry_at=T + 500, error="x")),  # lands, but no completion
        (five, Completed(at=T + 100)),  # lands: the lease holds at its last millisecond
    ]
    effects = {
        identity: AttemptEffects((_call(f"m{identity.update_id}", None, 0),))
        for identity in (wrong, three, four, five, stranger)
    }
    landed = bool_list(p, "commit",
                       p.settle_batch(Batch(settlements=tuple(items), effects=effects)), 4)
    p.require(landed == [False, False, True, True], f"commit landed {landed} for a "
              "wrong claim id, a lapsed lease, a failure and a live completion; expected "
              "[False, False, True, True]")
    written = sorted(e.method for e in _all(p).values() if e.update_id != 1)
    p.expect(written == ["m5"], f"commit with effects wrote the calls {written}; only "
             "the landed completion's (m5) may be written: a settle that did not land, a "
             "failure and an identity not settled write none")

    # The combined write. Its landed completion writes and the refused one does not.
    p.require(p.add(7, "o7", T), "add of a new update_id returned False")
    seven = p.claim_owned(7, now=T, lease_until=T + L)
    p.require(seven is not None, "claim_owned of a pending update returned None")
    assert seven is not None
    late = AttemptIdentity(2, two.attempt, two.claim_id)  # its lease ended at T+100
    landed = bool_list(p, "commit", p.settle_batch(Batch(
        ClaimTerms(T + 200, T + L, 5),
        claimed_records=((8, "o8", T + 200),),
        settlements=((seven, Completed(at=T + 200)), (late, Completed(at=T + 200))),
        effects={seven: AttemptEffects((_call("m7", 3, 0),)),
                 late: AttemptEffects((_call("m2", 3, 0),))},
    )), 2)
    p.expect(landed == [True, False], f"commit with a claimed record settled {landed}; "
             "expected [True, False] (a live claim, a lapsed one)")
    written = sorted(e.method for e in _all(p).values() if e.update_id not in (1, 5))
    p.expect(written == ["m7"], f"commit with a claimed record and effects wrote the calls "
             f"{written}; expected only the landed completion's ['m7']")

    if not has_method(p.store, "transaction"):
        return
    before = set(_all(p))
    nine = AttemptIdentity(9, 1, "attempt-of-the-transaction")
    effects_nine = AttemptEffects((_call("t0", 4, 0), _call("t1", 4, 1)))
    try:
        with p.call("transaction") as conn:
            p.call("write_effects", nine, effects_nine, T + 300, connection=conn)
            raise _Rollback("raised inside the block by the check")
    except _Rollback:
        pass
    p.expect(set(_all(p)) == before, "write_effects' calls stayed although the caller's "
             "transaction rolled back (they must be written in it and never committed by the "
             "store)")
    with p.call("transaction") as conn:
        ids = p.call("write_effects", nine, effects_nine, T + 300, connection=conn)
    ok = isinstance(ids, list) and len(ids) == 2 and all(type(i) is int for i in ids)
    if not p.check_type("write_effects", ok, "a list of 2 int call ids", ids):
        return
    after = _all(p)
    p.expect(ids[0] < ids[1] and set(after) - before == set(ids),
             f"write_effects returned {ids}; the new calls are {sorted(set(after) - before)}")
    for call_id, call in zip(ids, effects_nine.calls):
        found = after.get(call_id)
        p.expect(found is not None and (found.method, found.state, found.due_at, found.update_id,
                                        found.claim_id) == (call.method, "pending", T + 300, 9,
                                                            nine.claim_id),
                 f"write_effects' call {call.method} committed as {found}; expected pending at "
                 f"{stamp(T + 300)} for the given identity")


@rule(
    "outbox-claim",
    "fenced",
    "claim_calls takes due pending calls (due_at <= now) and lapsed sending ones (due_at < "
    "now), one call per chat in call_id order; only the claiming sender records sent, retry, "
    "failure or release.",
    applies="only with the outbox methods",
)
def rule_outbox_claim(p: Probe, fenced: bool, durable: bool) -> None:
    """Calls A (chat 1), B (chat 1), C (no chat) and D (chat 2) are completed at T+100.

    Nothing is claimable at T+99.
    At T+100 (``due_at <= now``) A, C and D are claimable.
    B is not, because A holds chat 1.
    At T+200 none is, because leases until T+200 are held at T+200.
    At T+201 A, C and D are claimable again, lapsed (``due_at < now``), with ``tries`` 2.
    B is still held by A.
    ``record_sent`` by the first sender is refused.
    ``record_sent`` by the current sender lands with ``sent``, ``sent_at`` and the result.
    Then B is claimable.
    ``retry_call``, ``fail_call`` and ``release_calls`` by another sender are refused.
    B retried to T+1000 holds chat 1.
    A later call E of chat 1 (due at T+300) is not claimed at T+400.
    B is claimed at T+1000.
    B failed releases the chat, and E is claimed.
    E released is ``pending`` at the release time with ``tries - 1``.
    It is claimable at once.
    ``limit`` 1 takes the lowest claimable call.
    """
    if not _has_outbox(p):
        return
    _completed(p, 1, (_call("A", 1, 0), _call("B", 1, 1), _call("C", None, 2),
                      _call("D", 2, 3)), T + 100)
    ids = {e.method: e.call_id for e in _all(p).values()}
    A, B, C, D = ids["A"], ids["B"], ids["C"], ids["D"]
    got = _claim(p, T + 99, "s0")
    p.expect(got == [], f"claim_calls at {stamp(T + 99)} took {got}; the calls are due at "
             f"{stamp(T + 100)}")
    got = _claim(p, T + 100, "s1")
    p.require(got == [A, C, D], f"claim_calls at {stamp(T + 100)} took {got}; expected "
              f"{[A, C, D]} (A, C, D due at their due_at; B waits behind A in chat 1)")
    got = _claim(p, T + 200, "s1b")
    p.expect(got == [], f"claim_calls at {stamp(T + 200)} took {got}; the leases end at "
             f"{stamp(T + 200)} and are held at that millisecond (due_at >= now), and B waits "
             "behind A")
    got = _claim(p, T + 201, "s2")
    p.require(got == [A, C, D], f"claim_calls at {stamp(T + 201)} took {got}; expected the "
              f"lapsed {[A, C, D]} (due_at < now) and not B (A, sending, holds chat 1)")
    tries = _all(p)[A].tries
    p.expect(tries == 2, f"call A claimed twice has tries {tries}; expected 2")
    refused = bool_list(p, "record_sent",
                        p.call("record_sent", [(A, "s1", '{"ok": 1}', T + 202)]), 1)
    p.expect(refused == [False], "record_sent by a sender whose lease lapsed and was taken "
             "over landed; only the claiming sender's token may record")
    landed = bool_list(p, "record_sent", p.call("record_sent", [(A, "s2", '{"ok": 2}', T + 202),
                                                                 (B, "s2", "{}", T + 202)]), 2)
    p.require(landed == [True, False], f"record_sent by the claiming sender (A) and for a "
              f"pending call (B) returned {landed}; expected [True, False]")
    a = _all(p)[A]
    p.expect((a.state, a.sent_at, a.result_json) == ("sent", T + 202, '{"ok": 2}'),
             f"call A recorded sent is {a.state!r}, sent_at {a.sent_at}, result "
             f"{a.result_json!r}")
    got = _claim(p, T + 202, "s3")
    p.require(got == [B], f"claim_calls after A was sent took {got}; expected [B] (C and D are "
              "still under s2's lease)")
    for method, args, kwargs in (
        ("retry_call", (B, "s2"), {"due_at": T + 1000, "error": "x"}),
        ("fail_call", (B, "s2"), {"at": T + 203, "error": "x"}),
    ):
        p.expect(not p.real_bool(method, p.call(method, *args, **kwargs)),
                 f"{method} by a sender that does not hold the call landed")
    got_release = bool_list(p, "release_calls", p.call("release_calls", [B], "s2", T + 203), 1)
    p.expect(got_release == [False], "release_calls by a sender that does not hold the call "
             "landed")
    p.require(p.real_bool("retry_call", p.call("retry_call", B, "s3", due_at=T + 1000,
                                               error="retry later")),
              "retry_call by the claiming sender returned False")
    b = _all(p)[B]
    p.expect((b.state, b.due_at, b.error) == ("pending", T + 1000, "retry later"),
             f"call B retried is {b.state!r} due at {stamp(b.due_at)} ({b.error!r})")
    _completed(p, 2, (_call("E", 1, 0),), T + 300)
    E = max(_all(p))
    got = _claim(p, T + 400, "s4")
    p.expect(E not in got, f"claim_calls took call E of chat 1 while the earlier call B of the "
             f"chat is pending until {stamp(T + 1000)} (an earlier call due later holds its "
             "chat)")
    got = _claim(p, T + 1000, "s5")
    p.require(B in got and E not in got, f"claim_calls at {stamp(T + 1000)} took {got}; "
              f"expected B ({B}) and not E ({E})")
    p.require(p.real_bool("fail_call", p.call("fail_call", B, "s5", at=T + 1001, error="no")),
              "fail_call by the claiming sender returned False")
    b = _all(p)[B]
    p.expect((b.state, b.due_at, b.sent_at, b.acknowledged) == ("failed", T + 1001, None, False),
             f"call B failed is {b.state!r}, due_at {stamp(b.due_at)}, sent_at {b.sent_at}, "
             f"acknowledged {b.acknowledged}")
    got = _claim(p, T + 1002, "s6")
    p.require(E in got, f"claim_calls after B failed took {got}; a failed call releases its "
              f"chat: E ({E}) is next")
    released = bool_list(p, "release_calls", p.call("release_calls", [E], "s6", T + 1003), 1)
    p.require(released == [True], f"release_calls by the claiming sender returned {released}")
    e = _all(p)[E]
    p.expect((e.state, e.due_at, e.tries) == ("pending", T + 1003, 0),
             f"call E released is {e.state!r} due at {stamp(e.due_at)} with tries {e.tries}; "
             f"expected pending at {stamp(T + 1003)} with tries 0 (a release is not a try)")
    _completed(p, 3, (_call("F", None, 0), _call("G", None, 1)), T + 1003)
    got = _claim(p, T + 1003, "s7", limit=1)
    p.expect(got == [E], f"claim_calls with limit 1 took {got}; expected the lowest claimable "
             f"call [{E}]")


@rule(
    "outbox-operators",
    "fenced",
    "failed calls wait for their acknowledgement (due_send_failures, a cursor), operators "
    "retry or drop calls, outbox_counts counts every state, and prune drops the sent and "
    "acknowledged history before its bound.",
    applies="only with the outbox methods",
)
def rule_outbox_operators(p: Probe, fenced: bool, durable: bool) -> None:
    """Three calls fail.

    ``due_send_failures`` lists the unacknowledged ones by ``call_id``.
    It lists after a cursor and up to ``limit``.
    ``acknowledge_send_failure`` lands once.
    An acknowledged call is listed no more.
    ``outbox_counts`` has every key with the right counts.
    The keys are ``pending``, ``sending``, ``sent``, ``failed`` and ``failed_acknowledged``.
    ``retry_failed_call`` makes a failed call ``pending`` at its time.
    It is refused for a sent call.
    ``drop_call`` deletes a pending or failed call, never a ``sending`` or ``sent`` one.
    ``list_calls(state=)`` filters and ``after_call_id`` pages.
    ``prune(before)`` deletes a sent call with ``sent_at < before``.
    It deletes an acknowledged failed call with ``due_at < before``.
    It deletes neither at the bound.
    It never deletes a pending call or an unacknowledged failure.
    """
    if not _has_outbox(p):
        return
    _completed(p, 1, tuple(_call(f"c{i}", None, i) for i in range(6)), T)
    ids = sorted(_all(p))
    got = _claim(p, T, "s", lease=L)
    p.require(got == ids, f"claim_calls of six due calls without a chat took {got}")
    for call_id in ids[:3]:
        p.require(p.real_bool("fail_call", p.call("fail_call", call_id, "s", at=T + 10,
                                                  error="refused")),
                  "fail_call by the claiming sender returned False")
    p.require(bool_list(p, "record_sent", p.call("record_sent", [(ids[3], "s", "{}", T + 20)]),
                        1) == [True], "record_sent by the claiming sender did not land")
    listed = [e.call_id for e in _entries(p, "due_send_failures",
                                         p.call("due_send_failures", limit=10))]
    p.expect(listed == ids[:3], f"due_send_failures listed {listed}; expected {ids[:3]}")
    listed = [e.call_id for e in _entries(p, "due_send_failures", p.call(
        "due_send_failures", limit=1, after_call_id=ids[0]))]
    p.expect(listed == ids[1:2], f"due_send_failures(limit=1, after_call_id={ids[0]}) listed "
             f"{listed}; expected {ids[1:2]}")
    p.expect(p.real_bool("acknowledge_send_failure",
                         p.call("acknowledge_send_failure", ids[0], T + 30)),
             "acknowledge_send_failure of an unacknowledged failure returned False")
    p.expect(not p.real_bool("acknowledge_send_failure",
                             p.call("acknowledge_send_failure", ids[0], T + 31)),
             "acknowledge_send_failure of an acknowledged failure returned True")
    p.expect(not p.real_bool("acknowledge_send_failure",
                             p.call("acknowledge_send_failure", ids[3], T + 31)),
             "acknowledge_send_failure of a sent call returned True")
    listed = [e.call_id for e in _entries(p, "due_send_failures",
                                         p.call("due_send_failures", limit=10))]
    p.expect(listed == ids[1:3], f"due_send_failures after an acknowledgement listed {listed}")
    want = {"pending": 0, "sending": 2, "sent": 1, "failed": 2, "failed_acknowledged": 1}
    counts = p.call("outbox_counts")
    p.expect(counts == want, f"outbox_counts returned {counts}; expected {want}")
    p.expect(p.real_bool("retry_failed_call", p.call("retry_failed_call", ids[1], T + 40)),
             "retry_failed_call of a failed call returned False")
    p.expect(not p.real_bool("retry_failed_call", p.call("retry_failed_call", ids[3], T + 40)),
             "retry_failed_call of a sent call returned True")
    one = _all(p)[ids[1]]
    p.expect((one.state, one.due_at, one.acknowledged) == ("pending", T + 40, False),
             f"a failed call retried by an operator is {one.state!r} due at "
             f"{stamp(one.due_at)}")
    pending = [e.call_id for e in _entries(p, "list_calls",
                                          p.call("list_calls", state="pending"))]
    p.expect(pending == [ids[1]], f"list_calls(state='pending') listed {pending}")
    page = [e.call_id for e in _entries(p, "list_calls",
                                       p.call("list_calls", limit=2, after_call_id=ids[1]))]
    p.expect(page == ids[2:4], f"list_calls(limit=2, after_call_id={ids[1]}) listed {page}")
    for call_id, state in ((ids[4], "sending"), (ids[3], "sent")):
        p.expect(not p.real_bool("drop_call", p.call("drop_call", call_id)),
                 f"drop_call deleted a {state} call")
    p.expect(p.real_bool("drop_call", p.call("drop_call", ids[1])),
             "drop_call of a pending call returned False")
    p.expect(p.real_bool("drop_call", p.call("drop_call", ids[2])),
             "drop_call of a failed call returned False")
    p.expect(p.call("get_call", ids[2]) is None, "a dropped call is still stored")
    # The bound of prune is strict. A call was sent at T+20 and one acknowledged at T+30.
    p.prune(T + 20)
    p.expect(ids[3] in _all(p), f"prune({stamp(T + 20)}) deleted a call sent at that time")
    p.prune(T + 21)
    left = set(_all(p))
    p.expect(ids[3] not in left, f"prune({stamp(T + 21)}) kept a call sent at {stamp(T + 20)}")
    p.expect(ids[0] in left, f"prune({stamp(T + 21)}) deleted a failure acknowledged at "
             f"{stamp(T + 30)}")
    p.prune(T + 31)
    left = set(_all(p))
    p.expect(ids[0] not in left, f"prune({stamp(T + 31)}) kept a failure acknowledged at "
             f"{stamp(T + 30)}")
    p.expect({ids[4], ids[5]} <= left, "prune deleted a call still being sent")


@rule(
    "outbox-concurrent-claim",
    "fenced",
    "claim_calls from 8 threads at once never returns one call twice.",
    applies="only with the outbox methods",
)
def rule_outbox_concurrent_claim(p: Probe, fenced: bool, durable: bool) -> None:
    """60 calls are due: 40 without a chat and 20 over 5 chats.

    8 threads are released together.
    Each claims 3 calls at a time with its own sender token until a claim returns none.
    No call id is returned twice.
    Every call without a chat was claimed, and so was the first call of each chat.
    The later calls of a chat wait behind the first, which is never recorded sent.
    """
    if not _has_outbox(p):
        return
    calls = [_call(f"u{i}", None, i) for i in range(40)]
    calls += [_call(f"k{i}", i % 5, 40 + i) for i in range(20)]
    _completed(p, 1, calls, T)
    barrier = threading.Barrier(THREADS, timeout=JOIN_TIMEOUT)
    taken: List[List[int]] = [[] for _ in range(THREADS)]
    errors: List[BaseException] = []

    def worker(index: int) -> None:
        try:
            barrier.wait()
            for _ in range(100):
                got = p.call("claim_calls", now=T + 1, lease_until=T + L, limit=3,
                             sender=f"sender-{index}")
                if not got:
                    return
                taken[index] += [entry.call_id for entry in got]
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,), daemon=True,
                                name=f"ptb-fence-check-outbox-{i}") for i in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(JOIN_TIMEOUT)
    if any(thread.is_alive() for thread in threads):
        p.fail(f"{THREADS} concurrent claim_calls did not finish within {JOIN_TIMEOUT:.0f} s")
        return
    for error in errors:
        if not isinstance(error, threading.BrokenBarrierError):
            raise error
    flat = [call_id for ids in taken for call_id in ids]
    twice = sorted({call_id for call_id in flat if flat.count(call_id) > 1})
    p.expect(not twice, f"concurrent claim_calls returned the calls {twice} more than once")
    stored = _all(p)
    by_method = {entry.method: entry.call_id for entry in stored.values()}
    want: Set[int] = {by_method[f"u{i}"] for i in range(40)} | {by_method[f"k{i}"]
                                                                for i in range(5)}
    p.expect(set(flat) == want, f"concurrent claim_calls took {len(set(flat))} distinct calls; "
             f"expected the {len(want)} in turn (every call without a chat, the first of each "
             "chat)")
    senders: Dict[int, Any] = {}
    for index, ids in enumerate(taken):
        for call_id in ids:
            senders[call_id] = f"sender-{index}"
    wrong = [call_id for call_id, sender in senders.items()
             if not p.real_bool("record_sent", p.call("record_sent",
                                                      [(call_id, sender, "{}", T + 2)])[0])]
    p.expect(not wrong, f"record_sent by the sender that claimed the calls {wrong} did not land")


def _has_claimed_inserts(p: Probe) -> bool:
    return _has_outbox(p) and all(
        has_method(p.store, method) for method in CLAIMED_INSERT_METHODS
    )


def _claimed(p: Probe, sender: str) -> List[int]:
    """``claimed_calls(sender)``, checked to be by ``call_id``.

    Returns:
        The call ids.
    """
    got = _entries(p, "claimed_calls", p.call("claimed_calls", sender, limit=10_000))
    ids = [entry.call_id for entry in got]
    p.expect(ids == sorted(ids), f"claimed_calls returned the calls {ids}: not by call_id")
    return ids


def _completed_claimed(
    p: Probe, update_id: int, calls: Sequence[OutboxCall], at: int, claim: CallClaim
) -> None:
    """Record, claim and complete ``update_id`` at ``at`` with ``calls`` under ``claim``."""
    p.require(p.add(update_id, f"o{update_id}", T), "add of a new update_id returned False")
    identity = p.claim_owned(update_id, now=T, lease_until=T + L)
    p.require(identity is not None, "claim_owned of a pending update returned None")
    assert identity is not None
    landed = bool_list(p, "commit", p.settle_batch(Batch(
        settlements=((identity, Completed(at=at)),),
        effects={identity: AttemptEffects(tuple(calls), claim=claim)},
    )), 1)
    p.require(landed == [True], f"commit of a live claim's completion with effects landed {landed}")


@rule(
    "outbox-claimed-inserts",
    "fenced",
    "a completion's effects with a claim insert the first claim.limit calls sending by its "
    "sender when their chat has no unsent call, the others pending; claimed_calls reads them "
    "back; their lease, record and release work as claim_calls'.",
    applies="only with claimed_calls",
)
def rule_outbox_claimed_inserts(p: Probe, fenced: bool, durable: bool) -> None:
    """Update 1 completes at T+100 with calls under a claim.

    The calls are A (chat 1), B (chat 1), C (no chat), D (chat 2) and E (chat 3).
    The claim is for ``s1`` until T+500 with limit 4.
    A, C and D are ``sending`` by s1, with ``due_at`` T+500 and ``tries`` 1.
    B is ``pending``, because A holds chat 1.
    E is ``pending``, because it is beyond the limit.
    ``claimed_calls("s1")`` is [A, C, D].
    Another sender's is empty.
    ``claim_calls`` at T+100 takes only E.
    Update 2 then completes with F (chat 2) and G (chat 4) under s1's claim.
    F is ``pending``, because D holds chat 2.
    G is ``sending``.
    ``record_sent`` of A by s1 lands, and then B is claimable.
    ``release_calls`` of G by s1 makes it ``pending`` with ``tries`` 0.
    At T+501 ``claim_calls`` by s3 takes the lapsed C and D.
    """
    if not _has_claimed_inserts(p):
        return
    claim = CallClaim("s1", T + 500, 4)
    _completed_claimed(p, 1, (_call("A", 1, 0), _call("B", 1, 1), _call("C", None, 2),
                              _call("D", 2, 3), _call("E", 3, 4)), T + 100, claim)
    stored = _all(p)
    ids = {e.method: e.call_id for e in stored.values()}
    A, B, C, D, E = (ids[m] for m in "ABCDE")
    for name in "ACD":
        entry = stored[ids[name]]
        p.expect(entry.state == "sending" and entry.due_at == T + 500 and entry.tries == 1,
                 f"call {name}, in its chat's turn and within the claim's limit, was inserted "
                 f"{entry.state!r} due at {stamp(entry.due_at)} with tries {entry.tries}; "
                 f"expected 'sending' until the claim's lease {stamp(T + 500)}, tries 1")
    for name, why in (("B", "A, inserted before it, holds chat 1"),
                      ("E", "it is beyond the claim's limit 4")):
        entry = stored[ids[name]]
        p.expect(entry.state == "pending" and entry.tries == 0 and entry.due_at == T + 100,
                 f"call {name} was inserted {entry.state!r} (tries {entry.tries}); expected "
                 f"'pending' due at the completion's at ({why})")
    got = _claimed(p, "s1")
    p.expect(got == [A, C, D], f"claimed_calls('s1') returned {got}; expected {[A, C, D]}")
    got = _claimed(p, "s2")
    p.expect(got == [], f"claimed_calls('s2') returned {got}; s2 claimed nothing")
    got = _claim(p, T + 100, "s2", lease=400)
    p.expect(got == [E], f"claim_calls at {stamp(T + 100)} took {got}; expected only E (A, C "
             "and D are claimed under a live lease, B waits behind A)")
    _completed_claimed(p, 2, (_call("F", 2, 0), _call("G", 4, 1)), T + 150,
                       CallClaim("s1", T + 500, 2))
    stored = _all(p)
    ids = {e.method: e.call_id for e in stored.values()}
    F, G = ids["F"], ids["G"]
    p.expect(stored[F].state == "pending",
             f"call F of chat 2 was inserted {stored[F].state!r} while D of chat 2 is sending; "
             "a chat with an unsent call gets no claimed insert")
    p.expect(stored[G].state == "sending", f"call G of the idle chat 4 was inserted "
             f"{stored[G].state!r}; expected 'sending' under the claim")
    landed = bool_list(p, "record_sent", p.call("record_sent", [(A, "s1", "{}", T + 160)]), 1)
    p.expect(landed == [True], "record_sent of a call claimed at insert by its sender did not "
             "land")
    got = _claim(p, T + 170, "s2", lease=300)
    p.expect(got == [B], f"claim_calls at {stamp(T + 170)} took {got}; expected B (A sent "
             "released chat 1; F waits behind D)")
    released = bool_list(p, "release_calls", p.call("release_calls", [G], "s1", T + 180), 1)
    p.expect(released == [True], "release_calls of a call claimed at insert by its sender did "
             "not land")
    entry = _all(p)[G]
    p.expect(entry.state == "pending" and entry.tries == 0,
             f"call G released is {entry.state!r} with tries {entry.tries}; expected 'pending' "
             "with tries 0")
    got = [i for i in _claim(p, T + 501, "s3") if i in (C, D)]
    p.expect(got == [C, D], f"claim_calls at {stamp(T + 501)} took {got} of C and D; their "
             f"claim's lease ended at {stamp(T + 500)}, so both are claimable")


@rule(
    "outbox-concurrent-claimed-inserts",
    "fenced",
    "completions committing claimed calls of one chat from 8 threads at once leave exactly "
    "one of them sending.",
    applies="only with claimed_calls",
)
def rule_outbox_concurrent_claimed_inserts(p: Probe, fenced: bool, durable: bool) -> None:
    """8 updates are claimed and 8 threads are released together.

    Each thread completes its update with one call of chat 9 under its own sender's claim.
    Exactly one call of chat 9 is ``sending`` afterwards.
    The other seven are ``pending``.
    A chat never has two claimed calls.
    """
    if not _has_claimed_inserts(p):
        return
    identities = []
    for update_id in range(1, THREADS + 1):
        p.require(p.add(update_id, f"c{update_id}", T), "add of a new update_id returned False")
        identity = p.claim_owned(update_id, now=T, lease_until=T + L)
        p.require(identity is not None, "claim_owned of a pending update returned None")
        identities.append(identity)
    barrier = threading.Barrier(THREADS, timeout=JOIN_TIMEOUT)
    errors: List[BaseException] = []

    def worker(index: int) -> None:
        identity = cast(AttemptIdentity, identities[index])
        try:
            barrier.wait()
            p.call("commit", Batch(settlements=((identity, Completed(at=T + 1)),), effects={
                identity: AttemptEffects((_call(f"m{index}", 9, 0),),
                                         claim=CallClaim(f"sender-{index}", T + L, 1)),
            }))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,), daemon=True,
                                name=f"ptb-fence-check-claimed-{i}") for i in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(JOIN_TIMEOUT)
    if any(thread.is_alive() for thread in threads):
        p.fail(f"{THREADS} concurrent completions did not finish within {JOIN_TIMEOUT:.0f} s")
        return
    for error in errors:
        if not isinstance(error, threading.BrokenBarrierError):
            raise error
    states = sorted(entry.state for entry in _all(p).values())
    p.expect(states == ["pending"] * (THREADS - 1) + ["sending"],
             f"{THREADS} concurrent completions each inserting a claimed call of chat 9 left "
             f"the states {states}; expected one 'sending' and the rest 'pending'")


def _has_record_and_claim(p: Probe) -> bool:
    return _has_outbox(p) and all(
        has_method(p.store, method) for method in RECORD_AND_CLAIM_METHODS
    )


@rule(
    "outbox-record-and-claim",
    "fenced",
    "record_sent_and_claim records the results, then claims in the same commit: a chat's "
    "next call is claimed by the call that records its earlier one; a refused record still "
    "claims; limit 0 claims nothing.",
    applies="only with record_sent_and_claim",
)
def rule_outbox_record_and_claim(p: Probe, fenced: bool, durable: bool) -> None:
    """Update 1 completes at T+10 with A, B (chat 1) and C (chat 2).

    ``claim_calls`` by s1 takes A and C.
    ``record_sent_and_claim`` of A by s1 at T+20 with limit 5 lands.
    It claims B, which is in turn once A is sent.
    B is ``sending`` by s1 until the lease given, with ``tries`` 1.
    A is ``sent`` with its result.
    Then a record of C by s2, which is not its sender, is refused.
    Its claim, with limit 0, takes nothing.
    C is still ``sending`` by s1.
    """
    if not _has_record_and_claim(p):
        return
    _completed(p, 1, (_call("A", 1, 0), _call("B", 1, 1), _call("C", 2, 2)), T + 10)
    ids = {e.method: e.call_id for e in _all(p).values()}
    A, B, C = ids["A"], ids["B"], ids["C"]
    got = _claim(p, T + 10, "s1", lease=300)
    p.require(got == [A, C], f"claim_calls took {got}; expected A and C (B waits behind A)")
    value = p.call("record_sent_and_claim", [(A, "s1", '{"message_id": 5}', T + 20)],
                   now=T + 20, lease_until=T + 400, limit=5, sender="s1")
    ok = (isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], list)
          and isinstance(value[1], list))
    if not p.check_type("record_sent_and_claim", ok,
                        "a tuple (list of bool, list of OutboxEntry)", value):
        return
    landed = bool_list(p, "record_sent_and_claim", value[0], 1)
    claimed = _entries(p, "record_sent_and_claim", value[1])
    p.expect(landed == [True], f"record_sent_and_claim of A by its sender returned {landed}; "
             "expected [True]")
    p.expect([e.call_id for e in claimed] == [B],
             f"record_sent_and_claim claimed {[e.call_id for e in claimed]}; expected B, "
             "in its chat's turn once A is recorded sent in the same commit")
    stored = _all(p)
    p.expect(stored[A].state == "sent" and stored[A].result_json == '{"message_id": 5}',
             f"A is {stored[A].state!r} with result {stored[A].result_json!r} after its "
             "record; expected 'sent' with the result recorded")
    p.expect(stored[B].state == "sending" and stored[B].due_at == T + 400
             and stored[B].tries == 1,
             f"B is {stored[B].state!r} due at {stamp(stored[B].due_at)} with tries "
             f"{stored[B].tries}; expected 'sending' until {stamp(T + 400)}, tries 1")
    value = p.call("record_sent_and_claim", [(C, "s2", "{}", T + 30)],
                   now=T + 30, lease_until=T + 400, limit=0, sender="s2")
    if isinstance(value, tuple) and len(value) == 2:
        p.expect(bool_list(p, "record_sent_and_claim", value[0], 1) == [False],
                 "record_sent_and_claim of C by s2 landed; only its sender s1 may record it")
        p.expect(_entries(p, "record_sent_and_claim", value[1]) == [],
                 "record_sent_and_claim with limit 0 claimed calls")
    stored = _all(p)
    p.expect(stored[C].state == "sending",
             f"C is {stored[C].state!r} after a refused record; expected still 'sending'")
