"""Durable broadcasts.

A broadcast is started once per name. Its recipients are added once per chat and claimed by
broadcast and chat id, each by one sender at a time. Only the holding sender settles a
recipient. A paused broadcast is not claimed. A cancel leaves its pending recipients out.
The rules run only for a store that declares ``broadcasts``.
"""

from __future__ import annotations

from typing import Any, Dict, List, Sequence, Tuple

from ptb_fence._values import (
    AttemptEffects,
    AttemptIdentity,
    BroadcastWrite,
    Completed,
    Failed,
    Recipient,
    RecipientOutcome,
    Settlement,
    StoredBroadcast,
)
from ptb_fence.contract import BROADCAST_METHODS, Batch, StoreFeatures
from ptb_fence.conformance._probe import (
    L,
    Abort,
    Probe,
    T,
    THREADS,
    claimed_identity,
    has_method,
    other_claim_id,
    stamp,
    write_effects_in_block,
)
from ptb_fence.conformance._races import _race
from ptb_fence.conformance._rule import rule

_PARAMS = '{"text":"news"}'


def _declares_broadcasts(p: Probe) -> bool:
    features = getattr(p.store, "features", None)
    return (isinstance(features, StoreFeatures) and features.broadcasts
            and all(has_method(p.store, m) for m in BROADCAST_METHODS))


def _claim(p: Probe, sender: str, now: int, limit: int, lease: int = 1000) -> List[Recipient]:
    value = p.call("claim_recipients", sender, now=now, lease_until=now + lease, limit=limit)
    ok = isinstance(value, list) and all(isinstance(r, Recipient) for r in value)
    if not p.check_type("claim_recipients", ok, "a list of Recipient", value):
        raise Abort
    return list(value)


def _one(p: Probe, name: str) -> StoredBroadcast:
    value = p.call("list_broadcasts", name)
    ok = isinstance(value, list) and len(value) == 1 and isinstance(value[0], StoredBroadcast)
    if not p.check_type("list_broadcasts", ok, f"a list of one StoredBroadcast named {name!r}",
                        value):
        raise Abort
    return value[0]  # type: ignore[no-any-return]


def _chats(recipients: Sequence[Recipient]) -> List[Any]:
    return [(r.broadcast_id, r.chat_id) for r in recipients]


