"""Concurrent claims.

Of 8 threads claiming one update at once, exactly one wins.
A :class:`threading.Barrier` releases the threads together.
The races run over fresh updates and over lapsed leases.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, List, Optional, Sequence, Tuple

from ptb_fence._values import AttemptIdentity
from ptb_fence.conformance._probe import JOIN_TIMEOUT, L, T, THREADS, Probe, stamp
from ptb_fence.conformance._rule import rule


def _race(p: Probe, call: Callable[[], Any]) -> Optional[List[Any]]:
    """Run ``call`` in 8 threads released together.

    Returns:
        The results, or :obj:`None` on a timeout.
    """
    barrier = threading.Barrier(THREADS, timeout=JOIN_TIMEOUT)
    results: List[Any] = [None] * THREADS
    errors: List[BaseException] = []

    def worker(index: int) -> None:
        try:
            barrier.wait()
            results[index] = call()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the checking thread
            errors.append(exc)

    threads = [
        threading.Thread(target=worker, args=(i,), daemon=True, name=f"ptb-fence-check-{i}")
        for i in range(THREADS)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(JOIN_TIMEOUT)
    if any(thread.is_alive() for thread in threads):
        p.fail(f"{THREADS} concurrent claims did not finish within {JOIN_TIMEOUT:.0f} s")
        return None
    for error in errors:
        if not isinstance(error, threading.BrokenBarrierError):
            raise error
    if errors:
        raise errors[0]
    return results


def _race_rounds(p: Probe) -> Sequence[Tuple[int, int, int]]:
    """Record updates 1-4 and return the races as ``(update_id, now, expected attempt)``.

    The races are four pending updates, then two lapsed leases.
    """
    for update_id in range(1, 5):
        p.require(p.add(update_id, f"b{update_id}", T), "add of a new update_id returned False")
    return (
        (1, T, 1),
        (2, T, 1),
        (3, T, 1),
        (4, T, 1),
        (1, T + L + 1, 2),
        (2, T + L + 1, 2),
    )


@rule(
    "concurrent-claim",
    "base",
    "Of 8 concurrent claims of one update exactly one wins.",
)
def rule_concurrent_claim(p: Probe, fenced: bool, durable: bool) -> None:
    """Of 8 concurrent ``claim`` calls on one update exactly one wins.

    The race repeats over fresh updates and over lapsed-lease takeovers.
    """
    for update_id, now, expected in _race_rounds(p):

        def call(update_id: int = update_id, now: int = now) -> Optional[int]:
            return p.claim(update_id, now=now, lease_until=now + L)

        results = _race(p, call)
        if results is None:
            return
        winners = [r for r in results if r is not None]
        what = "pending update" if expected == 1 else "lapsed lease"
        p.expect(
            winners == [expected],
            f"{THREADS} concurrent claims of the {what} {update_id} at {stamp(now)} returned "
            f"{sorted(results, key=repr)}; expected exactly one winner with attempt {expected}",
        )


@rule(
    "concurrent-claim-owned",
    "fenced",
    "Of 8 concurrent claim_owned calls of one update exactly one wins.",
)
def rule_concurrent_claim_owned(p: Probe, fenced: bool, durable: bool) -> None:
    """The same holds for ``claim_owned``.

    The winner's identity owns the update.
    """
    for update_id, now, expected in _race_rounds(p):

        def call(update_id: int = update_id, now: int = now) -> Optional[AttemptIdentity]:
            return p.claim_owned(update_id, now=now, lease_until=now + L)

        results = _race(p, call)
        if results is None:
            return
        winners = [r for r in results if r is not None]
        what = "pending update" if expected == 1 else "lapsed lease"
        ok = len(winners) == 1 and getattr(winners[0], "attempt", None) == expected
        p.expect(
            ok,
            f"{THREADS} concurrent claim_owned of the {what} {update_id} at {stamp(now)} had "
            f"{len(winners)} winner(s) {winners}; expected exactly one, attempt {expected}",
        )
        if ok:
            p.expect(
                p.owns(winners[0], now + L),
                f"the winner of the concurrent claim_owned of update {update_id} does not own it",
            )
