"""RecordingRequest: records a whole getUpdates batch in one commit before PTB sees it."""

from __future__ import annotations

import json
import logging
from typing import Any, Optional, Tuple

from telegram.request import BaseRequest, RequestData

from ptb_fence.ptb._interfaces import BatchRecorder
from ptb_fence.ptb._ptb_internals import REQUEST_DEFAULT, get_updates_request, set_get_updates_request
from ptb_fence.ptb._wrapped_request import WrappedRequest

__all__ = ["RecordingRequest", "unwrap_get_updates_request", "wrap_get_updates_request"]

_LOGGER = logging.getLogger("ptb_fence.ingest")


class RecordingRequest(WrappedRequest):
    """Wraps the request object PTB uses for ``getUpdates``.

    When a ``getUpdates`` answer arrives, the whole batch is recorded in the store in one
    commit (and, with a fenced store, claimed for this process in the same statement) before
    PTB parses it and puts the updates into the durable queue, which then forwards them
    without a commit of its own. If recording fails, a :class:`ptb_fence.ptb.IngestError`
    (a ``TelegramError``) makes PTB's polling loop fetch the same offset again. Everything
    else is delegated unchanged.
    """

    __slots__ = ("_parsed", "_recorder")

    def __init__(self, inner: BaseRequest, recorder: BatchRecorder) -> None:
        super().__init__(inner)
        self._recorder = recorder
        # the getUpdates answer parsed here, handed to PTB's parse_json_payload (one parse)
        self._parsed: Optional[Tuple[bytes, Any]] = None

    @property
    def recorder(self) -> BatchRecorder:
        """What records the ``getUpdates`` answers (a processor's ingest)."""
        return self._recorder

    async def do_request(
        self,
        url: str,
        method: str,
        request_data: Optional[RequestData] = None,
        read_timeout: Any = REQUEST_DEFAULT,
        write_timeout: Any = REQUEST_DEFAULT,
        connect_timeout: Any = REQUEST_DEFAULT,
        pool_timeout: Any = REQUEST_DEFAULT,
    ) -> Tuple[int, bytes]:
        """Send the request. Record a successful ``getUpdates`` batch before returning it.
        A ``getUpdates`` of the Updater's polling is sent once the processor has room for
        its answer (:meth:`Ingest.wait_for_room
        <ptb_fence.ptb._ingest.Ingest.wait_for_room>`)."""
        self._parsed = None
        get_updates = url.endswith("/getUpdates")
        if get_updates and self._recorder.records_batches:
            await self._recorder.wait_for_room()
        status, payload = await self._inner.do_request(
            url,
            method,
            request_data=request_data,
            read_timeout=read_timeout,
            write_timeout=write_timeout,
            connect_timeout=connect_timeout,
            pool_timeout=pool_timeout,
        )
        if get_updates and self._recorder.records_batches and 200 <= status < 300:
            try:
                answer = json.loads(payload.decode("utf-8"))
            except (UnicodeDecodeError, ValueError):
                return status, payload  # PTB reports the bad answer itself
            result = answer.get("result") if isinstance(answer, dict) else None
            if isinstance(result, list) and result:
                await self._recorder.record_batch(result)
            if isinstance(answer, dict):
                self._parsed = (payload, answer)
        return status, payload

    def parse_json_payload(self, payload: bytes) -> Any:  # type: ignore[override]
        """PTB's parse of an answer. The ``getUpdates`` answer that :meth:`do_request` parsed
        to record it is not parsed twice (PTB's ``Update.de_json`` copies what it reads, so
        the recorded dicts are not changed)."""
        parsed, self._parsed = self._parsed, None
        if parsed is not None and parsed[0] is payload:
            return parsed[1]
        return BaseRequest.parse_json_payload(payload)


def wrap_get_updates_request(bot: Any, recorder: BatchRecorder) -> bool:
    """Install a :class:`RecordingRequest` around ``bot``'s ``getUpdates`` request.

    Returns :obj:`False` (and changes nothing) if the bot does not look as expected. Updates
    are then recorded one by one by the durable queue — slower, equally durable. (Why not
    ``ApplicationBuilder.get_updates_request()``: see ``_ptb_internals``, internal 3.)
    """
    requests = get_updates_request(bot)
    if requests is None:
        return False
    get_updates = requests[0]
    if isinstance(get_updates, RecordingRequest):
        owner = get_updates.recorder
        if owner is recorder:
            return True
        if owner.active:
            raise RuntimeError(
                f"this Bot's getUpdates is wired to another running {owner.processor_name} "
                "(of another Application): shut that Application down first, or give each "
                "Application its own Bot"
            )
        get_updates = get_updates.inner  # left over from an Application that is gone
    if not isinstance(get_updates, BaseRequest):
        return False
    if not set_get_updates_request(bot, RecordingRequest(get_updates, recorder)):
        _LOGGER.debug("could not wrap the getUpdates request; recording update by update")
        return False
    return True


def unwrap_get_updates_request(bot: Any, recorder: BatchRecorder) -> None:
    """Undo :func:`wrap_get_updates_request` (at shutdown), so that the Bot can serve another
    Application and processor."""
    requests = get_updates_request(bot)
    if requests is None:
        return
    get_updates = requests[0]
    if isinstance(get_updates, RecordingRequest) and get_updates.recorder is recorder:
        set_get_updates_request(bot, get_updates.inner)
