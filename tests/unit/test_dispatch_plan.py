"""The outbox dispatcher's decisions without threads: a DispatchPlan fed events with the times
passed in, each test asserting the actions it answers (claims, records, holds, releases)."""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import pytest
from telegram.error import BadRequest, NetworkError, RetryAfter

from ptb_fence import OutboxEntry
from ptb_fence.runtime._dispatch_plan import (
    CLAIM,
    LOOK,
    RECORD_WINDOW,
    REST,
    CallKey,
    ClaimReservation,
    DispatchPlan,
    Expire,
    Fail,
    Record,
    Retry,
    Round,
    Send,
    StopTake,
    Wait,
)

NOW = 1_700_000_000_000  # epoch ms
LEASE_MS = 120_000
SENDER = "host:1:abc"


def entry(call_id: int, chat: Optional[int] = 5, *, update_id: Optional[int] = None,
          seq: int = 0, due_at: int = NOW + LEASE_MS, created_at: int = NOW) -> OutboxEntry:
    return OutboxEntry(
        call_id=call_id, update_id=call_id if update_id is None else update_id, attempt=1,
        claim_id="c", seq=seq, chat_key=chat, method="sendMessage", params_json="{}",
        at_most_once=False, state="sending", tries=1, due_at=due_at, created_at=created_at,
        sent_at=None, error=None, result_json=None, acknowledged=False,
    )


def plan(concurrency: int = 2, *, failure_handler: bool = False) -> DispatchPlan:
    made = DispatchPlan(concurrency, lease_seconds=120.0, sweep_every_seconds=30.0,
                        max_age_seconds=3600.0, failure_handler=failure_handler)
    made.begin_run(SENDER)
    return made


def sending(made: DispatchPlan, *calls: OutboxEntry) -> None:
    """``calls`` claimed, handed to senders and begun."""
    assert made.start(calls, NOW) == tuple(Send(call) for call in calls)
    for call in calls:
        assert made.begin_send(call, NOW) is None


def quiet(made: DispatchPlan) -> None:
    """The first sweep round ran: nothing woke the plan since and the next sweep is far."""
    assert made.next_step(NOW, 0.0) == Round((), read=False, claim=True, stop=False)
    assert made.claim_round(NOW) is True
    made.round_ended(NOW, sweep=True, full=False)
    assert (made.woken, made.next_poll) == (False, NOW + 30_000)


def reserve(made: DispatchPlan, slots: int, keys: Optional[Dict[CallKey, Optional[int]]] = None
            ) -> ClaimReservation:
    """A completion commit about to claim ``slots`` calls at insert."""
    reservation = ClaimReservation()
    reservation.slots = slots
    reservation.keys = dict(keys or {})
    made.reserve(reservation)
    return reservation


def waiting_behind(made: DispatchPlan, call: OutboxEntry) -> None:
    """A commit inserted a call pending behind ``call`` (claimed and sending here)."""
    key = (call.update_id + 1000, 1, "c", 0)
    reservation = reserve(made, 1, {key: call.chat_key})
    made.claims_ended(reservation, {key})
    assert made.next_step(NOW, 0.0) == Round((), read=True, claim=False, stop=False)
    assert made.read_back(made.take_ended(), [call], NOW) == []
    assert made.behind == {call.chat_key: 1}


def recorded_at(made: DispatchPlan, mono: float) -> None:
    """A record's commit ran at ``mono``."""
    made.results([(entry(999), "{}", None)], NOW)
    assert made.record(False, NOW, mono) is not None


def retry_after(seconds: int) -> RetryAfter:
    return RetryAfter(seconds)


def hold_everything(made: DispatchPlan, until: int) -> None:
    """A flood limit of the whole bot (a ``RetryAfter`` for a call of no chat) until ``until``."""
    decided = made.send_failed(entry(900, chat=None), retry_after(1), until - 1000)
    assert isinstance(decided, Retry) and decided.decision.hold_all
    assert made.hold_until == until


