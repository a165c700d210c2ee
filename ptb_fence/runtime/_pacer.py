"""Pacing every outbox send to Telegram's limits, for all processes of the bot at once.

:class:`OutboxPacing` says the limits. :class:`Pacer` turns a call into the buckets it is
paced by and takes its slot from the store, which keeps the buckets for every process
(``StoreFeatures.pacing``). A store without that part is paced in this process only. The
sender threads of one process share one store call per round (the first waiting thread takes
the slots of all).
"""

from __future__ import annotations

import math
import threading
import zlib
from dataclasses import dataclass
from typing import Any, Callable, List, Mapping, Optional, Sequence, Tuple

from ptb_fence._values import PaceBucket

__all__ = ["BOT_KEY", "BOT_WAIT_MS", "HOLD_KEY", "PAID_KEY", "HORIZON_MS", "LATE_MS",
           "OutboxPacing", "Pacer", "PacedBack", "is_paced"]

BOT_KEY = "bot"
"""The bucket of every paced send of the bot."""

PAID_KEY = "paid"
"""The bucket of the sends with ``allow_paid_broadcast``, instead of :data:`BOT_KEY`."""

HOLD_KEY = "hold"
"""A bucket no send is paced by, held with the bot's for a flood limit of the whole bot.
Reading it tells a hold apart from the bot's pace."""

HORIZON_MS = 500
"""A slot is taken at most this long ahead. A sender then waits for it. So a hold announced
meanwhile stops this process's sends within this time."""

LATE_MS = 40
"""A send this much past its slot (its thread was held up) gives the slot up and asks for
another. A late send would crowd the sends of other processes into one second, which
Telegram counts."""

BOT_WAIT_MS = 2000
"""A sender waits for the bot's pace up to this long, asking again as the slot nears. A
later slot (a hold), or a chat's pace beyond :data:`HORIZON_MS`, puts the call back due then,
its try not counted."""

STRIPE_RATE = 50.0
"""The most sends a second one bucket of the bot paces. A faster limit is split into stripes
(``bot``, ``bot:1``, ...), each send going by one of them, chosen by its chat. Bucket times are
whole milliseconds, so an interval is rounded up. A bucket of 600 a second would round 1.7 ms
up to 2 ms and keep to 500."""

STRIPE_LOSS = 0.01
"""The share of a limit the rounding of the stripes' intervals may lose. The number of stripes
is the first one from ``limit / STRIPE_RATE`` on whose interval rounds up by at most this."""


_MESSAGE_METHODS = frozenset({"copyMessage", "copyMessages", "forwardMessage",
                              "forwardMessages"})


def is_paced(method: str) -> bool:
    """Whether ``method`` posts a message, which Telegram's limits count.

    That is every ``send*`` method but ``sendChatAction``, and the copy and forward methods.
    Edits, deletes, answers and reads are not paced.
    """
    if method in _MESSAGE_METHODS:
        return True
    return method.startswith("send") and method != "sendChatAction"


def _interval_ms(per_seconds: float, seconds: float, headroom: float) -> int:
    return int(math.ceil(seconds * 1000.0 / per_seconds / (1.0 - headroom)))


def _positive(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"OutboxPacing.{name} must be a number > 0, got {value!r}")
    return float(value)


