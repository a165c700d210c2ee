"""Recovery: releasing claims at once, this process's liveness, taking over dead processes.

:class:`Recovery` is a collaborator of :class:`~ptb_fence.runtime._runtime.Runtime`
(``runtime.recovery``): the front ends call it when stopping begins (:meth:`Recovery.release`,
:meth:`Recovery.give_back`), at start and shutdown (:meth:`Recovery.hold_liveness`,
:meth:`Recovery.release_liveness`). The runtime's sweep and takeover watch call
:meth:`Recovery.take_over_dead`. Blocking calls only.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Callable, List, Optional, Sequence, Tuple

from ptb_fence.runtime._attempt import Attempt
from ptb_fence.runtime._outcome import ids

if TYPE_CHECKING:
    from ptb_fence.runtime._lease_keeper import LeaseKeeper, ReportStoreError
    from ptb_fence.runtime._options import RuntimeOptions
    from ptb_fence.runtime._port import StorePort
    from ptb_fence.runtime._stats import RuntimeStats

__all__ = [
    "ALONE_WAIT_SECONDS",
    "STOP_MARGIN_SECONDS",
    "AttemptTimeout",
    "Recovery",
    "clock_text",
]

_LOGGER = logging.getLogger("ptb_fence.runtime")

STOP_MARGIN_SECONDS = 2.0
"""How long after ``stop_timeout_seconds`` a stop waits for its store work (giving back what
is left, ending open fenced transactions), and how long the PTB processor's ``shutdown``
waits for its own (the lease keeper's last tick, the liveness signal). So
``Application.stop()`` returns within ``stop_timeout_seconds`` + 2 s and ``run_polling()``
within ``stop_timeout_seconds`` + 5 s (then the store's ``close()``), even when the database
does not answer. ``UpdateIntake.close()`` gives its own store work the same 2 s."""


RELEASE_RETRY_SECONDS = 0.5
"""How long :meth:`Recovery.release` tries again to release a row another short transaction
locks (a lease renewal in flight) before it leaves the row to its lease (and says so)."""


ALONE_WAIT_SECONDS = 10.0
"""How long an attempt that must run alone waits for the running handlers to end (new starts
are held meanwhile), or a suspect for its probation, before it is given back for a later
sweep."""


class AttemptTimeout(Exception):
    """An attempt's handler ran longer than ``attempt_timeout_seconds``.

    The attempt fails with this error and is retried by the ``retry`` policy (or exhausted).
    The handler was cancelled (asyncio) or abandoned (a blocking :class:`~ptb_fence.UpdateIntake`
    handler: its thread runs on). Its fenced writes are refused from then on, because the
    attempt has been settled.

    Args:
        update_id (:obj:`int`): The update.
        attempt (:obj:`int`): The attempt number.
        seconds (:obj:`float`): The limit that passed.
    """

    __slots__ = ("attempt", "seconds", "update_id")

    def __init__(self, update_id: int, attempt: int, seconds: float) -> None:
        self.update_id = update_id
        self.attempt = attempt
        self.seconds = seconds
        super().__init__(
            f"attempt {attempt} of update {update_id} ran longer than "
            f"attempt_timeout_seconds={seconds:g}: the attempt failed (its handler was "
            "cancelled, or left running on a blocking worker thread whose writes are refused)"
        )


class Recovery:
    """Gives claims back at once, holds this process's liveness signal and takes over the
    claims of dead processes.

    Args:
        port: The store port.
        options: The runtime's options (its clock).
        keeper: The lease keeper. An attempt given back is no longer renewed.
        report: How a store error is reported (the runtime's ``report_store_error``).
        stats: Where released attempts and store call durations are counted.
        taken_over: Called after dead processes' claims were made claimable (the outbox
            dispatcher's ``wake``: their calls are sent at once). :obj:`None`: nothing.
    """

    __slots__ = ("_keeper", "_options", "_port", "_report", "_stats", "_taken_over")

    def __init__(
        self,
        port: "StorePort",
        options: "RuntimeOptions",
        keeper: "LeaseKeeper",
        report: "ReportStoreError",
        stats: "RuntimeStats",
        taken_over: "Optional[Callable[[], object]]" = None,
    ) -> None:
        self._port = port
        self._options = options
        self._keeper = keeper
        self._report = report
        self._stats = stats
        self._taken_over = taken_over

    def release(self, attempts: Sequence[Attempt]) -> int:
        """Give ``attempts`` back to the store at once, in one ``release_many`` call.

        Each row becomes claimable now by any process, its attempt not counted as spent. The
        next claim writes a fresh claim id, so these attempts' fenced writes are refused from
        now on. Every attempt is ended here (no more renewals). A row another short
        transaction locks right now (a lease renewal in flight) is tried again for up to
        :data:`RELEASE_RETRY_SECONDS`. What is still not released then is logged (a WARNING
        each) and waits for its lease. Attempts that cannot be released (unfenced, or a store
        without ``release_many``) wait for their lease.

        Returns:
            The number released.
        """
        fenced: List[Attempt] = []
        for attempt in attempts:
            if attempt.fenced and not attempt.finished:
                fenced.append(attempt)
            self._keeper.unregister(attempt)
        if not fenced:
            return 0
        released, left, failure = self._release_until(
            fenced, time.monotonic() + RELEASE_RETRY_SECONDS, interrupt=False
        )
        self._log_not_released(left, failure)
        return released

    def give_back(self, attempts: Sequence[Attempt], grace: float) -> List[Attempt]:
        """Release the attempts a stop gave up waiting for. Their open fenced transactions
        are ended first. Blocking: at most about ``grace`` seconds (plus one store call).

        A locked row cannot be released (the release skips locked rows, never waits). A row
        that its attempt's own open fenced transaction locks is freed by cutting the store's
        own PostgreSQL connections of such transactions
        (:meth:`Attempt.interrupt_transactions`: rolled back by the server). One that another
        short transaction locks (a lease renewal in flight, an operator's ``SELECT ... FOR
        UPDATE``) frees itself. So the release is tried again until the row is free, the
        attempt settled, or ``grace`` passed. Each attempt is ended here (no more renewals).

        Logs what was released (INFO) and, one WARNING each, what was not and that its lease
        covers it. Returns the attempts not released whose update may still be claimed by
        them (their lease runs out by itself).
        """
        pending: List[Attempt] = []
        left: List[Attempt] = []
        for attempt in attempts:
            if attempt.result is None:  # not completed nor exhausted
                (pending if attempt.fenced else left).append(attempt)
            self._keeper.unregister(attempt)
        failure: Optional[BaseException] = None
        if pending:
            _, pending, failure = self._release_until(
                pending, time.monotonic() + grace, interrupt=True
            )
        self._log_not_released(pending + left, failure)
        return pending + left

    def _release_until(
        self, attempts: List[Attempt], deadline: float, *, interrupt: bool
    ) -> Tuple[int, List[Attempt], Optional[BaseException]]:
        """``release_many`` of ``attempts``, tried again for those whose row was not released
        while they are not settled, until ``deadline`` (monotonic). With ``interrupt`` their
        open fenced transactions are ended first. Logs what was released. Returns how many,
        the attempts not released (not settled) and the store error that ended the tries."""
        pending = attempts
        released = 0
        failure: Optional[BaseException] = None
        while pending:
            if interrupt:
                for attempt in pending:
                    if attempt.in_fenced_transaction:
                        attempt.interrupt_transactions()
            try:
                results = self._stats.timed(
                    "release",
                    self._port.release_many,
                    [attempt.identity for attempt in pending],
                    self._options.now_ms(),
                )
            except Exception as exc:
                failure = exc
                break
            locked: List[Attempt] = []
            for attempt, ok in zip(pending, results):
                if ok:
                    released += 1
                    attempt.mark_owner_lost()
                    _LOGGER.debug(
                        "released update %s attempt %s (claim %s)",
                        attempt.update_id,
                        attempt.attempt,
                        attempt.claim_id,
                        extra=ids(attempt),
                    )
                elif attempt.result is None:
                    # its own fenced transaction, or another one, still locks the row (or the
                    # claim is no longer its own, which only its lease can tell): try again
                    locked.append(attempt)
                # else: settled meanwhile (committed): nothing to give back
            pending = locked
            if not pending or time.monotonic() >= deadline:
                break
            time.sleep(0.05)
        if released:
            self._stats.attempt_ended("released", released)
            _LOGGER.info("released %d claimed update(s): claimable at once elsewhere", released)
        if failure is not None:
            self._report(failure, "settle")
        return released, [attempt for attempt in pending if attempt.result is None], failure

    @staticmethod
    def _log_not_released(attempts: List[Attempt], failure: Optional[BaseException]) -> None:
        for attempt in attempts:
            if not attempt.fenced:
                why = "an attempt without a claim id cannot be released"
            elif failure is not None:
                why = "the release failed"
            elif attempt.in_fenced_transaction:
                why = "its fenced transaction was still open (the row is locked)"
            else:
                why = (
                    "its row stayed locked by another transaction, or the claim is no longer "
                    "its own"
                )
            _LOGGER.warning(
                "update %s attempt %s was not released (%s): its lease covers it; it is "
                "claimable elsewhere from %s",
                attempt.update_id,
                attempt.attempt,
                why,
                clock_text(attempt.proven_until),
                extra=ids(attempt),
            )

    def hold_liveness(self) -> Optional[str]:
        """Start holding this process's liveness signal (the store's instance id, if any).

        A store failure is reported (step ``"sweep"``) and the process runs on without one:
        its claims are then taken over only after their lease.
        """
        try:
            return self._stats.timed("liveness", self._port.hold_liveness)
        except Exception as exc:
            self._report(exc, "sweep")
            return None

    def release_liveness(self) -> None:
        """Stop holding this process's liveness signal (reported, never raised).

        Not timed as a store call: a store may let go of its signal by closing a connection,
        without the database answering, so it must not end an outage in the log."""
        try:
            self._port.release_liveness()
        except Exception as exc:
            self._report(exc, "sweep")

    def take_over_dead(self) -> int:
        """Make the claims of provably dead instances claimable now (reported, never
        raised). Returns how many."""
        try:
            count = self._stats.timed("liveness", self._port.take_over_dead, self._options.now_ms())
        except Exception as exc:
            self._report(exc, "sweep")
            return 0
        if count:
            _LOGGER.info("took over %d update(s) and outbox call(s) of dead process(es)", count)
            if self._taken_over is not None:
                self._taken_over()
        return count


def clock_text(epoch_ms: int) -> str:
    """``epoch_ms`` as local wall-clock time with milliseconds (for log messages)."""
    seconds = epoch_ms / 1000.0
    return time.strftime("%H:%M:%S", time.localtime(seconds)) + f".{int(epoch_ms % 1000):03d}"