# -- claim sizing ----------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("inflight", "reserved", "room"),
    [
        (0, 0, 4),  # twice the senders
        (1, 0, 3),  # a sender is free: fill up to twice the senders
        (2, 0, 2),  # all busy, a whole round of room
        (3, 0, 0),  # all busy, less than a round: wait for the round
        (4, 0, 0),
        (1, 2, 1),  # senders reserved for calls claimed at insert count
        (0, 5, 0),  # never negative
    ],
)
def test_claim_room(inflight: int, reserved: int, room: int) -> None:
    made = plan(concurrency=2)
    made.start([entry(i) for i in range(1, inflight + 1)], NOW)
    reserve(made, reserved)
    assert made.claim_room() == room
    assert made.claim_limit() == room
    assert made.woken is True  # begin_run wakes, and a claim with no room stays due


@pytest.mark.parametrize(
    ("stop", "hold_until", "inflight", "room"),
    [
        (False, None, 0, 4),
        (False, None, 3, 1),  # claims at insert fill any room, a busy round or not
        (True, None, 0, 0),  # a stop claims nothing
        (False, NOW + 1, 0, 0),  # a flood hold claims nothing
        (False, NOW, 0, 4),  # the hold ended
    ],
)
def test_insert_room(stop: bool, hold_until: Optional[int], inflight: int, room: int) -> None:
    made = plan(concurrency=2)
    made.start([entry(i) for i in range(1, inflight + 1)], NOW)
    if stop:
        made.stop(deadline=15.0)
    if hold_until is not None:
        hold_everything(made, hold_until)
    assert made.insert_room(NOW) == room


def test_a_reservation_sets_senders_aside_until_its_calls_are_read_back() -> None:
    made = plan(concurrency=2)
    reservation = reserve(made, 3, {(1, 1, "c", 0): 5, (1, 1, "c", 1): 5, (2, 1, "c", 0): 6})
    assert (made.insert_room(NOW), made.claim_room(), made.claims_open) == (1, 1, 1)
    made.claims_ended(reservation, set(reservation.keys))
    assert (made.read_due, made.claims_open) == (True, 0)
    fresh = made.read_back(made.take_ended(),
                           [entry(10, 5, update_id=1), entry(11, 6, update_id=2)], NOW)
    assert [call.call_id for call in fresh] == [10, 11]
    assert (made.reserved, made.claim_room(), made.held) == (0, 4, {10, 11})
    assert made.wake([(1, 1, "c", 0)]) is True  # its keys are forgotten


def test_one_round_while_every_sender_is_busy() -> None:
    made = plan(concurrency=2)
    quiet(made)
    calls = [entry(i, chat=i) for i in range(1, 5)]
    made.wake()
    assert made.claim_limit() == 4
    assert made.claimed(calls, 4, sweep=False) is True  # full: claim again at once
    sending(made, *calls[:2])
    assert made.start(calls[2:], NOW) == (Send(calls[2]), Send(calls[3]))
    # a sender frees: one call of room is no round, nothing is claimed, the claim stays due
    made.send_ended(calls[0], '{"ok":1}', None, 10.0)
    assert made.next_step(NOW, 10.0) == Round(
        ((calls[0], '{"ok":1}', None),), read=False, claim=True, stop=False,
    )
    made.results([(calls[0], '{"ok":1}', None)], NOW)
    assert made.record(True, NOW, 10.0) == Record(((1, SENDER, '{"ok":1}', NOW),), limit=0)
    assert made.claim_limit() == 0
    assert made.next_step(NOW, 10.0) == Wait(1.0)  # woken, and no room
    # a second one frees: a whole round of room, claimed in one go
    made.send_ended(calls[1], '{"ok":2}', None, 10.05)
    assert made.next_step(NOW, 10.05) == Round((), read=False, claim=True, stop=False)
    assert made.claim_limit() == 2
    # its result waits for the record window
    assert made.next_step(NOW, 10.05) == Wait(pytest.approx(0.05))
    assert made.next_step(NOW, 10.1) == Round(
        ((calls[1], '{"ok":2}', None),), read=False, claim=False, stop=False,
    )


