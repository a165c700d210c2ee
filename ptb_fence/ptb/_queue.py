"""DurableUpdateQueue: the Application's update_queue that records before it returns."""

from __future__ import annotations

import asyncio
from typing import Any

from telegram import Update

from ptb_fence.ptb._interfaces import UpdateRecorder

__all__ = ["DurableUpdateQueue"]


class DurableUpdateQueue(asyncio.Queue[object]):
    """An :class:`asyncio.Queue` whose :meth:`put` records each :class:`telegram.Update`
    durably before it returns.

    PTB's polling advances its offset, and its webhook answers 200, only after ``put``
    returned: so an update is acknowledged to Telegram only after its row is committed. A
    store failure raises :class:`IngestError`. An update already recorded (a re-fetch) is not
    queued a second time. Objects that are not updates pass through unrecorded.

    Args:
        recorder: Records the updates (the processor's ingest).
    """

    def __init__(self, recorder: UpdateRecorder) -> None:
        super().__init__()
        self._recorder = recorder

    async def put(self, item: Any) -> None:
        """Record ``item`` (a :class:`telegram.Update`) durably, then queue it."""
        if isinstance(item, Update):
            recorder = self._recorder
            if not await recorder.record(item):
                return
            if recorder.stopping:
                # Application.stop() is waiting on join(): queued now it would never be
                # taken. It is recorded. The next start (or another process) handles it.
                recorder.unqueue(item.update_id)
                return
        # the queue is unbounded: asyncio.Queue.put would only call our put_nowait again
        asyncio.Queue.put_nowait(self, item)

    def put_nowait(self, item: Any) -> None:
        """Record and queue without awaiting.

        Recording an update here is a blocking store call on the event loop: prefer
        ``await put(update)``.
        """
        if isinstance(item, Update):
            recorder = self._recorder
            if not recorder.record_blocking(item):
                return
            if recorder.stopping:
                recorder.unqueue(item.update_id)
                return
        asyncio.Queue.put_nowait(self, item)

    def redeliver(self, update: Update) -> bool:
        """Queue an update that is already recorded (retries, lapsed leases, old records).

        Returns :obj:`False` (queueing nothing) once ``Application.stop()`` began: the update
        stays in the store for the next start or another process.
        """
        if self._recorder.stopping:
            return False
        asyncio.Queue.put_nowait(self, update)
        return True
