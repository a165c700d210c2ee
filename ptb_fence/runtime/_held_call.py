"""HeldCall: what ``attempt.outbox`` returns for a call that waits for the attempt's completion."""

from __future__ import annotations

import threading
from typing import Optional

from ptb_fence._values import AttemptIdentity

__all__ = ["HeldCall"]


class HeldCall:
    """A Bot API call an attempt holds until the commit that completes its update.

    :meth:`ptb_fence.Outbox.call` (and its shortcuts) return one for a call made outside a
    fenced transaction. Such a call has no row, and so no outbox id, until the completion
    commits. The handle says honestly where the call is:

    - ``"held"``: the attempt holds it. It is written in the completion's commit.
    - ``"committed"``: the completion committed. So the call is in the outbox and will be
      sent at least once. :attr:`call_id` is its outbox id when this process learnt it.
      A ``transaction(complete=True)`` returns the ids at once. A grouped completion does
      not, and this process's dispatcher fills the id in when it claims the call.
      Otherwise :attr:`call_id` is :obj:`None`, and :attr:`identity` and :attr:`seq` still
      identify the call.
    - ``"discarded"``: the attempt failed or lost its update. The call is never sent.

    Attributes:
        identity (:class:`~ptb_fence.AttemptIdentity`): The attempt that made the call.
        seq (:obj:`int`): The call's position among the calls of that attempt. With
            ``identity`` it is the call's key in the outbox (:attr:`ptb_fence.OutboxEntry.seq`).
        method (:obj:`str`): The Bot API method.
    """

    __slots__ = ("__weakref__", "_call_id", "_lock", "_state", "identity", "method", "seq")

    def __init__(self, identity: AttemptIdentity, seq: int, method: str) -> None:
        self.identity = identity
        self.seq = seq
        self.method = method
        self._state = "held"
        self._call_id: Optional[int] = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return (
            f"HeldCall(update_id={self.identity.update_id}, attempt={self.identity.attempt}, "
            f"seq={self.seq}, method={self.method!r}, state={self._state!r}, "
            f"call_id={self._call_id})"
        )

    @property
    def state(self) -> str:
        """:obj:`str`: ``"held"``, ``"committed"`` or ``"discarded"``."""
        return self._state

    @property
    def committed(self) -> bool:
        """:obj:`bool`: The completion that carried the call committed: it will be sent."""
        return self._state == "committed"

    @property
    def discarded(self) -> bool:
        """:obj:`bool`: The attempt failed or lost its update: the call is never sent."""
        return self._state == "discarded"

    @property
    def call_id(self) -> Optional[int]:
        """:obj:`int` | :obj:`None`: The call's outbox id, once committed and known here."""
        return self._call_id

    def __int__(self) -> int:
        """The outbox id (e.g. ``processor.outbox_call(int(handle))``).

        Raises:
            LookupError: The id is not known (yet): the call is held, discarded, or committed
                by a grouped completion whose id this process has not learnt.
        """
        call_id = self._call_id
        if call_id is None:
            raise LookupError(
                f"{self!r} has no outbox id here: "
                + {
                    "held": "it is written when the attempt's completion commits",
                    "discarded": "its attempt did not complete, so it was never written",
                    "committed": "its completion committed in a group; find it by identity "
                    "and seq (ptb-fence outbox list) or wait for this process to send it",
                }[self._state]
            )
        return call_id

    __index__ = __int__

    # -- the runtime's side -------------------------------------------------------------------
    def resolve(self, call_id: Optional[int]) -> None:
        """The completion committed (``call_id``: its outbox id when known)."""
        with self._lock:
            if self._state == "discarded":
                return
            self._state = "committed"
            if call_id is not None:
                self._call_id = call_id

    def discard(self) -> None:
        """The attempt did not complete: the call is never written."""
        with self._lock:
            if self._state == "held":
                self._state = "discarded"
