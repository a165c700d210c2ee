"""What the durable queue, the getUpdates wrapper and the Application mix-in need from the
processor side, as interfaces.

They depend on these, not on the modules that implement them (``_ingest``, ``_processor``),
so the modules of ``ptb_fence.ptb`` import one way.
"""

from __future__ import annotations

import abc
from typing import TYPE_CHECKING, Any, List, Protocol


if TYPE_CHECKING:
    import asyncio

    from telegram import Update

__all__ = ["ApplicationBinding", "BatchRecorder", "UpdateRecorder"]


class UpdateRecorder(Protocol):
    """Records updates put into :class:`~ptb_fence.ptb.DurableUpdateQueue` (one by one)."""

    @property
    def stopping(self) -> bool:
        """``Application.stop()`` began: nothing more is queued."""

    async def record(self, update: "Update") -> bool:
        """Record ``update`` durably. Returns :obj:`False` if it must not be queued (a duplicate, or
        not a Telegram update). Raises :class:`~ptb_fence.ptb.IngestError` if it could not
        be recorded."""

    def record_blocking(self, update: "Update") -> bool:
        """As :meth:`record`, blocking the calling thread."""

    def unqueue(self, update_id: int) -> None:
        """A recorded update will not be queued after all (stopping): release it."""


class BatchRecorder(Protocol):
    """Records whole ``getUpdates`` answers (:class:`~ptb_fence.ptb._request.RecordingRequest`)."""

    @property
    def active(self) -> bool:
        """Its processor is initialized (it owns the Bot's getUpdates wrapper)."""

    @property
    def processor_name(self) -> str:
        """The class name of its processor (for messages)."""

    @property
    def records_batches(self) -> bool:
        """``getUpdates`` answers are to be recorded now."""

    async def wait_for_room(self) -> None:
        """Before a ``getUpdates``: wait until the processor has room for another answer
        (a backlog stays at Telegram, unconfirmed, instead of in this process)."""

    async def record_batch(self, result: List[Any]) -> None:
        """Record the ``result`` list of a ``getUpdates`` answer in one commit. Raises
        :class:`~ptb_fence.ptb.IngestError` if it could not be recorded."""


class ApplicationBinding(abc.ABC):
    """The processor as :class:`~ptb_fence.ptb.FencedApplicationMixin` sees it.

    :class:`~ptb_fence.ptb.BaseFenceProcessor` implements it. The mix-in calls these methods
    at the matching points of the Application's life.
    """

    __slots__ = ()

    @property
    @abc.abstractmethod
    def queue(self) -> "asyncio.Queue[object]":
        """The durable ``update_queue`` the Application must use (a
        :class:`~ptb_fence.ptb.DurableUpdateQueue`)."""

    @abc.abstractmethod
    def attach(self, application: Any) -> None:
        """Bind the processor to ``application`` (called by its constructor)."""

    @abc.abstractmethod
    async def application_stopping(self) -> None:
        """``Application.stop()`` begins: queue nothing more."""

    @abc.abstractmethod
    def application_started(self) -> None:
        """``Application.start()`` ran (again): resume queueing and sweeping."""