@rule(
    "broadcasts",
    "durable",
    "start_broadcast, add_recipients, claim_recipients, settle_recipients and "
    "set_broadcast_state (when broadcasts is declared) keep each recipient once, claim it for "
    "one sender at a time, settle it only for that sender, and honour pause and cancel.",
    applies="only for a store that declares ``broadcasts``",
)
def rule_broadcasts(p: Probe, fenced: bool, durable: bool) -> None:
    """A broadcast started twice is one. Recipients added twice are kept once.

    Claims go by broadcast and chat id, up to the limit. A claimed recipient is not claimed
    again under its lease, and is again once the lease ended. Only its sender settles it.
    ``pending`` puts it back at its due time. A paused broadcast is not claimed, a resumed
    one is. A cancel makes the pending recipients ``cancelled`` and stays. The counts say
    all of it.
    """
    if not _declares_broadcasts(p):
        return
    first = p.call("start_broadcast", "news", "sendMessage", _PARAMS, T)
    again = p.call("start_broadcast", "news", "sendPhoto", '{"photo":"x"}', T + 5)
    if not p.check_type("start_broadcast", isinstance(first, StoredBroadcast),
                        "a StoredBroadcast", first):
        raise Abort
    p.expect(again == first,
             f"start_broadcast of an existing name returned {again!r}; expected the first "
             f"one as it was, {first!r}")
    p.expect((first.state, first.total, first.method, first.params_json)
             == ("active", 0, "sendMessage", _PARAMS),
             f"a new broadcast was {first!r}; expected active, no recipients, its method and "
             "parameters")
    bid = first.broadcast_id
    added = p.call("add_recipients", bid, [30, 10, 20, 10], T)
    p.expect(added == 3, f"add_recipients of [30, 10, 20, 10] returned {added!r}; expected 3")
    added = p.call("add_recipients", bid, [20, 40], T)
    p.expect(added == 1, f"add_recipients of [20, 40] with 20 there returned {added!r}; "
             "expected 1")
    got = _claim(p, "s1", T, 2)
    p.expect(_chats(got) == [(bid, 10), (bid, 20)] and all(
        (r.method, r.params_json, r.tries) == ("sendMessage", _PARAMS, 1) for r in got),
        f"the first claim of 2 returned {got!r}; expected chats 10 and 20, first tries")
    got = _claim(p, "s2", T, 10)
    p.expect(_chats(got) == [(bid, 30), (bid, 40)],
             f"a second sender's claim returned {_chats(got)}; expected chats 30 and 40 only")
    landed = p.call("settle_recipients", "s2", [RecipientOutcome(bid, 10, "sent")], T)
    p.expect(landed == [False], f"another sender's outcome for chat 10 returned {landed!r}; "
             "expected [False]")
    landed = p.call("settle_recipients", "s1", [
        RecipientOutcome(bid, 10, "sent"), RecipientOutcome(bid, 20, "pending", due_at=T + 500,
                                                            error="429")], T)
    p.expect(landed == [True, True], f"the holder's outcomes returned {landed!r}; expected "
             "[True, True]")
    p.expect(_claim(p, "s1", T + 499, 10) == [],
             "a recipient put back due later, or held under a lease, was claimed early")
    got = _claim(p, "s1", T + 500, 10)
    p.expect([(c, r.tries) for c, r in zip(_chats(got), got)] == [((bid, 20), 2)],
             f"the claim at the due time returned {got!r}; expected chat 20, second try")
    got = _claim(p, "s3", T + 1001, 10)
    p.expect(_chats(got) == [(bid, 30), (bid, 40)],
             f"the claim after the second sender's lease ended returned {_chats(got)}; "
             "expected its chats 30 and 40")
    landed = p.call("settle_recipients", "s2", [RecipientOutcome(bid, 30, "sent")], T + 1001)
    p.expect(landed == [False], "a sender whose lease was taken over settled its recipient")
    p.call("settle_recipients", "s3", [RecipientOutcome(bid, 30, "blocked", error="403"),
                                       RecipientOutcome(bid, 40, "failed", error="400")],
           T + 1001)
    counted = _one(p, "news")
    p.expect((counted.sent, counted.sending, counted.blocked, counted.failed, counted.total)
             == (1, 1, 1, 1, 4),
             f"the counts were {counted!r}; expected 1 sent, 1 sending, 1 blocked, 1 failed")
    p.call("settle_recipients", "s1", [RecipientOutcome(bid, 20, "sent")], T + 1001)
    p.expect(_one(p, "news").done, "a broadcast with every recipient settled is not done")

    other = p.call("start_broadcast", "promo", "sendMessage", _PARAMS, T)
    p.call("add_recipients", other.broadcast_id, [1, 2, 3], T)
    paused = p.call("set_broadcast_state", "promo", "paused", T)
    p.expect(isinstance(paused, StoredBroadcast) and paused.state == "paused",
             f"set_broadcast_state(paused) returned {paused!r}")
    p.expect(_claim(p, "s1", T + 2000, 10) == [], "a paused broadcast's recipient was claimed")
    p.call("set_broadcast_state", "promo", "active", T)
    got = _claim(p, "s1", T + 2000, 1)
    p.expect(_chats(got) == [(other.broadcast_id, 1)],
             f"the resumed broadcast's claim returned {_chats(got)}; expected chat 1")
    cancelled = p.call("set_broadcast_state", "promo", "cancelled", T)
    p.expect(isinstance(cancelled, StoredBroadcast)
             and (cancelled.cancelled, cancelled.sending) == (2, 1),
             f"a cancel returned {cancelled!r}; expected the 2 pending cancelled, 1 sending")
    still = p.call("set_broadcast_state", "promo", "active", T)
    p.expect(isinstance(still, StoredBroadcast) and still.state == "cancelled",
             f"a cancelled broadcast was made {getattr(still, 'state', still)!r}; a cancel "
             "stays")
    p.expect(p.call("set_broadcast_state", "nobody", "paused", T) is None,
             "set_broadcast_state of an unknown name did not return None")
    names = [b.name for b in p.call("list_broadcasts")]
    p.expect(names == ["news", "promo"], f"list_broadcasts named {names}; expected "
             "['news', 'promo'] by id")


@rule(
    "broadcasts-concurrent",
    "durable",
    "Eight threads claiming recipients of one broadcast at once (when broadcasts is declared) "
    "never get one recipient twice.",
    applies="only for a store that declares ``broadcasts``",
)
def rule_broadcasts_concurrent(p: Probe, fenced: bool, durable: bool) -> None:
    """A broadcast of 100 recipients. Eight threads claim 20 each at once, as eight senders.

    Every recipient is claimed once and only once.
    """
    if not _declares_broadcasts(p):
        return
    started = p.call("start_broadcast", "race", "sendMessage", _PARAMS, T)
    p.call("add_recipients", started.broadcast_id, list(range(1000, 1100)), T)
    counter = iter(range(THREADS))

    def call() -> List[int]:
        return [r.chat_id for r in _claim(p, f"racer{next(counter)}", T, 20)]

    results = _race(p, call)
    if results is None:
        return
    chats = sorted(c for result in results for c in result)
    p.expect(chats == list(range(1000, 1100)),
             f"{THREADS} concurrent claims of 20 got {len(chats)} recipients, "
             f"{len(set(chats))} distinct; expected each of the 100 once")


