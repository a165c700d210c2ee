"""Attempt: what a handler receives for one try at one update."""

from __future__ import annotations

import contextvars
import inspect
import logging
import threading
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Optional, TypeVar

from ptb_fence._errors import AttemptFinished, OwnershipLost, TransactionEnded, UsageError
from ptb_fence._values import AttemptIdentity, BroadcastWrite, Completed, StepRecord
from ptb_fence.runtime._effects import HeldEffects, OpenTransaction
from ptb_fence.runtime._held_call import HeldCall
from ptb_fence.runtime._outbox import Outbox
from ptb_fence.runtime._block_connection import BlockConnection
from ptb_fence.runtime._connections import (
    COMMITTED_OR_ROLLED_BACK,
    ROLLBACK_MARK,
    CallerConnection,
    GivenConnection,
    asyncio_refusal,
    caller_connection,
    dbapi_connection,
    interrupt,
    transaction_ended,
)
from ptb_fence.runtime._steps import decode_result, effect_key, encode_result, step_name
from ptb_fence.runtime._transaction_group import run_grouped
from ptb_fence.runtime._phase import (
    _ALREADY_COMPLETED,
    _ASYNC_FN,
    _ALREADY_EXHAUSTED,
    _FINISHED,
    _HANDLER_RETURNED,
    AttemptHost,
    Phase,
)


if TYPE_CHECKING:
    import asyncio  # imported where used: import ptb_fence stays light

__all__ = [
    "Attempt",
    "FencedBlock",
    "Phase",
    "current_attempt",
    "enter_attempt",
    "exit_attempt",
]


_LOGGER = logging.getLogger("ptb_fence.runtime")

T = TypeVar("T")

_CURRENT: "contextvars.ContextVar[Optional[Attempt]]" = contextvars.ContextVar(
    "ptb_fence_current_attempt", default=None
)

# the fenced transaction open in this context (its block runs here): outbox calls made in it
# are written through its connection
_OPEN: "contextvars.ContextVar[Optional[OpenTransaction]]" = contextvars.ContextVar(
    "ptb_fence_open_transaction", default=None
)


_MARKED = (
    "was {how} inside the block: it was rolled back when the block ended, so nothing of it "
    "was written and complete=True settled nothing (the attempt fails, not retried). To "
    "retry the update raise an exception out of the block; to give up call "
    "attempt.exhaust(reason) after it"
)


def current_attempt() -> "Optional[Attempt]":
    """Return the :class:`Attempt` of the update being handled, or :obj:`None` outside one.

    It is a :class:`contextvars.ContextVar`: visible in the handler's task and in
    :func:`asyncio.to_thread` calls made from it.
    """
    return _CURRENT.get()


def enter_attempt(attempt: "Optional[Attempt]") -> "contextvars.Token[Optional[Attempt]]":
    """Make ``attempt`` the :func:`current_attempt` of this context (a front end does this
    around a handler. :obj:`None`: no attempt). Pass the token to :func:`exit_attempt`."""
    return _CURRENT.set(attempt)


def exit_attempt(token: "contextvars.Token[Optional[Attempt]]") -> None:
    """Restore the :func:`current_attempt` that :func:`enter_attempt` replaced."""
    _CURRENT.reset(token)