@dataclass(frozen=True, slots=True)
class OutboxPacing:
    """Telegram's limits, which every outbox send of the bot is paced by.

    The pace is kept in the store, so every process sharing it paces together. A
    ``RetryAfter`` answer holds its chat there, or every chat for a flood limit of the bot.
    Pass it as ``outbox_pacing=`` to the processors or :class:`~ptb_fence.UpdateIntake`.
    Without it the sends go as fast as the senders go.

    Args:
        per_second (:obj:`float`): Messages per second of the whole bot. Default 30.
        private_chat_per_second (:obj:`float`): Messages per second to one private chat (a
            positive chat id). Default 1.
        group_per_minute (:obj:`float`): Messages per minute to one group or channel (a negative
            chat id or a ``@username``). Default 20.
        paid_per_second (:obj:`float`): Messages per second sent with
            ``allow_paid_broadcast``, instead of ``per_second``. Default 1000.
        headroom (:obj:`float`): The share below each limit the sends keep to. It is room for
            the network's jitter. Default 0.05.

    Raises:
        ValueError: A limit is not a positive number, or ``headroom`` is not in ``[0, 1)``.
    """

    per_second: float = 30.0
    private_chat_per_second: float = 1.0
    group_per_minute: float = 20.0
    paid_per_second: float = 1000.0
    headroom: float = 0.05

    def __post_init__(self) -> None:
        for name in ("per_second", "private_chat_per_second", "group_per_minute",
                     "paid_per_second"):
            object.__setattr__(self, name, _positive(name, getattr(self, name)))
        headroom = self.headroom
        if isinstance(headroom, bool) or not isinstance(headroom, (int, float)) \
                or not 0 <= headroom < 1:
            raise ValueError(f"OutboxPacing.headroom must be in [0, 1), got {headroom!r}")

    def buckets(self, method: str, params: Mapping[str, Any],
                chat_key: Optional[int] = None) -> Tuple[PaceBucket, ...]:
        """The buckets a call is paced by: none for a method that posts no message.

        A call goes by the bot's bucket (or the paid one) and by its chat's.
        """
        if not is_paced(method):
            return ()
        chat = params.get("chat_id", chat_key)
        paid = params.get("allow_paid_broadcast") is True
        key, rate = (PAID_KEY, self.paid_per_second) if paid else (BOT_KEY, self.per_second)
        stripes = _stripes(rate, self.headroom)
        stripe = _stripe_of(chat, stripes)
        buckets = [PaceBucket(key if stripe == 0 else f"{key}:{stripe}",
                              _interval_ms(rate / stripes, 1.0, self.headroom))]
        if isinstance(chat, bool) or not isinstance(chat, (int, str)) or chat == "":
            return tuple(buckets)
        if isinstance(chat, int) and chat > 0:
            interval = _interval_ms(self.private_chat_per_second, 1.0, self.headroom)
        else:
            interval = _interval_ms(self.group_per_minute, 60.0, self.headroom)
        buckets.append(PaceBucket(f"chat:{chat}"[:64], interval))
        return tuple(buckets)

    def hold_keys(self) -> Tuple[str, ...]:
        """Every bucket a flood limit of the whole bot holds: each stripe of the bot and of
        the paid sends, and :data:`HOLD_KEY`."""
        keys = [HOLD_KEY]
        for key, rate in ((BOT_KEY, self.per_second), (PAID_KEY, self.paid_per_second)):
            keys += [key] + [f"{key}:{n}" for n in range(1, _stripes(rate, self.headroom))]
        return tuple(keys)


def _stripes(rate: float, headroom: float) -> int:
    """How many stripes pace ``rate`` a second: enough to keep each at most
    :data:`STRIPE_RATE`, and more while rounding an interval up would lose more than
    :data:`STRIPE_LOSS` of the rate."""
    least = max(1, int(math.ceil(rate / STRIPE_RATE)))
    for stripes in range(least, least * 4 + 1):
        exact = stripes * 1000.0 / rate / (1.0 - headroom)
        if math.ceil(exact) <= exact * (1.0 + STRIPE_LOSS):
            return stripes
    return least * 4


def _stripe_of(chat: Any, stripes: int) -> int:
    if stripes == 1:
        return 0
    if isinstance(chat, int) and not isinstance(chat, bool):
        return chat % stripes
    return zlib.crc32(str(chat).encode("utf-8")) % stripes


class PacedBack(Exception):
    """A call whose slot is beyond :data:`HORIZON_MS`: it goes back, due at ``until``.

    Its try is not counted. ``bot_wide``: the bot's own bucket is what waits (a hold of every
    chat, or the bot at its pace), so this process claims nothing before ``until``.
    """

    def __init__(self, until: int, bot_wide: bool) -> None:
        super().__init__(f"paced: next slot at {until}{' (the whole bot)' if bot_wide else ''}")
        self.until = until
        self.bot_wide = bot_wide


