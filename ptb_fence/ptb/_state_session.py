"""StateSession: the persisted bot state of one attempt at one update, from the committed rows
read before PTB handled it to the writes its completion carries.

The attempt works on private copies of the update's ``user_data``, ``chat_data`` and
``bot_data`` (:class:`~ptb_fence.ptb.FencedCallbackContext` hands them out while the session is
active), so nothing a failed attempt changed is seen by anyone else. The conversation states
live in the handlers' own dicts, set to the committed state before the update is handled and
put back when the attempt does not complete. :meth:`StateSession.writes` is the difference to
what was read, each write conditional on the version read.
"""

from __future__ import annotations

import contextvars
from typing import Any, Callable, Dict, List, Mapping, Optional, Set, Tuple

from ptb_fence._state_codec import (
    conversation_state_key,
    decode_state,
    encode_state,
    same_state,
)
from ptb_fence._values import StateEntry, StateKey, StateWrite
from ptb_fence.ptb._ptb_internals import conversation_states, pending_state

__all__ = [
    "NOT_HELD",
    "StateSession",
    "active_session",
    "conversation_state_key",
    "decode_state",
    "encode_state",
]

def _unchanged(stored: Optional[str], value: Any, encoded: Optional[str]) -> bool:
    """Whether the row text ``stored`` (:obj:`None`: no state) already holds ``value``
    (``encoded``: its text here). Texts that differ may hold the same state: a set pickled in
    another process's hash order is not a change, so it is neither written nor a conflict."""
    if stored == encoded:
        return True
    if stored is None or encoded is None:
        return False
    return same_state(stored, value, encoded)


class _NotHeld:
    __slots__ = ()

    def __repr__(self) -> str:
        return "NOT_HELD"


NOT_HELD: Any = _NotHeld()
""":func:`StateSession.data` for data the session does not hold (the context falls back to
the Application's)."""

_ACTIVE: "contextvars.ContextVar[Optional[StateSession]]" = contextvars.ContextVar(
    "ptb_fence_state_session", default=None
)


def active_session() -> "Optional[StateSession]":
    """The session of the update handled in this task, or :obj:`None`."""
    return _ACTIVE.get()


