"""Per-chat order: updates of one chat run one after another, in update_id order.

One definition of the chat key: :func:`chat_key` for an update dict, :func:`update_chat_key`
for a python-telegram-bot ``Update``, :func:`stored_chat_key` for what a store records. One
in-process turn keeper, :class:`ChatOrder`, used by both front ends: ``UpdateIntake`` starts a
worker from its ``start`` callback, the PTB processor wakes an asyncio future
(:class:`ptb_fence.ptb._chat_turns.ChatTurns`). Across processes (``strict_chat_order``) the
store keeps the order: see :class:`~ptb_fence.runtime._store_chat_order.StoreChatOrder`.
"""

from __future__ import annotations

import heapq
import threading
from collections.abc import Mapping  # not typing's alias: its isinstance is 5x slower
from typing import Any, Callable, Dict, Hashable, List, Optional, Set, Tuple


__all__ = ["ChatOrder", "JOB_KEY", "chat_key", "stored_chat_key", "update_chat_key"]


JOB_KEY = "ptb_fence_job"
"""The key of a durable job run's payload in its update body (see ``_durable_jobs``)."""


def chat_key(update: Mapping[str, Any]) -> Hashable:
    """The ordering key of an update dict: its chat's id, else its user's, else its own id.

    A private chat's id equals its user's id, so a user's inline queries and their private
    messages share one key.
    """
    for name, value in update.items():
        if name == "update_id" or not isinstance(value, Mapping):
            continue
        if name == JOB_KEY:  # a durable job's run: its job's chat, else its user
            for field in ("chat_id", "user_id"):
                if isinstance(value.get(field), int):
                    return int(value[field])
            continue
        chat = value.get("chat")
        if not isinstance(chat, Mapping):
            message = value.get("message")
            chat = message.get("chat") if isinstance(message, Mapping) else None
        chat_id = chat.get("id") if isinstance(chat, Mapping) else None
        if isinstance(chat_id, int):
            return chat_id
        for user_field in ("from", "user"):
            user = value.get(user_field)
            user_id = user.get("id") if isinstance(user, Mapping) else None
            if isinstance(user_id, int):
                return user_id
    return ("update", update.get("update_id"))


def update_chat_key(update: Any) -> Hashable:
    """The ordering key of a python-telegram-bot ``Update``: the same rule as :func:`chat_key`
    (its effective chat's id, else its effective user's, else its own id), so both front ends
    order chats alike."""
    chat = update.effective_chat
    if chat is not None:
        return int(chat.id)
    user = update.effective_user
    if user is not None:
        return int(user.id)
    job = (getattr(update, "api_kwargs", None) or {}).get(JOB_KEY)
    if isinstance(job, Mapping):  # a durable job's run: its job's chat, else its user
        for field in ("chat_id", "user_id"):
            if isinstance(job.get(field), int):
                return int(job[field])
    return ("update", update.update_id)


def stored_chat_key(key: Hashable) -> Optional[int]:
    """The chat key a store records for ``key`` (from :func:`chat_key`/
    :func:`update_chat_key`): the chat's (or user's) id, :obj:`None` for an update of no chat
    (keyed by its own id), which is never ordered."""
    return key if isinstance(key, int) and not isinstance(key, bool) else None


class ChatOrder:
    """Hands updates to ``start(key, update_id, item)`` one chat at a time (thread-safe).

    A chat waiting for its turn holds no worker: only the head of each chat is started. When
    the started update finishes the caller calls :meth:`done`, which starts the chat's next
    update (smallest ``update_id`` first). ``start`` is called outside the lock, on the thread
    that called :meth:`submit` or :meth:`done`.
    """

    __slots__ = ("_busy", "_cond", "_known", "_lock", "_queues", "_start")

    def __init__(self, start: Callable[[Hashable, int, Any], None]) -> None:
        self._start = start
        # taken as the lock itself (no Python frame per use, as the Condition's would add).
        # The condition only wakes wait_empty
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._queues: Dict[Hashable, List[Tuple[int, int, Any]]] = {}
        self._busy: Set[Hashable] = set()
        self._known: Set[int] = set()

    def __len__(self) -> int:
        with self._lock:
            return len(self._known)

    def knows(self, update_id: int) -> bool:
        """Whether ``update_id`` is queued or running here."""
        with self._lock:
            return update_id in self._known

    def submit(self, key: Hashable, update_id: int, item: Any) -> bool:
        """Queue an update. Returns :obj:`False` if it is already queued or running here."""
        with self._lock:
            if update_id in self._known:
                return False
            self._known.add(update_id)
            heapq.heappush(self._queues.setdefault(key, []), (update_id, id(item), item))
            if key in self._busy:
                return True
            self._busy.add(key)
            head = heapq.heappop(self._queues[key])
        self._start(key, head[0], head[2])
        return True

    def done(self, key: Hashable, update_id: int) -> None:
        """The update finished: start the chat's next one, if any."""
        with self._lock:
            self._known.discard(update_id)
            queue = self._queues.get(key)
            if queue:
                head = heapq.heappop(queue)
            else:
                self._queues.pop(key, None)
                self._busy.discard(key)
                head = None
            if not self._known:
                self._cond.notify_all()  # what wait_empty waits for
        if head is not None:
            self._start(key, head[0], head[2])

    def waiting_count(self) -> int:
        """How many updates wait for their chat's turn (each busy chat runs one of those it
        knows). Read without the lock, a snapshot."""
        return len(self._known) - len(self._busy)

    def waiting(self, key: Hashable) -> bool:
        """Whether an update of ``key``'s chat waits here for its turn."""
        with self._lock:
            return bool(self._queues.get(key))

    def withdraw(self, key: Hashable, update_id: int) -> bool:
        """Take a waiting update out of its chat's queue (e.g. its task was cancelled).
        Returns :obj:`False` if it is not waiting (already started: call :meth:`done` instead)."""
        with self._lock:
            queue = self._queues.get(key)
            if not queue:
                return False
            kept = [entry for entry in queue if entry[0] != update_id]
            if len(kept) == len(queue):
                return False
            heapq.heapify(kept)
            self._queues[key] = kept
            self._known.discard(update_id)
            self._cond.notify_all()
            return True

    def drop_waiting(self) -> int:
        """Forget every update still waiting for its chat's turn. Returns how many."""
        with self._lock:
            dropped = 0
            for key, queue in list(self._queues.items()):
                for update_id, _, _ in queue:
                    self._known.discard(update_id)
                    dropped += 1
                queue.clear()
            self._cond.notify_all()
            return dropped

    def wait_empty(self, timeout: "float | None") -> bool:
        """Wait until nothing is queued or running. Returns :obj:`False` on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._known, timeout)
