"""How an :class:`~ptb_fence.UpdateIntake` sweep claims due updates: a page at a time within
the runtime's claim budget (one statement and one commit per page where the store can), each
update handed to its chat's queue with its claim."""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Tuple

from ptb_fence._values import StoredUpdate
from ptb_fence.runtime._attempt import Attempt
from ptb_fence.runtime._core import Runtime
from ptb_fence.runtime._wakeups import Wakeups

__all__ = ["claim_and_dispatch", "list_and_dispatch", "release_items", "retry_soon"]

PAGE = 500
"""The most updates one sweep hands over."""


def claim_and_dispatch(
    runtime: Runtime,
    dispatch: Callable[[StoredUpdate, Optional[Attempt]], bool],
    closed: Callable[[], bool],
    *,
    include_fresh: bool,
    take_over: bool,
    after: Optional[int] = None,
    running: Callable[[], int] = lambda: 0,
) -> Tuple[int, bool, Optional[int]]:
    """Claim the next page of due updates (at most the claim budget) and ``dispatch`` each
    with its attempt; an attempt not dispatched (already queued here, or closing) is
    released at once; with ``after`` only updates with a greater id. Returns the number handed
    over, whether the page was full (or the budget spent: look again once claims are settled)
    and the next page's ``after`` (below the lowest released, :obj:`None` after a short
    page: start at the lowest id). A store error is reported as
    step ``"sweep"``."""
    # accepted updates start unclaimed: claims ahead stay within the buffer (the bound)
    limit = runtime.reserve_claims(min(PAGE, runtime.ahead_budget(running())))
    if limit <= 0:
        return 0, True, after
    try:
        page = runtime.claim_page(
            limit=limit, include_fresh=include_fresh, take_over=take_over, after=after
        )
    except Exception as exc:
        runtime.report_store_error(exc, "sweep")
        return 0, False, None
    finally:
        runtime.unreserve_claims(limit)
    handed = 0
    stale: List[Attempt] = []
    for attempt, body in page:
        if not closed() and dispatch(StoredUpdate(attempt.update_id, body), attempt):
            handed += 1
        else:
            stale.append(attempt)
    if stale:  # claimable at once: the next page starts at the lowest of them
        runtime.release(stale)
        after = min(attempt.update_id for attempt in stale) - 1
        return handed, handed > 0 or len(page) >= limit, after
    return handed, len(page) >= limit, page[-1][0].update_id if len(page) >= limit else None


def list_and_dispatch(
    runtime: Runtime,
    dispatch: Callable[[StoredUpdate], bool],
    closed: Callable[[], bool],
    include_fresh: bool,
) -> Tuple[int, bool]:
    """Without claim ids: list the next page of due updates and ``dispatch`` each (claimed
    when it starts). Returns the number handed over and whether the page was full. A store
    error is reported as step ``"sweep"``."""
    handed = 0
    try:
        rows = runtime.due_page(limit=PAGE, include_fresh=include_fresh)
    except Exception as exc:
        runtime.report_store_error(exc, "sweep")
        rows = []
    for row in rows:
        if closed():
            break
        if dispatch(row):
            handed += 1
    return handed, len(rows) >= PAGE


def release_items(runtime: Runtime, items: List[Any]) -> None:
    """Release the attempts of queued items ``(text, update, attempt)`` that will not start."""
    attempts = [item[2] for item in items if item[2] is not None]
    if attempts:
        runtime.release(attempts)


def retry_soon(
    wakeups: Wakeups,
    dispatch: Callable[[StoredUpdate], bool],
    alive: Callable[[], bool],
    update_id: int,
    delay: float,
    body: Optional[str],
) -> None:
    """Hand a failed update whose retry is due after ``delay`` to its chat's queue then
    (``dispatch``), while ``alive()``; without its ``body`` the sweep takes it."""
    if body is None:
        return
    tries = [0]

    def wake() -> None:
        if not alive():
            return
        if not dispatch(StoredUpdate(update_id=update_id, body=body)):
            # still finishing its failed attempt here: look again shortly
            tries[0] += 1
            if tries[0] < 200:
                wakeups.call_later(0.05, wake)

    # a few ms late, so the store sees the retry time as come (due_at <= now)
    wakeups.call_later(delay + 0.005, wake)