class _Ticket:
    __slots__ = ("buckets", "error", "time")

    def __init__(self, buckets: Tuple[PaceBucket, ...]) -> None:
        self.buckets = buckets
        self.time: Optional[int] = None
        self.error: Optional[BaseException] = None


Take = Callable[[Sequence[Sequence[PaceBucket]], int, int], List[int]]
"""``take(wants, now, horizon_ms)``: the store's ``take_send_slots``."""


class Pacer:
    """The slots of this process's sends, taken from the store in shared rounds.

    Args:
        pacing: The limits.
        take: The store's ``take_send_slots`` as ``take(wants, now, horizon_ms)``.
        hold: The store's ``hold_sends``.
        now_ms: The clock in epoch milliseconds.
    """

    __slots__ = ("_cond", "_hold", "_now_ms", "_pacing", "_taking", "_take", "_waiting")

    def __init__(self, pacing: OutboxPacing, take: Take,
                 hold: Callable[[Sequence[Tuple[str, int]]], None],
                 now_ms: Callable[[], int]) -> None:
        self._pacing = pacing
        self._take = take
        self._hold = hold
        self._now_ms = now_ms
        self._cond = threading.Condition()
        self._taking = False
        self._waiting: List[_Ticket] = []

    def buckets(self, method: str, params: Mapping[str, Any],
                chat_key: Optional[int]) -> Tuple[PaceBucket, ...]:
        """The buckets of a call (see :meth:`OutboxPacing.buckets`)."""
        return self._pacing.buckets(method, params, chat_key)

    def slot(self, buckets: Tuple[PaceBucket, ...]) -> int:
        """The time the send may go, in epoch ms: at most :data:`HORIZON_MS` away, or later.

        A time beyond the horizon took no slot. The calling thread may take the slots of the
        other waiting threads in the same store call.

        Raises:
            Exception: The store's error.
        """
        if not buckets:
            return self._now_ms()
        ticket = _Ticket(buckets)
        with self._cond:
            self._waiting.append(ticket)
            while ticket.time is None and ticket.error is None:
                if self._taking:
                    self._cond.wait()
                    continue
                batch, self._waiting = self._waiting, []
                self._taking = True
                self._cond.release()
                try:
                    self._round(batch)
                finally:
                    self._cond.acquire()
                    self._taking = False
                    self._cond.notify_all()
        if ticket.error is not None:
            raise ticket.error
        assert ticket.time is not None
        return ticket.time

    def _round(self, batch: List[_Ticket]) -> None:
        try:
            times = self._take([t.buckets for t in batch], self._now_ms(), HORIZON_MS)
        except Exception as exc:  # every waiting sender hears of it
            for ticket in batch:
                ticket.error = exc
            return
        for ticket, at in zip(batch, times):
            ticket.time = int(at)

    def deferred(self, buckets: Tuple[PaceBucket, ...], until: int) -> PacedBack:
        """The send of ``buckets`` waits until ``until``: whether the bot's bucket is why.

        It reads the bot's bucket alone (a negative horizon takes nothing).
        """
        bot = tuple(b for b in buckets if b.key.split(":")[0] in (BOT_KEY, PAID_KEY))
        try:
            alone = self._take([bot], self._now_ms(), -1)[0] if bot else 0
        except Exception:  # the call goes back all the same
            alone = 0
        return PacedBack(until, alone > self._now_ms() + HORIZON_MS)

    def hold_keys(self) -> Tuple[str, ...]:
        """The buckets a flood limit of the whole bot holds (see
        :meth:`OutboxPacing.hold_keys`)."""
        return self._pacing.hold_keys()

    def hold(self, key: str, until: int) -> None:
        """Hold ``key`` until ``until`` in the store, for every process.

        Raises:
            Exception: The store's error.
        """
        self._hold([(key, int(until))])
