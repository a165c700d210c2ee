"""SettleBatcher: completions that arrive together are settled in one commit."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, List, Tuple

from ptb_fence._values import Completed
from ptb_fence.runtime._attempt import Attempt
from ptb_fence.runtime._core import Outcome

if TYPE_CHECKING:
    from ptb_fence.ptb._processor import BaseFenceProcessor

__all__ = ["SettleBatcher"]

MAX_BATCH = 256


class SettleBatcher:
    """Group commit of completions (``settle_owned_many``).

    The first completion is sent at once; completions that arrive while it is in flight are
    sent together in the next statement. Every caller waits for its own result, so an attempt
    is settled before its success is reported, exactly as with a single ``settle_owned``.
    """

    __slots__ = ("_flushing", "_pending", "_processor")

    def __init__(self, processor: "BaseFenceProcessor") -> None:
        self._processor = processor
        self._pending: List[Tuple[Attempt, Completed, "asyncio.Future[str]"]] = []
        self._flushing = False

    async def complete(self, attempt: Attempt) -> str:
        """Settle ``attempt`` as completed (grouped); returns the :class:`Outcome`."""
        runtime = self._processor.runtime
        loop = asyncio.get_running_loop()
        future: "asyncio.Future[str]" = loop.create_future()
        self._pending.append((attempt, Completed(runtime.options.now_ms()), future))
        if not self._flushing:
            self._flushing = True
            loop.create_task(self._flush(), name="ptb_fence:settle")
        return await future

    async def _flush(self) -> None:
        runtime = self._processor.runtime
        store = runtime.store
        batch: List[Tuple[Attempt, Completed, "asyncio.Future[str]"]] = []
        try:
            while self._pending:
                await asyncio.sleep(0)  # completions of this loop iteration join the batch
                batch, self._pending = self._pending[:MAX_BATCH], self._pending[MAX_BATCH:]
                items = [(attempt.identity, settlement) for attempt, settlement, _ in batch]
                try:
                    landed = await self._processor._call(store.settle_owned_many, items)
                except Exception as exc:
                    for attempt, _, future in batch:
                        if not future.done():
                            future.set_result(runtime.completion_failed(attempt, exc))
                else:
                    for (attempt, _, future), ok in zip(batch, landed):
                        if not future.done():
                            future.set_result(runtime.completion_landed(attempt, bool(ok)))
                batch = []
        finally:
            self._flushing = False
            # cancelled (shutdown): nobody is left waiting forever; the leases decide
            for _, _, future in batch + self._pending:
                if not future.done():
                    future.set_result(Outcome.LOST)
            self._pending = []