class StateSession:
    """One attempt's persisted state.

    Args:
        update: The update being handled.
        loaded: The committed rows read for it (absent keys: none).
        data: Per kind (``user``, ``chat``, ``bot``) the key and the private value the
            attempt works on (decoded from ``loaded``, or a fresh empty value).
        conversations: ``(handler, conversation key, state key)`` of every persistent
            conversation handler that has a key for the update.
        on_end: Called with the session and whether its writes landed, once.
    """

    __slots__ = ("_contexts", "_declared", "_dropped", "_ended", "_landed", "_on_end", "_prepared", "_taken",
                 "_token", "conversations", "data", "keyboards", "loaded", "update")

    def __init__(
        self,
        update: Any,
        loaded: Dict[StateKey, StateEntry],
        data: Dict[str, Tuple[StateKey, Any]],
        conversations: List[Tuple[Any, Tuple[Any, ...], StateKey]],
        on_end: Callable[["StateSession", Tuple[StateWrite, ...], bool], None],
    ) -> None:
        self.update = update
        self.loaded = loaded
        self.data = data
        self.conversations = conversations
        self._on_end = on_end
        self._contexts: Set[int] = set()
        self._ended = False
        self._landed = False
        # made when first needed (most attempts declare and drop nothing): fewer objects per
        # update for the garbage collector to pass over
        self._declared: Optional[Dict[StateKey, Any]] = None
        self._dropped: Optional[Set[str]] = None
        # with the callback-data cache fenced: the keyboards the attempt put into the bot's
        # cache, {uuid: (uuid, access time, {button uuid: data})}, written with its completion
        self.keyboards: Optional[Dict[str, Tuple[str, float, Dict[str, Any]]]] = None
        self._prepared: Optional[Tuple[StateWrite, ...]] = None
        self._taken: Optional[Tuple[StateWrite, ...]] = None
        self._token: Optional[contextvars.Token[Optional[StateSession]]] = None

    # -- while PTB handles the update -------------------------------------------------------
    def activate(self) -> None:
        """From here on, this task's contexts of the update get the private data."""
        self._token = _ACTIVE.set(self)

    def deactivate(self) -> None:
        """Back to the Application's data in this task."""
        if self._token is not None:
            _ACTIVE.reset(self._token)
            self._token = None

    def note_context(self, update: Any, context: Any) -> None:
        """``context`` was built for ``update`` (PTB builds one per update): if it is this
        session's update, the context hands out the private data."""
        if update is self.update:
            self._contexts.add(id(context))

    def owns_context(self, context: Any) -> bool:
        """``context`` was built for this session's update."""
        return id(context) in self._contexts

    def data_of(self, context: Any, kind: str) -> Any:
        """The private ``kind`` data for ``context``, or :data:`NOT_HELD`."""
        if id(context) not in self._contexts or kind not in self.data:
            return NOT_HELD
        return self.data[kind][1]

    def holds(self, key: StateKey) -> Optional[str]:
        """The kind (``user``, ``chat``) under which the session holds ``key``, or
        :obj:`None`."""
        for kind, (held, _) in self.data.items():
            if held == key:
                return kind
        return None

    def drop(self, kind: str, empty: Any) -> None:
        """``Application.drop_user_data``/``drop_chat_data`` of the ``kind`` data the session
        holds, while it handles the update: from now on its contexts get ``empty`` and, unless
        the handlers fill it again, the completion deletes the row (a tombstone) with the
        update's other writes."""
        key, _ = self.data[kind]
        self.data[kind] = (key, empty)
        if self._dropped is None:
            self._dropped = set()
        self._dropped.add(kind)

    def declare(self, state: Any, name: Optional[str]
                ) -> Tuple[Any, Tuple[Any, ...], StateKey]:
        """The conversation (of the handler ``name``, or the only persistent one the update
        has) goes to ``state`` after this callback: writes taken from now on carry it (PTB
        sets it only when the callback returns, after a ``transaction(complete=True)`` in it
        committed). Returns its handler, conversation key and state key.

        Raises:
            ValueError: No persistent conversation of that name has a key for the update, or
                several have and ``name`` was not given.
        """
        found = [c for c in self.conversations if name is None or c[0].name == name]
        if not found:
            raise ValueError(
                "no persistent ConversationHandler"
                + (f" named {name!r}" if name is not None else "")
                + " has a conversation for this update"
            )
        if len(found) > 1:
            raise ValueError(
                "the update belongs to the persistent conversations "
                + ", ".join(sorted(repr(c[0].name) for c in found)) + ": pass name="
            )
        if self._declared is None:
            self._declared = {}
        self._declared[found[0][2]] = state
        return found[0]

    def _state_text(self, handler: Any, conversation: Tuple[Any, ...],
                    key: StateKey) -> Tuple[bool, Any, Optional[str]]:
        """``(known, state, text)``: the conversation's state to write now (declared, else the
        handler's) and its text. Not known while a ``block=False`` callback's task runs."""
        declared = self._declared
        if declared is not None and key in declared:
            state = declared[key]
        else:
            state = conversation_states(handler).get(conversation)
            pending = pending_state(state)
            if pending is not None:
                done, state = pending
                if not done:
                    return False, None, None
        if state is None or state == handler.END:
            return True, None, None
        return True, state, encode_state(state)

    def _diff(self, base: Mapping[StateKey, StateEntry]) -> Tuple[StateWrite, ...]:
        """The writes from ``base`` (absent: no row) to now."""
        out: List[StateWrite] = []
        for kind, (key, value) in self.data.items():
            old = base.get(key)
            if (old is None or old.value is None) and not value:
                continue  # nothing stored (or a tombstone), nothing to store
            # dropped and not filled again: delete the row
            dropped = self._dropped is not None and kind in self._dropped
            encoded = None if dropped and not value else encode_state(value)
            if old is None or not _unchanged(old.value, value, encoded):
                out.append(StateWrite(key, encoded, 0 if old is None else old.version))
        for handler, conversation, key in self.conversations:
            known, state, text = self._state_text(handler, conversation, key)
            old = base.get(key)
            if known and not _unchanged(None if old is None else old.value, state, text):
                out.append(StateWrite(key, text, 0 if old is None else old.version))
        for uuid, access_time, buttons in list((self.keyboards or {}).values()):
            key = StateKey("callback", "", uuid)
            if key not in base:  # new keyboards only (a late diff: not the ones taken)
                out.append(StateWrite(key, encode_state((access_time, buttons)), 0))
        return tuple(out)

    # -- the completion ---------------------------------------------------------------------
    def writes(self) -> Tuple[StateWrite, ...]:
        """What changed since the state was read, each write at the version read.

        Unchanged state writes nothing. State that was absent and is still empty writes
        nothing. A conversation that ended writes :obj:`None` where a row exists. A
        ``block=False`` callback's state whose task has not ended is left as committed. A
        declared next state (:meth:`declare`) is written in place of the handler's."""
        return self._diff(self.loaded)

    def prepare(self) -> None:
        """PTB finished handling the update: compute the writes now, in the update's own task
        (a value that cannot be pickled fails this attempt here, named, instead of the
        grouped completion it would join).

        Raises:
            TypeError: The state cannot be stored (the message names the fix).
        """
        try:
            self._prepared = self.writes()
        except Exception as exc:
            raise TypeError(
                f"FencedPersistence cannot store the state of update "
                f"{getattr(self.update, 'update_id', None)}: {type(exc).__name__}: {exc}; keep "
                "only picklable values in user_data, chat_data, bot_data and conversation "
                "states"
            ) from exc

    def take(self) -> Tuple[StateWrite, ...]:
        """The writes for the commit that completes the attempt: those :meth:`prepare`
        computed, else computed now (a ``transaction(complete=True)`` inside a handler).
        Remembered (see :meth:`late_writes`)."""
        self._taken = self._prepared if self._prepared is not None else self.writes()
        return self._taken

    def late_writes(self) -> Tuple[StateWrite, ...]:
        """After a completion that landed with taken writes: what changed since (at the
        versions that commit left), e.g. a conversation state PTB set when the callback
        returned after its ``transaction(complete=True)``. None otherwise."""
        if self._taken is None or not self._landed:
            return ()
        base = dict(self.loaded)
        for write in self._taken:
            base[write.key] = StateEntry(write.value, write.version + 1)
        return self._diff(base)

    def declared_differs(self) -> List[Tuple[str, Any, Any]]:
        """``(handler name, declared, actual)`` where PTB set another state than declared."""
        out = []
        if self._declared is None:
            return []
        for handler, conversation, key in self.conversations:
            if key in self._declared:
                actual = conversation_states(handler).get(conversation)
                declared = self._declared[key]
                if actual is None and declared == handler.END:
                    continue
                if actual != declared:
                    out.append((handler.name, declared, actual))
        return out

    def end(self, writes: Tuple[StateWrite, ...], landed: bool) -> None:
        """The attempt ended: its ``writes`` landed with its completion (``landed``), or
        nothing of it did (a failure, a lost claim, a conflict). Only the first call counts."""
        if self._ended:
            return
        self._ended = True
        self._landed = landed
        self._on_end(self, writes, landed)

    @property
    def ended(self) -> bool:
        """:obj:`bool`: :meth:`end` was called."""
        return self._ended
