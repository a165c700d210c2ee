"""``ptb-fence persistence``: move a bot's state between a PicklePersistence file and the
store (``import``, ``export``) and show one user's, chat's or conversation's state (``show``).

The file is read and written with python-telegram-bot's own :class:`telegram.ext.PicklePersistence`
format (a single file by default): ``user_data``, ``chat_data``, ``bot_data``, the
``conversations`` of every named handler and the keyboards of the callback-data cache
(``arbitrary_callback_data``; one ``callback`` row per keyboard, as FencedPersistence keeps
them). The cache's callback-query ids are not moved: they only matter to the process that
answered the queries.
"""

from __future__ import annotations

import asyncio
import pickle
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from ptb_fence._state_codec import (
    conversation_state_key,
    decode_state,
    encode_state,
    state_key_tuple,
)
from ptb_fence._values import StateEntry, StateKey, StateWrite
from ptb_fence.cli._errors import Refused

__all__ = ["export_pickle", "import_pickle", "read_pickle", "show_state", "stored_state"]

_PAGE = 500


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
        await persistence.get_conversations("")  # loads every handler's conversations
        callback = await persistence.get_callback_data()
        return {"user_data": dict(users), "chat_data": dict(chats), "bot_data": bot,
                "conversations": dict(persistence.conversations or {}),
                "keyboards": list(callback[0]) if callback else []}

    try:
        return asyncio.run(load())
    except TypeError as exc:  # PTB's message for a file that is no pickle data
        raise Refused(f"{path!r}: {exc}") from None


def _writes_of(data: Dict[str, Any]) -> Dict[StateKey, str]:
    texts: Dict[StateKey, str] = {}
    for user_id, value in data["user_data"].items():
        if value:
            texts[StateKey("user", "", str(int(user_id)))] = encode_state(value)
    for chat_id, value in data["chat_data"].items():
        if value:
            texts[StateKey("chat", "", str(int(chat_id)))] = encode_state(value)
    if data["bot_data"]:
        texts[StateKey("bot")] = encode_state(data["bot_data"])
    for name, states in data["conversations"].items():
        for key, state in states.items():
            if state is not None:
                texts[conversation_state_key(name, tuple(key))] = encode_state(state)
    for uuid, access_time, buttons in data.get("keyboards", []):
        texts[StateKey("callback", "", str(uuid))] = encode_state((access_time, dict(buttons)))
    return texts


def stored_state(store: Any, kind: Optional[str] = None,
                 name: Optional[str] = None) -> List[Tuple[StateKey, StateEntry]]:
    """Every row (of ``kind``/``name``), page by page."""
    rows: List[Tuple[StateKey, StateEntry]] = []
    after: Optional[StateKey] = None
    while True:
        page = store.list_state(kind=kind, name=name, after=after, limit=_PAGE)
        rows += page
        if len(page) < _PAGE:
            return rows
        after = page[-1][0]


def import_pickle(store: Any, path: str, *, at: int, multi_file: bool = False,
                  replace: bool = False) -> Dict[str, int]:
    """Write the file's state into the store in one transaction.

    Without ``replace`` a key that already holds state in the store is refused (nothing is
    written); with it, the file's value replaces it (at its current version).

    Returns:
        Dict[:obj:`str`, :obj:`int`]: How many rows per kind were written.

    Raises:
        Refused: The file is unreadable, the store keeps no state, state exists (without
            ``replace``), or it changed while the import ran (run it again).
    """
    if not callable(getattr(store, "write_state", None)):
        raise Refused(f"{type(store).__name__} keeps no persisted bot state")
    texts = _writes_of(read_pickle(path, multi_file=multi_file))
    current = store.read_state(list(texts)) if texts else {}
    present = [key for key, entry in current.items() if entry.value is not None]
    if present and not replace:
        raise Refused(
            f"the store already holds state for {len(present)} of the file's keys (e.g. "
            f"{present[0].kind} {present[0].name} {present[0].key}".replace("  ", " ")
            + "): pass --replace to overwrite it with the file's, or export it first"
        )
    writes = [
        StateWrite(key, text, current[key].version if key in current else 0)
        for key, text in texts.items()
    ]
    conflict = store.write_state(writes, at) if writes else None
    if conflict is not None:
        raise Refused(f"state changed while importing ({len(conflict.keys)} keys): nothing was "
                      "written; run the import again")
    counts: Dict[str, int] = {}
    for key in texts:
        counts[key.kind] = counts.get(key.kind, 0) + 1
    return counts


def export_pickle(store: Any, path: str) -> Dict[str, int]:
    """Write the store's state to a PicklePersistence file (single file, PTB's format).

    Returns:
        Dict[:obj:`str`, :obj:`int`]: How many rows per kind were written.
    """
    data: Dict[str, Any] = {"user_data": {}, "chat_data": {}, "bot_data": {},
                            "callback_data": None, "conversations": {}}
    counts: Dict[str, int] = {}
    keyboards: List[Tuple[str, float, Dict[str, Any]]] = []
    for key, entry in stored_state(store):
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
    if keyboards:  # PTB's format: (keyboards, callback-query ids)
        data["callback_data"] = (keyboards, {})
    with open(path, "wb") as file:
        pickle.dump(data, file)
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
