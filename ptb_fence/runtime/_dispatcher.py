"""OutboxDispatcher: sends the committed outbox calls of every attempt (skeleton: wiring)."""

from __future__ import annotations

from typing import Any, Callable, Dict, Mapping, Optional

from ptb_fence.contract import OUTBOX_METHODS
from ptb_fence.runtime._options import RuntimeOptions
from ptb_fence.runtime._port import StorePort
from ptb_fence.runtime._stats import RuntimeStats

__all__ = ["OutboxDispatcher"]


class OutboxDispatcher:
    """The sender of one process's outbox (created by the runtime for a fenced front end whose
    store has an outbox; the front end gives it a way to send and starts it)."""

    __slots__ = ("_defaults", "_port", "_options", "_stats", "_report", "_sender_missing")

    def __init__(
        self,
        port: StorePort,
        options: RuntimeOptions,
        stats: RuntimeStats,
        report_store_error: Callable[..., None],
    ) -> None:
        self._port = port
        self._options = options
        self._stats = stats
        self._report = report_store_error
        self._defaults: Dict[str, Any] = {}
        self._sender_missing: Optional[str] = None

    @property
    def defaults(self) -> Mapping[str, Any]:
        """The bot's defaults applied to queued calls (PTB ``Defaults.api_defaults``)."""
        return self._defaults

    @defaults.setter
    def defaults(self, values: Mapping[str, Any]) -> None:
        self._defaults = dict(values)

    def refuse_calls(self, why: Optional[str]) -> None:
        """Make ``attempt.outbox`` refuse with ``why`` (the front end cannot send:
        :obj:`None` allows it again)."""
        self._sender_missing = why

    def refusal(self) -> Optional[str]:
        """Why calls cannot be queued here, or :obj:`None`."""
        return self._sender_missing

    def wake(self) -> None:
        """A commit carrying calls landed: send them now."""


def no_outbox(store: object) -> str:
    """The TypeError text for ``attempt.outbox`` on a store without the outbox."""
    return (
        f"{type(store).__name__} has no outbox (OutboxStore: {', '.join(OUTBOX_METHODS)}): "
        "attempt.outbox needs a store that keeps Bot API calls (SQLiteUpdateStore, "
        "PostgresUpdateStore, MemoryUpdateStore)"
    )