@pytest.mark.parametrize(
    ("claimed", "limit", "sweep", "full", "behind_kept"),
    [
        (4, 4, True, True, True),
        (2, 4, True, False, False),  # a sweep that is not full forgets who waits behind
        (2, 4, False, False, True),
    ],
)
def test_a_claim_is_full_or_took_every_call_in_turn(
    claimed: int, limit: int, sweep: bool, full: bool, behind_kept: bool
) -> None:
    made = plan(concurrency=4)
    quiet(made)
    first = entry(100, chat=7)
    made.claimed([first], 1, sweep=False)
    sending(made, first)
    waiting_behind(made, first)
    calls = [entry(i) for i in range(1, claimed + 1)]
    assert made.claimed(calls, limit, sweep) is full
    assert made.held == {100} | {call.call_id for call in calls}
    assert (made.behind == {7: 1}) is behind_kept
    made.round_ended(NOW + 10, sweep, full)
    assert made.next_poll == (NOW + 10 if full else NOW + 30_010 if sweep else NOW + 30_000)


def test_expired_calls_are_failed_not_sent() -> None:
    made = plan()
    old = entry(1, created_at=NOW - 3_600_001)
    young = entry(2, created_at=NOW - 3_600_000)
    assert made.start([old, young], NOW) == (
        Expire(old, "expired: queued more than 3600 s ago, never sent"), Send(young),
    )
    assert list(made.inflight) == [2]


@pytest.mark.parametrize(
    ("due_at", "refused", "inflight", "held"),
    [
        (NOW + 30_000, None, {1}, {1}),  # a quarter of the lease left: sent
        (NOW + 29_999, "lapsed", set(), set()),  # less: left to whoever claims it next
    ],
)
def test_a_request_begins_only_with_a_quarter_of_the_lease_left(
    due_at: int, refused: Optional[str], inflight: "set[int]", held: "set[int]"
) -> None:
    made = plan()
    call = entry(1, due_at=due_at)
    made.claimed([call], 4, sweep=False)
    made.start([call], NOW)
    assert made.begin_send(call, NOW) == refused
    assert (set(made.inflight), made.held, made.started) == (inflight, held, inflight)


# -- the record window -----------------------------------------------------------------------

@pytest.mark.parametrize(
    ("last_record", "ended", "mono", "behind", "due"),
    [
        (None, 10.0, 10.0, False, True),  # the first result: at once
        (5.0, 10.0, 10.0, False, True),  # after a quiet spell: at once
        (10.0, 10.02, 10.05, False, False),  # within a window of the last record
        (10.0, 10.02, 10.0 + RECORD_WINDOW, False, True),  # the window passed
        (10.0, 10.02, 10.05, True, True),  # a later call of the chat waits: at once
    ],
)
def test_record_window(last_record: Optional[float], ended: float, mono: float, behind: bool,
                       due: bool) -> None:
    made = plan()
    quiet(made)
    call = entry(1, chat=7)
    made.claimed([call], 4, sweep=False)
    sending(made, call)
    if last_record is not None:
        recorded_at(made, last_record)
    if behind:
        waiting_behind(made, call)
    made.send_ended(call, '{"ok":1}', None, ended)
    assert made.record_due(mono) is due
    step = made.next_step(NOW, mono)
    if due:
        assert step == Round(((call, '{"ok":1}', None),), read=False, claim=False, stop=False)
        assert made.done == []
    else:
        assert last_record is not None
        assert step == Wait(pytest.approx(last_record + RECORD_WINDOW - mono))
        assert len(made.done) == 1


