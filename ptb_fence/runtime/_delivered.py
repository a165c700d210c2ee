"""DeliveredExhaustion: what ``handle_exhaustion`` receives, with an outbox whose calls commit
with the exhaustion's acknowledgement.

An error handler runs once per failed attempt. ``handle_exhaustion`` runs once per update that will
not run again (at least once: until it returns). A message to the user queued there
(``exhaustion.outbox.reply_text("Sorry ...")``) is written in the commit that acknowledges the
exhaustion: sent iff that commit lands, so once, however often the handler ran before.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Tuple

from ptb_fence._errors import AttemptFinished, UsageError
from ptb_fence._values import AttemptIdentity, Exhaustion
from ptb_fence.runtime._effects import HeldEffects, OpenTransaction
from ptb_fence.runtime._held_call import HeldCall
from ptb_fence.runtime._outbox import Outbox
from ptb_fence.runtime._phase import AttemptHost

__all__ = ["DeliveredExhaustion", "ExhaustionCalls"]


class ExhaustionCalls:
    """The outbox calls one delivery of an exhaustion queues, held for its acknowledgement
    (the :class:`~ptb_fence.runtime._outbox.OutboxOwner` of its :class:`Outbox`).

    Args:
        host: The runtime (its store port, clock, outbox settings).
        exhaustion: The exhaustion being delivered.
        refusal: Why this front end cannot queue calls (the fix named), or :obj:`None`.
    """

    __slots__ = ("_effects", "_exhaustion", "_host", "_outbox", "_refusal", "attempt", "update_id")

    def __init__(self, host: AttemptHost, exhaustion: Exhaustion, refusal: Optional[str]) -> None:
        self._host = host
        self._exhaustion = exhaustion
        self._refusal = refusal
        self._effects = HeldEffects()
        self._outbox: Optional[Outbox] = None
        self.update_id = exhaustion.update_id
        self.attempt = exhaustion.attempt

    @property
    def identity(self) -> AttemptIdentity:
        """The exhaustion's identity (its calls are written under it)."""
        return self._exhaustion.identity

    @property
    def update(self) -> Any:
        """:obj:`None`: the update is read from :attr:`body`."""
        return None

    @property
    def body(self) -> Optional[str]:
        """The update's stored text (what ``reply_text`` answers)."""
        return self._exhaustion.body

    @property
    def host(self) -> AttemptHost:
        """The runtime."""
        return self._host

    @property
    def effects(self) -> HeldEffects:
        """The calls held for the acknowledgement."""
        return self._effects

    @staticmethod
    def open_transaction() -> Optional[OpenTransaction]:
        """None: the calls are always held for the acknowledgement."""
        return None

    def raise_if_finished(self) -> None:
        """Refuse a call once the delivery ended (its acknowledgement was written or not).

        Raises:
            AttemptFinished: The handler returned or raised already.
        """
        if self._effects.closed:
            raise AttemptFinished(
                self.identity,
                "the exhaustion handler ended: a call queued now cannot ride its "
                "acknowledgement; queue it before the handler returns",
            )

    @property
    def outbox(self) -> Outbox:
        """The :class:`~ptb_fence.Outbox` of this delivery.

        Raises:
            UsageError: This front end or store cannot write calls with the acknowledgement
                (the message names the fix).
        """
        if self._refusal is not None:
            raise UsageError(self._refusal)
        if self._outbox is None:
            self._outbox = Outbox(self, self._host.outbox_defaults())
        return self._outbox

    def take(self) -> "Optional[Tuple[Any, Tuple[HeldCall, ...]]]":
        """The effects to write with the acknowledgement, or :obj:`None` (none held)."""
        return self._effects.take()

    def landed(self) -> Tuple[HeldCall, ...]:
        """The acknowledgement committed with the calls taken: nothing more can be held."""
        return self._effects.landed()

    def discard(self, why: str) -> None:
        """The delivery ended without its calls landing: drop them (never sent)."""
        self._effects.discard(why)


@dataclass(frozen=True, eq=False)
class DeliveredExhaustion(Exhaustion):
    """An :class:`~ptb_fence.Exhaustion` as ``handle_exhaustion`` receives it: the same fields,
    and an :attr:`outbox`. It equals (and hashes as) the plain exhaustion with its fields.

    Calls queued on :attr:`outbox` are written in the commit that acknowledges the exhaustion,
    when the handler returns normally: sent iff that commit lands. A handler that raises
    leaves the exhaustion due and its calls are dropped (the next delivery queues its own). So
    a message telling the user that their update failed goes out once.
    """

    calls: ExhaustionCalls = field(repr=False, compare=False)

    @property
    def outbox(self) -> Outbox:
        """:class:`~ptb_fence.Outbox`: Bot API calls sent iff this exhaustion's
        acknowledgement commits (``exhaustion.outbox.reply_text("Sorry, that failed.")``
        answers the update's message).

        Raises:
            UsageError: A front end without an outbox (``DurableUpdateProcessor``,
                ``UpdateIntake(handle=...)``: use ``FencedUpdateProcessor`` or
                ``UpdateIntake(handle_attempt=...)``), or a store that cannot write calls with
                an acknowledgement.
        """
        return self.calls.outbox

    def _fields(self) -> Tuple[Any, ...]:
        return (self.update_id, self.attempt, self.claim_id, self.body, self.exhausted_at,
                self.error)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Exhaustion):
            return NotImplemented
        return self._fields() == (other.update_id, other.attempt, other.claim_id, other.body,
                                  other.exhausted_at, other.error)

    def __hash__(self) -> int:
        return hash(self._fields())  # as the plain Exhaustion's (a frozen dataclass's)

    @classmethod
    def of(cls, exhaustion: Exhaustion, calls: ExhaustionCalls) -> "DeliveredExhaustion":
        """``exhaustion`` delivered with ``calls``."""
        return cls(
            exhaustion.update_id,
            exhaustion.attempt,
            exhaustion.claim_id,
            exhaustion.body,
            exhaustion.exhausted_at,
            exhaustion.error,
            calls,
        )
