"""FencedPersistence: PTB's ``user_data``, ``chat_data``, ``bot_data`` and persistent
conversation states, committed with the update that changed them."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import weakref
from collections.abc import MutableMapping
from typing import Any, Dict, List, Optional, Set, Tuple, Union

from telegram import Update
from telegram.ext import BasePersistence, ConversationHandler, PersistenceInput

from ptb_fence._values import StateEntry, StateKey, StateWrite
from ptb_fence.contract import STATE_METHODS, StoreCapabilities
from ptb_fence.ptb._callback_data import (
    keyboard_key,
    pressed_keyboard,
    record_keyboard,
    resolve_press,
)
from ptb_fence.ptb._context import FencedCallbackContext
from ptb_fence.ptb._group_commit import AsyncGroupCommit
from ptb_fence.ptb._ptb_internals import (
    conversation_key,
    fence_keyboard_cache,
    conversation_states,
    missing_conversation_internals,
)
from ptb_fence.ptb._state_session import (
    StateSession,
    active_session,
    conversation_state_key,
    decode_state,
    encode_state,
)
from ptb_fence._state_codec import same_state
from ptb_fence.runtime._attempt import current_attempt
from ptb_fence.runtime._durable_jobs import job_run_of
from ptb_fence.ptb._job_queue import (
    CONVERSATION_TIMEOUT,
    FencedJobQueue,
    conversation_timeout_of,
)

__all__ = ["FencedPersistence"]

_LOGGER = logging.getLogger("ptb_fence.ptb")

_BOT = StateKey("bot")

PREFETCH_MAX_AGE = 1.0
"""Seconds a state read made when an update was recorded or queued is used for its attempt.
Older, the attempt reads again (in a backlog an update may wait long for a slot, and another
process may have changed its state meanwhile)."""

_Rows = Dict[StateKey, StateEntry]
_Parts = Tuple[Dict[str, StateKey], List[Tuple[Any, Tuple[Any, ...], StateKey]]]
"""An update's data keys per kind and its persistent conversations (handler, key, state
key)."""

_DROP_TRIES = 5
"""How often a drop of user or chat data is tried when another writer moves the row."""


def _walk(handlers: Any) -> List[Any]:
    """Every handler, also those inside conversation handlers (entry points, states,
    fallbacks), depth first, each once."""
    seen: Set[int] = set()
    out: List[Any] = []
    stack = list(reversed(list(handlers)))
    while stack:
        handler = stack.pop()
        if id(handler) in seen:
            continue
        seen.add(id(handler))
        out.append(handler)
        if isinstance(handler, ConversationHandler):
            inner = list(handler.entry_points) + list(handler.fallbacks)
            for group in handler.states.values():
                inner += list(group)
            stack += reversed(inner)
    return out


def _mutable_mapping(value: Any) -> bool:
    """``isinstance(value, MutableMapping)``, a plain dict (the usual data) answered at once
    (asked per update: the ABC check is several calls)."""
    return type(value) is dict or isinstance(value, MutableMapping)


def _retrieve(rows: "Optional[Union[_Rows, asyncio.Future[_Rows]]]") -> None:
    """A read ahead nobody uses: its failure, if any, is retrieved (no asyncio warning)."""
    if rows is None or isinstance(rows, dict):
        return
    if rows.done():
        if not rows.cancelled():
            rows.exception()
    else:
        rows.add_done_callback(lambda f: None if f.cancelled() else f.exception())


class FencedPersistence(BasePersistence[Any, Any, Any]):
    """A :class:`telegram.ext.BasePersistence` whose state commits with the update.

    The changes an update's handlers make to ``context.user_data``, ``context.chat_data``,
    ``context.bot_data`` and to the states of persistent :class:`~telegram.ext.ConversationHandler`
    s (``persistent=True, name=...``) are written **in the commit that completes the update**.
    That is the grouped completion, or the handler's ``transaction(complete=True)`` with its
    domain writes. Nothing of a failed, exhausted or stale attempt is written. Before an update
    is handled, its state is read from the store, so every attempt starts from the committed
    state. A retry does not see what a failed attempt changed. After a restart, or in another
    process sharing the store, a conversation continues where the last completed update left it.
    Each piece of state is versioned. An attempt whose state changed meanwhile does not
    complete. It runs again on the fresh state, its attempt not spent, so no change is lost.

    Set it with the builder, with a :class:`~ptb_fence.ptb.FencedUpdateProcessor` on the same
    store::

        store = SQLiteUpdateStore("bot.sqlite3")
        processor = FencedUpdateProcessor(store)
        app = (processor.install(Application.builder().token(TOKEN))
               .persistence(FencedPersistence(store)).build())

    ``Application.drop_user_data``/``drop_chat_data`` called by a handler of an update of that
    user (chat) is written with the update's completion. Called elsewhere, PTB's next flush
    deletes the stored row. Handlers see private copies of the data through ``context``.
    ``context.application.user_data[...]`` and jobs see the committed data, and changes made
    there are not persisted.

    With ``arbitrary_callback_data`` the callback-data cache is fenced too. Each inline keyboard
    an update puts into the bot's cache is a state row written with the update's completion. A
    press this process's cache cannot resolve has its keyboard read from the store, and the
    handlers see the original objects. See :doc:`/explanation/limits` for what stays unfenced:
    ``block=False`` handlers, ``conversation_timeout`` and keyboards sent outside an update.

    Args:
        store: The processor's store. It must keep persisted state
            (:class:`~ptb_fence.StateStore`: the shipped stores do).

    Keyword Args:
        store_data (:class:`telegram.ext.PersistenceInput`, optional): Which data to fence.
            Defaults to all: ``user_data``, ``chat_data``, ``bot_data`` and ``callback_data``
            (the last only matters with ``arbitrary_callback_data``).
        update_interval (:obj:`float`, optional): How often PTB calls the ``update_*``
            methods (they write nothing, since the fence writes, and only notice changes
            made outside an update). Defaults to ``60``.

    Raises:
        TypeError: The store keeps no persisted state (the message names its methods).
    """

    __slots__ = ("_application", "_committed", "_conversations", "_keyboards", "_lock", "_noticed",
                 "_prefetched", "_published", "_reads", "_session_drops", "_store")

    def __init__(
        self,
        store: Any,
        *,
        store_data: Optional[PersistenceInput] = None,
        update_interval: float = 60,
    ) -> None:
        data = store_data if store_data is not None else PersistenceInput()
        if "state" not in StoreCapabilities.of(store):
            raise TypeError(
                f"{type(store).__name__} keeps no persisted bot state (StateStore: "
                f"{', '.join(STATE_METHODS)}, with the outbox): FencedPersistence needs a "
                "store that has it, such as SQLiteUpdateStore or PostgresUpdateStore"
            )
        super().__init__(store_data=data, update_interval=update_interval)
        self._store = store
        self._application: Optional["weakref.ref[Any]"] = None
        self._keyboards = False  # the callback-data cache is fenced (set by attach)
        # the newest committed row this process knows per key (what a failed attempt's
        # conversation state goes back to, what jobs see in the Application's dicts)
        self._committed: Dict[StateKey, StateEntry] = {}
        self._lock = threading.Lock()
        self._noticed: Set[StateKey] = set()
        self._conversations: Optional[Tuple[List[Tuple[Any, int, int]], List[Any]]] = None
        self._published: Dict[StateKey, int] = {}  # the version shown in the Application's dicts
        # drops made while an update held the key: its completion writes them, not the flush
        self._session_drops: Set[StateKey] = set()
        # the reads of updates that start together go to the store in one read_state
        self._reads: AsyncGroupCommit[List[StateKey], Dict[StateKey, StateEntry]] = (
            AsyncGroupCommit(self._read_many, "ptb_fence-state-reads")
        )
        # update id -> (its rows read ahead or the read on its way, their keys, when)
        self._prefetched: Dict[int, Tuple[Optional[Union[_Rows, "asyncio.Future[_Rows]"]],
                                          List[StateKey], float, Optional[_Parts]]] = {}

    @property
    def store(self) -> Any:
        """The store the state is kept in."""
        return self._store

    # -- wiring -----------------------------------------------------------------------------
    def attach(self, application: Any) -> None:
        """Check that ``application`` can fence this persistence and bind to it. Called by
        :class:`~ptb_fence.ptb.FencedApplicationMixin` at ``initialize()``, before PTB loads
        any persisted data. Logs a WARNING for each use that cannot be fenced.

        Raises:
            RuntimeError: The Application's processor is not a
                :class:`~ptb_fence.ptb.FencedUpdateProcessor` on this persistence's store, its
                context type does not derive from
                :class:`~ptb_fence.ptb.FencedCallbackContext`, or this PTB lacks an internal
                FencedPersistence needs (each message names the fix).
        """
        processor: Any = getattr(application, "update_processor", None)
        runtime = getattr(processor, "runtime", None)
        if runtime is None or not runtime.attempt_aware:
            raise RuntimeError(
                f"FencedPersistence needs a FencedUpdateProcessor (the Application's processor "
                f"is {type(processor).__name__}): the state commits with the update's "
                "completion, which only a fenced attempt has. Build the Application with "
                "FencedUpdateProcessor(store).install(Application.builder()...)"
                ".persistence(FencedPersistence(store))"
            )
        if processor.store is not self._store:
            raise RuntimeError(
                "FencedPersistence was given another store than the Application's "
                "FencedUpdateProcessor: the state must commit in the same database "
                "transaction as the update; pass the processor's store to both"
            )
        if not issubclass(application.context_types.context, FencedCallbackContext):
            raise RuntimeError(
                f"FencedPersistence needs the context type to derive from "
                f"ptb_fence.ptb.FencedCallbackContext ({application.context_types.context.__name__}"
                " does not): it hands handlers the attempt's private copies of the data"
            )
        missing = missing_conversation_internals()
        if missing:
            from telegram import __version__ as ptb_version

            raise RuntimeError(
                f"FencedPersistence cannot re-read conversation states with "
                f"python-telegram-bot {ptb_version}: it lacks {'; '.join(missing)}. "
                "Install a python-telegram-bot version ptb_fence supports (22.x)"
            )
        self._application = weakref.ref(application)
        self._keyboards = self._fences_keyboards(application)  # per update: read once here
        if self._keyboards:
            if not fence_keyboard_cache(application.bot.callback_data_cache, record_keyboard):
                _LOGGER.warning(
                    "FencedPersistence cannot see the keyboards this python-telegram-bot's "
                    "callback-data cache inserts: keyboards sent with context.bot are kept in "
                    "this process only (those queued through attempt.outbox are written)"
                )
        self._warn_unfenced(application)

    def _fences_keyboards(self, application: Any) -> bool:
        """The callback-data cache is fenced: ``store_data.callback_data`` and the bot has
        one (``arbitrary_callback_data``)."""
        return bool(self.store_data.callback_data) and (
            getattr(application.bot, "callback_data_cache", None) is not None
        )

    def _app(self) -> Any:
        application = None if self._application is None else self._application()
        if application is None:
            raise RuntimeError(
                "FencedPersistence is not attached to a ptb_fence Application: build it with "
                "FencedUpdateProcessor(store).install(Application.builder()...)"
                ".persistence(FencedPersistence(store)); any other processor is refused"
            )
        return application

    def _warn_unfenced(self, application: Any) -> None:
        defaults = getattr(application.bot, "defaults", None)
        all_non_blocking = defaults is not None and defaults.block is False
        if all_non_blocking:
            _LOGGER.warning(
                "FencedPersistence: Defaults(block=False) makes every handler non-blocking: "
                "what they change in user_data/chat_data/bot_data after the update completed "
                "is not persisted, and a conversation state they set is written only if their "
                "task ended by the completion"
            )
        for handler in _walk(h for group in application.handlers.values() for h in group):
            if handler.block is False and not all_non_blocking:
                _LOGGER.warning(
                    "FencedPersistence: %s (callback %s) runs with block=False: what it "
                    "changes in user_data/chat_data/bot_data after the update completed is not "
                    "persisted, and a conversation state it sets is written only if its task "
                    "ended by the completion; make it blocking to fence it",
                    type(handler).__name__,
                    getattr(getattr(handler, "callback", None), "__name__", "?"),
                )
            if isinstance(handler, ConversationHandler) and not handler.persistent:
                _LOGGER.warning(
                    "FencedPersistence: ConversationHandler %r is not persistent "
                    "(persistent=False, PTB's default): its conversations live in this "
                    "process's memory, lost on a restart or a kill and unknown to other "
                    "processes. Pass persistent=True and a name=... to the ConversationHandler "
                    "to fence its states with the updates",
                    handler.name or "entered by " + ", ".join(
                        getattr(getattr(entry, "callback", None), "__name__", "?")
                        for entry in handler.entry_points
                    ),
                )
            durable = isinstance(application.job_queue, FencedJobQueue)
            if isinstance(handler, ConversationHandler) and handler.persistent:
                if handler.conversation_timeout and not durable:
                    _LOGGER.warning(
                        "FencedPersistence: ConversationHandler %r has conversation_timeout: "
                        "the timeout is a job in this process's JobQueue and its deadline is "
                        "not persisted, so after a restart or a takeover by another process "
                        "the conversation does not time out (its state is still fenced). "
                        "FencedUpdateProcessor(store, durable_jobs=True) keeps it in the store",
                        handler.name,
                    )
        queue = application.job_queue
        try:
            # a durable job runs as an update: what it changes commits with it
            jobs = [] if queue is None or isinstance(queue, FencedJobQueue) else list(queue.jobs())
        except Exception:  # a scheduler that cannot list its jobs before it runs
            jobs = []
        for job in jobs:
            _LOGGER.warning(
                "FencedPersistence: job %r runs outside any update, so what it changes in "
                "user_data/chat_data/bot_data is not persisted (a WARNING names each change "
                "PTB's flush finds); change persisted state in handlers",
                job.name,
            )

    def _persistent_conversations(self, application: Any) -> List[Any]:
        """The persistent conversation handlers, walked again only when the Application's
        handlers changed (per update this is on the hot path)."""
        handlers = application.handlers
        shape = [(group, id(hs), len(hs)) for group, hs in handlers.items()]
        cached = self._conversations
        if cached is not None and cached[0] == shape:
            return cached[1]
        found = [
            handler
            for handler in _walk(h for group in handlers.values() for h in group)
            if isinstance(handler, ConversationHandler) and handler.persistent and handler.name
        ]
        self._conversations = (shape, found)
        return found

    # -- one update -------------------------------------------------------------------------
    def _keys(self, application: Any, update: Update) -> Tuple[
        Dict[str, StateKey], List[Tuple[Any, Tuple[Any, ...], StateKey]]
    ]:
        """The update's data keys per kind and its persistent conversations."""
        wanted: Dict[str, StateKey] = {}
        user_id, chat_id = _user_and_chat(update)
        if self.store_data.user_data and user_id is not None:
            wanted["user"] = StateKey("user", "", str(user_id))
        if self.store_data.chat_data and chat_id is not None:
            wanted["chat"] = StateKey("chat", "", str(chat_id))
        if self.store_data.bot_data:
            wanted["bot"] = _BOT
        conversations: List[Tuple[Any, Tuple[Any, ...], StateKey]] = []
        timed_out = _timed_out(update)
        for handler in self._persistent_conversations(application):
            if timed_out is not None:  # a timeout's run: its one conversation
                conversation = timed_out[1] if timed_out[0] == handler.name else None
            else:
                conversation = conversation_key(handler, update)
            if conversation is not None:
                conversations.append(
                    (handler, conversation, conversation_state_key(handler.name, conversation))
                )
        return wanted, conversations

    def _read_keys(self, application: Any, update: Update, parts: _Parts) -> List[StateKey]:
        """Every key the update's state read takes: its data, its conversations and, for a
        press of a keyboard this process's cache does not hold, that keyboard's row."""
        wanted, conversations = parts
        keys = list(wanted.values()) + [state for _, _, state in conversations]
        if self._keyboards:
            pressed = pressed_keyboard(update)
            if pressed is not None:
                keys.append(keyboard_key(pressed[0]))
        return keys

    def state_keys(self, application: Any, update: object) -> List[StateKey]:
        """The keys of ``update``'s state (its user's and chat's data, ``bot_data``, its
        persistent conversations). None when this persistence does not fence it."""
        if not isinstance(update, Update) or self._application is None:
            return []
        if self._application() is not application:
            return []
        now = time.monotonic()
        self._forget_old(now)
        parts = self._keys(application, update)
        keys = self._read_keys(application, update, parts)
        if keys:  # remembered for its attempt (with the rows read ahead, once they come)
            self._prefetched[update.update_id] = (None, keys, now, parts)
        return keys

    def _forget_old(self, now: float) -> None:
        """Drop what was read ahead for updates not handled here in time (oldest first)."""
        while self._prefetched:
            oldest = next(iter(self._prefetched))
            if now - self._prefetched[oldest][2] <= PREFETCH_MAX_AGE:
                break
            _retrieve(self._prefetched.pop(oldest)[0])

    def deposit(self, reads: List[Tuple[int, List[StateKey]]], rows: _Rows) -> None:
        """``rows`` were read right after the updates of ``reads`` (``(update_id, keys)``)
        were recorded, in the same store call: each attempt uses its rows instead of a read
        of its own if it starts within :data:`PREFETCH_MAX_AGE`."""
        now = time.monotonic()
        self._forget_old(now)
        self._learn(rows)  # once for the group
        for update_id, keys in reads:
            known = self._prefetched.get(update_id)
            parts = None if known is None else known[3]
            mine: _Rows = {}
            for key in keys:
                entry = rows.get(key)
                if entry is not None:
                    mine[key] = entry
            self._prefetched[update_id] = (mine, keys, now, parts)

    def prefetch(self, application: Any, update: object) -> None:
        """Start reading ``update``'s committed state now (it was recorded already: a
        ``getUpdates`` answer), while it waits for its chat's turn and a slot. The updates
        queued together share one read. Used as :meth:`deposit`'s rows are."""
        if isinstance(update, Update) and update.update_id in self._prefetched:
            return
        keys = self.state_keys(application, update)
        if not keys:
            return
        assert isinstance(update, Update)
        _, _, now, parts = self._prefetched[update.update_id]
        future = self._reads.enqueue(keys)
        self._prefetched[update.update_id] = (future, keys, now, parts)

    async def _loaded(self, update: Update, keys: List[StateKey]) -> _Rows:
        """The committed rows of ``keys``: those read ahead for the update if fresh and for
        these keys, else a read now. The newer rows this process committed since take their
        place (another process's change meanwhile is a version conflict at the completion,
        retried from fresh state, as one during the handler is)."""
        ahead = self._prefetched.pop(update.update_id, None)
        loaded: Optional[_Rows] = None
        if ahead is not None:
            rows, ahead_keys, at, _ = ahead
            if (rows is not None and ahead_keys == keys
                    and time.monotonic() - at <= PREFETCH_MAX_AGE):
                try:
                    loaded = dict(rows if isinstance(rows, dict) else await rows)
                except Exception:  # read again below. A failure there fails the attempt
                    loaded = None
            else:
                _retrieve(rows)
        if loaded is None:
            loaded = dict(await self._reads.submit(keys)) if keys else {}
        with self._lock:
            for key in keys:
                known = self._committed.get(key)
                got = loaded.get(key)
                if known is not None and (got is None or known.version > got.version):
                    loaded[key] = known
        return loaded

    async def open_session(self, application: Any, update: object) -> Optional[StateSession]:
        """Read the update's committed state (one store read, shared by the updates that
        start together) and make it the attempt's:
        private copies of its data, its conversation states set in the handlers. :obj:`None`
        when there is nothing to fence here (not a Telegram update, no fenced attempt, or
        another Application)."""
        if not isinstance(update, Update) or self._application is None:
            return None
        if application is None or self._application() is not application:
            return None
        attempt = current_attempt()
        if attempt is None or not attempt.fenced:
            return None
        ahead = self._prefetched.get(update.update_id)
        # the keys computed when it was recorded or queued (the handlers' keys of one update
        # do not change)
        if ahead is not None and ahead[3] is not None:
            parts, keys = ahead[3], ahead[1]
        else:
            parts = self._keys(application, update)
            keys = self._read_keys(application, update, parts)
        wanted, conversations = parts
        loaded = await self._loaded(update, keys)
        fences_keyboards = self._keyboards
        # a press of a keyboard this process's cache does not hold: read with the rest
        pressed = pressed_keyboard(update) if fences_keyboards else None
        if pressed is not None:
            entry = loaded.pop(keyboard_key(pressed[0]), None)
            resolve_press(getattr(application, "bot"), update, pressed[0],
                          None if entry is None else entry.value)
        data: Dict[str, Tuple[StateKey, Any]] = {}
        for kind, key in wanted.items():
            entry = loaded.get(key)
            if entry is not None and entry.value is not None:
                value = decode_state(entry.value)
            else:
                value = self._empty(application, kind)
            data[kind] = (key, value)
        for handler, conversation, key in conversations:
            self._set_conversation(handler, conversation, loaded.get(key))
        session = StateSession(update, loaded, data, conversations, self._session_ended)
        if fences_keyboards:
            session.keyboards = {}
        # its writes ride the commit that completes the attempt. It learns how that went
        attempt.effects.hold_state(session)
        return session

    async def handled(self, application: Any, session: StateSession, failed: bool) -> None:
        """PTB finished handling the session's update. A failure undoes the attempt's
        conversation states at once (its data were private copies). Otherwise its writes
        ride the completion. If a ``transaction(complete=True)`` completed it already and
        state changed after that commit (a conversation state set by the callback's return
        without :meth:`~ptb_fence.ptb.FencedCallbackContext.next_conversation_state`), that
        change is written right away, outside the fence, with a WARNING: a crash in between
        would lose it.

        Raises:
            TypeError: The state cannot be stored (a value that cannot be pickled): the
                attempt fails with it.
        """
        if failed:
            session.end((), False)
            return
        if not session.ended:
            try:
                session.prepare()  # the grouped completion only takes the result
            except TypeError:
                session.end((), False)
                raise
        for name, declared, actual in session.declared_differs():
            _LOGGER.warning(
                "FencedPersistence: update %s declared the next state %r of conversation %r "
                "but its callback returned %r: %r was committed",
                getattr(session.update, "update_id", None), declared, name, actual, declared,
            )
        late = session.late_writes()
        if not late:
            return
        named = ", ".join(sorted(
            f"{w.key.kind}{' ' + w.key.name if w.key.name else ''} {w.key.key}".strip()
            for w in late))
        _LOGGER.warning(
            "FencedPersistence: update %s changed %s after its transaction(complete=True) "
            "committed; written right after it, outside the fence (a crash in between loses "
            "it): change data before that transaction, and declare a conversation's next "
            "state with context.next_conversation_state(STATE) before it",
            getattr(session.update, "update_id", None), named,
        )
        processor: Any = getattr(application, "update_processor")
        port = processor.runtime.port
        conflict = await processor.call_store(port.write_state, late, processor.runtime.now_ms())
        if conflict is None:
            self._learn({w.key: StateEntry(w.value, w.version + 1) for w in late})
        else:
            _LOGGER.warning(
                "FencedPersistence: the late change of update %s was not written: %s changed "
                "meanwhile", getattr(session.update, "update_id", None), named,
            )

    async def _read_many(self, requests: List[List[StateKey]]) -> List[Dict[StateKey, StateEntry]]:
        """One store read for the keys of several updates. Each gets its own rows."""
        processor: Any = getattr(self._app(), "update_processor")
        wanted = list(dict.fromkeys(key for keys in requests for key in keys))
        rows: Dict[StateKey, StateEntry] = await processor.call_store(
            processor.runtime.port.read_state, wanted
        )
        self._learn(rows)
        out: List[Dict[StateKey, StateEntry]] = []
        for keys in requests:
            mine: Dict[StateKey, StateEntry] = {}
            for key in keys:
                entry = rows.get(key)
                if entry is not None:
                    mine[key] = entry
            out.append(mine)
        return out

    @staticmethod
    def _empty(application: Any, kind: str) -> Any:
        types = application.context_types
        if kind == "user":
            return types.user_data()
        return types.chat_data() if kind == "chat" else types.bot_data()

    @staticmethod
    def _set_conversation(handler: Any, conversation: Tuple[Any, ...],
                          entry: Optional[StateEntry]) -> None:
        states = conversation_states(handler)
        if entry is None or entry.value is None:
            states.pop(conversation, None)
        else:
            states[conversation] = decode_state(entry.value)

    def _learn(self, rows: Dict[StateKey, StateEntry]) -> None:
        """Remember committed rows newer than the ones known."""
        with self._lock:
            for key, entry in rows.items():
                if key.kind == "callback":
                    continue  # written once, read once per process: nothing to remember
                known = self._committed.get(key)
                if known is None or known.version < entry.version:
                    self._committed[key] = entry

    def _session_ended(
        self, session: StateSession, writes: Tuple[StateWrite, ...], landed: bool
    ) -> None:
        application = None if self._application is None else self._application()
        if landed:
            self._learn({w.key: StateEntry(w.value, w.version + 1) for w in writes})
            if application is not None:
                self._publish(application, session, writes)
            return
        # nothing of the attempt landed: its conversation states go back to the committed
        # ones (its data were private copies: nothing to undo)
        with self._lock:
            committed = dict(self._committed)
        for handler, conversation, state in session.conversations:
            entry = committed.get(state, session.loaded.get(state))
            self._set_conversation(handler, conversation, entry)

    def _publish(
        self, application: Any, session: StateSession, writes: Tuple[StateWrite, ...]
    ) -> None:
        """Show the committed data in the Application's dicts (jobs and other code read
        them there), where they are mappings that can be updated in place. ``writes``: the
        session's landed writes (their data are the session's own copies, which nobody
        changes any more: copied as they are, not decoded again)."""
        shown: List[Tuple[str, StateKey, Any, int, str]] = []
        with self._lock:  # once per update: which data changed since they were shown
            for kind, (key, value) in session.data.items():
                newest = self._committed.get(key)
                if newest is None or newest.value is None:
                    continue
                if self._published.get(key) == newest.version:
                    continue  # shown already (an update that did not change it)
                self._published[key] = newest.version
                shown.append((kind, key, value, newest.version, newest.value))
        if not shown:
            return
        written = {w.key: w.version + 1 for w in writes}
        for kind, key, value, version, text in shown:
            if kind == "bot":
                target = application.bot_data
            elif kind == "user":
                target = application.user_data[int(key.key)]
            else:
                target = application.chat_data[int(key.key)]
            if _mutable_mapping(target) and _mutable_mapping(value) and target is not value:
                target.clear()
                target.update(value if written.get(key) == version else decode_state(text))

    def _notice_outside_change(self, key: StateKey, data: Any, what: str) -> None:
        """PTB's flush hands over data that differ from the committed ones: changed outside
        any update (a job, or code using the Application's dicts). Say so once per key."""
        with self._lock:
            committed = self._committed.get(key)
            if key in self._noticed:
                return
        if committed is None or committed.value is None:
            if not data:
                return
        elif same_state(committed.value, data, encode_state(data)):
            return
        with self._lock:
            self._noticed.add(key)
        _LOGGER.warning(
            "FencedPersistence: %s was changed outside any update (in a job, or through the "
            "Application's dicts): it is not persisted; change persisted state in a handler, "
            "through context",
            what,
        )

    # -- BasePersistence --------------------------------------------------------------------
    async def get_user_data(self) -> Dict[int, Any]:
        """Nothing at start: each update reads its user's data from the store.

        Raises:
            RuntimeError: Not attached to a ptb_fence Application (a
                :class:`~ptb_fence.ptb.FencedUpdateProcessor` is needed).
        """
        self._app()
        return {}

    async def get_chat_data(self) -> Dict[int, Any]:
        """Nothing at start: each update reads its chat's data from the store.

        Raises:
            RuntimeError: Not attached to a ptb_fence Application.
        """
        self._app()
        return {}

    async def get_bot_data(self) -> Any:
        """The committed ``bot_data``, as jobs see it. Each update reads it again.

        Raises:
            RuntimeError: Not attached to a ptb_fence Application.
        """
        application = self._app()
        processor = application.update_processor
        rows = await processor.call_store(processor.runtime.port.read_state, [_BOT])
        self._learn(rows)
        entry = rows.get(_BOT)
        if entry is None or entry.value is None:
            return self._empty(application, "bot")
        return decode_state(entry.value)

    async def get_callback_data(self) -> None:
        """:obj:`None`: nothing at start. A press of a keyboard this process's cache does not
        hold reads that keyboard from the store before it is handled."""
        return None

    async def get_conversations(self, name: str) -> Dict[Any, Any]:
        """Nothing at start: each update reads its conversation states from the store.

        Raises:
            RuntimeError: Not attached to a ptb_fence Application.
        """
        self._app()
        return {}

    async def update_conversation(self, name: str, key: Any, new_state: Optional[object]) -> None:
        """Writes nothing: the state was written with the update that set it."""

    async def update_user_data(self, user_id: int, data: Any) -> None:
        """Writes nothing (the fence wrote what handlers changed). It logs a WARNING if ``data``
        differs from the committed data (changed outside any update)."""
        self._notice_outside_change(StateKey("user", "", str(user_id)), data,
                                    f"user_data of user {user_id}")

    async def update_chat_data(self, chat_id: int, data: Any) -> None:
        """Writes nothing. It logs a WARNING if ``data`` differs from the committed data."""
        self._notice_outside_change(StateKey("chat", "", str(chat_id)), data,
                                    f"chat_data of chat {chat_id}")

    async def update_bot_data(self, data: Any) -> None:
        """Writes nothing. It logs a WARNING if ``data`` differs from the committed data."""
        self._notice_outside_change(_BOT, data, "bot_data")

    async def update_callback_data(self, data: Any) -> None:
        """Writes nothing: each keyboard was written with the update that sent it."""

    async def drop_chat_data(self, chat_id: int) -> None:
        """Delete the chat's data from the store (``Application.drop_chat_data``, applied by
        PTB's next flush): see :meth:`drop_user_data`."""
        await self._drop(StateKey("chat", "", str(chat_id)), f"chat_data of chat {chat_id}")

    async def drop_user_data(self, user_id: int) -> None:
        """Delete the user's data from the store (``Application.drop_user_data``, applied by
        PTB's next flush, at the latest when the Application stops): a tombstone at the
        version read, outside any update's fence. When another writer moved the version
        meanwhile the row is read again and the drop retried, a few times, then given up with
        a WARNING (a store error is logged the same way: PTB's flush would only hand it to the
        error handlers without an update)."""
        await self._drop(StateKey("user", "", str(user_id)), f"user_data of user {user_id}")

    def dropping(self, application: Any, kind: str, ident: int) -> None:
        """``Application.drop_user_data``/``drop_chat_data`` was called (the
        :class:`~ptb_fence.ptb.FencedApplicationMixin` calls this before PTB drops its dict).
        Inside the handling of an update whose session holds that user's or chat's data the
        drop rides the update's completion (a failed attempt drops nothing) and PTB's later
        flush leaves that row alone (a later update may have filled it again). Elsewhere the
        flush applies it."""
        if self._application is None or self._application() is not application:
            return
        session = active_session()
        key = StateKey(kind, "", str(ident))
        if session is None or session.ended or session.holds(key) != kind:
            return
        session.drop(kind, self._empty(application, kind))
        with self._lock:
            self._session_drops.add(key)

    async def _drop(self, key: StateKey, what: str) -> None:
        application = None if self._application is None else self._application()
        if application is None:
            return
        with self._lock:
            if key in self._session_drops:  # an update's completion carries this drop
                self._session_drops.discard(key)
                return
        processor: Any = getattr(application, "update_processor")
        port = processor.runtime.port
        try:
            for _ in range(_DROP_TRIES):
                rows: Dict[StateKey, StateEntry] = await processor.call_store(
                    port.read_state, [key]
                )
                self._learn(rows)
                entry = rows.get(key)
                if entry is None or entry.value is None:
                    return  # nothing stored (or dropped already)
                write = StateWrite(key, None, entry.version)
                conflict = await processor.call_store(
                    port.write_state, (write,), processor.runtime.now_ms()
                )
                if conflict is None:
                    self._learn({key: StateEntry(None, entry.version + 1)})
                    return
        except Exception as exc:  # the flush has no update to fail: say it here
            _LOGGER.warning("FencedPersistence: %s was not dropped from the store: %s: %s",
                            what, type(exc).__name__, exc)
            return
        _LOGGER.warning(
            "FencedPersistence: %s was not dropped from the store: it changed %d times while "
            "the drop was tried (another update kept writing it); drop it again", what,
            _DROP_TRIES,
        )

    async def refresh_user_data(self, user_id: int, user_data: Any) -> None:
        """Nothing: the update's data were read from the store before it was handled."""

    async def refresh_chat_data(self, chat_id: int, chat_data: Any) -> None:
        """Nothing: the update's data were read from the store before it was handled."""

    async def refresh_bot_data(self, bot_data: Any) -> None:
        """Nothing: the update's data were read from the store before it was handled."""

    async def flush(self) -> None:
        """Nothing to flush: every change was committed with its update."""


def _user_and_chat(update: Update) -> Tuple[Optional[int], Optional[int]]:
    """The user and the chat whose data an update's handlers get (a durable job's run: the
    job's)."""
    run = job_run_of(update.api_kwargs)
    if run is not None:
        return run.user_id, run.chat_id
    user, chat = update.effective_user, update.effective_chat
    return (None if user is None else user.id), (None if chat is None else chat.id)


def _timed_out(update: Update) -> Optional[Tuple[str, Tuple[Any, ...]]]:
    """The handler name and conversation key of a conversation timeout's run, or
    :obj:`None`."""
    run = job_run_of(update.api_kwargs)
    if run is None or not run.callback.startswith(CONVERSATION_TIMEOUT):
        return None
    try:
        found = conversation_timeout_of(run.name, decode_state(run.data))
    except Exception:  # a run this process cannot read runs without the conversation
        return None
    return None if found is None else (found[0], found[1])