def test_at_most_one_record_commit_per_window() -> None:
    made = plan()
    quiet(made)
    first, second = entry(1, chat=1), entry(2, chat=2)
    sending(made, first, second)
    made.send_ended(first, '{"ok":1}', None, 10.0)
    step = made.next_step(NOW, 10.0)
    assert isinstance(step, Round) and len(step.done) == 1
    made.results(step.done, NOW)
    assert made.record(claim=True, now=NOW, mono=10.0) == Record(
        ((1, SENDER, '{"ok":1}', NOW),), limit=3,
    )
    made.send_ended(second, '{"ok":2}', None, 10.01)
    assert made.next_step(NOW, 10.05) == Wait(pytest.approx(0.05))
    step = made.next_step(NOW, 10.1)
    assert isinstance(step, Round) and [done[0] for done in step.done] == [second]


@pytest.mark.parametrize(
    ("claim", "stop", "hold_until", "limit"),
    [
        (True, False, None, 4),
        (False, False, None, 0),
        (True, True, None, 0),  # a stop claims nothing with its record
        (True, False, NOW + 1, 0),  # nor does a flood hold
        (True, False, NOW, 4),
    ],
)
def test_a_record_claims_the_calls_in_turn(claim: bool, stop: bool, hold_until: Optional[int],
                                           limit: int) -> None:
    made = plan()
    if stop:
        made.stop(deadline=15.0)
    if hold_until is not None:
        hold_everything(made, hold_until)
    made.results([(entry(1), "{}", None), (entry(2), None, NetworkError("x"))], NOW)
    assert made.record(claim, NOW, 10.0) == Record(((1, SENDER, "{}", NOW),), limit)
    assert made.record(claim, NOW, 11.0) is None  # nothing left to record
    assert made.last_record == 10.0


def test_nothing_to_record_is_no_record() -> None:
    made = plan()
    assert made.record(True, NOW, 10.0) is None
    assert made.last_record == 0.0


def test_a_record_counts_what_the_journal_did_not_and_holds_what_it_claimed() -> None:
    made = plan()
    made.claimed([entry(1), entry(2), entry(3)], 4, sweep=False)
    made.note(2)
    made.results([(entry(i), "{}", None) for i in (1, 2, 3)], NOW)
    record = made.record(True, NOW, 10.0)
    assert record == Record(((1, SENDER, "{}", NOW), (2, SENDER, "{}", NOW),
                             (3, SENDER, "{}", NOW)), 4)
    # call 2 was counted when noted, call 3 is another sender's now
    assert made.recorded(record, [True, True, False], [entry(9)]) == 1
    assert (made.held, made.noted) == ({9}, set())
    assert record.took_all(1) is True
    assert record.took_all(4) is False
    assert Record(record.items, 0).took_all(0) is False


@pytest.mark.parametrize(
    ("swept", "failed", "settled", "woken"),
    [
        (True, False, True, False),  # the record's commit claimed the chat's next call
        (False, False, False, True),  # it did not: claim it now
        (True, True, False, True),  # a failure leaves the chat's next call to a claim
    ],
)
def test_chat_order_a_chats_next_call_after_the_previous_ended(
    swept: bool, failed: bool, settled: bool, woken: bool
) -> None:
    made = plan()
    quiet(made)
    first = entry(1, chat=7)
    made.claimed([first], 4, sweep=False)
    sending(made, first)
    waiting_behind(made, first)
    assert made.woken is False  # the chat's next call waits for call 1
    made.send_ended(first, '{"ok":1}', None, 10.0)
    recorded_at(made, 10.0)  # within a window: only the waiting call makes it due
    assert made.record_due(10.0) is True
    assert made.results_recorded(made.done, swept, failed) is settled
    assert (made.behind, made.woken, made.held) == ({}, woken, set())


def test_a_result_kept_for_the_next_record_stays_held() -> None:
    made = plan()
    call = entry(1)
    made.claimed([call], 4, sweep=False)
    made.results([(call, "{}", None)], NOW)
    record = made.record(True, NOW, 10.0)
    assert record is not None
    made.record_failed(record)
    assert made.results_recorded([(call, "{}", None)], False, False) is False
    assert made.held == {1}


