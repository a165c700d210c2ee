"""HeldEffects: what an attempt holds to write in the commit that completes its update.

One place for every effect that must land exactly when the completion lands (the outbox's Bot
API calls, durable jobs, broadcasts, and the persisted bot state of a :class:`StateSource` such
as FencedPersistence's session): the attempt *has* one. The runtime takes its :class:`~ptb_fence.AttemptEffects`
when it completes the attempt (the grouped completion's ``commit`` with ``Batch.effects``, or
a ``transaction(complete=True)`` through ``write_effects``), then tells it whether that commit
landed.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable, List, Optional, Protocol, Sequence, Tuple

from ptb_fence._values import AttemptEffects, BroadcastWrite, JobWrite, OutboxCall, StateWrite
from ptb_fence.runtime._held_call import HeldCall

__all__ = ["HeldEffects", "OpenTransaction", "StateSource", "Taken"]

_LOGGER = logging.getLogger("ptb_fence.runtime")


class StateSource(Protocol):
    """Persisted state an attempt changed, written with its completion: asked for its writes
    when the completion is written (so changes up to that moment ride it), told once how the
    attempt ended."""

    def take(self) -> Tuple[StateWrite, ...]:
        """The versioned writes for the commit being written now (none: nothing changed)."""

    def end(self, writes: Tuple[StateWrite, ...], landed: bool) -> None:
        """The attempt ended: ``writes`` landed with its completion (``landed``), or nothing
        of it did."""

Taken = Tuple[AttemptEffects, Tuple[HeldCall, ...]]
"""What :meth:`HeldEffects.take` gives: the effects to write and the handles they resolve."""


class OpenTransaction:
    """A fenced transaction of an attempt whose block runs in this context: effects made in
    it are written through its connection (and commit or roll back with it).

    Attributes:
        attempt: The attempt whose transaction it is.
        connection: The connection the store's ``write_effects`` runs on (:obj:`None` for the
            memory store).
        wrote_calls (:obj:`bool`): A call was written in it (its commit wakes the sender).
        call_ids (List[:obj:`int`]): The outbox ids of the calls written in it (dropped if
            the block ended the transaction itself and they escaped with its commit).
        checkable (:obj:`bool`): The connection's transaction was seen open at the start,
            so one seen ended later was ended by the block.
    """

    __slots__ = ("attempt", "connection", "wrote_calls", "call_ids", "checkable")

    def __init__(self, attempt: object, connection: Any, checkable: bool = False) -> None:
        self.attempt = attempt
        self.connection = connection
        self.wrote_calls = False
        self.call_ids: List[int] = []
        self.checkable = checkable


class HeldEffects:
    """The effects one attempt holds until its completion commits.

    Thread-safe: a handler may queue from worker threads. While a completion is writing them
    (between :meth:`take` and :meth:`landed`/:meth:`restore`) nothing more can be held: a
    call made then could not ride the commit, and is refused rather than lost.
    """

    __slots__ = ("_broadcasts", "_calls", "_cancels", "_handles", "_jobs", "_lock", "_next_seq",
                 "_state", "_taken", "_taken_state", "_closed")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._calls: List[OutboxCall] = []
        self._handles: List[HeldCall] = []
        self._next_seq = 0
        self._taken = False
        self._closed: Optional[str] = None  # why nothing more can be held
        self._state: Optional[StateSource] = None
        self._taken_state: Tuple[StateWrite, ...] = ()
        # durable jobs scheduled and removed, each with the object the handler holds
        self._jobs: List[Tuple[JobWrite, Any]] = []
        self._cancels: List[Any] = []
        # broadcasts started, each with what to call once it landed
        self._broadcasts: List[Tuple[BroadcastWrite, Callable[[BroadcastWrite], None]]] = []

    @property
    def closed(self) -> bool:
        """:obj:`bool`: Nothing more can be held (committed, or discarded)."""
        return self._closed is not None

    @property
    def empty(self) -> bool:
        """:obj:`bool`: Nothing is held (the completion writes no effects)."""
        return (not self._calls and self._state is None and not self._jobs
                and not self._cancels and not self._broadcasts)

    def hold_state(self, source: StateSource) -> None:
        """Write ``source``'s state with the completion (asked when it is written) and tell it
        how the attempt ended.

        Raises:
            RuntimeError: The attempt already ended or holds a state source.
        """
        with self._lock:
            if self._closed is not None:
                raise RuntimeError(self._closed)
            if self._state is not None:
                raise RuntimeError("the attempt already holds persisted state")
            self._state = source

    def next_seq(self) -> int:
        """The next call's position in the attempt (also for calls written in a transaction,
        so every call of an attempt has its own ``seq``)."""
        with self._lock:
            seq = self._next_seq
            self._next_seq += 1
            return seq

    def hold_call(self, call: OutboxCall, handle: HeldCall) -> None:
        """Hold ``call`` for the completion.

        Raises:
            RuntimeError: The completion is being written, or the attempt ended: the call
                would be lost (the message says why).
        """
        with self._lock:
            if self._closed is not None:
                raise RuntimeError(self._closed)
            if self._taken:
                raise RuntimeError(
                    "the attempt's completion is being committed right now: a call queued "
                    "from another thread at this moment cannot ride it; queue calls before "
                    "the handler completes"
                )
            self._calls.append(call)
            self._handles.append(handle)

    def hold_job(self, write: JobWrite, job: Any) -> None:
        """Write the durable job ``write`` with the completion. ``job`` is the handler's object
        of it (its ``job_id`` is not known before the commit).

        Raises:
            RuntimeError: As :meth:`hold_call`.
        """
        with self._lock:
            self._refuse_if_closed_or_taken("a job scheduled")
            self._jobs.append((write, job))

    def cancel_job(self, job: Any) -> None:
        """Remove the durable job ``job`` with the completion (one scheduled by this attempt:
        it is not written at all).

        Raises:
            RuntimeError: As :meth:`hold_call`.
        """
        with self._lock:
            self._refuse_if_closed_or_taken("a job removed")
            kept = [(write, held) for write, held in self._jobs if held is not job]
            if len(kept) != len(self._jobs):
                self._jobs = kept
            elif getattr(job, "job_id", None) is not None:
                self._cancels.append(job)

    def hold_broadcast(self, write: BroadcastWrite,
                       landed: Callable[[BroadcastWrite], None]) -> None:
        """Start the broadcast ``write`` with the completion. ``landed(write)`` is called once
        the completion committed it.

        Raises:
            RuntimeError: As :meth:`hold_call`.
        """
        with self._lock:
            self._refuse_if_closed_or_taken("a broadcast started")
            self._broadcasts.append((write, landed))

    def _refuse_if_closed_or_taken(self, what: str) -> None:
        if self._closed is not None:
            raise RuntimeError(self._closed)
        if self._taken:
            raise RuntimeError(
                f"the attempt's completion is being committed right now: {what} from another "
                "thread at this moment cannot ride it. Do it before the handler completes"
            )

    def take(self) -> Optional[Taken]:
        """The effects to write now, or :obj:`None` when nothing is held. Until
        :meth:`landed` or :meth:`restore`, nothing more can be held."""
        with self._lock:
            state = self._take_state()
            self._taken_state = state
            if (not self._calls and not state and not self._jobs and not self._cancels
                    and not self._broadcasts):
                return None
            self._taken = True
            return AttemptEffects(
                calls=tuple(self._calls), state=state,
                jobs=tuple(write for write, _ in self._jobs),
                cancelled_jobs=tuple(int(job.job_id) for job in self._cancels),
                broadcasts=tuple(write for write, _ in self._broadcasts),
            ), tuple(self._handles)

    def landed(self, call_ids: Optional[Sequence[int]] = None) -> Tuple[HeldCall, ...]:
        """The completion committed, with the taken effects if any were taken
        (``call_ids``: their ids, in order, when the write returned them). Nothing more can be
        held afterwards. Returns the handles of the taken calls (none: nothing was taken)."""
        with self._lock:
            handles: List[HeldCall] = []
            started: List[Tuple[BroadcastWrite, Callable[[BroadcastWrite], None]]] = []
            if self._taken:
                handles, self._handles, self._calls = self._handles, [], []
                self._jobs, self._cancels = [], []
                started, self._broadcasts = self._broadcasts, []
            self._taken = False
            self._closed = "the attempt's completion committed: nothing more can ride it"
            source, self._state = self._state, None
            written, self._taken_state = self._taken_state, ()
        self._tell(source, written, True)
        for write, landed in started:
            try:
                landed(write)
            except Exception:
                _LOGGER.exception("broadcasts: telling the sender of %r failed", write.name)
        for i, handle in enumerate(handles):
            handle.resolve(call_ids[i] if call_ids is not None and i < len(call_ids) else None)
        return tuple(handles)

    def restore(self) -> None:
        """The commit that carried the taken effects rolled back. The attempt still owns its
        update (e.g. its ``transaction(complete=True)`` block raised): keep them held."""
        with self._lock:
            self._taken = False
            self._taken_state = ()

    def discard(self, why: str = "the attempt ended without completing") -> None:
        """The attempt did not complete: drop everything held (never written, never sent).
        Later calls are refused with ``why``."""
        with self._lock:
            handles, self._handles, self._calls = self._handles, [], []
            self._jobs, self._cancels, self._broadcasts = [], [], []
            self._taken = False
            self._closed = why
            source, self._state = self._state, None
            self._taken_state = ()
        self._tell(source, (), False)
        for handle in handles:
            handle.discard()

    def _take_state(self) -> Tuple[StateWrite, ...]:
        """The state source's writes (under the lock). A source raises only where one attempt
        is concerned (FencedPersistence computes them in the update's own task before a
        grouped completion, and a ``transaction(complete=True)`` takes them for itself), so
        its error fails that attempt and nothing of it is written."""
        return () if self._state is None else self._state.take()

    @staticmethod
    def _tell(source: Optional[StateSource], writes: Tuple[StateWrite, ...], landed: bool) -> None:
        """Tell the state source how the attempt ended. Its failure is logged, never raised
        into the completion (which already happened)."""
        if source is None:
            return
        try:
            source.end(writes, landed)
        except Exception:
            _LOGGER.exception("persisted state: handling the end of the attempt failed")