@rule(
    "broadcasts-effects",
    "durable",
    "A completion's broadcasts (when broadcasts is declared) are started when it lands and "
    "not at all when it is refused. A broadcast of that name with another call gets none of "
    "its recipients.",
    applies="only for a store that declares ``broadcasts``",
)
def rule_broadcasts_effects(p: Probe, fenced: bool, durable: bool) -> None:
    """One ``commit`` settles four attempts, each starting a broadcast of its own name.

    A's completion lands: its broadcast is started at the completion's time, with its chats.
    B is a wrong claim id, C's lease ended before its completion and D fails. They start
    nothing. A fifth attempt's completion names a broadcast that exists with another call.
    It lands and adds none of its chats there.
    The rest needs ``transaction()`` and ``write_effects``.
    The broadcast ``write_effects`` writes in a block vanishes when the block raises.
    It lands when the block ends normally.
    """
    if not _declares_broadcasts(p):
        return
    a = claimed_identity(p, 1, T + L)
    b_real = claimed_identity(p, 2, T + L)
    b = AttemptIdentity(b_real.update_id, b_real.attempt, other_claim_id(b_real.claim_id))
    c = claimed_identity(p, 3, T + 5)
    d = claimed_identity(p, 4, T + L)
    e = claimed_identity(p, 5, T + L)
    p.call("start_broadcast", "taken", "sendMessage", '{"text":"first"}', T)
    settlements: Tuple[Tuple[AttemptIdentity, Settlement], ...] = (
        (a, Completed(T + 10)), (b, Completed(T + 10)), (c, Completed(T + 10)),
        (d, Failed(T + 10, T + 100, "x")), (e, Completed(T + 10)),
    )
    effects: Dict[AttemptIdentity, AttemptEffects] = {
        identity: AttemptEffects(broadcasts=(
            BroadcastWrite(f"from-{identity.update_id}", "sendMessage", _PARAMS, (7, 8, 9)),))
        for identity in (a, b, c, d)
    }
    effects[e] = AttemptEffects(broadcasts=(
        BroadcastWrite("taken", "sendMessage", _PARAMS, (7, 8)),))
    landed = p.settle_batch(Batch(settlements=settlements, effects=effects))
    p.expect(landed == [True, False, False, True, True],
             f"commit landed {landed}; expected [True, False, False, True, True] (the "
             "owner's completion, a wrong claim id, a lease ended at "
             f"{stamp(T + 5)}, the owner's failure, the owner's completion)")
    listed = p.call("list_broadcasts")
    started = sorted(b.name for b in listed if b.name.startswith("from-"))
    p.expect(started == ["from-1"], f"after the commit the broadcasts started by completions "
             f"are {started}; expected only ['from-1'], that of the completion that landed")
    if started == ["from-1"]:
        one = _one(p, "from-1")
        p.expect((one.created_at, one.total, one.pending, one.state)
                 == (T + 10, 3, 3, "active"),
                 f"the landed completion started {one!r}; expected it created at "
                 f"{stamp(T + 10)}, active, with its 3 chats pending")
    taken = _one(p, "taken")
    p.expect(taken.total == 0, f"a completion's broadcast named like one with another call "
             f"added {taken.total} recipient(s) to it; expected none")
    _in_transaction(p)


def _in_transaction(p: Probe) -> None:
    identity = AttemptIdentity(9, 1, "attempt-of-the-transaction")
    for name, raises in (("rolled", True), ("kept", False)):
        effects = AttemptEffects(broadcasts=(BroadcastWrite(name, "sendMessage", _PARAMS,
                                                            (5, 6)),))
        if not write_effects_in_block(p, identity, effects, T + 20, rolls_back=raises):
            return
        listed = [b.total for b in p.call("list_broadcasts", name)]
        want = [] if raises else [2]
        what = "raised" if raises else "ended normally"
        p.expect(listed == want, f"write_effects(connection=) of a broadcast inside a "
                 f"transaction() block that {what} left broadcasts of {listed} recipients; "
                 f"expected {want}")