class Attempt:
    """One attempt at handling one update: its identity and its fenced-write tools.

    A handler gets it as ``context.attempt`` (PTB), as the second argument of
    ``handle_attempt(update, attempt)`` (:class:`~ptb_fence.UpdateIntake`), or from
    :func:`current_attempt`.

    Attributes:
        identity (:class:`~ptb_fence.AttemptIdentity`): The capability of this attempt. The
            idempotency key of everything it does.
        update_id (:obj:`int`): The update's id.
        attempt (:obj:`int`): The attempt number (from 1).
        claim_id (:obj:`str`): The persisted claim id of this attempt (opaque).
    """

    __slots__ = (
        "_after",
        "_body",
        "_connections",
        "_effects",
        "_exhausted_at",
        "_exhausted_error",
        "_failure",
        "_holding",
        "_identity",
        "_lock",
        "_loop_waiters",
        "_lost",
        "_lost_event",
        "_opening",
        "_outbox",
        "_phase",
        "_proven_until",
        "_result",
        "_resume",
        "_retry_decision",
        "_runtime",
        "_suspect",
        "_suspicion",
        "_update",
        "attempt",
        "claim_id",
        "update_id",
    )

    def __init__(
        self,
        runtime: AttemptHost,
        update_id: int,
        attempt: int,
        claim_id: Optional[str],
        proven_until: int,
        body: Optional[str] = None,
    ) -> None:
        self._runtime = runtime
        self.update_id = update_id
        self.attempt = attempt
        self.claim_id = claim_id or ""
        self._identity = (
            AttemptIdentity(update_id, attempt, claim_id) if claim_id is not None else None
        )
        # owner_lost's Event is made when first asked for: most attempts never are, and an
        # Event (a Condition and its lock) is the dearest part of an attempt to build
        self._lost = False
        self._lost_event: Optional[threading.Event] = None
        self._lock = threading.Lock()
        self._proven_until = proven_until
        self._phase = Phase.RUNNING
        self._result: Optional[Phase] = None  # COMPLETED or EXHAUSTED once reached, kept after ENDED
        self._resume = Phase.RUNNING  # the phase a failed COMPLETING returns to
        self._opening = 0  # fenced transactions opening or open
        self._holding = 0  # fenced transactions whose ownership check succeeded, still open
        self._connections: "list[Any]" = []  # the store's own, of open fenced transactions
        self._after: "list[Callable[[], None]]" = []  # called once none is open any more
        self._exhausted_error: Optional[str] = None
        self._exhausted_at: Optional[int] = None
        self._body = body
        # the claim of a suspect row (taken over from a process that died): the attempt runs
        # alone in this process and is marked isolated first (see the front ends)
        self._suspect: Optional[AttemptIdentity] = None
        self._suspicion = 0
        self._loop_waiters: "list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]]" = []
        # what the completion writes besides the settle (created on first use: an attempt that
        # queues nothing costs nothing)
        self._effects: Optional[HeldEffects] = None
        self._outbox: Optional[Outbox] = None
        self._update: Any = None
        self._failure: Optional[BaseException] = None  # reported by the front end
        # the retry decision for a failure, made once (see Runtime.retry_delay)
        self._retry_decision: "Optional[tuple[BaseException, Optional[float]]]" = None

    def __repr__(self) -> str:
        return (
            f"Attempt(update_id={self.update_id}, attempt={self.attempt}, "
            f"claim_id={self.claim_id!r}, owner_lost={self._lost})"
        )

    @property
    def owner_lost(self) -> threading.Event:
        """:class:`threading.Event`: Set when the lease keeper learns that this attempt lost
        its update (renewal refused, the last proven lease passed, or its settle did not
        land). Advisory: :meth:`owns` and :meth:`transaction` are the authority."""
        event = self._lost_event
        if event is None:
            with self._lock:
                event = self._lost_event
                if event is None:
                    event = threading.Event()
                    if self._lost:
                        event.set()
                    self._lost_event = event
        return event

    @property
    def lost(self) -> bool:
        """:obj:`bool`: Whether :attr:`owner_lost` is set (without making its Event)."""
        return self._lost

    @property
    def identity(self) -> AttemptIdentity:
        """:class:`~ptb_fence.AttemptIdentity`: The full identity of this attempt."""
        if self._identity is None:
            raise UsageError(
                "this attempt has no claim id: it was claimed with the base contract (unary "
                "handling); use FencedUpdateProcessor (PTB) or UpdateIntake(handle_attempt=...) "
                "with a fenced store"
            )
        return self._identity

    @property
    def fenced(self) -> bool:
        """:obj:`bool`: Whether this attempt carries a persisted claim id."""
        return self._identity is not None

    @property
    def suspicion(self) -> int:
        """:obj:`int`: 0, or how suspect the row this attempt took is (a process that died
        held an earlier claim of it, see :class:`~ptb_fence.BatchStore`). 1: its
        handler starts on probation (no other handler starts meanwhile). 2: it runs alone."""
        return self._suspicion

    @property
    def runs_alone(self) -> bool:
        """:obj:`bool`: This attempt took a row *suspect again*: its handler runs with no
        other handler of this process, and a crash during it counts against it alone."""
        return self._suspicion >= 2

    @property
    def suspect_claim(self) -> Optional[AttemptIdentity]:
        """:class:`~ptb_fence.AttemptIdentity` | :obj:`None`: The claim to mark before the
        handler starts (set only when :attr:`suspicion` is not 0, also for unary handling,
        whose attempts carry no claim id)."""
        return self._suspect

    def suspect(self, identity: AttemptIdentity, suspicion: int) -> None:
        """This attempt's claim ``identity`` took a row of this ``suspicion`` (1 or 2)."""
        self._suspect = identity
        self._suspicion = suspicion

    @property
    def phase(self) -> Phase:
        """:class:`Phase`: Where this attempt is in its life."""
        return self._phase

    @property
    def result(self) -> Optional[Phase]:
        """:class:`Phase` | :obj:`None`: ``COMPLETED`` or ``EXHAUSTED`` once reached (kept
        after the attempt ended)."""
        return self._result

    @property
    def completed(self) -> bool:
        """:obj:`bool`: Whether a ``transaction(complete=True)`` committed this attempt."""
        return self._result is Phase.COMPLETED

    @property
    def exhausted(self) -> bool:
        """:obj:`bool`: Whether :meth:`exhaust` recorded a terminal failure for this attempt."""
        return self._result is Phase.EXHAUSTED

    @property
    def exhaustion_error(self) -> Optional[str]:
        """:obj:`str` | :obj:`None`: The recorded terminal failure's text."""
        return self._exhausted_error

    @property
    def exhausted_at(self) -> Optional[int]:
        """:obj:`int` | :obj:`None`: When the terminal failure was recorded (epoch ms)."""
        return self._exhausted_at

    @property
    def body(self) -> Optional[str]:
        """:obj:`str` | :obj:`None`: The stored update text this attempt was claimed with."""
        return self._body

    @body.setter
    def body(self, text: Optional[str]) -> None:
        self._body = text

    @property
    def update(self) -> Any:
        """:class:`telegram.Update` | :obj:`dict` | :obj:`None`: The update being handled, as
        the front end has it.

        PTB gives the :class:`telegram.Update`. :class:`~ptb_fence.UpdateIntake` gives the
        update dict. It is :obj:`None` when not known, and then :attr:`body` is read.
        :attr:`outbox` reads it for ``reply_text``.
        """
        return self._update

    @update.setter
    def update(self, update: Any) -> None:
        self._update = update

    @property
    def failure(self) -> Optional[BaseException]:
        """:exc:`BaseException` | :obj:`None`: The failure the front end reported for this
        attempt (PTB: the handler's exception, before any error handler runs)."""
        return self._failure

    def report_failure(self, error: BaseException) -> None:
        """The front end's report that this attempt's handler failed with ``error`` (the
        first report is kept: it is what the attempt settles with)."""
        if self._failure is None:
            self._failure = error

    @property
    def retry_follows(self) -> bool:
        """:obj:`bool`: Whether the update runs again after the failure reported for this
        attempt (:attr:`failure`, PTB's ``context.error`` in an error handler).

        :obj:`False` on its last attempt, for a misuse, when the retry policy gives up, after
        :meth:`exhaust`, and when no failure was reported. Decided once: the settle uses the
        same answer. An error handler that talks to the user can say nothing while it is
        :obj:`True`. ``handle_exhaustion`` is the place to tell the user once (its
        ``exhaustion.outbox`` commits with the acknowledgement).
        """
        error = self._failure
        if error is None or self._result is not None:
            return False
        return self._runtime.retry_follows(self, error)

    @property
    def retry_decision(self) -> "Optional[tuple[BaseException, Optional[float]]]":
        """The failure whose retry was decided, and the delay (seconds, or :obj:`None` for no
        retry), or :obj:`None`: not decided yet."""
        return self._retry_decision

    @retry_decision.setter
    def retry_decision(self, decided: "tuple[BaseException, Optional[float]]") -> None:
        self._retry_decision = decided

    @property
    def host(self) -> AttemptHost:
        """The runtime this attempt belongs to (its store port and clock)."""
        return self._runtime

    @property
    def outbox(self) -> Outbox:
        """:class:`~ptb_fence.Outbox`: This attempt's Bot API calls, sent iff the commit that
        carries them lands (see :class:`~ptb_fence.Outbox`).

        Raises:
            TypeError: The store has no outbox (:class:`~ptb_fence.OutboxStore`), the attempt
                is not fenced, or the front end has nothing to send with (the message names
                the fix).
        """
        outbox = self._outbox
        if outbox is None:
            if not self.fenced:
                raise UsageError(
                    "attempt.outbox needs attempt-aware handling with a fenced store "
                    "(FencedUpdateProcessor, or UpdateIntake(handle_attempt=...)): an unfenced "
                    "attempt cannot decide what it committed"
                )
            refusal = self._runtime.outbox_refusal()
            if refusal is not None:
                raise UsageError(refusal)
            outbox = Outbox(self, self._runtime.outbox_defaults(),
                            self._runtime.outbox_prepare())
            with self._lock:
                if self._outbox is None:
                    self._outbox = outbox
                outbox = self._outbox
        return outbox

    def broadcast(self, name: str, chat_ids: Iterable[int], method: str = "sendMessage",
                  **params: Any) -> BroadcastWrite:
        """Start the broadcast ``name`` with this attempt's completion.

        It is :meth:`ptb_fence.ptb.FencedUpdateProcessor.broadcast` held for the commit that
        completes the update: the broadcast and its recipients land with it, or not at all. A
        failed, retried or stale attempt starts nothing. Nothing is read or written now, so it
        is safe in a coroutine. The recipients are written in the completion's transaction, so
        keep very large lists (a whole user table) to the processor's own ``broadcast``.

        Args:
            name (:obj:`str`): The broadcast's name, unique in the store. A broadcast of that
                name gets the chats it lacks. With another call it gets none (an ERROR is
                logged).
            chat_ids (Iterable[:obj:`int`]): The recipients' chat ids.
            method (:obj:`str`, optional): The Bot API method. Defaults to ``"sendMessage"``.
            **params: The call's other parameters, JSON values.

        Returns:
            :class:`ptb_fence.BroadcastWrite`: What the completion writes.

        Raises:
            UsageError: The store keeps no broadcasts, the attempt is not fenced, or the
                arguments are wrong (the message names the fix).
            RuntimeError: The completion committed already.
        """
        if not self.fenced:
            raise UsageError(
                "attempt.broadcast needs attempt-aware handling with a fenced store "
                "(FencedUpdateProcessor, or UpdateIntake(handle_attempt=...))")
        write: BroadcastWrite = self._runtime.broadcast_write(name, chat_ids, method, params)
        self.effects.hold_broadcast(write, self._runtime.broadcast_landed)
        return write

    @property
    def effects(self) -> HeldEffects:
        """What this attempt holds for the commit that completes its update."""
        held = self._effects
        if held is None:
            with self._lock:
                if self._effects is None:
                    self._effects = HeldEffects()
                held = self._effects
        return held

    def take_effects(self) -> "Optional[tuple[Any, Any]]":
        """For the runtime completing this attempt: the held effects and their handles
        (:meth:`HeldEffects.take`), or :obj:`None` when none are held (no extra work)."""
        held = self._effects
        return None if held is None else held.take()

    def effects_landed(self) -> "tuple[HeldCall, ...]":
        """For the runtime: the completion landed. The handles of the held calls it carried
        (resolved, empty when it carried none). Nothing more can be held."""
        held = self._effects
        return () if held is None else held.landed()

    def drop_effects(self, why: str = "the attempt ended without completing") -> None:
        """The attempt did not complete: discard what it held (never written)."""
        held = self._effects
        if held is not None:
            held.discard(why)

    def open_transaction(self) -> Optional[OpenTransaction]:
        """The fenced transaction of this attempt whose block runs in the calling context
        (thread or task), or :obj:`None`."""
        opened = _OPEN.get()
        return opened if opened is not None and opened.attempt is self else None

    def raise_if_finished(self) -> None:
        """Raise :exc:`~ptb_fence.AttemptFinished` if no commit of this attempt can carry a
        new write any more (completed, exhausted, or its handler returned). A write inside an
        open fenced transaction of it rides that transaction."""
        if self.open_transaction() is not None:
            return
        if self._result is Phase.COMPLETED:
            raise AttemptFinished(
                self.identity,
                "attempt already completed: its transaction(complete=True) committed, so no "
                "commit of it can carry this; queue outbox calls before or inside that "
                "transaction",
            )
        self._raise_if_finished()

    @property
    def proven_until(self) -> int:
        """:obj:`int`: The end (epoch ms) of the last lease the store confirmed."""
        return self._proven_until

    @property
    def finished(self) -> bool:
        """:obj:`bool`: Completing, completed, exhausted or ended: nothing left to renew."""
        return self._phase in _FINISHED

    @property
    def settling(self) -> bool:
        """:obj:`bool`: The handler returned and the runtime settles (or settled) it."""
        return self._phase is Phase.SETTLING or (
            self._phase is Phase.COMPLETING and self._resume is Phase.SETTLING
        )

    @property
    def holds_fence(self) -> bool:
        """:obj:`bool`: Whether a fenced transaction of this attempt is open and its ownership
        check succeeded.

        It then holds the row lock (PostgreSQL: its ``FOR UPDATE`` check, or with
        ``complete=True`` its completing ``UPDATE``, SQLite the database's write lock), so
        nobody else can claim the update until that transaction ends: the attempt provably
        still owns it, even past its lease. The lease keeper neither renews it nor
        reports it lost meanwhile.
        """
        return self._holding > 0

    @property
    def in_fenced_transaction(self) -> bool:
        """:obj:`bool`: Whether a fenced transaction of this attempt is opening or open (its row
        may be locked: the lease keeper does not renew it meanwhile)."""
        return self._opening > 0

    # -- transitions (the runtime and the lease keeper call these) ---------------------------
    def begin_settling(self) -> None:
        """RUNNING → SETTLING: the handler returned. The runtime's settle decides from now on
        whether the owner was lost (renewals continue meanwhile)."""
        with self._lock:
            if self._phase is Phase.RUNNING:
                self._phase = Phase.SETTLING
            elif self._phase is Phase.COMPLETING:
                self._resume = Phase.SETTLING

    def record_exhaustion(self, error: str, at: int) -> None:
        """→ EXHAUSTED: a terminal failure landed in the store at ``at``."""
        with self._lock:
            self._exhausted_error = error
            self._exhausted_at = at
            self._result = Phase.EXHAUSTED
            if self._phase is not Phase.ENDED:
                self._phase = Phase.EXHAUSTED
            self._proven_until = min(self._proven_until, at)  # nothing left to renew

    def end(self) -> None:
        """→ ENDED: the attempt left the lease keeper. Late renewal results are ignored."""
        with self._lock:
            self._phase = Phase.ENDED

    def _begin_completing(self) -> None:
        with self._lock:
            self._resume = self._phase if self._phase is Phase.SETTLING else Phase.RUNNING
            self._phase = Phase.COMPLETING

    def _end_completing(self, committed: bool) -> None:
        with self._lock:
            if committed:
                self._result = Phase.COMPLETED
            if self._phase is Phase.COMPLETING:
                self._phase = Phase.COMPLETED if committed else self._resume

    def renewed(self, ok: Optional[bool], lease_until: int) -> bool:
        """Apply a renewal result. Return :obj:`True` when it proves the update lost.

        ``ok`` :obj:`None` (the row was locked right now) is undecided, as is a refusal while
        this attempt holds its fence (its own transaction locks the row).
        """
        with self._lock:
            if self.finished:
                return False
            if ok:
                self._proven_until = max(self._proven_until, lease_until)
                return False
            return not (ok is None or self.holds_fence)

    def after_transactions(self, callback: Callable[[], None]) -> bool:
        """Call ``callback`` (once, on the thread that ends it) when the last fenced
        transaction of this attempt that is opening or open now has ended: by then
        :attr:`completed` says whether a completing one committed.

        Returns :obj:`False`, and never calls it, when none is open now (the caller decides
        at once: :attr:`completed` is already final for the transactions that ended).
        """
        with self._lock:
            if self._opening == 0:
                return False
            self._after.append(callback)
            return True

    def may_report_lost(self) -> bool:
        """Whether the lease keeper may report this attempt lost now: not finished, not being
        settled (the settle's result decides) and not holding its fence."""
        with self._lock:
            return not (self.finished or self.settling or self.holds_fence)

    def _raise_if_finished(self) -> None:
        """Raise :exc:`~ptb_fence.AttemptFinished` if this attempt can no longer write.

        A handler mistake, not a takeover: checked before touching the database, nothing
        logged, ``owner_lost`` untouched.
        """
        if self._result is Phase.COMPLETED:
            raise AttemptFinished(self.identity, _ALREADY_COMPLETED)
        if self._result is Phase.EXHAUSTED:
            raise AttemptFinished(self.identity, _ALREADY_EXHAUSTED)
        if self._phase in (Phase.ENDED, Phase.SETTLING):  # the runtime settles once the
            raise AttemptFinished(self.identity, _HANDLER_RETURNED)  # handler returned

    # -- owner lost -------------------------------------------------------------------------
    def mark_owner_lost(self) -> None:
        """Set :attr:`owner_lost` and wake its asyncio waiters (idempotent)."""
        with self._lock:
            if self._lost:
                return
            self._lost = True
            if self._lost_event is not None:
                self._lost_event.set()
            waiters, self._loop_waiters = self._loop_waiters, []
        for loop, future in waiters:
            try:
                loop.call_soon_threadsafe(_set_future, future)
            except RuntimeError:  # the loop is closed
                pass

    async def wait_owner_lost(self) -> None:
        """Wait (asyncio) until :attr:`owner_lost` is set, without blocking the event loop."""
        import asyncio

        loop = asyncio.get_running_loop()
        future: "asyncio.Future[None]" = loop.create_future()
        with self._lock:
            if self._lost:
                return
            self._loop_waiters.append((loop, future))
        await future

    def raise_if_lost(self) -> None:
        """Raise :exc:`~ptb_fence.OwnershipLost` if :attr:`owner_lost` is set."""
        if self._lost:
            raise OwnershipLost(self.identity)

    # -- fenced writes ----------------------------------------------------------------------
    def owns(self, connection: Any = None) -> bool:
        """Return whether this exact claim still holds an unexpired lease now.

        Args:
            connection: The caller's open DB-API connection (or cursor) to the store's
                database, or a SQLAlchemy ``Connection``/``Session`` or Django connection on
                it (their DB-API connection is used and a Session begins its transaction). The
                check then runs inside the caller's transaction (PostgreSQL:
                ``SELECT … FOR UPDATE``). Without it the answer is advisory only.
        """
        port = self._runtime.port
        if connection is not None:
            connection = dbapi_connection(connection)
        return port.owns(self.identity, self._runtime.now_ms(), connection=connection)

    @contextmanager
    def transaction(self, *, connection: Any = None, complete: bool = False) -> Iterator[Any]:
        """Open a transaction that holds only while this attempt owns its update.

        Opens a transaction on a connection of the store's own driver (``sqlite3.Connection``
        for SQLite, a psycopg2 connection for PostgreSQL, :obj:`None` for the memory store) —
        or uses ``connection`` —, checks :meth:`owns` inside it, yields the connection for the
        domain writes, and commits on exit. The block cannot commit, roll back or close it
        itself: a DB-API connection is yielded wrapped (the driver's own in all else), whose
        ``commit()``, ``rollback()``, ``close()`` and ``COMMIT`` statements raise
        :exc:`~ptb_fence.TransactionEnded` before anything reaches the database (a SQLAlchemy
        Session or Connection and Django refuse their commits the same way). With
        ``complete=True`` on a store with ``complete_owned``
        (:class:`~ptb_fence.BatchStore`: the SQLite and PostgreSQL stores) the
        check and the completion are one conditional statement at
        the start, which holds the row until the commit. An exception in the block rolls both
        back, so the attempt still owns its update and fails or is retried as usual.

        How long it may stay open: while it is open the ownership check's lock is held
        (PostgreSQL: the update's row, SQLite: the whole database's write lock), the attempt's
        lease is not renewed and it is not reported lost. With ``complete=True`` it completes
        however long it stayed open (settled at the time of its ownership check). Without, it
        keeps the update only if it ends within about 3/4 of ``lease_seconds``. After that the
        next renewal is refused and :attr:`owner_lost` fires. On SQLite every other write of
        every process (renewals, claims, records) waits meanwhile, at most the store's
        ``busy_timeout``, then fails and is reported: keep fenced transactions short.

        ``connection`` may be what the handler holds, on the store's database:

        - a DB-API connection or cursor (sqlite3, psycopg2, psycopg 3, another driver's). It
          is committed (or rolled back) on exit. One in autocommit mode is put in a
          transaction (``BEGIN``) before the ownership check and ends with ``COMMIT`` (or
          ``ROLLBACK``). A block that writes nothing runs in a transaction too.
        - a SQLAlchemy 2 ``Session`` (or ``scoped_session``) or ``Connection``: the check and
          the settle run on its DB-API connection, in its transaction, and on exit the Session
          is flushed and committed (a Connection's transaction committed) by SQLAlchemy. The
          block receives the Session or Connection. A Session inside ``session.begin()`` or
          a Connection already in a transaction is refused (:exc:`ValueError`): their commit
          would come later, after the attempt counted as completed.
        - a Django connection (``django.db.connection``): the transaction is a
          ``transaction.atomic()`` block that Django commits on exit. Refused inside another
          ``atomic()`` block (:exc:`ValueError`).

        Args:
            connection: Use this connection (see above) instead of one of the store's.
            complete: Also settle the attempt as completed in the same commit, so a crash
                after the commit never re-runs the handler.

        Raises:
            OwnershipLost: The attempt no longer owns the update. Everything was rolled back.
            AttemptFinished: The attempt was already completed or exhausted, or its handler
                returned (a mistake in the handler, not a lost lease). Nothing was opened.
            TransactionEnded: The block tried to commit, roll back or close the connection
                (refused), ended its transaction by a way no guard saw (a cursor's
                ``COMMIT``: the outbox calls written in it are dropped), or left it marked for
                rollback (Django ``set_rollback(True)``, a failed SQLAlchemy flush).
                ``complete=True`` settled nothing. A misuse: the attempt is not retried.
            UsageError: ``connection`` is none of the above, or an asyncio connection or
                session (the message names what works). Nothing was opened. A misuse.
        """
        block = FencedBlock(self, connection, complete)
        try:
            with block.manager as conn:
                yielded = block.enter(conn)
                try:
                    yield yielded
                except BaseException:
                    block.raised()
                    raise
                finally:  # before the commit: then the pool may lend it to other calls
                    block.left()
                block.before_commit()
            block.committed()
        finally:
            block.end()

    def interrupt_transactions(self) -> int:
        """End this attempt's open fenced transactions on the store's own PostgreSQL
        connections at once (a stop gave up waiting and the update is released next): the
        connection is cut, the server rolls back and unlocks the row, the block's next
        statement or commit fails. Others (a caller's connection, SQLite, the memory store)
        end by themselves. Returns how many were interrupted."""
        with self._lock:
            return sum(1 for conn in self._connections if interrupt(conn))

    def _reopen(self, checked_at: int, conn: Any) -> None:
        """The block ended the transaction itself: if it committed, its commit also landed
        the completion made at the start. Undo it (the handler's mistake is reported as
        :exc:`~ptb_fence.TransactionEnded` and the attempt fails and is retried as usual)."""
        try:
            self._runtime.port.reopen_completed(self.identity, checked_at, connection=conn)
        except Exception:  # the TransactionEnded that follows is the error the handler sees
            _LOGGER.warning(
                "update %s attempt %s: the block committed its fenced transaction itself and "
                "the completion it carried could not be undone",
                self.update_id,
                self.attempt,
                exc_info=True,
            )

    def _undo_escape(
        self, opened: OpenTransaction, first: bool, checked_at: int, conn: Any,
        given: Optional[CallerConnection],
    ) -> None:
        """The block raised: if it had ended its transaction itself first, by a way no guard
        saw, undo what escaped of the fence's own (the completion made at the start, the
        outbox calls written), as when the block returns. Never raises: the block's error
        is the one to report."""
        try:
            ended = transaction_ended(conn) if given is None else given.ended()
            if ended != COMMITTED_OR_ROLLED_BACK:
                return
            if first:
                self._reopen(checked_at, conn if given is None else given.store_connection())
        except Exception:
            _LOGGER.warning(
                "update %s attempt %s: could not tell whether the failed block had ended its "
                "fenced transaction itself",
                self.update_id,
                self.attempt,
                exc_info=True,
            )
            return
        if opened.call_ids:
            self._drop_escaped(opened.call_ids)

    def _drop_escaped(self, call_ids: "list[int]") -> None:
        """The block ended its transaction itself after writing outbox calls: a commit
        through a way no guard saw (a cursor's ``COMMIT``) may have committed them outside
        the fence. Delete them before the dispatcher's next sweep finds them (the commit
        that ended the block woke no sender)."""
        port = self._runtime.port
        for call_id in call_ids:
            try:
                port.drop_call(call_id)
            except Exception:  # the TransactionEnded that follows is the error to report
                _LOGGER.warning(
                    "update %s attempt %s: outbox call %s escaped the fence with the block's "
                    "own commit and could not be dropped",
                    self.update_id,
                    self.attempt,
                    call_id,
                    exc_info=True,
                )

    def _complete_after_commit(self, checked_at: int) -> None:
        """Settle completed right after the caller's commit (a store without ``connection=``
        on ``settle_owned``): the block's writes are committed whatever happens here."""
        self._begin_completing()
        landed = False
        taken = self.take_effects()
        try:
            port = self._runtime.port
            if taken is None:
                landed = port.settle_owned(self.identity, Completed(checked_at))
            else:  # the held calls ride the completion's own commit
                # a moved state version (a StateConflict) is "not landed" here: the block's
                # writes are committed already, so the update runs again (at least once)
                landed = bool(port.settle_owned_many(
                    [(self.identity, Completed(checked_at))], effects={self.identity: taken[0]}
                )[0])
        finally:
            self._end_completing(landed)
            if taken is not None:
                if landed:
                    self._runtime.calls_committed(self.effects_landed())
                else:
                    self.drop_effects("the attempt's completion did not land")
        if not landed:
            _LOGGER.warning(
                "update %s attempt %s: the transaction committed but its completion did not "
                "land (the store settles after the commit): the update runs again",
                self.update_id,
                self.attempt,
            )
            self.mark_owner_lost()

    def exhaust(self, reason: str) -> None:
        """Record a terminal failure now: no more retries. The exhaustion handler is called.

        With a durable store and an exhaustion handler the update becomes an unacknowledged
        exhaustion (delivered until acknowledged). Otherwise it is settled abandoned.

        Raises:
            OwnershipLost: The attempt no longer owns the update. Nothing was recorded.
            AttemptFinished: The attempt was already completed or exhausted, or its handler
                returned. Nothing was recorded.
        """
        if not isinstance(reason, str) or not reason:
            raise ValueError("exhaust(reason) needs a non-empty reason text")
        self._raise_if_finished()
        if not self._runtime.settle_exhausted(self, reason):
            raise OwnershipLost(self.identity)

    # -- effect keys and recorded steps -----------------------------------------------------
    def effect_key(self, name: str) -> str:
        """Return the idempotency key of the work ``name`` of this update.

        It is the same in every attempt at this update: a retry, a takeover after a crash,
        a run after a deploy. It differs for another update, another name and another bot.
        Pass it to an API that honours idempotency keys (a payment provider), so the work is
        applied once however often it is asked for.

        The key is 45 characters long: ``ptbf-`` and 40 lowercase hexadecimal digits. It is
        safe in an HTTP header and in a URL.

        Args:
            name (:obj:`str`): What the work is, unique within the handler (e.g. ``"charge"``).
                At most 200 characters.

        Raises:
            UsageError: ``name`` is empty, too long or not a :obj:`str`.
        """
        return effect_key(self._runtime.port.bot_id, self.update_id, self._body, self._update,
                          name)

    async def step(self, name: str, fn: Callable[[str], Any]) -> Any:
        """Do the work ``name`` once across the attempts at this update, and return its result.

        If an earlier attempt recorded a result for ``name``, it is returned and ``fn`` is not
        called. Otherwise ``fn(key)`` is called with :meth:`effect_key` of ``name``. It may be
        a plain or an ``async def`` function. Its result must be JSON. It is recorded at once,
        fenced, in a commit of its own: the record stays when the attempt fails later, and a
        stale attempt's record is refused. Concurrent steps share commits.

        One window is left: a crash after ``fn`` returned and before its record landed calls
        ``fn`` again in the next attempt, with the same key. An API that honours the key
        applies the work once.

        Args:
            name (:obj:`str`): What the work is (see :meth:`effect_key`).
            fn: Called with the effect key. It does the work and returns what the retry needs.

        Returns:
            The result, decoded from its JSON (a tuple comes back as a list).

        Raises:
            OwnershipLost: The attempt no longer owns its update. The work was done, its
                result is not recorded. The new owner calls ``fn`` again with the same key.
            UsageError: The store records no steps, the result is not JSON, ``name`` is not
                a name, or the step was called inside :meth:`transaction`.
            AttemptFinished: As in :meth:`transaction`.
        """
        key = self._begin_step(name)
        found = await self._off_loop(lambda: self._runtime.port.read_step(key))
        if found is not None:
            return decode_result(found.result)
        result = fn(key)
        if inspect.isawaitable(result):
            result = await result
        text = encode_result(name, result)
        await self.run_in_transaction(lambda conn: self._record_step(conn, key, name, text))
        return decode_result(text)

    def step_blocking(self, name: str, fn: Callable[[str], Any]) -> Any:
        """The blocking form of :meth:`step`, for :class:`~ptb_fence.UpdateIntake` handlers
        and worker threads. ``fn`` must be a plain function.

        Raises:
            UsageError: ``fn`` returned an awaitable (use ``await attempt.step(...)``), or as
                in :meth:`step`.
            OwnershipLost: As in :meth:`step`.
            AttemptFinished: As in :meth:`transaction`.
        """
        key = self._begin_step(name)
        found = self._runtime.port.read_step(key)
        if found is not None:
            return decode_result(found.result)
        result = fn(key)
        if inspect.isawaitable(result):
            if inspect.iscoroutine(result):
                result.close()
            raise UsageError(
                f"step {name!r}: fn returned an awaitable. step_blocking calls a plain "
                "function. In an async handler use 'await attempt.step(name, fn)'"
            )
        text = encode_result(name, result)
        with self.transaction() as conn:
            self._record_step(conn, key, name, text)
        return decode_result(text)

    def steps(self) -> "list[StepRecord]":
        """Return the steps recorded for this update so far, by any attempt (a blocking read).
        Empty on a store without steps."""
        return self._runtime.port.steps_of(self.update_id)

    def _begin_step(self, name: str) -> str:
        """Check a step may start here. Its effect key."""
        step_name(name)
        self._raise_if_finished()
        if not self._runtime.port.has_steps:
            raise UsageError(self._runtime.port.no_steps())
        self.identity  # noqa: B018 - raises the fix for an attempt without a claim id
        if _OPEN.get() is not None:
            # its record is a commit of its own: inside an open block it would wait for that
            # block's lock (SQLite) or outlive its rollback
            raise UsageError(
                f"step {name!r} was called inside attempt.transaction(): call it before or "
                "after the block. Its result is recorded in a commit of its own"
            )
        return self.effect_key(name)

    def _record_step(self, conn: Any, key: str, name: str, text: str) -> None:
        """Inside a fenced transaction: record the step, refused if the attempt lost."""
        record = StepRecord(key, self.update_id, name, text, self.attempt, self.claim_id,
                            self._runtime.now_ms())
        if not self._runtime.port.record_step(record, connection=conn):
            raise OwnershipLost(self.identity)

    # -- asyncio forms: the blocking store calls run off the event loop ---------------------
    async def run_in_transaction(
        self, fn: Callable[[Any], T], *, connection: Any = None, complete: bool = False
    ) -> T:
        """Run ``fn(connection)`` on a worker thread inside :meth:`transaction`.

        The asyncio form of :meth:`transaction`: it never blocks the event loop.

        On the store's own connection (no ``connection=``, a store with ``complete_owned``)
        concurrent calls share commits. One that finds two transactions of the store in
        flight waits on the event loop (no thread held) and then runs with the others that
        waited, in one transaction, each in a savepoint of its own, with one commit. What
        holds for :meth:`transaction` holds for each of them. A block that raises, or whose
        attempt lost its update, is rolled back to its savepoint alone and its caller gets
        its error. When the shared commit fails, each runs again in a transaction of its
        own. At low load a call runs alone at once, as before.

        Args:
            fn: Called with the transaction's connection. Its result is returned.
            connection: As in :meth:`transaction` (e.g. a SQLAlchemy ``Session``). ``fn``
                receives it. For Django call :meth:`transaction` in a function you run
                with :func:`asyncio.to_thread` instead, and close that thread's connection
                there (``django.db.close_old_connections()``): Django connections belong to
                the thread that opened them.
            complete: As in :meth:`transaction`.

        Raises:
            OwnershipLost: The attempt no longer owns the update. ``fn``'s writes were
                rolled back.
            UsageError: ``fn`` is an ``async def`` function (or returned an awaitable): it
                would write nothing. Pass a plain function. The transaction is rolled back.
                Or ``connection`` is an asyncio connection or session (the message names
                the recipe that works). Nothing was opened.
            AttemptFinished: As in :meth:`transaction`.
            TransactionEnded: As in :meth:`transaction`.
        """
        self._raise_if_finished()
        if inspect.iscoroutinefunction(fn):
            raise UsageError(_ASYNC_FN)
        if connection is not None:
            refused = asyncio_refusal(connection)  # at the call, not later on a thread
            if refused is not None:
                raise UsageError(refused)

        if connection is None and self._runtime.port.completes_first:
            # commits, not statements, are what concurrent fenced writes wait for: those
            # that arrive while the store's transactions are in flight share the next one
            return await run_grouped(self, fn, complete, self._off_loop)
        return await self._off_loop(lambda: self.run_alone(fn, connection, complete))

    def open_block(self, complete: bool) -> "FencedBlock":
        """Open a fenced block of this attempt on a connection a group commits."""
        return FencedBlock(self, None, complete, False)

    def run_alone(self, fn: Callable[[Any], T], connection: Any = None,
                  complete: bool = False) -> T:
        """Run ``fn(connection)`` inside :meth:`transaction`, on this thread, in a
        transaction of its own. Returns ``fn``'s result.

        Raises:
            UsageError: ``fn`` returned an awaitable (the transaction is rolled back).
        """
        with self.transaction(connection=connection, complete=complete) as conn:
            result = fn(conn)
            if inspect.isawaitable(result):
                if inspect.iscoroutine(result):
                    result.close()  # never awaited: no "never awaited" warning either
                raise UsageError(_ASYNC_FN)  # rolls the transaction back
            return result

    async def _off_loop(self, fn: Callable[[], T]) -> T:
        """Run blocking ``fn`` on the runtime's store threads (keeping context variables)."""
        hop = self._runtime.executor
        if hop is None:
            import asyncio

            return await asyncio.to_thread(fn)
        return await hop.run(fn)

    async def owns_async(self, connection: Any = None) -> bool:
        """The asyncio form of :meth:`owns`: the store call runs off the event loop."""
        return await self._off_loop(lambda: self.owns(connection))

    async def exhaust_async(self, reason: str) -> None:
        """The asyncio form of :meth:`exhaust`: the store call runs off the event loop."""
        await self._off_loop(lambda: self.exhaust(reason))


