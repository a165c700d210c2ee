"""OutboxPacing: which buckets a call is paced by, and how the bot's limit is striped."""

from __future__ import annotations

import math
from typing import Dict, List

import pytest

from ptb_fence import OutboxPacing
from ptb_fence.runtime._broadcasts import BroadcastSender
from ptb_fence.runtime._pacer import BOT_KEY, HOLD_KEY, PAID_KEY, STRIPE_LOSS, STRIPE_RATE, \
    is_paced


@pytest.mark.parametrize("method, paced", [
    ("sendMessage", True), ("sendPhoto", True), ("copyMessage", True),
    ("forwardMessages", True), ("sendChatAction", False), ("editMessageText", False),
    ("answerCallbackQuery", False), ("deleteMessage", False), ("getMe", False),
])
def test_only_methods_that_post_a_message_are_paced(method: str, paced: bool) -> None:
    assert is_paced(method) is paced
    assert bool(OutboxPacing().buckets(method, {"chat_id": 5})) is paced


def test_a_private_chat_and_a_group_have_their_own_bucket() -> None:
    pacing = OutboxPacing()
    private = pacing.buckets("sendMessage", {"chat_id": 42})
    group = pacing.buckets("sendMessage", {"chat_id": -100123})
    assert private[-1].key == "chat:42"
    assert private[-1].interval_ms == math.ceil(1000 / 0.95)  # 1 a second, 5 % below
    assert group[-1].key == "chat:-100123"
    assert group[-1].interval_ms == math.ceil(60_000 / 20 / 0.95)  # 20 a minute
    assert private[0].key.split(":")[0] == BOT_KEY and group[0].key.split(":")[0] == BOT_KEY


def test_paid_broadcasts_go_by_the_paid_limit_instead_of_the_bots() -> None:
    (bot, _chat) = OutboxPacing().buckets("sendMessage", {"chat_id": 7,
                                                          "allow_paid_broadcast": True})
    assert bot.key.split(":")[0] == PAID_KEY


def _stripe_rates(pacing: OutboxPacing, chats: int = 20_000) -> Dict[str, float]:
    rates: Dict[str, float] = {}
    for chat in range(1, chats + 1):
        bucket = pacing.buckets("sendMessage", {"chat_id": chat})[0]
        rates[bucket.key] = 1000.0 / bucket.interval_ms
    return rates


@pytest.mark.parametrize("limit", [1, 5, 20, 30, 45, 100, 300, 600, 1000])
def test_the_stripes_of_a_limit_together_keep_just_below_it(limit: int) -> None:
    """Bucket times are whole milliseconds: the stripes are chosen so that rounding their
    intervals up loses at most STRIPE_LOSS, and no stripe is faster than STRIPE_RATE."""
    pacing = OutboxPacing(per_second=limit)
    rates = _stripe_rates(pacing)
    together = sum(rates.values())
    assert together <= limit * (1 - pacing.headroom) + 1e-9
    assert together >= limit * (1 - pacing.headroom) / (1 + STRIPE_LOSS)
    assert max(rates.values()) <= STRIPE_RATE
    assert set(rates) <= set(pacing.hold_keys())  # a flood hold holds every stripe


def test_a_chat_always_goes_by_the_same_stripe_and_chats_spread_over_all() -> None:
    pacing = OutboxPacing(per_second=600)
    keys: List[str] = [pacing.buckets("sendMessage", {"chat_id": chat})[0].key
                       for chat in range(1, 1001)]
    again = [pacing.buckets("sendMessage", {"chat_id": chat})[0].key
             for chat in range(1, 1001)]
    assert keys == again
    counts = {key: keys.count(key) for key in set(keys)}
    assert len(counts) > 1 and max(counts.values()) - min(counts.values()) <= 1
    named = {pacing.buckets("sendMessage", {"chat_id": f"@channel{n}"})[0].key
             for n in range(200)}
    assert len(named) == len(counts)  # usernames spread over the stripes too


def test_hold_keys_hold_the_bot_the_paid_sends_and_the_hold_marker() -> None:
    keys = OutboxPacing(per_second=30, paid_per_second=1000).hold_keys()
    assert keys[0] == HOLD_KEY and BOT_KEY in keys and PAID_KEY in keys
    assert len(keys) == len(set(keys))


@pytest.mark.parametrize("field, value", [("per_second", 0), ("group_per_minute", -1),
                                          ("headroom", 1.0), ("paid_per_second", True)])
def test_a_wrong_limit_is_refused_with_its_name(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        OutboxPacing(**{field: value})  # type: ignore[arg-type]


def test_a_senders_page_keeps_one_interval_of_the_bots_pace_between_coinciding_slots() -> None:
    """The stripes of idle buckets grant many slots at the same moment. The sender spreads
    them one interval of the bot's pace apart, in slot order, and carries the spacing on to
    its next page. A slot beyond the horizon (not taken) takes no place in the plan."""
    pacing = OutboxPacing(per_second=300)
    sender = BroadcastSender(None, pacing, take=None, hold=None, now_ms=lambda: 0)
    gap = 1000.0 / (300 * 0.95)
    calls = [f"c{n}" for n in range(6)]
    times = [1000, 1000, 1000, 1010, 1000, 9000]  # the last: no slot taken (a hold)
    plan = sender._plan(calls, times, now=1000)
    goes = [go for _, _, go in plan]
    assert [call for call, _, _ in plan] == ["c0", "c1", "c2", "c4", "c3", "c5"]
    assert goes[:5] == pytest.approx([1000 + i * gap for i in range(5)])
    assert goes[5] == 9000  # sent back at its time, never sent from this plan
    later = sender._plan(["d0"], [1001], now=1001)
    assert later[0][2] == pytest.approx(1000 + 5 * gap)  # the spacing goes on
    idle = sender._plan(["e0"], [60_000], now=60_000)
    assert idle[0][2] == 60_000  # after a pause the page starts at its slot
