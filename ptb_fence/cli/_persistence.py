"""``ptb-fence persistence``: move a bot's state between a PicklePersistence file and the
store (``import``, ``export``) and show one user's, chat's or conversation's state (``show``).

The file has python-telegram-bot's own :class:`telegram.ext.PicklePersistence` format (a
single file by default). It holds ``user_data``, ``chat_data``, ``bot_data``, the
``conversations`` of every named handler and the keyboards of the callback-data cache
(``arbitrary_callback_data``). Each keyboard is one ``callback`` row, as FencedPersistence
keeps them. The cache's callback-query ids are not moved. They only matter to the process
that answered the queries.
"""

from __future__ import annotations

import asyncio
import os
import pickle
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

from ptb_fence._state_codec import (
    conversation_state_key,
    decode_state,
    encode_state,
    same_state,
    state_key_tuple,
)
from ptb_fence._values import StateEntry, StateKey, StateWrite
from ptb_fence.cli._errors import Refused
from ptb_fence.cli._progress import bar

__all__ = ["BATCH", "export_pickle", "import_pickle", "iter_state", "read_pickle", "show_state",
           "stored_state"]

_PAGE = 500

BATCH = 1000
"""Keys written per transaction by an import.

PostgreSQL holds an advisory lock per key until the commit. A stock server's lock table has
room for about 6,400 locks (64 per connection), shared by every session."""

_TRIES = 5


def read_pickle(path: str, *, multi_file: bool = False) -> Dict[str, Any]:
    """The state in a PicklePersistence file: ``user_data``, ``chat_data``, ``bot_data``,
    ``conversations`` (``{name: {key tuple: state}}``), read by PTB's PicklePersistence.

    Raises:
        Refused: The file does not exist or is not PicklePersistence data.
    """
    from telegram.ext import PicklePersistence

    if not multi_file and not Path(path).is_file():
        raise Refused(f"no PicklePersistence file at {path!r}")
    persistence = PicklePersistence(filepath=path, single_file=not multi_file)

    async def load() -> Dict[str, Any]:
        users = await persistence.get_user_data()
        chats = await persistence.get_chat_data()
        bot = await persistence.get_bot_data()
        try:
            await persistence.get_conversations("")  # loads every handler's conversations
        except AttributeError:  # PTB wrote None: the bot had no persistent conversation
            persistence.conversations = {}
        callback = await persistence.get_callback_data()
        # a kind the bot did not store (PersistenceInput(chat_data=False), ...) is None in
        # the file: nothing of it to import
        return {"user_data": dict(users or {}), "chat_data": dict(chats or {}), "bot_data": bot,
                "conversations": dict(persistence.conversations or {}),
                "keyboards": list(callback[0]) if callback else []}

    try:
        return asyncio.run(load())
    except TypeError as exc:  # PTB's message for a file that is no pickle data
        raise Refused(f"{path!r}: {exc}") from None


def _values_of(data: Dict[str, Any]) -> Iterator[Tuple[StateKey, Any]]:
    """The file's state, one key and value at a time (encoded by the caller, batch by batch:
    the text of every row at once would double what the loaded file takes)."""
    for user_id, value in data["user_data"].items():
        if value:
            yield StateKey("user", "", str(int(user_id))), value
    for chat_id, value in data["chat_data"].items():
        if value:
            yield StateKey("chat", "", str(int(chat_id))), value
    if data["bot_data"]:
        yield StateKey("bot"), data["bot_data"]
    for name, states in data["conversations"].items():
        for key, state in states.items():
            if state is not None:
                yield conversation_state_key(name, tuple(key)), state
    for uuid, access_time, buttons in data.get("keyboards", []):
        yield StateKey("callback", "", str(uuid)), (access_time, dict(buttons))


_Batch = Dict[StateKey, Tuple[Any, str]]


def _batches(items: Iterator[Tuple[StateKey, Any]]) -> Iterator[_Batch]:
    """The items with their encoded text, :data:`BATCH` keys at a time (a key given twice:
    the last wins)."""
    batch: _Batch = {}
    for key, value in items:
        batch[key] = (value, encode_state(value))
        if len(batch) >= BATCH:
            yield batch
            batch = {}
    if batch:
        yield batch


