"""SharedState: the per-update state the processor, its ingest and its sweeper share."""

from __future__ import annotations

import asyncio
from typing import Callable, Dict, List, Optional, Set

from ptb_fence.runtime._attempt import Attempt
from ptb_fence.runtime._runtime import Record

__all__ = ["Recorded", "SharedState"]

Recorded = Record
"""What recording one update gave: the pre-claimed :class:`Attempt` (a fenced store claimed
it at ingest), :obj:`True` (recorded, to be claimed when handled) or :obj:`False` (already
recorded: a duplicate, not queued again)."""


class SharedState:
    """Which updates this processor holds, and whether it may queue more.

    Used on the event loop thread only. Guarantees:

    - An ``update_id`` is in :attr:`inflight` from its booking for the queue until its
      processing ends or it is released. So the sweep and the retry timers never queue an
      update that is already queued or running here.
    - A pre-claimed :class:`Attempt` held here is either taken by the update's processing or
      given back with ``release``. None is dropped while its lease keeps being renewed.

    Attributes:
        inflight: Ids of updates queued or being processed here.
        ingested: Outcomes of a ``getUpdates`` batch recorded before PTB puts its updates.
        preclaimed: Attempts claimed at ingest, waiting for their update's processing.
        started: The processor is initialized (and not shut down).
        stopping: ``Application.stop()`` began (or shutdown): nothing more is queued.
        finishing: Ids of the updates queued or being processed when stopping began: they
            may still start until the stop's deadline (:meth:`may_start`).
        batch_ingest: The Bot's ``getUpdates`` answers are recorded whole.
        parked: Returns how many of the updates held here wait for their chat's turn (the
            processor's chat turns). They do not count for :meth:`wait_for_room`.
    """

    __slots__ = (
        "_finished",
        "_release",
        "_room",
        "_room_below",
        "parked",
        "batch_ingest",
        "finishing",
        "inflight",
        "ingested",
        "preclaimed",
        "recording",
        "started",
        "stopping",
    )

    def __init__(self, release: Callable[[List[Attempt]], None]) -> None:
        self._release = release
        self.inflight: Set[int] = set()
        self.ingested: Dict[int, Recorded] = {}
        self.preclaimed: Dict[int, Attempt] = {}
        # ids whose put is recording them now (not booked yet): a sweep that lists the row
        # meanwhile must not queue a second copy (the copy that loses the claim would end the
        # update's stay in flight while the other still waits to start)
        self.recording: Set[int] = set()
        self.started = False
        self.stopping = False
        self.finishing: Set[int] = set()
        self._finished: Optional[asyncio.Event] = None
        self.batch_ingest = False
        # how many held updates wait for their chat's turn (set by the processor)
        self.parked: Callable[[], int] = lambda: 0
        # the poller waiting for room (see wait_for_room), woken by done()
        self._room: "Optional[asyncio.Future[None]]" = None
        self._room_below = 0

    def held(self, update_id: int) -> bool:
        """Whether ``update_id`` is already on its way here: queued or processed
        (:attr:`inflight`), being recorded by a put, or recorded by a ``getUpdates`` batch
        and about to be put. A sweep or a retry timer must not queue it again."""
        return (
            update_id in self.inflight
            or update_id in self.recording
            or update_id in self.ingested
        )

    def may_start(self, update_id: int) -> bool:
        """Whether the update's handling may start now: not stopping, or it was queued when
        stopping began and the stop still waits for it."""
        return not self.stopping or update_id in self.finishing

    def begin_stopping(self) -> None:
        """Stopping began: queue nothing more. The updates queued or being processed now may
        still start (:attr:`finishing`)."""
        self.stopping = True
        self.finishing = set(self.inflight)
        self._wake_poller()

    def holding(self) -> int:
        """Updates held here that may take a slot: queued or processed, or recorded by a
        ``getUpdates`` answer and about to be put, less those waiting for their chat's turn
        (:attr:`parked`)."""
        return len(self.inflight) + len(self.ingested) - self.parked()

    async def wait_for_room(self, below: int, recheck: float = 1.0) -> None:
        """Wait until fewer than ``below`` updates are :meth:`holding` here, or stopping
        began. Used by the poller before each ``getUpdates``: Telegram keeps what is not
        fetched (unconfirmed), so a backlog waits there instead of as tasks in this process
        (whose memory, and the garbage collector's passes over it, grow with the backlog).
        Updates waiting for their chat's turn do not count: a chat that floods the bot does
        not hold back the other chats' updates. ``recheck``: seconds after which the count
        is read again even unwoken."""
        while self.holding() >= below and not self.stopping:
            room = self._room
            if room is None or room.done():
                room = self._room = asyncio.get_running_loop().create_future()
            self._room_below = below
            await asyncio.wait((room,), timeout=recheck)

    def _wake_poller(self) -> None:
        room = self._room
        if room is not None and not room.done() and (
            self.stopping or self.holding() < self._room_below
        ):
            room.set_result(None)
            self._room = None

    def done(self, update_id: int) -> None:
        """The processing of ``update_id`` ended (or it will not be queued after all)."""
        self.inflight.discard(update_id)
        if self._room is not None:
            self._wake_poller()
        finishing = self.finishing
        if finishing:
            finishing.discard(update_id)
            if not finishing and self._finished is not None:
                self._finished.set()

    async def wait_finished(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds until every update of :attr:`finishing` was
        processed. Returns :obj:`True` when they were. Then (either way) nothing more may start."""
        try:
            if self.finishing:
                self._finished = asyncio.Event()
                try:
                    await asyncio.wait_for(self._finished.wait(), max(timeout, 0.0))
                except asyncio.TimeoutError:
                    pass
            return not self.finishing
        finally:
            self._finished = None
            self.finishing = set()

    def book(self, update_id: int, outcome: Recorded) -> bool:
        """Book one recorded update for processing. Returns :obj:`False` for a duplicate."""
        if outcome is False:
            return False
        if isinstance(outcome, Attempt):
            self.preclaimed[update_id] = outcome
        self.inflight.add(update_id)
        return True

    def take_ingested(self, update_id: int) -> Optional[Recorded]:
        """The outcome of ``update_id`` if a ``getUpdates`` batch recorded it (once)."""
        return self.ingested.pop(update_id, None)

    def take_preclaimed(self, update_id: int) -> Optional[Attempt]:
        """The attempt claimed at ingest for ``update_id``, handed to its processing (once)."""
        return self.preclaimed.pop(update_id, None)

    def unqueue(self, update_id: int) -> None:
        """A booked update that will not be queued after all (stopping): release it."""
        attempt = self.preclaimed.pop(update_id, None)
        if attempt is not None:
            self._release([attempt])
        self.done(update_id)

    def release(self, attempts: List[Attempt]) -> None:
        """Give back attempts that will not be started (claimable at once where the store
        can release)."""
        self._release(attempts)

    def take_unstarted(self, *, ingested_only: bool = False) -> List[Attempt]:
        """Take the pre-claimed attempts held here (all, or only those of :attr:`ingested`,
        which PTB never put): they will not be started."""
        stale: List[Attempt] = [v for v in self.ingested.values() if isinstance(v, Attempt)]
        self.ingested.clear()
        if not ingested_only:
            stale += list(self.preclaimed.values())
            self.preclaimed.clear()
        return stale

    def release_preclaimed(self, *, ingested_only: bool = False) -> None:
        """Give back the pre-claimed attempts held here (as :meth:`take_unstarted`), in one
        ``release``."""
        stale = self.take_unstarted(ingested_only=ingested_only)
        if stale:
            self._release(stale)
