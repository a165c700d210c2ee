"""The life cycle of an :class:`~ptb_fence.Attempt` (its phases) and what it needs from its
runtime (a narrow interface)."""

from __future__ import annotations

from enum import Enum
from typing import Any, Mapping, Optional, Protocol

from ptb_fence.runtime._hop import StoreHop
from ptb_fence.runtime._port import StorePort

__all__ = ["AttemptHost", "Phase"]

_ALREADY_COMPLETED = (
    "attempt already completed: a transaction(complete=True) committed it; open further "
    "transactions without complete=True (or before completing)"
)
_ALREADY_EXHAUSTED = (
    "attempt already exhausted: exhaust() recorded its terminal failure; the attempt can no "
    "longer write"
)
_HANDLER_RETURNED = (
    "attempt ended: the handler returned; the attempt can no longer write (keep fenced writes "
    "inside the handler)"
)
_ASYNC_FN = (
    "run_in_transaction(fn) got an async function (or fn returned an awaitable), which would "
    "write nothing: pass a plain function: run_in_transaction runs fn on a worker thread; do "
    "the async work before or after; the transaction was rolled back and nothing was settled"
)

class Phase(Enum):
    """Where an :class:`Attempt` is in its life. Transitions (all made by Attempt's methods)::

        RUNNING ──transaction(complete=True)──▶ COMPLETING ──commit──▶ COMPLETED
           │   ◀──────────── rolled back / failed ─────┘
           ├──exhaust() landed / exhaustion recorded──▶ EXHAUSTED
           └──handler returned (begin_settling)──▶ SETTLING ──exhausted──▶ EXHAUSTED
        any ──end() (left the lease keeper)──▶ ENDED

    COMPLETED and EXHAUSTED are kept as :attr:`Attempt.result` after ENDED.
    """

    RUNNING = "running"
    """Claimed. The handler runs. The lease keeper renews it."""
    COMPLETING = "completing"
    """A ``transaction(complete=True)`` is settling inside its commit."""
    COMPLETED = "completed"
    """A ``transaction(complete=True)`` committed."""
    SETTLING = "settling"
    """The handler returned. The runtime settles (a refused renewal is expected)."""
    EXHAUSTED = "exhausted"
    """A terminal failure was recorded (handler ``exhaust()`` or the retry policy)."""
    ENDED = "ended"
    """Left the lease keeper: nothing more happens to it."""


_FINISHED = frozenset({Phase.COMPLETING, Phase.COMPLETED, Phase.EXHAUSTED, Phase.ENDED})


class AttemptHost(Protocol):
    """What an :class:`Attempt` needs from its runtime (a narrow interface: Attempt does not
    depend on the Runtime class)."""

    @property
    def port(self) -> StorePort:
        """The store the attempt's fenced writes go to."""

    @property
    def executor(self) -> "Optional[StoreHop]":
        """The store threads for blocking store work from asyncio, or :obj:`None` (then
        :func:`asyncio.to_thread`)."""

    def now_ms(self) -> int:
        """The current time in store units."""

    def log_transaction_refused(self, attempt: Any) -> None:
        """Log a fenced transaction refused because the attempt lost its update."""

    def settle_exhausted(self, attempt: Any, reason: str) -> bool:
        """Record a handler-terminal failure. Returns :obj:`True` when it landed."""

    def outbox_refusal(self) -> Optional[str]:
        """Why ``attempt.outbox`` cannot be used here (the fix named), or :obj:`None`."""

    def outbox_defaults(self) -> Mapping[str, Any]:
        """The bot's defaults for outbox calls (PTB ``Defaults.api_defaults``, or empty)."""

    def outbox_prepare(self) -> Any:
        """The front end's change to queued calls (``OutboxPrepare``), or :obj:`None`."""

    def calls_committed(self, handles: Any = ()) -> None:
        """A commit carrying outbox calls landed: wake this process's sender."""

    def broadcast_write(self, name: str, chat_ids: Any, method: str,
                        params: Mapping[str, Any]) -> Any:
        """The broadcast as a completion writes it, checked (``UsageError`` naming the fix)."""

    def broadcast_landed(self, write: Any) -> None:
        """A commit started the broadcast ``write``: wake this process's broadcast sender."""

    def retry_follows(self, attempt: Any, error: BaseException) -> bool:
        """Whether the update runs again after ``attempt`` failed with ``error``."""


