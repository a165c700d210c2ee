"""Figures for operators.

``figures()`` counts the unsettled rows and gives the oldest of them.
It counts the unacknowledged exhaustions and gives the oldest of them.
In a chat-ordered store it names the chat held longest by one update.
The rule runs only for a store with ``figures``.
"""

from __future__ import annotations

from typing import Optional, cast

from ptb_fence._values import Abandoned, Completed, Failed, StoreFigures
from ptb_fence.contract import CHAT_ORDER_METHODS, FIGURES_METHODS
from ptb_fence.conformance._probe import L, T, Abort, Probe, bool_list, has_method, stamp
from ptb_fence.conformance._rule import rule


def _time(value: Optional[int]) -> str:
    return "None" if value is None else stamp(value)


def _show(figures: StoreFigures) -> str:
    return (
        f"StoreFigures(unsettled={figures.unsettled}, "
        f"oldest_unsettled_received_at={_time(figures.oldest_unsettled_received_at)}, "
        f"exhaustions_waiting={figures.exhaustions_waiting}, "
        f"oldest_exhaustion_at={_time(figures.oldest_exhaustion_at)}, "
        f"held_chat={figures.held_chat}, held_chat_since={_time(figures.held_chat_since)})"
    )


def _figures(p: Probe) -> StoreFigures:
    value = p.call("figures")
    ok = (
        isinstance(value, StoreFigures)
        and type(value.unsettled) is int
        and type(value.exhaustions_waiting) is int
        and all(
            item is None or type(item) is int
            for item in (
                value.oldest_unsettled_received_at,
                value.oldest_exhaustion_at,
                value.held_chat,
                value.held_chat_since,
            )
        )
    )
    expected = "a StoreFigures (int counts; each time and the chat key an int or None)"
    if not p.check_type("figures", ok, expected, value):
        raise Abort
    return cast(StoreFigures, value)


def _expect(p: Probe, want: StoreFigures, when: str, why: str) -> None:
    got = _figures(p)
    p.expect(got == want, f"figures() {when} returned {_show(got)}; expected {_show(want)} "
             f"({why})")


def _claimed(p: Probe, update_id: int, received_at: int, now: int) -> int:
    """Record ``update_id`` (no chat key) and claim it with the base ``claim``.

    Returns:
        The attempt.
    """
    p.require(p.add(update_id, f"f{update_id}", received_at),
              "add of a new update_id returned False")
    return _claim(p, update_id, now)


def _claim(p: Probe, update_id: int, now: int) -> int:
    attempt = p.claim(update_id, now=now, lease_until=now + L)
    p.require(attempt is not None, f"claim of claimable update {update_id} returned None")
    assert attempt is not None
    return attempt


