"""Store-wide pacing.

A bucket never seen is free. A slot moves its buckets on by their intervals. A slot beyond the
horizon takes nothing. A negative horizon only reads. A hold grants nothing before its end and
never shortens. Concurrent takers never get overlapping slots of one bucket.
The rules run only for a store that declares ``pacing``.
"""

from __future__ import annotations

from typing import List, Sequence

from ptb_fence._values import PaceBucket
from ptb_fence.contract import PACE_METHODS, StoreFeatures
from ptb_fence.conformance._probe import Abort, Probe, T, THREADS, has_method
from ptb_fence.conformance._races import _race
from ptb_fence.conformance._rule import rule

_BOT = PaceBucket("bot", 100)
_CHAT = PaceBucket("chat:7", 1000)
_BURST = PaceBucket("chat:-8", 300, 600)


def _declares_pacing(p: Probe) -> bool:
    features = getattr(p.store, "features", None)
    return (isinstance(features, StoreFeatures) and features.pacing
            and all(has_method(p.store, m) for m in PACE_METHODS))


def _take(p: Probe, wants: Sequence[Sequence[PaceBucket]], now: int, horizon: int) -> List[int]:
    value = p.call("take_send_slots", [list(w) for w in wants], now=now, horizon_ms=horizon)
    ok = (isinstance(value, list) and len(value) == len(wants)
          and all(type(v) is int for v in value))
    if not p.check_type("take_send_slots", ok, f"a list of {len(wants)} int", value):
        raise Abort
    return list(value)


@rule(
    "pacing",
    "durable",
    "take_send_slots (when pacing is declared) grants a slot at the latest of now, each "
    "bucket's pace and each hold, takes nothing beyond the horizon, and hold_sends never "
    "shortens a hold.",
    applies="only for a store that declares ``pacing``",
)
def rule_pacing(p: Probe, fenced: bool, durable: bool) -> None:
    """Fresh buckets grant at ``now``. Each slot moves its buckets on by their intervals.

    Two wants of one call are decided in order: the second of the bot and a chat waits for the
    chat's interval. A want beyond the horizon takes nothing and says when to ask again. A
    negative horizon only reads. A tolerance lets a burst go early. A hold grants nothing
    before its end, and a shorter hold later does not shorten it. Sends without buckets go at
    ``now``.
    """
    if not _declares_pacing(p):
        return
    got = _take(p, [[_BOT, _CHAT], [_BOT, _CHAT], [_BOT]], T, 100)
    want = [T, T + 1000, T + 100]
    p.expect(got == want,
             f"take_send_slots of [bot+chat, bot+chat, bot] on fresh buckets at {T} returned "
             f"{got}; expected {want} (the second waits for the chat, beyond the horizon, so "
             "it takes nothing and the third takes the bot's next slot)")
    got = _take(p, [[_BOT]], T, -1)
    p.expect(got == [T + 200], f"a read (negative horizon) of the bot at {T} returned {got}; "
             f"expected [{T + 200}] after two slots of 100 ms")
    got = _take(p, [[_BOT]], T, -1)
    p.expect(got == [T + 200], f"a read took a slot: a second read returned {got}; expected "
             f"[{T + 200}]")
    got = _take(p, [[_CHAT]], T + 1000, 0)
    p.expect(got == [T + 1000], f"the chat at {T + 1000}, one interval after its slot, "
             f"returned {got}; expected [{T + 1000}]")
    got = _take(p, [[_BURST]] * 4, T, 0)
    want = [T, T, T, T + 300]
    p.expect(got == want,
             f"a bucket of 300 ms with a tolerance of 600 ms at {T} returned {got}; expected "
             f"{want} (three slots at once, the fourth not taken)")
    got = _take(p, [[]], T, 0)
    p.expect(got == [T], f"a send without buckets returned {got}; expected [{T}]")

    p.call("hold_sends", [("bot", T + 5000)])
    got = _take(p, [[_BOT]], T + 1000, 100)
    p.expect(got == [T + 5000], f"the bot held until {T + 5000} returned {got} at {T + 1000}; "
             f"expected [{T + 5000}] and no slot")
    p.call("hold_sends", [("bot", T + 2000)])
    got = _take(p, [[_BOT]], T + 3000, 100)
    p.expect(got == [T + 5000], f"a shorter hold shortened the first: the bot at {T + 3000} "
             f"returned {got}; expected [{T + 5000}]")
    got = _take(p, [[_BOT]], T + 5000, 0)
    p.expect(got == [T + 5000], f"the bot at the hold's end returned {got}; expected "
             f"[{T + 5000}]")


@rule(
    "pacing-concurrent",
    "durable",
    "Eight threads taking slots of one bucket at once (when pacing is declared) never get "
    "overlapping slots.",
    applies="only for a store that declares ``pacing``",
)
def rule_pacing_concurrent(p: Probe, fenced: bool, durable: bool) -> None:
    """Eight threads each take five slots of a fresh bucket of 10 ms at once, horizon 1 s.

    The 40 slots granted are distinct and at least 10 ms apart.
    """
    if not _declares_pacing(p):
        return
    bucket = PaceBucket("chat:race", 10)

    def call() -> List[int]:
        return _take(p, [[bucket]] * 5, T, 1000)

    results = _race(p, call)
    if results is None:
        return
    slots = sorted(at for result in results for at in result)
    gaps = [b - a for a, b in zip(slots, slots[1:])]
    p.expect(len(slots) == 5 * THREADS and all(gap >= 10 for gap in gaps),
             f"{THREADS} threads taking 5 slots each of a bucket of 10 ms got {slots}; expected "
             f"{5 * THREADS} slots at least 10 ms apart")

