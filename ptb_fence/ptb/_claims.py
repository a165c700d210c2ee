"""StartClaims: the claim an update starts with, taken together with the claims of the next
updates this processor has queued (one commit for several), within the runtime's claim budget.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import AsyncIterator, List, Optional

from ptb_fence.ptb._state import SharedState
from ptb_fence.ptb._threads import StoreThreads
from ptb_fence.runtime._attempt import Attempt
from ptb_fence.runtime._core import Runtime

__all__ = ["StartClaims"]


class StartClaims:
    """Finds or takes the claim of an update that is starting (on the event loop).

    An update claimed ahead (at ingest, with an earlier update, by a sweep) starts with that
    claim. Otherwise it is claimed now, together with the next updates recorded pending here
    and queued (lowest ``update_id`` first, as many as the claim budget allows): one
    ``claim_owned_many`` commit for all, the others booked as pre-claimed. An update whose
    claim is in flight with another one waits for it instead of claiming on its own.

    Args:
        runtime: The processor's runtime.
        state: The state shared with the processor, its ingest and its sweeper.
        threads: The store threads.
    """

    __slots__ = ("_runtime", "_state", "_threads")

    def __init__(self, runtime: Runtime, state: SharedState, threads: StoreThreads) -> None:
        self._runtime = runtime
        self._state = state
        self._threads = threads
        runtime.reservations.tracks_running = True

    async def attempt_for(self, update_id: int) -> Optional[Attempt]:
        """The attempt ``update_id`` starts with; :obj:`None`: not ours (taken elsewhere,
        final, spent), or stopping (it stays in the store)."""
        state = self._state
        state.pending.discard(update_id)
        attempt = state.take_preclaimed(update_id)
        in_flight = state.claiming.get(update_id)
        if attempt is None and in_flight is not None:
            await asyncio.shield(in_flight)
            attempt = state.take_preclaimed(update_id)
        if attempt is not None or state.stopping:
            return attempt
        runtime = self._runtime
        if not runtime.claims_ahead:
            return await self._threads.call(runtime.claim, update_id)
        granted = runtime.reserve_claims(len(state.pending), own=1)
        try:
            extras = state.next_pending(granted)
            if not extras:
                return await self._threads.call(runtime.claim, update_id)
            return await self._claim_with(update_id, extras)
        finally:
            runtime.unreserve_claims(1 + granted)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Count an update as holding a slot while in this block (the claim budget's
        ``running``)."""
        reservations = self._runtime.reservations
        reservations.started()
        try:
            yield
        finally:
            reservations.ended()

    async def _claim_with(self, update_id: int, extras: List[int]) -> Optional[Attempt]:
        """Claim ``update_id`` and ``extras`` in one call; book the extras as pre-claimed."""
        state, runtime = self._state, self._runtime
        done: "asyncio.Future[None]" = asyncio.get_running_loop().create_future()
        for extra in extras:
            state.claiming[extra] = done
        attempts: List[Optional[Attempt]] = [None] * (1 + len(extras))
        try:
            attempts = await self._threads.call_handing_on(
                lambda: runtime.claim_many([update_id, *extras]),
                lambda landed: self._release_all(landed),
            )
        finally:
            self._book(extras, attempts[1:])
            done.set_result(None)
        return attempts[0]

    def _book(self, extras: List[int], attempts: List[Optional[Attempt]]) -> None:
        state = self._state
        stale: List[Attempt] = []
        for extra, attempt in zip(extras, attempts):
            state.claiming.pop(extra, None)
            if attempt is None:
                continue
            if state.stopping or extra not in state.inflight:
                stale.append(attempt)  # will not start here: claimable at once elsewhere
            else:
                state.preclaimed[extra] = attempt
        if stale:
            state.release(stale)

    def _release_all(self, attempts: List[Optional[Attempt]]) -> None:
        landed = [attempt for attempt in attempts if attempt is not None]
        if landed:
            self._state.release(landed)
