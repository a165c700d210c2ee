"""Ingest: recording updates before they are acknowledged, and grouped completions.

Records one update put into the durable queue (grouped with the others put at the same time),
a whole ``getUpdates`` answer in one commit, claimed at ingest with a fenced store that can;
hands on what landed while its ingest was cancelled; and completes successful fenced
attempts in groups (one commit for the completions, and the fresh updates, that arrive
together).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable, List, Optional, Tuple

from telegram import Update

from ptb_fence._values import Completed
from ptb_fence.ptb._bodies import (
    ingest_error,
    parse_update,
    raw_body,
    update_body,
    valid_raw_update_id,
    valid_update_id,
)
from ptb_fence.ptb._group_commit import GroupCommit
from ptb_fence.ptb._state import Recorded, SharedState
from ptb_fence.ptb._threads import StoreThreads
from ptb_fence.runtime._attempt import Attempt
from ptb_fence.runtime._core import Runtime

__all__ = ["Ingest"]

_LOGGER = logging.getLogger("ptb_fence.ptb")

Row = Tuple[int, str, int]


class Ingest:
    """Records updates for one processor; the durable queue's
    :class:`~ptb_fence.ptb._interfaces.UpdateRecorder` and the getUpdates wrapper's
    :class:`~ptb_fence.ptb._interfaces.BatchRecorder`.

    Args:
        runtime: The processor's runtime.
        state: The state shared with the processor and its sweeper.
        threads: The store threads.
        application: Returns the attached Application (or :obj:`None`).
        redeliver: Queues an update that is already recorded; :obj:`False` when stopping.
        processor_name: The class name of the processor (for messages).
    """

    __slots__ = (
        "_application",
        "_combined_write",
        "_fast_claim",
        "_fast_settle",
        "_name",
        "_redeliver",
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
        # can do both in one transaction: add_claimed_and_settle_many)
        self._writer: GroupCommit[Tuple[str, Any], Any] = GroupCommit(
            self._write_many, "ptb_fence:write"
        )
        # which optional store capabilities the hot path uses (decided once)
        store = runtime.store
        fenced = runtime.uses_claim_ids
        self._fast_settle = fenced and callable(getattr(store, "settle_owned_many", None))
        self._fast_claim = fenced and callable(getattr(store, "add_claimed_many", None))
        self._combined_write = self._fast_claim and callable(
            getattr(store, "add_claimed_and_settle_many", None)
        )

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

    def unqueue(self, update_id: int) -> None:
        """A recorded update will not be queued after all (stopping): release it."""
        self._state.unqueue(update_id)

    async def record(self, update: Update) -> bool:
        """Record ``update`` (grouped with the updates put at the same time); :obj:`False`
        for a duplicate or an update without a Telegram ``update_id``."""
        if not valid_update_id(update):
            return False
        known = self._state.take_ingested(update.update_id)
        if known is not None:
            return self._state.book(update.update_id, known)
        try:
            body = update_body(update)
            outcome = await self._writer.submit(
                ("add", (update.update_id, body)),
                orphan=lambda landed: self._hand_on(update, landed),
            )
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            raise ingest_error(update.update_id, exc) from exc
        return self._state.book(update.update_id, outcome)

    def record_blocking(self, update: Update) -> bool:
        """As :meth:`record`, blocking the calling thread (``put_nowait``)."""
        if not valid_update_id(update):
            return False
        known = self._state.take_ingested(update.update_id)
        if known is not None:
            return self._state.book(update.update_id, known)
        try:
            outcome = self._store_rows(self._rows([(update.update_id, update_body(update))]))
        except Exception as exc:
            raise ingest_error(update.update_id, exc) from exc
        return self._state.book(update.update_id, outcome[0])

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
            if isinstance(raw, dict) and valid_raw_update_id(raw.get("update_id")):
                items.append((raw["update_id"], raw_body(raw)))
                raws.append(raw)
        if not items:
            return
        # anything left from an earlier batch was never put (PTB stopped or dropped it):
        # stop renewing it so its lease lapses and a sweep takes it
        self._state.release_preclaimed(ingested_only=True)
        try:
            outcome = await self._threads.call_handing_on(
                lambda: self._store_rows(self._rows(items)),
                lambda landed: self._hand_on_batch(raws, landed),
            )
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            raise ingest_error([update_id for update_id, _ in items], exc) from exc
        for (update_id, _), value in zip(items, outcome):
            self._state.ingested[update_id] = value

    # -- grouped completion ------------------------------------------------------------------
    @property
    def completes_in_groups(self) -> bool:
        """Successful fenced attempts are completed together (:meth:`complete`)."""
        return self._fast_settle

    async def complete(self, attempt: Attempt) -> Any:
        """Complete ``attempt`` in one commit with the completions (and fresh updates) that
        arrive at the same time; returns the runtime's outcome."""
        return await self._writer.submit(("done", attempt))

    # -- recording (blocking, on the store threads) ------------------------------------------
    def _rows(self, items: List[Tuple[int, str]]) -> List[Row]:
        now = self._runtime.options.now_ms()
        return [(update_id, body, now) for update_id, body in items]

    def _store_rows(self, rows: List[Row]) -> List[Recorded]:
        """Record rows (blocking): per row the pre-claimed Attempt, True, or False (exists)."""
        runtime = self._runtime
        store = runtime.store
        if self._fast_claim:
            lease_until = runtime.options.now_ms() + runtime.options.lease_ms
            return self._adopt(store.add_claimed_many(rows, lease_until=lease_until), rows, lease_until)
        if len(rows) > 1 and callable(getattr(store, "add_many", None)):
            return [bool(added) for added in store.add_many(rows)]
        return [bool(store.add(*row)) for row in rows]

    def _adopt(self, identities: List[Any], rows: List[Row], lease_until: int) -> List[Recorded]:
        """Per row: the pre-claimed Attempt (registered with the lease keeper) or False."""
        return [
            False if identity is None else self._runtime.adopt(identity, lease_until, row[1])
            for identity, row in zip(identities, rows)
        ]

    async def _write_many(self, items: List[Tuple[str, Any]]) -> List[Any]:
        """One group of writes: ``("add", (update_id, body))`` records a fresh update (result:
        as :meth:`_store_rows`, or the exception to raise to ``put``), ``("done", attempt)``
        completes an attempt (result: the outcome). One commit where the store can do both."""
        runtime = self._runtime
        store = runtime.store
        adds = [(i, payload) for i, (kind, payload) in enumerate(items) if kind == "add"]
        dones = [(i, payload) for i, (kind, payload) in enumerate(items) if kind == "done"]
        results: List[Any] = [None] * len(items)
        rows = self._rows([payload for _, payload in adds])
        at = runtime.options.now_ms()
        settlements = [(attempt.identity, Completed(at)) for _, attempt in dones]
        if adds and dones and self._combined_write:
            lease_until = at + runtime.options.lease_ms

            def both() -> "Tuple[List[Any], List[bool]]":
                added, landed = store.add_claimed_and_settle_many(
                    rows, lease_until=lease_until, settlements=settlements
                )
                return self._adopt(added, rows, lease_until), landed

            try:
                recorded, landed = await self._threads.call(both)
            except Exception as exc:
                for i, _ in adds:
                    results[i] = exc
                for i, attempt in dones:
                    results[i] = runtime.completion_failed(attempt, exc)
                return results
            for (i, _), value in zip(adds, recorded):
                results[i] = value
            for (i, attempt), ok in zip(dones, landed):
                results[i] = runtime.completion_landed(attempt, bool(ok))
            return results
        if adds:
            try:
                recorded = await self._threads.call(self._store_rows, rows)
            except Exception as exc:
                recorded = [exc] * len(adds)
            for (i, _), value in zip(adds, recorded):
                results[i] = value
        if dones:
            try:
                landed = await self._threads.call(store.settle_owned_many, settlements)
            except Exception as exc:
                for i, attempt in dones:
                    results[i] = runtime.completion_failed(attempt, exc)
            else:
                for (i, attempt), ok in zip(dones, landed):
                    results[i] = runtime.completion_landed(attempt, bool(ok))
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
                    self._runtime.end(outcome)  # its lease lapses; a sweep takes it
                continue
            self._hand_on(update, outcome)

    def _hand_on(self, update: Update, outcome: Any) -> None:
        """A recorded update whose recorder was cancelled: queue it (it is ours to handle),
        or, while stopping, release it to its lease and the sweep."""
        if outcome is False or isinstance(outcome, BaseException):
            return
        state = self._state
        if state.stopping or not state.started:
            if isinstance(outcome, Attempt):
                self._runtime.end(outcome)
            return
        _LOGGER.info(
            "update %s was recorded while its ingest was cancelled: handing it on",
            update.update_id,
            extra={"update_id": update.update_id},
        )
        state.book(update.update_id, outcome)
        if not self._redeliver(update):
            state.unqueue(update.update_id)
