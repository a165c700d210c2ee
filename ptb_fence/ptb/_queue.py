"""DurableUpdateQueue: the Application's update_queue that records before it returns."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import TYPE_CHECKING, Any, Optional, Sequence, Union

from telegram import Update
from telegram.error import TelegramError

if TYPE_CHECKING:
    from ptb_fence.ptb._processor import BaseFenceProcessor

__all__ = ["DurableUpdateQueue", "IngestError", "update_body"]

_LOGGER = logging.getLogger("ptb_fence.ingest")


class IngestError(TelegramError):
    """An update could not be recorded; it was not acknowledged to Telegram.

    A :class:`telegram.error.TelegramError`, so PTB's polling loop retries the same offset and
    the webhook answers 5xx: Telegram delivers the update again.
    """

    __slots__ = ()


def _null(_: object) -> None:
    return None


def update_body(update: Update) -> str:
    """The JSON text stored for ``update``.

    Updates arrive in PTB already parsed, so the stored body is ``update.to_json()``. With
    ``arbitrary_callback_data`` PTB has replaced ``callback_query.data`` by the cached Python
    object before the queue; objects that are not JSON are stored as ``null`` (and the body
    gets ``"_ptb_fence": {"callback_data": "not stored"}``), so a replay of such an update
    (retry, takeover, restart) sees ``callback_query.data`` as :obj:`None`.
    """
    try:
        return update.to_json()
    except (TypeError, ValueError):
        data = update.to_dict()
        query = data.get("callback_query")
        if isinstance(query, dict):
            query["data"] = None
        data["_ptb_fence"] = {"callback_data": "not stored"}
        return json.dumps(data, default=_null)


class DurableUpdateQueue(asyncio.Queue[object]):
    """An :class:`asyncio.Queue` whose :meth:`put` records each :class:`telegram.Update`
    durably before it returns.

    PTB's polling advances its offset, and its webhook answers 200, only after ``put``
    returned: so an update is acknowledged to Telegram only after its row is committed. A
    store failure raises :class:`IngestError`. An update already recorded (a re-fetch) is not
    queued a second time. Objects that are not updates pass through unrecorded.
    """

    def __init__(self, processor: "BaseFenceProcessor") -> None:
        super().__init__()
        self._processor = processor

    async def put(self, item: Any) -> None:
        """Record ``item`` (a :class:`telegram.Update`) durably, then queue it."""
        if isinstance(item, Update):
            if not await self._processor._record(item):
                return
            if self._processor._stopping:
                # Application.stop() is waiting on join(): queued now it would never be
                # taken. It is recorded; the next start (or another process) handles it.
                self._processor._unqueue(item.update_id)
                return
        # the queue is unbounded: asyncio.Queue.put would only call our put_nowait again
        asyncio.Queue.put_nowait(self, item)

    def put_nowait(self, item: Any) -> None:
        """Record and queue without awaiting.

        Recording an update here is a blocking store call on the event loop: prefer
        ``await put(update)``.
        """
        if isinstance(item, Update):
            if not self._processor._record_blocking(item):
                return
            if self._processor._stopping:
                self._processor._unqueue(item.update_id)
                return
        asyncio.Queue.put_nowait(self, item)

    def redeliver(self, update: Update) -> bool:
        """Queue an update that is already recorded (retries, lapsed leases, old records).

        Returns :obj:`False` (queueing nothing) once ``Application.stop()`` began: the update
        stays in the store for the next start or another process.
        """
        if self._processor._stopping:
            return False
        asyncio.Queue.put_nowait(self, update)
        return True

    def _fail(
        self, update_ids: Union[Optional[int], Sequence[int]], error: BaseException
    ) -> IngestError:
        if isinstance(update_ids, int) or update_ids is None:
            what = f"update {update_ids}"
            first = update_ids
        else:
            what = "updates " + ", ".join(str(u) for u in update_ids)
            first = update_ids[0] if update_ids else None
        _LOGGER.error(
            "could not record %s (%s: %s); not acknowledged to Telegram",
            what,
            type(error).__name__,
            error,
            extra={"update_id": first},
        )
        return IngestError(f"ptb_fence could not record {what}: {type(error).__name__}")
