"""One table, one bot.

``bind_bot`` lets the first bot id bind a table and refuses another.
"""

from __future__ import annotations

from ptb_fence._errors import TableBotMismatch
from ptb_fence.conformance._probe import Probe, has_method
from ptb_fence.conformance._rule import rule


@rule(
    "bind-bot",
    "base",
    "bind_bot (when present) accepts the same bot id again and raises "
    "TableBotMismatch for another one.",
    applies="only for a store with ``bind_bot``",
)
def rule_bind_bot(p: Probe, fenced: bool, durable: bool) -> None:
    """``bind_bot`` with the same bot id again is a no-op.

    Another bot id raises :exc:`ptb_fence.TableBotMismatch`, because the first binder wins.
    The owner stays.
    """
    if not has_method(p.store, "bind_bot"):
        return
    p.call("bind_bot", 4242)
    p.call("bind_bot", 4242)  # the same bot again: a no-op
    try:
        p.store.bind_bot(4343)
    except TableBotMismatch:
        pass
    except Exception as exc:
        p.fail(f"bind_bot(4343) after bind_bot(4242) raised {type(exc).__name__}: {exc}; it "
               "must raise ptb_fence.TableBotMismatch")
    else:
        p.fail("bind_bot(4343) after bind_bot(4242) returned; the first binder wins, so it must "
               "raise ptb_fence.TableBotMismatch")
    p.call("bind_bot", 4242)  # the owner is unchanged