def test_a_call_left_pending_behind_another_senders_call_is_claimed_now() -> None:
    made = plan()
    quiet(made)
    reservation = reserve(made, 2, {(1, 1, "c", 0): 7, (2, 1, "c", 0): 8})
    made.claims_ended(reservation, set(reservation.keys))
    # call (1, 0) was inserted claimed, call (2, 0) pending: no call of chat 8 here
    fresh = made.read_back(made.take_ended(), [entry(11, 7, update_id=1)], NOW)
    assert [call.call_id for call in fresh] == [11]
    assert (made.behind, made.woken, made.claim_keys) == ({}, True, {})


def test_a_failed_commit_leaves_nothing_waiting_behind() -> None:
    made = plan()
    quiet(made)
    reservation = reserve(made, 1, {(1, 1, "c", 0): 7})
    made.claims_ended(reservation, set())  # it did not land
    assert made.read_back(made.take_ended(), [], NOW) == []
    assert (made.behind, made.woken, made.reserved) == ({}, False, 0)


def test_a_read_back_skips_held_calls_and_calls_near_their_lease_end() -> None:
    made = plan()
    made.claimed([entry(1)], 4, sweep=False)
    calls = [entry(1), entry(2, due_at=NOW + 59_999), entry(3, due_at=NOW + 60_000)]
    assert made.read_back([], calls, NOW) == [calls[2]]


@pytest.mark.parametrize(
    ("keys", "claimed_at_insert", "woken"),
    [
        ((), (), True),  # unknown calls: claim
        (((1, 1, "c", 0),), ((1, 1, "c", 0),), False),  # claimed at insert: read back later
        (((1, 1, "c", 0), (1, 1, "c", 1)), ((1, 1, "c", 0),), True),  # one inserted pending
    ],
)
def test_wake(keys: Sequence[CallKey], claimed_at_insert: Sequence[CallKey],
              woken: bool) -> None:
    made = plan()
    quiet(made)
    reserve(made, len(claimed_at_insert), {key: 5 for key in claimed_at_insert})
    assert made.wake(keys) is woken
    assert made.woken is woken


@pytest.mark.parametrize(
    ("claim", "swept", "done", "woken", "at", "then"),
    [
        (True, False, False, False, NOW, CLAIM),
        (False, False, False, True, NOW, CLAIM),  # woken meanwhile
        (False, False, True, False, NOW, LOOK),  # a recorded call may free a chat
        (True, True, True, False, NOW, REST),  # the record claimed every call in turn
        (True, True, True, False, NOW + 30_000, CLAIM),  # but a sweep stays due
        (False, False, False, False, NOW, REST),
    ],
)
def test_after_record(claim: bool, swept: bool, done: bool, woken: bool, at: int,
                      then: str) -> None:
    made = plan()
    quiet(made)
    if woken:
        made.wake()
    results = ((entry(1), "{}", None),) if done else ()
    assert made.after_record(Round(results, False, claim, False), swept, at) == then
    assert made.woken is False


# -- retries and flood holds -----------------------------------------------------------------

def test_retry_after_holds_one_chat_until_three_chats_hold_the_whole_bot() -> None:
    made = plan()
    quiet(made)
    first = made.send_failed(entry(1, chat=1), retry_after(5), NOW)
    assert isinstance(first, Retry)
    assert (first.due_at, first.decision.hold_all, made.hold_until) == (NOW + 5000, False, 0)
    second = made.send_failed(entry(2, chat=2), retry_after(3), NOW + 1000)
    assert isinstance(second, Retry) and not second.decision.hold_all
    third = made.send_failed(entry(3, chat=3), retry_after(4), NOW + 2000)
    assert isinstance(third, Retry)
    assert (third.due_at, third.decision.hold_all) == (NOW + 6000, True)
    assert made.hold_until == NOW + 6000
    # the hold refuses claims of both kinds and the loop claims the moment it ends
    assert made.insert_room(NOW + 2000) == 0
    assert made.claim_round(NOW + 2000) is None
    assert made.next_poll == NOW + 6000
    made.wake()
    assert made.next_step(NOW + 2000, 10.0) == Wait(1.0)  # at most a second at a time
    assert made.next_step(NOW + 5500, 10.0) == Wait(0.5)
    assert made.next_step(NOW + 6000, 10.0) == Round((), False, True, False)
    assert made.claim_round(NOW + 6000) is True


