"""WrappedRequest: a PTB request object that wraps another and delegates to it.

The base of ptb_fence's request wrappers (:class:`~ptb_fence.ptb._request.RecordingRequest`,
:class:`~ptb_fence.ptb._direct_sends.DirectSendWatch`): what they pass on unchanged lives
here once. Each wrapper sends through ``do_request`` itself.
"""

from __future__ import annotations

from typing import Optional

from telegram.request import BaseRequest

__all__ = ["WrappedRequest"]


class WrappedRequest(BaseRequest):
    """A request object around ``inner``: its timeout, start and stop are the inner one's.

    Args:
        inner: The wrapped request object.
    """

    __slots__ = ("_inner",)

    def __init__(self, inner: BaseRequest) -> None:
        self._inner = inner

    @property
    def inner(self) -> BaseRequest:
        """The wrapped request object."""
        return self._inner

    @property
    def read_timeout(self) -> Optional[float]:
        """The wrapped request's read timeout."""
        return self._inner.read_timeout

    async def initialize(self) -> None:
        """Initialize the wrapped request."""
        await self._inner.initialize()

    async def shutdown(self) -> None:
        """Shut the wrapped request down."""
        await self._inner.shutdown()
