"""The type of a front end's change to queued outbox calls (see
:attr:`~ptb_fence.runtime._dispatcher.OutboxDispatcher.prepare`)."""

from __future__ import annotations

from typing import Any, Callable, Dict, Tuple

from ptb_fence._values import StateWrite

__all__ = ["OutboxPrepare"]

OutboxPrepare = Callable[
    [str, Dict[str, Any], bool], Tuple[Dict[str, Any], Tuple[StateWrite, ...]]
]
"""``prepare(method, params, in_transaction) -> (params, state writes)``.

It returns the parameters to keep and the persisted state the call needs with them.
For example an inline keyboard's callback data is replaced by the ids PTB's callback-data
cache gave them. ``in_transaction`` says the call is written inside an open fenced
transaction. That transaction then carries those writes too. Held calls return no writes,
because the front end holds their state for the completion."""