@rule(
    "figures",
    "base",
    "figures (when present) counts the pending, processing and failed rows with the oldest "
    "received_at among them, the unacknowledged exhaustions with the oldest due_at among "
    "them, and (chat order) the chat whose oldest unsettled update is the oldest among chats "
    "with two or more; settled rows count nowhere.",
    applies="only with ``figures``",
)
def rule_figures(p: Probe, fenced: bool, durable: bool) -> None:
    """An empty store has no figures: zero counts, and every time and the chat are :obj:`None`.

    A pending, a processing and a failed row are counted.
    The oldest ``received_at`` is the smallest among them.
    It is neither the lowest ``update_id``'s nor a ``due_at``.
    A completed row counts nowhere.
    Neither does a row abandoned with ``settled_at`` set, even an older one.
    Rows without a chat key never make a held chat.
    Durable stores: an exhaustion by ``exhaust`` is counted.
    So is one by a ``durable_exhaustion`` spend.
    Their oldest time is the smallest ``due_at``, when each ended.
    An acknowledged exhaustion is not counted, even an earlier one.
    No exhaustion counts as unsettled.
    The figures follow the rows: a completion and an acknowledgement change them.
    Chat-ordered stores: a chat is held when it has two or more unsettled rows.
    Unsettled rows are pending, processing or failed. A completed row of the chat does not count.
    Of those chats, the one whose smallest unsettled ``received_at`` is the smallest is held.
    It is held since that ``received_at``, not since its lowest ``update_id``'s.
    A chat with one unsettled row is never held, however old.
    On a tie the smaller chat key wins.
    """
    if not all(has_method(p.store, m) for m in FIGURES_METHODS):
        return
    _expect(p, StoreFigures(0, None, 0, None), "of an empty store", "nothing waits in it")

    # The oldest row is completed and the next oldest abandoned, so neither waits. Of the
    # three that wait the failed one is the oldest, though its update_id and due_at are not.
    p.require(p.add(1, "f1", T + 30), "add of a new update_id returned False")  # pending
    _claimed(p, 2, T + 20, T + 30)  # processing
    p.settle(3, _claimed(p, 3, T + 10, T + 30), Failed(at=T + 31, retry_at=T + 1000, error="x"))
    p.settle(4, _claimed(p, 4, T + 1, T + 30), Completed(at=T + 32))
    p.settle(5, _claimed(p, 5, T + 2, T + 30), Abandoned(at=T + 33, error="x"))
    waiting = StoreFigures(3, T + 10, 0, None)
    _expect(p, waiting, "with a pending (1), a processing (2), a failed (3), a completed (4) and "
            "an abandoned (5) row", f"1, 2 and 3 are unsettled, the oldest received at "
            f"{stamp(T + 10)} (3); 4 and 5 are settled; no row has a chat key")

    if durable:
        p.require(p.add(6, "f6", T + 3), "add of a new update_id returned False")
        six = p.claim_owned(6, now=T + 40, lease_until=T + L)
        p.require(six is not None, "claim_owned of a pending update returned None")
        assert six is not None
        p.require(p.exhaust(six, at=T + 300, error="x"), "exhaust of a live claim returned False")
        p.require(p.add(7, "f7", T + 4), "add of a new update_id returned False")
        seven = p.claim_owned(7, now=T + 40, lease_until=T + 100, max_attempts=1)
        p.require(seven is not None, "claim_owned of a pending update returned None")
        assert seven is not None
        p.require(p.settle_owned(seven, Failed(at=T + 41, retry_at=T + 50, error="x")),
                  "settle_owned(Failed) of a live claim returned False")
        spent = p.claim_owned(7, now=T + 200, lease_until=T + L, max_attempts=1,
                              durable_exhaustion=True)
        p.require(spent is None, "claim_owned of an update whose attempts are spent returned "
                  "an identity")
        p.require(p.add(8, "f8", T + 5), "add of a new update_id returned False")
        eight = p.claim_owned(8, now=T + 40, lease_until=T + L)
        p.require(eight is not None, "claim_owned of a pending update returned None")
        assert eight is not None
        p.require(p.exhaust(eight, at=T + 100, error="x"),
                  "exhaust of a live claim returned False")
        p.require(p.acknowledge_exhaustion(eight, T + 400),
                  "acknowledge_exhaustion of an exhaustion returned False")
        waiting = StoreFigures(3, T + 10, 2, T + 200)
        _expect(p, waiting, "with exhaustions 6 (exhaust at T+300), 7 (spent at T+200) and 8 "
                "(exhausted at T+100, acknowledged)", "6 and 7 wait for their "
                "acknowledgement, the oldest ended at T+200; 8 is acknowledged; none is "
                "unsettled")

    # The figures follow the rows. The failed row completes and the oldest exhaustion is
    # acknowledged.
    p.settle(3, _claim(p, 3, T + 1000), Completed(at=T + 1001))
    if durable:
        listed = {exhaustion.update_id: exhaustion for exhaustion in p.due_exhaustions()}
        p.require(7 in listed, "due_exhaustions does not list spent update 7")
        p.require(p.acknowledge_exhaustion(listed[7].identity, T + 1002),
                  "acknowledge_exhaustion of an exhaustion returned False")
        waiting = StoreFigures(2, T + 20, 1, T + 300)
        why = "1 and 2 wait, the oldest received at T+20; exhaustion 6 waits (T+300)"
    else:
        waiting = StoreFigures(2, T + 20, 0, None)
        why = "1 and 2 wait, the oldest received at T+20"
    _expect(p, waiting, "after 3 completed" + (" and 7 was acknowledged" if durable else ""),
            why)

    if not all(has_method(p.store, m) for m in CHAT_ORDER_METHODS):
        return
    # Each claim below takes the row in turn in its chat. A store may order its base claim too.
    rows = [
        (20, "c20", T + 52, 7), (21, "c21", T + 60, 7),  # chat 7: two unsettled, since T+52
        (22, "c22", T + 40, 8),  # chat 8: one row, the oldest chat row that waits
        (23, "c23", T + 35, 9), (24, "c24", T + 45, 9),  # chat 9: 23 completes below
        (28, "c28", T + 56, 11), (29, "c29", T + 50, 11),  # chat 11: since T+50 (29)
    ]
    got = bool_list(p, "add_many_in_chats", p.call("add_many_in_chats", rows), len(rows))
    p.require(got == [True] * len(rows), f"add_many_in_chats of new update_ids returned {got}")
    _claim(p, 20, T + 60)  # processing: still unsettled
    p.settle(23, _claim(p, 23, T + 60), Completed(at=T + 61))
    p.settle(28, _claim(p, 28, T + 60), Failed(at=T + 61, retry_at=T + 2000, error="x"))
    exhausted, ended = (1, T + 300) if durable else (0, None)
    _expect(p, StoreFigures(8, T + 20, exhausted, ended, held_chat=11, held_chat_since=T + 50),
            "with chats 7 (20 processing, 21 pending), 8 (22), 9 (23 completed, 24) and 11 "
            "(28 failed, 29 pending)", "chats 7 and 11 have two unsettled rows each; chat 11's "
            "oldest, 29, was received at T+50, before chat 7's oldest (T+52); chat 8 has one "
            "row only, chat 9 one unsettled row")
    p.settle(28, _claim(p, 28, T + 2000), Completed(at=T + 2001))
    got = bool_list(p, "add_many_in_chats",
                    p.call("add_many_in_chats", [(30, "c30", T + 52, 5), (31, "c31", T + 90, 5)]),
                    2)
    p.require(got == [True, True], f"add_many_in_chats of new update_ids returned {got}")
    _expect(p, StoreFigures(9, T + 20, exhausted, ended, held_chat=5, held_chat_since=T + 52),
            "after 28 completed and chat 5 got 30 (received T+52) and 31",
            "chat 11 has one unsettled row left; chats 5 and 7 are both held since T+52: the "
            "smaller chat key wins")