def iter_state(store: Any, kind: Optional[str] = None,
               name: Optional[str] = None) -> Iterator[Tuple[StateKey, StateEntry]]:
    """Every row (of ``kind``/``name``), read page by page (each page its own read: nothing is
    held open between pages)."""
    after: Optional[StateKey] = None
    while True:
        page = store.list_state(kind=kind, name=name, after=after, limit=_PAGE)
        yield from page
        if len(page) < _PAGE:
            return
        after = page[-1][0]


def stored_state(store: Any, kind: Optional[str] = None,
                 name: Optional[str] = None) -> List[Tuple[StateKey, StateEntry]]:
    """Every row (of ``kind``/``name``), page by page."""
    return list(iter_state(store, kind, name))


class _Progress:
    """Progress lines for a long import or export, at most one a second and one at the end
    (a bar when the total is known).

    Args:
        say: Where a line goes (the command's stderr).
        verb: What is done to the rows (``"imported"``, ``"exported"``).
        total: How many rows there are (:obj:`None`: not known ahead).
    """

    __slots__ = ("_last", "_say", "_total", "_verb", "done")

    def __init__(self, say: Optional[Callable[[str], None]], verb: str,
                 total: Optional[int]) -> None:
        self._say = say
        self._verb = verb
        self._total = total
        self._last = time.monotonic()
        self.done = 0

    def add(self, rows: int, *, final: bool = False) -> None:
        """Count ``rows`` more as done and say so if a second passed (or at the end)."""
        self.done += rows
        now = time.monotonic()
        if self._say is None or (not final and now - self._last < 1.0):
            return
        self._last = now
        # the same bar as the other long commands (prune, migrate)
        self._say(f"{self._verb} {bar(self.done, self._total)} state row(s)")


def _present(current: Dict[StateKey, StateEntry], batch: _Batch) -> List[StateKey]:
    """The batch's keys that hold other state in the store than the file's (a key that holds
    the file's state already was imported before: an import that stopped, run again)."""
    return [
        key for key, entry in current.items()
        if entry.value is not None and not same_state(entry.value, *batch[key])
    ]


def import_pickle(store: Any, path: str, *, at: int, multi_file: bool = False,
                  replace: bool = False,
                  progress: Optional[Callable[[str], None]] = None) -> Dict[str, int]:
    """Write the file's state into the store, :data:`BATCH` keys per transaction.

    One transaction for every key would hold a PostgreSQL advisory lock per key until its
    commit. The server's lock table (``max_locks_per_transaction`` times the connections) is
    full beyond about 10,000 keys. Every other session on the server then fails too.
    A batch holds at most :data:`BATCH` locks, for a moment.

    Without ``replace`` a key that already holds other state in the store is refused: every
    key is read first, and nothing is written when one is found. A key that holds the file's
    state already is left as it is, so an import that stopped (a lost connection, a signal)
    is finished by running it again. With ``replace`` the file's value replaces the stored
    one (at its current version).

    Args:
        store: The store (keeps state: ``read_state``, ``write_state``).
        path: The PicklePersistence file.
        at: The write time (epoch milliseconds).
        multi_file: The file was written with ``single_file=False``.
        replace: Overwrite other state the store holds for the file's keys.
        progress: Where a line of progress goes (at most one a second).

    Returns:
        Dict[:obj:`str`, :obj:`int`]: How many rows per kind the file has (written now or
        holding the file's state already).

    Raises:
        Refused: The file is unreadable, the store keeps no state, other state exists (without
            ``replace``), or it changed while the import ran (run it again).
    """
    if not callable(getattr(store, "write_state", None)):
        raise Refused(f"{type(store).__name__} keeps no persisted bot state")
    data = read_pickle(path, multi_file=multi_file)
    total = sum(1 for _ in _values_of(data))
    if not replace:  # every batch read before any is written: refused, nothing written
        checked = _Progress(progress, "checked", total)
        for batch in _batches(_values_of(data)):
            present = _present(store.read_state(list(batch)), batch)
            if present:
                raise Refused(
                    f"the store already holds other state for {_key_text(present[0])}"
                    + (f" and {len(present) - 1} more of the file's keys"
                       if len(present) > 1 else "")
                    + " (in the first of them read): pass --replace to overwrite it with the "
                    "file's, or export it first"
                )
            checked.add(len(batch))
    done = _Progress(progress, "imported", total)
    counts: Dict[str, int] = {}
    for batch in _batches(_values_of(data)):
        _write_batch(store, batch, at, replace=replace, written=done.done)
        for key in batch:
            counts[key.kind] = counts.get(key.kind, 0) + 1
        done.add(len(batch))
    done.add(0, final=True)
    return counts


