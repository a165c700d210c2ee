"""Ingest: recording updates before they are acknowledged, and grouped completions.

It records one update put into the durable queue, grouped with the others put at the same time.
It records a whole ``getUpdates`` answer in one commit, claimed at ingest with a fenced store
that can. It hands on what landed while its ingest was cancelled. It completes successful fenced
attempts in groups: one commit for the completions, and the fresh updates, that arrive
together. It claims the updates that start together in one more commit.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any, Callable, Dict, List, Optional, Tuple

from telegram import Update

from ptb_fence._errors import is_misuse
from ptb_fence._update_ids import is_update_id
from ptb_fence._values import StateEntry, StateKey
from ptb_fence.ptb._bodies import (
    ingest_error,
    log_recording_again,
    parse_update,
    raw_body,
    update_body,
    valid_update_id,
)
from ptb_fence.ptb._group_commit import AsyncGroupCommit
from ptb_fence.ptb._persistence import FencedPersistence
from ptb_fence.ptb._state import Recorded, SharedState
from ptb_fence.ptb._threads import StoreThreads
from ptb_fence.runtime._attempt import Attempt
from ptb_fence.runtime._backoff import Backoff
from ptb_fence.runtime._chats import chat_key, update_chat_key
from ptb_fence.runtime._runtime import Runtime

__all__ = ["Ingest"]

_LOGGER = logging.getLogger("ptb_fence.ptb")

_NO_ROOM: Any = object()
"""A grouped claim the bound had no room for (it waits and goes with a later group)."""

POLL_AHEAD = 200
"""The least :attr:`Ingest.poll_ahead`: two ``getUpdates`` pages (PTB's default ``limit`` is
100), so the next page is fetched while a full one still waits. Measured: with one page the
pipeline ran dry at page ends and groups shrank. With four, the held tasks cost the garbage
collector as much as no bound."""


class Ingest:
    """Records updates for one processor. The durable queue's
    :class:`~ptb_fence.ptb._interfaces.UpdateRecorder` and the getUpdates wrapper's
    :class:`~ptb_fence.ptb._interfaces.BatchRecorder`.

    Args:
        runtime: The processor's runtime.
        state: The state shared with the processor and its sweeper.
        threads: The store threads.
        application: Returns the attached Application (or :obj:`None`).
        redeliver: Queues an update that is already recorded. Returns :obj:`False` when stopping.
        processor_name: The class name of the processor (for messages).
    """

    __slots__ = (
        "_application",
        "_claiming",
        "_claims",
        "_grouped_completion",
        "_name",
        "_redeliver",
        "_room",
        "_runtime",
        "_state",
        "_threads",
        "_writer",
    )

    def __init__(
        self,
        runtime: Runtime,
        state: SharedState,
        threads: StoreThreads,
        application: Callable[[], Any],
        redeliver: Callable[[Update], bool],
        processor_name: str,
    ) -> None:
        self._name = processor_name
        self._runtime = runtime
        self._state = state
        self._threads = threads
        self._application = application
        self._redeliver = redeliver
        # group commits: updates put at the same time (webhook) are recorded together, and
        # completions that arrive together are settled together
        # (fresh updates and completions that arrive together share one commit when the store
        # can do both in one transaction: its commit)
        # (claims ride in it where the store settles and claims in one commit: its groups
        # then wait for the items of the updates that advance together, see AsyncGroupCommit)
        self._writer: AsyncGroupCommit[Tuple[str, Any], Any] = AsyncGroupCommit(
            self._write_many, "ptb_fence:write", gather=runtime.claims_with_completions
        )
        # claims of the updates that start together: one commit per group, in a pipeline of
        # their own (a group of claims is in the store while a group of completions is)
        self._claims: AsyncGroupCommit[int, Optional[Attempt]] = AsyncGroupCommit(
            self._claim_many, "ptb_fence:claim"
        )
        self._claiming = 0  # claims submitted and not yet back
        self._room: "List[asyncio.Future[None]]" = []  # claims waiting for room

    # -- what the queue and the getUpdates wrapper see ---------------------------------------
    @property
    def stopping(self) -> bool:
        """``Application.stop()`` began: nothing more is queued."""
        return self._state.stopping

    @property
    def active(self) -> bool:
        """The processor is initialized."""
        return self._state.started

    @property
    def processor_name(self) -> str:
        """The class name of the processor (for messages)."""
        return self._name

    @property
    def records_batches(self) -> bool:
        """``getUpdates`` answers are recorded now."""
        return self._state.started or self._state.batch_ingest

    def _persistence(self) -> Tuple[Any, Optional[FencedPersistence]]:
        """The Application and its FencedPersistence, if it has one."""
        application = self._application()
        persistence = getattr(application, "persistence", None)
        return application, persistence if isinstance(persistence, FencedPersistence) else None

    def unqueue(self, update_id: int) -> None:
        """A recorded update will not be queued after all (stopping): release it."""
        self._state.unqueue(update_id)

    async def record(self, update: Update) -> bool:
        """Record ``update`` (grouped with the updates put at the same time). Returns :obj:`False`
        for a duplicate or an update without a Telegram ``update_id``."""
        if not valid_update_id(update):
            self._runtime.stats.invalid()
            return False
        application, persistence = self._persistence()
        known = self._state.take_ingested(update.update_id)
        if known is not None:
            if persistence is not None and known is not False:
                # recorded with its getUpdates answer: its state is read now, with the
                # updates of that answer queued with it (one read)
                persistence.prefetch(application, update)
            return self._state.book(update.update_id, known)
        # read right after the record, in the same store call (no read of its own later)
        keys = [] if persistence is None else persistence.state_keys(application, update)
        state = self._state
        state.recording.add(update.update_id)  # a sweep meanwhile leaves it to this put
        try:
            # one loop iteration first: a handler that woke this put (a webhook answering
            # after the previous update was handled) has its processing finish meanwhile, so
            # its slot is free and its completion goes to the store in the same commit as
            # this record
            await asyncio.sleep(0)
            try:
                body = update_body(update)
                outcome = await self._writer.submit(
                    ("add", (update.update_id, body, update_chat_key(update), keys)),
                    orphan=lambda landed: self._hand_on(update, landed),
                )
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                raise ingest_error(update.update_id, exc) from exc
            return state.book(update.update_id, outcome)
        finally:
            state.recording.discard(update.update_id)

    def record_blocking(self, update: Update) -> bool:
        """As :meth:`record`, blocking the calling thread (``put_nowait``)."""
        if not valid_update_id(update):
            self._runtime.stats.invalid()
            return False
        known = self._state.take_ingested(update.update_id)
        if known is not None:
            return self._state.book(update.update_id, known)
        try:
            outcome = self._runtime.record_many(
                [(update.update_id, update_body(update))],
                claim=True,
                chats=[update_chat_key(update)],
            )
        except Exception as exc:
            raise ingest_error(update.update_id, exc) from exc
        return self._state.book(update.update_id, outcome[0])

    @property
    def poll_ahead(self) -> int:
        """:obj:`int`: A ``getUpdates`` is sent only while fewer updates than this wait for a
        slot or run here: ``max(POLL_AHEAD, 2 * max_concurrent)``."""
        return max(POLL_AHEAD, 2 * self._runtime.options.max_concurrent)

    async def wait_for_room(self) -> None:
        """Before the Updater's next ``getUpdates``: wait until fewer than
        :attr:`poll_ahead` updates wait for a slot or run here (see
        :meth:`SharedState.wait_for_room <ptb_fence.ptb._state.SharedState.wait_for_room>`).
        Not for a ``getUpdates`` outside the Updater's polling (its last one in
        ``Updater.stop()`` confirms the offset and must not wait)."""
        updater = getattr(self._application(), "updater", None)
        if updater is None or not updater.running or not self._state.started:
            return
        await self._state.wait_for_room(self.poll_ahead)

    async def record_batch(self, result: List[Any]) -> None:
        """Record a whole getUpdates answer in one commit (called by RecordingRequest)."""
        updater = getattr(self._application(), "updater", None)
        if updater is not None and not updater.running:
            # not the Updater's polling (e.g. its last getUpdates in Updater.stop(), or a
            # manual call): PTB puts none of these, and Telegram keeps them (they are not
            # confirmed), so recording (and claiming) them would only strand them for a lease
            return
        items = []
        raws: List[Any] = []
        for raw in result:
            if isinstance(raw, dict) and is_update_id(raw.get("update_id")):
                items.append((raw["update_id"], raw_body(raw)))
                raws.append(raw)
            else:
                self._runtime.stats.invalid()
        # the rule of update_chat_key, on the dict. Stored only under strict_chat_order
        chats = ([chat_key(raw) for raw in raws]
                 if self._runtime.options.strict_chat_order else None)
        if not items:
            return
        # anything left from an earlier batch was never put (PTB stopped or dropped it):
        # give it back (claimable at once)
        self._state.release_preclaimed(ingested_only=True)
        backoff = Backoff()
        while True:
            try:
                outcome = await self._threads.call_handing_on(
                    lambda: self._runtime.record_many(items, claim=True, chats=chats),
                    lambda landed: self._hand_on_batch(raws, landed),
                )
                break
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                ids = [update_id for update_id, _ in items]
                if is_misuse(exc) or updater is None or not updater.running:
                    raise ingest_error(ids, exc) from exc
                # the answer is in hand: recorded again after a back-off, not fetched again
                # after PTB's (growing to 30 s: the work would resume that late)
                wait = backoff.failed()
                outage = self._runtime.stats.outage
                level = outage.failed("ingest")
                log_recording_again(ids, exc, level, wait,
                                    outage.note("ingest") if level == logging.ERROR else "")
                await asyncio.sleep(wait)
        for (update_id, _), value in zip(items, outcome):
            self._state.ingested[update_id] = value

    # -- grouped completion ------------------------------------------------------------------
    async def complete(self, attempt: Attempt) -> Any:
        """Complete ``attempt`` (one that :meth:`Runtime.completes_in_group
        <ptb_fence.runtime._runtime.Runtime.completes_in_group>`) in one commit with the
        completions (and fresh updates) that arrive at the same time, then end it (also when cancelled: no longer renewed, no
        longer held). Returns the runtime's outcome."""
        try:
            return await self._writer.submit(("done", attempt))
        finally:
            self._runtime.end(attempt)
            self._ended()

    # -- grouped claims ----------------------------------------------------------------------
    async def claim(self, update_id: int) -> Optional[Attempt]:
        """Claim ``update_id`` for the attempt that starts now: in one commit with the claims
        that arrive at the same time where the store claims many at once
        (:attr:`Runtime.claims_in_groups`), else on its own. :obj:`None`: not taken.

        If the caller is cancelled while the claim is in the store, a claim that still landed
        is released (claimable at once), not left to its lease."""
        runtime = self._runtime
        if not runtime.claims_in_groups:
            return await self._threads.call_handing_on(
                lambda: runtime.claim(update_id), self._release_orphan
            )
        if runtime.claims_with_completions:
            return await self._claim_with_completions(update_id)
        # the bound: claims held (completions still in the store included) and claims on
        # their way stay within max_concurrent + ingest_claim_buffer
        options = runtime.options
        bound = options.max_concurrent + options.ingest_claim_buffer
        while runtime.keeper.count() + self._claiming >= bound:
            room = asyncio.get_running_loop().create_future()
            self._room.append(room)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(room, 0.05)  # woken by ended() (or looks again)
        self._claiming += 1
        try:
            attempt: Optional[Attempt] = await self._claims.submit(
                update_id, orphan=self._release_orphan
            )
        finally:
            self._claiming -= 1
        return attempt

    async def _claim_with_completions(self, update_id: int) -> Optional[Attempt]:
        """Claim in the writer's next group, in the commit that settles the completions of
        that group (one ``commit``): the slots those completions free are claimed
        in the commit that frees them. The group admits as many claims as the bound leaves
        room for once its completions landed. A claim it has no room for waits for an attempt
        to end and goes with a later group."""
        while True:
            result = await self._writer.submit(("claim", update_id), orphan=self._release_orphan)
            if result is not _NO_ROOM:
                attempt: Optional[Attempt] = result
                return attempt
            room = asyncio.get_running_loop().create_future()
            self._room.append(room)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(room, 0.05)  # woken by ended() (or looks again)

    def _ended(self) -> None:
        """An attempt ended (no longer held): the claims waiting for room look again."""
        waiting, self._room = self._room, []
        for room in waiting:
            if not room.done():
                room.set_result(None)

    def _release_orphan(self, attempt: Any) -> None:
        if isinstance(attempt, Attempt):
            self._state.release([attempt])

    # -- groups of writes (on the store threads) ----------------------------------------------
    async def _claim_many(self, update_ids: List[int]) -> List[Optional[Attempt]]:
        """One group of claims (:meth:`Runtime.claim_many`: one commit)."""
        return await self._threads.call(self._runtime.claim_many, update_ids)

    async def _write_many(self, items: List[Tuple[str, Any]]) -> List[Any]:
        """One group of writes: ``("add", (update_id, body, chat, state keys))`` records a fresh
        update and reads its state keys after the commit, for FencedPersistence (result:
        what :meth:`Runtime.record_many` gives for it, or the exception to raise to ``put``),
        ``("done", attempt)`` completes an attempt (result: the outcome). The runtime does it
        in one commit where the store can."""
        adds = [(i, payload) for i, (kind, payload) in enumerate(items) if kind == "add"]
        dones = [(i, payload) for i, (kind, payload) in enumerate(items) if kind == "done"]
        claims = [(i, payload) for i, (kind, payload) in enumerate(items) if kind == "claim"]
        results: List[Any] = [None] * len(items)
        attempts = [attempt for _, attempt in dones]
        claim_ids = [update_id for _, update_id in claims]
        claimed: List[Optional[Attempt]] = []
        runtime = self._runtime
        if adds:
            wanted = list(dict.fromkeys(k for _, (_, _, _, keys) in adds for k in keys))

            def record_then_read() -> Tuple[Any, Optional[Dict[StateKey, StateEntry]]]:
                done = runtime.record_and_complete(
                    [(update_id, body) for _, (update_id, body, _, _) in adds],
                    attempts,
                    claim=True,
                    chats=[chat for _, (_, _, chat, _) in adds],
                )
                rows = None
                if wanted:
                    try:
                        rows = runtime.port.read_state(wanted)
                    except Exception:  # each attempt reads for itself then (and reports)
                        _LOGGER.debug("reading state ahead failed", exc_info=True)
                return done, rows

            (records, outcomes), rows = await self._threads.call(record_then_read)
            if rows is not None:
                _, persistence = self._persistence()
                if persistence is not None:
                    persistence.deposit(
                        [(update_id, keys) for _, (update_id, _, _, keys) in adds if keys], rows
                    )
            if claims:  # after the records (which claim first, at ingest)
                claimed = (await self._threads.call(runtime.complete_and_claim, [], claim_ids))[1]
            for n, (i, _) in enumerate(adds):
                results[i] = records if isinstance(records, BaseException) else records[n]
        else:
            # the claims the bound has room for (the completions of this group, which land in
            # the same commit, make room) are admitted. The others wait for a later group
            outcomes, claimed = await self._threads.call(
                runtime.complete_and_claim, attempts, claim_ids
            )
        for (i, _), outcome in zip(dones, outcomes):
            results[i] = outcome
        for n, (i, _) in enumerate(claims):
            results[i] = claimed[n] if n < len(claimed) else _NO_ROOM
        return results

    # -- what landed while its ingest was cancelled ------------------------------------------
    def _hand_on_batch(self, raws: List[Any], outcomes: List[Recorded]) -> None:
        """A getUpdates batch landed but its caller was cancelled (``Updater.stop()``)."""
        application = self._application()
        bot = application.bot if application is not None else None
        for raw, outcome in zip(raws, outcomes):
            update: Optional[Update] = None
            if outcome is not False and bot is not None:
                try:
                    update = parse_update(raw, bot)
                except Exception:
                    _LOGGER.exception("recorded update %s cannot be parsed", raw.get("update_id"))
            if update is None:
                if isinstance(outcome, Attempt):
                    self._state.release([outcome])  # claimable at once (or after its lease)
                continue
            self._hand_on(update, outcome)

    def _hand_on(self, update: Update, outcome: Any) -> None:
        """A recorded update whose recorder was cancelled: queue it (it is ours to handle),
        or, while stopping, release it (claimable at once elsewhere)."""
        if outcome is False or isinstance(outcome, BaseException):
            return
        state = self._state
        if state.stopping or not state.started:
            if isinstance(outcome, Attempt):
                self._state.release([outcome])
            return
        _LOGGER.info(
            "update %s was recorded while its ingest was cancelled: handing it on",
            update.update_id,
            extra={"update_id": update.update_id},
        )
        state.book(update.update_id, outcome)
        if not self._redeliver(update):
            state.unqueue(update.update_id)