@pytest.mark.parametrize(
    ("holds", "chat", "at", "hold_all"),
    [
        ([(1, 5), (2, 5)], 3, 1000, True),  # three chats whose holds overlap
        ([(1, 5), (2, 5)], 2, 1000, False),  # the same chat twice is one chat
        ([(1, 1), (2, 5)], 3, 2000, False),  # chat 1's hold ended: two chats only
        ([], None, 0, True),  # a call of no chat: the bot's own limit
    ],
)
def test_flood_limit_of_the_whole_bot(holds: List[Tuple[int, int]], chat: Optional[int],
                                      at: int, hold_all: bool) -> None:
    made = plan()
    for number, (held_chat, seconds) in enumerate(holds, start=1):
        made.send_failed(entry(number, chat=held_chat), retry_after(seconds), NOW)
    decided = made.send_failed(entry(99, chat=chat), retry_after(7), NOW + at)
    assert isinstance(decided, Retry)
    assert decided.decision.hold_all is hold_all
    assert made.hold_until == (NOW + at + 7000 if hold_all else 0)


def test_other_failures_fail_or_back_off_without_a_hold() -> None:
    made = plan(failure_handler=True)
    assert made.delivery_begins() is True
    made.delivery_ended(more=False)
    assert made.failures_due is False
    refused = made.send_failed(entry(1), BadRequest("Chat not found"), NOW)
    assert refused == Fail(entry(1), "BadRequest: Chat not found")
    made.failed()
    assert made.failures_due is True  # the handler hears of it
    retried = made.send_failed(entry(2), NetworkError("Bad Gateway"), NOW)
    assert isinstance(retried, Retry)
    assert (retried.due_at, made.hold_until, made.flood) == (NOW + 1000, 0, {})


def test_a_retry_wakes_the_loop_when_it_falls_due() -> None:
    made = plan()
    quiet(made)
    made.retry_set(NOW + 3000)
    made.retry_set(NOW + 5000)  # the earliest one counts
    assert made.next_retry == NOW + 3000
    assert made.next_step(NOW + 2500, 10.0) == Wait(0.5)
    assert made.next_step(NOW + 3000, 10.0) == Round((), False, True, False)
    assert made.claim_round(NOW + 3000) is False  # not a sweep round
    assert made.next_retry is None


# -- the stop --------------------------------------------------------------------------------

def test_a_stop_claims_nothing_records_and_releases_what_was_not_started() -> None:
    made = plan(concurrency=2)
    quiet(made)
    begun, ended, waiting = entry(1, chat=1), entry(2, chat=2), entry(3, chat=3)
    sending(made, begun, ended)
    made.start([waiting], NOW)
    made.send_ended(ended, '{"ok":2}', None, 10.0)
    recorded_at(made, 10.0)
    made.stop(deadline=15.0)
    assert made.insert_room(NOW) == 0
    step = made.next_step(NOW, 10.01)  # records at once, window or not
    assert step == Round(((ended, '{"ok":2}', None),), read=False, claim=False, stop=True)
    made.results(step.done, NOW)
    assert made.record(True, NOW, 10.01) == Record(((2, SENDER, '{"ok":2}', NOW),), 0)
    # the call handed to a sender that had not begun never begins
    assert made.begin_send(waiting, NOW) == "stopping"
    assert made.stop_waits(10.02) is True  # call 1 is still being sent
    assert made.stop_waits(15.0) is False  # the bound passed
    error = NetworkError("Bad Gateway")
    made.send_ended(begun, None, error, 10.5)
    assert made.stop_waits(10.5) is False
    take = made.stop_take()
    assert take == StopTake(((begun, None, error),), frozenset(), (3,))
    # what commits claimed for this sender and it never read back is released too, not a
    # sent call whose record failed
    made.results([(entry(4), "{}", None)], NOW)
    assert made.to_release(take, [entry(3), entry(4), entry(5)]) == [3, 5]