def _key_text(key: StateKey) -> str:
    return " ".join(part for part in (key.kind, key.name, key.key) if part)


def _write_batch(store: Any, batch: _Batch, at: int, *, replace: bool,
                 written: int) -> None:
    """Write one batch in one transaction, at the versions read just before. A version that
    moved (a bot writing the same keys meanwhile) reads and writes the batch again, a few
    times."""
    for _ in range(_TRIES):
        current = store.read_state(list(batch))
        present = set(_present(current, batch))
        if present and not replace:
            raise Refused(
                f"other state was written for {len(present)} of the file's keys while the import "
                f"ran (e.g. {_key_text(next(iter(present)))}); {written:,} row(s) were imported "
                "before it: pass --replace to overwrite it, or run the import again after an "
                "export"
            )
        writes = [
            StateWrite(key, text, current[key].version if key in current else 0)
            for key, (_, text) in batch.items()
            if key not in current or current[key].value is None or key in present
        ]
        if not writes or store.write_state(writes, at) is None:
            return
    raise Refused(
        f"state kept changing while importing ({_TRIES} tries of one batch of {len(batch)} "
        f"keys); {written:,} row(s) were imported before it: run the import again (rows "
        "holding the file's state already are skipped)"
    )


def export_pickle(store: Any, path: str,
                  progress: Optional[Callable[[str], None]] = None) -> Dict[str, int]:
    """Write the store's state to a PicklePersistence file (single file, PTB's format).

    The rows are read page by page (each page a read of its own: no transaction or lock is
    held, and only one page's text is in memory beside the decoded state). The file is
    written to a temporary name and renamed into place once complete.

    Args:
        store: The store.
        path: The file to write.
        progress: Where a line of progress goes (at most one a second).

    Returns:
        Dict[:obj:`str`, :obj:`int`]: How many rows per kind were written.
    """
    data: Dict[str, Any] = {"user_data": {}, "chat_data": {}, "bot_data": {},
                            "callback_data": None, "conversations": {}}
    counts: Dict[str, int] = {}
    keyboards: List[Tuple[str, float, Dict[str, Any]]] = []
    done = _Progress(progress, "exported", None)
    for key, entry in iter_state(store):
        if entry.value is None:
            continue
        value = decode_state(entry.value)
        if key.kind == "user":
            data["user_data"][int(key.key)] = value
        elif key.kind == "chat":
            data["chat_data"][int(key.key)] = value
        elif key.kind == "bot":
            data["bot_data"] = value
        elif key.kind == "conversation":
            data["conversations"].setdefault(key.name, {})[state_key_tuple(key)] = value
        elif key.kind == "callback":
            access_time, buttons = value
            keyboards.append((key.key, access_time, buttons))
        else:
            continue
        counts[key.kind] = counts.get(key.kind, 0) + 1
        done.add(1)
    if keyboards:  # PTB's format: (keyboards, callback-query ids)
        data["callback_data"] = (keyboards, {})
    partial = f"{path}.part"
    with open(partial, "wb") as file:
        pickle.dump(data, file, protocol=pickle.HIGHEST_PROTOCOL)
    os.replace(partial, path)
    done.add(0, final=True)
    return counts


def show_state(store: Any, *, user: Optional[int] = None, chat: Optional[int] = None,
               bot: bool = False, conversation: Optional[str] = None,
               key: Optional[str] = None) -> List[Tuple[StateKey, StateEntry, Any]]:
    """The rows asked for, with their decoded values: one user's, one chat's, the bot's, or
    a conversation's (one key given as JSON, e.g. ``[5, 7]``, else every key)."""
    if conversation is not None:
        if key is None:
            rows = stored_state(store, "conversation", conversation)
        else:
            import json

            try:
                parsed = json.loads(key)
            except ValueError:
                raise Refused(f"--key must be the conversation key as JSON, e.g. [5, 7]; got "
                              f"{key!r}") from None
            wanted = conversation_state_key(conversation, tuple(parsed if isinstance(parsed, list)
                                                                else [parsed]))
            rows = list(store.read_state([wanted]).items())
    else:
        wanted_key = (StateKey("user", "", str(user)) if user is not None
                      else StateKey("chat", "", str(chat)) if chat is not None
                      else StateKey("bot"))
        rows = list(store.read_state([wanted_key]).items())
    return [(k, e, None if e.value is None else decode_state(e.value)) for k, e in rows]
