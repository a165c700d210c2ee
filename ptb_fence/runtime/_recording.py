"""Recording, grouped claims and grouped completion: runtime operations shared by both front
ends.

A mixin of :class:`~ptb_fence.runtime._core.Runtime`; every store call goes through its port.
"""

from __future__ import annotations

import itertools
import logging
import threading
from typing import TYPE_CHECKING, Any, Callable, Hashable, List, Optional, Sequence, Tuple, Union

from ptb_fence._values import AttemptIdentity, Completed, Settlement
from ptb_fence.runtime._chats import stored_chat_key

if TYPE_CHECKING:
    from ptb_fence.runtime._attempt import Attempt
    from ptb_fence.runtime._lease_keeper import LeaseKeeper
    from ptb_fence.runtime._options import RuntimeOptions
    from ptb_fence.runtime._outcome import Outcome
    from ptb_fence.runtime._port import Recorded, Row, StorePort

__all__ = ["REDELIVERIES_AT_INFO", "Record", "RecordingOps"]

_LOGGER = logging.getLogger("ptb_fence.ingest")

REDELIVERIES_AT_INFO = 5
"""How many redeliveries dropped at ingest one runtime logs at INFO; later ones at DEBUG (a
redelivery is normal for webhooks, but a bot that drops every new message must be able to see
why)."""

Record = Union["Attempt", bool]
"""Per recorded update: the :class:`~ptb_fence.Attempt` it was claimed with at ingest (already
registered with the lease keeper), :obj:`True` (recorded pending) or :obj:`False` (the id
exists: a duplicate)."""


