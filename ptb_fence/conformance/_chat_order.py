"""Chat order.

Of each chat only the lowest unsettled update is claimed or listed.
Rows recorded without a chat key can be keyed later.
The rules run only for a store with the chat-order methods.
``chat-keys`` also needs the keying methods.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, cast

from ptb_fence.contract import CHAT_KEYING_METHODS, CHAT_ORDER_METHODS
from ptb_fence._values import Abandoned, AttemptIdentity, Completed, Failed, StoredUpdate
from ptb_fence.conformance._probe import FAR, L, T, Abort, Probe, bool_list, has_method, stamp
from ptb_fence.conformance._rule import rule


def _chat_claim(p: Probe, update_id: int, now: int, lease_until: int) -> Optional[AttemptIdentity]:
    value = p.call(
        "claim_in_chat_order", update_id, now=now, lease_until=lease_until, max_attempts=5
    )
    if value is not None and not p.check_identity("claim_in_chat_order", value):
        raise Abort
    return cast(Optional[AttemptIdentity], value)


def _chat_due(
    p: Probe, now: int, pending_before: int, chat_key: Optional[int] = None
) -> List[int]:
    kwargs: Dict[str, Any] = {"now": now, "pending_before": pending_before, "limit": 100}
    if chat_key is not None:
        kwargs["chat_key"] = chat_key
    value = p.call("due_in_chat_order", **kwargs)
    ok = isinstance(value, list) and all(
        isinstance(item, StoredUpdate) and type(item.update_id) is int for item in value
    )
    if not p.check_type("due_in_chat_order", ok, "a list of StoredUpdate", value):
        raise Abort
    return [item.update_id for item in value]


@rule(
    "chat-order",
    "fenced",
    "add_many_in_chats/claim_in_chat_order/due_in_chat_order (when present): only the "
    "lowest unsettled update of a chat (pending, processing or failed) is claimed or "
    "listed, none while an attempt of the chat holds a live lease; settled updates and "
    "rows without a chat key do not wait.",
    applies="only with ``add_many_in_chats``, ``claim_in_chat_order``, ``due_in_chat_order``",
)
def rule_chat_order(p: Probe, fenced: bool, durable: bool) -> None:
    """``add_many_in_chats`` equals ``add_many`` position by position.

    Of each chat key only the lowest unsettled update is claimed or listed.
    ``claim_in_chat_order`` claims and ``due_in_chat_order`` lists.
    An update waits while a lower update of its chat is pending or processing.
    It also waits while a lower update failed and waits for its retry.
    That failed update is listed from its ``due_at`` on, inclusive.
    An update waits while another update of its chat holds a lease live at ``now`` (inclusive).
    An abandoned update releases its chat.
    Rows without a chat key never wait.
    ``chat_key=`` lists one chat only.
    """
    if not all(has_method(p.store, m) for m in CHAT_ORDER_METHODS):
        return
    rows = [(1, "c1", T, 7), (2, "c2", T, 7), (3, "c3", T, None), (4, "c4", T, 8),
            (1, "c1", T, 7)]
    got = bool_list(p, "add_many_in_chats", p.call("add_many_in_chats", rows), len(rows))
    p.require(got == [True, True, True, True, False], f"add_many_in_chats returned {got}; "
              "expected [True, True, True, True, False] (the last repeats update_id 1)")
    p.require(p.add(5, "c5", T), "add of a new update_id returned False")  # no chat key
    at = T + 1
    listed = _chat_due(p, at, T)
    p.expect(listed == [1, 3, 4, 5], f"due_in_chat_order(now={stamp(at)}) returned {listed}; "
             "expected [1, 3, 4, 5]: 2 waits for 1 (same chat, lower and unsettled)")
    p.expect(_chat_claim(p, 2, at, T + L) is None, "claim_in_chat_order(2) returned an "
             "identity while update 1 of the same chat is pending")
    a = _chat_claim(p, 1, at, T + 50)
    p.require(a is not None and a.attempt == 1, f"claim_in_chat_order(1) returned {a}; "
              "expected attempt 1 (the lowest unsettled update of its chat)")
    assert a is not None
    p.expect(p.owns(a, T + 50), "a claim_in_chat_order claim is not owned up to its lease")
    p.expect(_chat_claim(p, 3, at, T + L) is not None, "claim_in_chat_order of an update "
             "without a chat key returned None")
    listed = _chat_due(p, T + 2, T)
    p.expect(listed == [4, 5], f"due_in_chat_order while 1 is processing returned {listed}; "
             "expected [4, 5] (2 waits; 1 and 3 hold live leases)")
    p.require(p.settle_owned(a, Failed(at=T + 3, retry_at=T + 100, error="x")),
              "settle_owned(Failed) of a live claim returned False")
    p.expect(_chat_claim(p, 2, T + 99, T + L) is None, "claim_in_chat_order(2) returned an "
             "identity while update 1 of its chat failed and waits for its retry")
    for now, want in ((T + 99, [4, 5]), (T + 100, [1, 4, 5])):
        listed = _chat_due(p, now, T)
        p.expect(listed == want, f"due_in_chat_order(now={stamp(now)}) returned {listed}; "
                 f"expected {want} (1 failed, due at {stamp(T + 100)} inclusive; 2 waits)")
    p.expect(_chat_due(p, T + 100, T, chat_key=8) == [4], "due_in_chat_order(chat_key=8) "
             "must list only the rows of chat 8")
    b = _chat_claim(p, 1, T + 100, T + 200)
    p.require(b is not None and b.attempt == 2, f"claim_in_chat_order(1) at its retry time "
              f"returned {b}; expected attempt 2")
    assert b is not None
    p.require(p.settle_owned(b, Abandoned(at=T + 101, error="x")), "settle_owned(Abandoned) "
              "of a live claim returned False")
    c = _chat_claim(p, 2, T + 102, T + 300)
    p.expect(c is not None, "claim_in_chat_order(2) returned None after update 1 of its chat "
             "was abandoned (a settled update releases its chat)")
    # A lower update recorded after a higher one was claimed waits while that attempt's lease
    # is live (inclusive). It no longer waits after the lease lapsed.
    p.require(bool_list(p, "add_many_in_chats", p.call("add_many_in_chats", [(20, "c20", T, 9)]),
                     1) == [True], "add_many_in_chats of a new update_id returned [False]")
    d = _chat_claim(p, 20, T + 1, T + 400)
    p.require(d is not None, "claim_in_chat_order(20) of an idle chat returned None")
    p.require(bool_list(p, "add_many_in_chats", p.call("add_many_in_chats", [(19, "c19", T, 9)]),
                     1) == [True], "add_many_in_chats of a new update_id returned [False]")
    p.expect(_chat_claim(p, 19, T + 400, FAR) is None, "claim_in_chat_order(19) returned an "
             "identity while update 20 of its chat holds a lease live at now (due_at == now)")
    p.expect(_chat_claim(p, 19, T + 401, FAR) is not None, "claim_in_chat_order(19) returned "
             "None after the lease of update 20 (higher) lapsed")


def _unkeyed(p: Probe, **kwargs: Any) -> List[int]:
    value = p.call("unkeyed_in_chats", **kwargs)
    ok = isinstance(value, list) and all(isinstance(row, StoredUpdate) for row in value)
    if not p.check_type("unkeyed_in_chats", ok, "a list of StoredUpdate", value):
        return []
    return [row.update_id for row in value]


@rule(
    "chat-keys",
    "fenced",
    "unkeyed_in_chats/set_chat_keys (when present, with chat order): the unsettled "
    "rows without a chat key are listed, and keyed only while they have none and hold "
    "the given body; a keyed row then holds its chat.",
    applies="only with the chat-order methods and ``unkeyed_in_chats``, ``set_chat_keys``",
)
def rule_chat_keys(p: Probe, fenced: bool, durable: bool) -> None:
    """``unkeyed_in_chats`` lists the unsettled rows without a chat key by ``update_id``.

    It lists neither a keyed nor a settled row.
    It lists after ``after_update_id``, at most ``limit`` rows.
    ``set_chat_keys`` keys only a row that has no key and holds exactly the given body.
    It returns how many rows it keyed.
    A keyed row then holds its chat like one recorded with the key.
    """
    if not all(has_method(p.store, m) for m in CHAT_ORDER_METHODS + CHAT_KEYING_METHODS):
        return
    for update_id in (1, 2, 4):
        p.require(p.add(update_id, f"c{update_id}", T), "add of a new update_id returned False")
    keyed = p.call("add_many_in_chats", [(3, "c3", T, 7)])
    p.require(bool_list(p, "add_many_in_chats", keyed, 1) == [True],
              "add_many_in_chats of a new update_id returned [False]")
    done = p.claim_owned(4, now=T, lease_until=T + L, max_attempts=5)
    p.require(done is not None, "claim_owned of a pending update returned None")
    assert done is not None
    p.require(p.settle_owned(done, Completed(at=T + 1)),
              "settle_owned(Completed) of a live claim returned False")
    listed = _unkeyed(p, limit=10)
    p.expect(listed == [1, 2], f"unkeyed_in_chats(limit=10) returned {listed}; expected [1, 2] "
             "(3 has a chat key, 4 is settled)")
    listed = _unkeyed(p, after_update_id=1, limit=10)
    p.expect(listed == [2], f"unkeyed_in_chats(after_update_id=1) returned {listed}; "
             "expected [2]")
    listed = _unkeyed(p, limit=1)
    p.expect(listed == [1], f"unkeyed_in_chats(limit=1) returned {listed}; expected [1]")
    count = p.call("set_chat_keys", [(1, "c1", 7), (2, "not its body", 7), (4, "c4", 7)])
    p.expect(type(count) is int and count == 1, f"set_chat_keys returned {count!r}; expected "
             "1 (2 holds another body, 4 is settled)")
    listed = _unkeyed(p, limit=10)
    p.expect(listed == [2], f"unkeyed_in_chats after set_chat_keys returned {listed}; "
             "expected [2]")
    p.expect(_chat_claim(p, 3, T + 2, T + L) is None, "claim_in_chat_order(3) returned an "
             "identity while update 1, keyed into its chat by set_chat_keys, is pending")
    p.expect(_chat_due(p, T + 2, T) == [1, 2], "due_in_chat_order must list 1 (the lowest of "
             "chat 7, keyed by set_chat_keys) and 2 (no chat key), not 3")