def test_a_stop_waits_for_commits_that_claim_calls_for_it() -> None:
    made = plan()
    reservation = reserve(made, 1)
    made.stop(deadline=15.0)
    assert made.stop_waits(10.0) is True
    made.claims_ended(reservation, set())
    assert made.stop_waits(10.0) is False


def test_a_stop_releases_calls_still_claimed_while_one_is_being_sent() -> None:
    made = plan(concurrency=1)
    begun, handed = entry(1), entry(2)
    sending(made, begun)
    made.start([handed], NOW)
    made.not_submitted(3)  # the pool was shut down
    made.stop(deadline=15.0)
    take = made.stop_take()
    assert take == StopTake((), frozenset({1}), (3, 2))
    assert made.to_release(take, [entry(1), entry(2)]) == [2, 3]


# -- store errors ----------------------------------------------------------------------------

def test_a_failed_read_is_tried_again_after_a_growing_back_off() -> None:
    made = plan()
    quiet(made)
    reservation = reserve(made, 0)
    made.claims_ended(reservation, set())
    assert made.next_step(NOW, 10.0) == Round((), read=True, claim=False, stop=False)
    made.read_failed(made.take_ended(), 10.0)
    assert 10.05 <= made.read_at <= 10.1  # the first back-off, with jitter
    wait = made.next_step(NOW, 10.0)
    assert isinstance(wait, Wait) and wait.seconds == pytest.approx(made.read_at - 10.0)
    step = made.next_step(NOW, made.read_at)
    assert step == Round((), read=True, claim=False, stop=False)
    made.read_failed(made.take_ended(), 20.0)
    assert 20.1 <= made.read_at <= 20.2  # doubled
    assert made.ended == [(reservation, set())]  # kept for the next read
    made.read_back(made.take_ended(), [], NOW)
    made.read_failed([], 30.0)
    assert 30.05 <= made.read_at <= 30.1  # an answer resets it


def test_a_failed_record_is_recorded_with_the_next_one_first() -> None:
    made = plan()
    made.results([(entry(1), "{}", None)], NOW)
    record = made.record(False, NOW, 10.0)
    assert record is not None
    made.results([(entry(2), "{}", None)], NOW)
    made.record_failed(record)
    assert made.record(False, NOW, 10.2) == Record(
        ((1, SENDER, "{}", NOW), (2, SENDER, "{}", NOW)), 0,
    )


def test_a_round_that_raised_sweeps_again_a_second_later() -> None:
    made = plan()
    quiet(made)
    made.round_failed(NOW)
    assert made.next_poll == NOW + 1000
    assert made.next_step(NOW + 999, 10.0) == Wait(pytest.approx(0.001))
    assert made.next_step(NOW + 1000, 10.0) == Round((), False, True, False)
    assert made.claim_round(NOW + 1000) is True


# -- failure delivery ------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("handler", "state", "begins"),
    [
        (True, "due", True),
        (True, "delivering", False),  # one round at a time
        (True, "idle", False),
        (False, "due", False),  # nobody to deliver to
    ],
)
def test_failure_delivery_rounds(handler: bool, state: str, begins: bool) -> None:
    made = plan(failure_handler=handler)
    if state != "due":
        assert made.delivery_begins() is True
    if state == "idle":
        made.delivery_ended(more=False)
    assert made.delivery_begins() is begins
    if begins:
        assert (made.delivering, made.failures_due) == (True, False)
        made.delivery_ended(more=True)
        assert (made.delivering, made.failures_due) == (False, True)
        assert made.delivery_begins() is True  # the next page