class RecordingOps:
    """``record``, ``record_many``, ``record_and_complete``, ``claim_many`` and
    ``complete_many``."""

    __slots__ = ()

    if TYPE_CHECKING:
        port: StorePort
        options: RuntimeOptions
        attempt_aware: bool
        delivers_exhaustions: bool
        keeper: LeaseKeeper
        running_count: Callable[[], int]
        _ingest_lock: threading.Lock
        _redeliveries: "itertools.count[int]"

        def release(self, attempts: Sequence[Attempt]) -> int: ...

        @property
        def uses_claim_ids(self) -> bool: ...

        def adopt(
            self,
            identity: AttemptIdentity,
            lease_until: int,
            body: Optional[str] = None,
            *,
            at_ingest: bool = True,
        ) -> Attempt: ...

        def completion_settled(self, attempt: Attempt, landed: bool) -> Outcome: ...

        def completion_failed(self, attempt: Attempt, error: BaseException) -> Outcome: ...

        def _store_settle(self, attempt: Attempt, settlement: Settlement) -> bool: ...

        def claim(self, update_id: int, body: Optional[str] = None) -> Optional[Attempt]: ...

        def report_store_error(
            self, error: BaseException, step: str, *, ids: "Optional[dict[str, Any]]" = None
        ) -> None: ...

    def record(self, update_id: int, body: str, chat: Hashable = None) -> bool:
        """Record one update as pending; :obj:`False` when its id exists (a duplicate).

        ``update_id`` must be valid (:func:`ptb_fence._update_ids.is_update_id`); a store
        error propagates (the update was not recorded: do not acknowledge it to Telegram).
        ``chat``: the update's chat key (:func:`~ptb_fence.runtime._chats.chat_key`), stored
        under ``strict_chat_order``.
        """
        if self.options.strict_chat_order:
            return self.record_many([(update_id, body)], chats=[chat])[0] is True
        added = self.port.add(update_id, body, self.options.now_ms())
        if not added:
            self._dropped_redelivery(update_id)
        return added

    def _note_redeliveries(
        self, items: Sequence[Tuple[int, str]], records: Sequence[Record]
    ) -> None:
        for (update_id, _), record in zip(items, records):
            if record is False:
                self._dropped_redelivery(update_id)

    def _dropped_redelivery(self, update_id: int) -> None:
        """Say that ``update_id`` was not recorded because its id is already recorded.

        The first :data:`REDELIVERIES_AT_INFO` of this runtime log at INFO: a fake Bot API
        restarted against a kept database numbers its updates from the start again, and a
        bot that then drops every new message without a word looks broken. A different update
        under a recorded id was already logged at WARNING by the store.
        """
        seen = next(self._redeliveries)
        extra = {"update_id": update_id}
        if seen >= REDELIVERIES_AT_INFO:
            _LOGGER.debug("update %s is already recorded: not handled again", update_id,
                          extra=extra)
            return
        _LOGGER.info(
            "update %s is already recorded: not handled again (a redelivery, which is normal; "
            "if it is a new message, its update id was used before: a test Bot API restarted "
            "against a kept database, or two bots sharing one table)%s",
            update_id,
            "; further redeliveries are logged at DEBUG" if seen == REDELIVERIES_AT_INFO - 1
            else "",
            extra=extra,
        )

    def _rows(self, items: Sequence[Tuple[int, str]], now: int) -> "List[Row]":
        return [(update_id, body, now) for update_id, body in items]

    def _claims_at_ingest(self, claim: bool) -> bool:
        # under strict_chat_order an update is claimed only when it is its chat's turn
        return (
            claim
            and self.uses_claim_ids
            and self.port.claims_at_ingest
            and not self.options.strict_chat_order
        )

    def _adopt_all(
        self, recorded: "List[Recorded]", items: Sequence[Tuple[int, str]], lease_until: int
    ) -> List[Record]:
        return [
            value if isinstance(value, bool) else self.adopt(value, lease_until, body)
            for value, (_, body) in zip(recorded, items)
        ]

    def record_many(
        self,
        items: Sequence[Tuple[int, str]],
        *,
        claim: bool = False,
        chats: Optional[Sequence[Hashable]] = None,
    ) -> List[Record]:
        """Record ``(update_id, body)`` updates (one commit where the store can).

        With ``claim`` (and a fenced runtime whose store records and claims in one commit,
        ``port.claims_at_ingest``) the first fresh updates, as many as the claim budget allows
        (``max_concurrent + ingest_claim_buffer`` minus the claims held here), are claimed for
        their first attempt in the same commit and returned as registered
        :class:`~ptb_fence.Attempt` objects; the others are recorded pending (:obj:`True`,
        a second commit). :obj:`False`: a duplicate. A store error propagates (attempts
        claimed by the first commit are then released). ``chats``: per item its chat key,
        stored under ``strict_chat_order`` (which never claims at ingest).
        """
        records = self._record_many(items, claim=claim, chats=chats)
        self._note_redeliveries(items, records)
        return records

    def _record_many(
        self,
        items: Sequence[Tuple[int, str]],
        *,
        claim: bool,
        chats: Optional[Sequence[Hashable]],
    ) -> List[Record]:
        now = self.options.now_ms()
        if self.options.strict_chat_order:
            keys = list(chats) if chats is not None else [None] * len(items)
            return list(
                self.port.add_many_in_chats(
                    [(u, body, now, stored_chat_key(key)) for (u, body), key in zip(items, keys)]
                )
            )
        rows = self._rows(items, now)
        if not self._claims_at_ingest(claim):
            return list(self.port.add_many(rows))
        with self._ingest_lock:  # the budget is counted and spent by one recorder at a time
            options = self.options
            budget = self._claim_budget()
            if budget == 0:
                return list(self.port.add_many(rows))
            lease_until = options.lease_deadline(now)
            recorded = self.port.record_claimed(
                rows[:budget],
                lease_until=lease_until,
                now=now,
                max_attempts=options.max_attempts,
                durable_exhaustion=self.delivers_exhaustions,
            )
            claimed = self._adopt_all(recorded, items[:budget], lease_until)
        if len(rows) <= budget:
            return claimed
        try:
            rest = list(self.port.add_many(rows[budget:]))
        except BaseException:
            self.release([value for value in claimed if not isinstance(value, bool)])
            raise
        return claimed + rest

    def _claim_budget(self) -> int:
        """How many more claims at ingest: ``max_concurrent + ingest_claim_buffer`` minus the
        claims held here (being renewed) minus the slots still free (the front end may claim
        for them when it starts an update recorded pending). So claims waiting to start never
        exceed the buffer, and all claims held never exceed ``max_concurrent + buffer``."""
        held = len(self.keeper.active())
        running = min(self.running_count(), held)
        return max(0, self.options.ingest_claim_buffer - (held - running))

    @property
    def claims_in_groups(self) -> bool:
        """:obj:`bool`: :meth:`claim_many` claims in one statement (a fenced runtime, a store
        with ``claim_owned_many``, no ``strict_chat_order``); otherwise it is the loop of
        :meth:`claim`, and a front end gains nothing by grouping its claims."""
        return (
            self.uses_claim_ids
            and self.port.claims_many_at_once
            and not self.options.strict_chat_order
        )

    def claim_many(
        self, update_ids: Sequence[int], bodies: Optional[Sequence[Optional[str]]] = None
    ) -> "List[Optional[Attempt]]":
        """Claim updates that start now for their next attempt (one commit where the store
        can: :attr:`claims_in_groups`), each registered with the lease keeper.

        Per position what :meth:`claim` gives: the attempt, or :obj:`None` when it was not
        taken (a live lease elsewhere, a final row, attempts spent, an id repeated in
        ``update_ids``) or when the store failed (reported per update as step ``"claim"``;
        the lease and the sweep take care of the updates).
        """
        texts = list(bodies) if bodies is not None else [None] * len(update_ids)
        if not self.claims_in_groups or len(update_ids) < 2:
            return [self.claim(update_id, text) for update_id, text in zip(update_ids, texts)]
        options = self.options
        now = options.now_ms()
        lease_until = options.lease_deadline(now)
        try:
            identities = self.port.claim_owned_many(
                update_ids,
                now=now,
                lease_until=lease_until,
                max_attempts=options.max_attempts,
                durable_exhaustion=self.delivers_exhaustions,
            )
        except Exception as exc:
            for update_id in update_ids:  # as if each had been claimed on its own
                self.report_store_error(exc, "claim", ids={"update_id": update_id})
            return [None] * len(update_ids)
        return [
            None if identity is None else self.adopt(identity, lease_until, text, at_ingest=False)
            for identity, text in zip(identities, texts)
        ]

    def complete_many(self, attempts: Sequence["Attempt"]) -> "List[Outcome]":
        """Settle handled attempts as completed (one commit where the store can).

        Per attempt its outcome: ``COMPLETED``, or ``LOST`` when the settle did not land
        (``owner_lost`` fired) or the store failed (reported as step ``"settle"``).
        """
        if not attempts:
            return []
        at = self.options.now_ms()
        fenced = all(attempt.fenced for attempt in attempts)
        try:
            if fenced:
                landed = self.port.settle_owned_many(
                    [(attempt.identity, Completed(at)) for attempt in attempts]
                )
            else:
                landed = [self._store_settle(attempt, Completed(at)) for attempt in attempts]
        except Exception as exc:
            return [self.completion_failed(attempt, exc) for attempt in attempts]
        return [self.completion_settled(a, ok) for a, ok in zip(attempts, landed)]

    def record_and_complete(
        self,
        items: Sequence[Tuple[int, str]],
        attempts: Sequence["Attempt"],
        *,
        claim: bool = True,
        chats: Optional[Sequence[Hashable]] = None,
    ) -> "Tuple[Union[List[Record], BaseException], List[Outcome]]":
        """:meth:`record_many` and :meth:`complete_many` as one group: one commit where the
        store can record, claim and settle together (``add_claimed_and_settle_many``).

        Returns the records (or the store error that prevented them: do not acknowledge those
        updates) and the outcomes of the completions.
        """
        if (
            not items
            or not attempts
            or not self._claims_at_ingest(claim)
            or not (self.port.records_and_settles_together and all(a.fenced for a in attempts))
            or len(items) > self._claim_budget()  # claims only part: two commits
        ):
            try:
                records: "Union[List[Record], BaseException]" = (
                    self.record_many(items, claim=claim, chats=chats) if items else []
                )
            except Exception as exc:
                records = exc
            return records, self.complete_many(attempts)
        now = self.options.now_ms()
        lease_until = self.options.lease_deadline(now)
        try:
            recorded, landed = self.port.record_claimed_and_settle(
                self._rows(items, now),
                [(attempt.identity, Completed(now)) for attempt in attempts],
                lease_until=lease_until,
                now=now,
                max_attempts=self.options.max_attempts,
                durable_exhaustion=self.delivers_exhaustions,
            )
        except Exception as exc:
            return exc, [self.completion_failed(attempt, exc) for attempt in attempts]
        records = self._adopt_all(recorded, items, lease_until)
        self._note_redeliveries(items, records)
        return records, [self.completion_settled(a, ok) for a, ok in zip(attempts, landed)]