class FencedBlock:
    """One fenced transaction of an attempt, in the steps its driver takes.

    :meth:`Attempt.transaction` drives one around the store's own commit (or the caller's).
    A :class:`~ptb_fence.runtime._transaction_group.TransactionGroup` drives several on one
    connection, a savepoint each, and commits them together. Building one opens it (the
    lease keeper leaves the row alone): :meth:`end` must follow, whatever happens.

    Args:
        attempt: The attempt whose transaction it is.
        connection: The caller's connection, or :obj:`None` for the store's own.
        complete: Also settle the attempt as completed in the same commit.
        store_transaction: Open the store's own transaction as :attr:`manager`
            (:obj:`False`: the driver brings the connection and commits it).

    Raises:
        AttemptFinished: As in :meth:`Attempt.transaction`. Nothing was opened.
        UsageError: As in :meth:`Attempt.transaction`. Nothing was opened.
    """

    __slots__ = (
        "_call_ids",
        "_checked_at",
        "_complete",
        "_conn",
        "_first",
        "_given",
        "_holding",
        "_inside",
        "_open_here",
        "_opened",
        "_own",
        "_refusals",
        "_taken",
        "_token",
        "attempt",
        "identity",
        "manager",
    )

    def __init__(
        self, attempt: Attempt, connection: Any, complete: bool, store_transaction: bool = True
    ) -> None:
        port = attempt.host.port
        identity = self.identity = attempt.identity
        attempt._raise_if_finished()
        self.attempt = attempt
        self._complete = complete
        # a store whose owns/settle_owned take no connection= cannot settle inside the
        # caller's commit: it settles right after it (at-least-once completion, see StorePort)
        self._inside = inside = port.atomic_completion
        # with the capability, the ownership check IS the settle: one conditional statement at
        # the start that locks the row until the commit (the rollback restores the claim)
        self._first = complete and inside and port.completes_first
        self._given: Optional[CallerConnection] = None
        self.manager: Any = None
        if connection is not None:
            # a TypeError for unknown objects
            self.manager = self._given = caller_connection(connection, identity)
        elif store_transaction:
            self.manager = port.transaction()  # TypeError naming the fix when the store has none
        self._conn: Any = None
        self._checked_at = 0
        self._holding = False
        self._own = False
        self._open_here = False
        self._opened: Optional[OpenTransaction] = None
        self._refusals: "Optional[BlockConnection | CallerConnection]" = None
        self._token: "Optional[contextvars.Token[Optional[OpenTransaction]]]" = None
        self._taken: "Optional[tuple[Any, Any]]" = None
        self._call_ids: "Optional[list[int]]" = None
        with attempt._lock:
            # from here until the transaction ends the lease keeper leaves this attempt's row
            # alone: once the ownership check below locked it, a renewal would wait on the lock
            attempt._opening += 1

    def enter(self, conn: Any, check: Any = None) -> Any:
        """Check ownership inside the transaction open on ``conn`` (through ``check``, the
        same connection as the driver wants the check sent, when given), and return what the
        block receives.

        Raises:
            OwnershipLost: The attempt no longer owns the update.
        """
        attempt = self.attempt
        runtime = attempt.host
        port = runtime.port
        identity = self.identity
        given = self._given
        if given is not None:
            # a connection in autocommit mode is put in a transaction first: the check's row
            # lock must last until this block's commit
            given.prepare()
        self._checked_at = checked_at = runtime.now_ms()
        if self._first:
            owned = port.complete_owned(identity, checked_at, connection=check or conn)
        else:
            owned = port.owns(identity, checked_at, connection=check or conn)
        if not owned:
            attempt._raise_if_finished()  # it finished meanwhile (e.g. another thread)
            runtime.log_transaction_refused(attempt)
            # the database's refusal is the authoritative proof of loss
            attempt.mark_owner_lost()
            raise OwnershipLost(identity)
        self._conn = conn
        own = self._own = given is None and conn is not None  # a stop may interrupt it
        with attempt._lock:
            attempt._holding += 1
            self._holding = True
            if own:
                attempt._connections.append(conn)
        if given is not None:
            # a store whose owns does not use the caller's connection left it outside a
            # transaction: open one, so the block's reads and writes are one transaction and
            # a block that writes nothing is not taken for one that committed
            given.begin()
        # what a store's own transaction() yields may still be outside one (a store that
        # begins lazily): only a transaction open here can have been ended
        self._open_here = (transaction_ended(conn) if given is None else given.ended()) is None
        self._opened = opened = OpenTransaction(attempt, conn, self._open_here)
        # a DB-API connection reaches the block guarded: its commit() and rollback() are
        # refused before they reach the database (an ORM's hooks do the same)
        yielded = conn if given is None else given.yielded
        guard: Optional[BlockConnection] = None
        if yielded is not None and (given is None or isinstance(given, GivenConnection)):
            yielded = guard = BlockConnection(yielded, identity)
        self._refusals = guard if guard is not None else given
        self._token = _OPEN.set(opened)
        return yielded

    def run(self, fn: Callable[[Any], T], conn: Any, check: Any = None) -> T:
        """:meth:`enter`, ``fn`` with what the block receives, :meth:`left` and
        :meth:`before_commit`, with this attempt the :func:`current_attempt`. Returns
        ``fn``'s result.

        Raises:
            UsageError: ``fn`` returned an awaitable (it would write nothing).
        """
        token = _CURRENT.set(self.attempt)
        try:
            yielded = self.enter(conn, check)
            try:
                result = fn(yielded)
                if inspect.isawaitable(result):
                    if inspect.iscoroutine(result):
                        result.close()  # never awaited: no "never awaited" warning either
                    raise UsageError(_ASYNC_FN)
            except BaseException:
                self.raised()
                raise
            finally:
                self.left()
            self.before_commit()
            return result
        finally:
            _CURRENT.reset(token)

    def raised(self) -> None:
        """The block raised: undo what escaped of it if it had ended its transaction itself
        by a way no guard saw (a refused commit ended nothing)."""
        refusals = self._refusals
        if self._open_here and (refusals is None or refusals.refused is None):
            assert self._opened is not None
            self.attempt._undo_escape(
                self._opened, self._first, self._checked_at, self._conn, self._given
            )

    def landed_with_escape(self) -> Optional[bool]:
        """After another block ended the shared transaction itself: whether this block's
        completion landed with it (it was committed, not rolled back), or :obj:`None` when
        this block made no completion at its start to tell by."""
        if not self._first:
            return None
        port = self.attempt.host.port
        return not port.owns(self.identity, self._checked_at)

    def left(self) -> None:
        """The block returned or raised (before the commit: then the pool may lend the
        connection to other calls)."""
        if self._token is not None:
            _OPEN.reset(self._token)
            self._token = None
        if self._own:
            self._own = False
            attempt = self.attempt
            with attempt._lock:
                attempt._connections.remove(self._conn)

    def before_commit(self) -> None:
        """The block returned: refuse what it ended itself, then write the held effects and
        the completion.

        Raises:
            TransactionEnded: As in :meth:`Attempt.transaction`.
            OwnershipLost: The completion's settle did not land.
        """
        refusals = self._refusals
        if refusals is not None and refusals.refused is not None:
            raise refusals.refused  # caught in the block: it still fails
        attempt = self.attempt
        runtime = attempt.host
        port = runtime.port
        identity = self.identity
        given = self._given
        conn = self._conn
        opened = self._opened
        assert opened is not None
        ended = transaction_ended(conn) if given is None else given.ended()
        if ended is not None and (self._open_here or ended != COMMITTED_OR_ROLLED_BACK):
            if self._first and ended == COMMITTED_OR_ROLLED_BACK:
                # complete=True settled nothing
                attempt._reopen(self._checked_at, given.store_connection() if given else conn)
            if opened.call_ids and not ended.startswith(ROLLBACK_MARK):
                attempt._drop_escaped(opened.call_ids)
            if ended.startswith(ROLLBACK_MARK):
                raise TransactionEnded(identity, ended, _MARKED.format(how=ended))
            raise TransactionEnded(identity, ended)
        if self._complete and self._inside:
            # what the attempt held rides this commit (its ids are known at once)
            self._taken = taken = attempt.take_effects()
            if taken is not None:
                self._call_ids = port.write_effects(
                    identity, taken[0], runtime.now_ms(), connection=conn
                )
            attempt._begin_completing()
            # Completed at the time of the ownership check, not "now": the check locked the row
            # (PostgreSQL FOR UPDATE, SQLite the database's write lock, the memory store its
            # lock) and the lock is held until this commit, so no other claim can have
            # happened since. A competing claim waits for the lock and then sees the completed
            # row. So a transaction that stayed open past its lease still completes, exactly
            # once.
            settled = self._first or port.settle_owned(
                identity, Completed(self._checked_at), connection=conn
            )
            if not settled:
                attempt.mark_owner_lost()
                raise OwnershipLost(identity)

    def committed(self) -> None:
        """The commit landed: resolve the effects it carried, complete the attempt, wake the
        sender."""
        attempt = self.attempt
        completes = self._complete and self._inside
        landed_calls: "tuple[HeldCall, ...]" = ()
        if self._taken is not None:
            self._taken = None
            landed_calls = attempt.effects.landed(self._call_ids)
        elif completes:
            attempt.effects_landed()  # completed: nothing more can be held
        if completes:
            attempt._end_completing(True)
        elif self._complete:
            attempt._complete_after_commit(self._checked_at)
        if landed_calls or (self._opened is not None and self._opened.wrote_calls):
            attempt.host.calls_committed(landed_calls)

    def end(self) -> None:
        """The transaction ended, committed or not (after :meth:`committed` when it was):
        restore what did not land, and tell who waits for the attempt's transactions."""
        attempt = self.attempt
        if self._taken is not None:  # written, then rolled back: still held for a completion
            self._taken = None
            attempt.effects.restore()
        # also when the commit itself failed: the attempt is then not complete
        if self._complete:
            attempt._end_completing(False)  # no-op once committed
        with attempt._lock:
            attempt._opening -= 1
            if self._holding:
                self._holding = False
                attempt._holding -= 1
            after: "list[Callable[[], None]]" = []
            if attempt._opening == 0:
                after, attempt._after = attempt._after, []
        for callback in after:
            try:
                callback()
            except Exception:  # what waited for this transaction must not break its end
                _LOGGER.exception(
                    "update %s attempt %s: reporting the end of its fenced transaction failed",
                    attempt.update_id,
                    attempt.attempt,
                )


def _set_future(future: "asyncio.Future[None]") -> None:
    if not future.done():
        future.set_result(None)
