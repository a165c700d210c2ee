"""The callback-data cache (``arbitrary_callback_data``) under FencedPersistence: one state row
per keyboard, written with the completion of the update that sent it, read back when a press
of it reaches a process whose cache does not hold it.

A keyboard's row is ``StateKey("callback", "", keyboard_uuid)`` holding the encoded
``(access_time, {button_uuid: callback_data})``, as PTB's ``CallbackDataCache`` keeps it.
Rows are written once (from version 0: the uuids are random). ``prune`` deletes the rows
written before the store's retain period (see the README).
"""

from __future__ import annotations

import time
from typing import Any, Dict, Optional, Tuple

from telegram import CallbackQuery, InlineKeyboardMarkup, Message
from telegram.ext import CallbackDataCache, InvalidCallbackData

from ptb_fence._state_codec import decode_state, encode_state
from ptb_fence._values import StateKey, StateWrite
from ptb_fence.ptb._ptb_internals import set_callback_query_data
from ptb_fence.ptb._state_session import active_session

__all__ = [
    "Keyboard",
    "keyboard_key",
    "keyboard_of",
    "keyboard_write",
    "pressed_keyboard",
    "record_keyboard",
    "resolve_press",
    "outbox_preparer",
]

Keyboard = Tuple[str, float, Dict[str, Any]]
"""``(keyboard uuid, access time, {button uuid: callback data})``, as
``CallbackDataCache.persistence_data`` lists a keyboard."""

_UUID = 32  # the length of a uuid4().hex: PTB's ids are keyboard uuid + button uuid


def keyboard_key(uuid: str) -> StateKey:
    """The state row of keyboard ``uuid``."""
    return StateKey("callback", "", uuid)


def keyboard_of(original: Any, sent: Any) -> Optional[Keyboard]:
    """The keyboard the cache inserted when it turned ``original`` into ``sent`` (same
    buttons, their data replaced by ``keyboard uuid + button uuid``), or :obj:`None`."""
    if not isinstance(original, InlineKeyboardMarkup) or not isinstance(
        sent, InlineKeyboardMarkup
    ):
        return None
    uuid: Optional[str] = None
    buttons: Dict[str, Any] = {}
    for row, sent_row in zip(original.inline_keyboard, sent.inline_keyboard):
        for button, sent_button in zip(row, sent_row):
            text = sent_button.callback_data
            if button.callback_data is None or not isinstance(text, str) or len(text) <= _UUID:
                continue
            uuid = text[:_UUID]
            buttons[text[_UUID:]] = button.callback_data
    if uuid is None:
        return None
    return uuid, time.time(), buttons


def keyboard_write(keyboard: Keyboard) -> StateWrite:
    """The write that stores ``keyboard`` (a new row)."""
    uuid, access_time, buttons = keyboard
    return StateWrite(keyboard_key(uuid), encode_state((access_time, buttons)), 0)


def record_keyboard(original: Any, sent: Any) -> None:
    """The bot's cache inserted a keyboard (``context.bot`` sent or edited one): the update
    being handled in this task writes it with its completion. Outside an update (a job), or
    without the callback-data cache fenced, it stays in this process's cache only."""
    session = active_session()
    if session is None or session.ended or session.keyboards is None:
        return
    keyboard = keyboard_of(original, sent)
    if keyboard is not None:
        session.keyboards[keyboard[0]] = keyboard


def pressed_keyboard(update: Any) -> Optional[Tuple[str, str]]:
    """``(keyboard uuid, button uuid)`` of a press this process's cache could not resolve
    (``callback_query.data`` is ``InvalidCallbackData`` holding the id), else :obj:`None`."""
    query = getattr(update, "callback_query", None)
    if not isinstance(query, CallbackQuery) or not isinstance(query.data, InvalidCallbackData):
        return None
    text = query.data.callback_data
    if not isinstance(text, str) or len(text) <= _UUID:
        return None
    return text[:_UUID], text[_UUID:]


def resolve_press(bot: Any, update: Any, uuid: str, value: Optional[str]) -> bool:
    """Resolve the press of keyboard ``uuid`` (see :func:`pressed_keyboard`) from its stored
    row's ``value``: ``callback_query.data`` and the buttons of the message it is under get
    their original objects, and the bot's cache learns the keyboard as if it had sent it
    (``drop_data`` works). :obj:`False` when the row is missing (the data stay
    ``InvalidCallbackData``)."""
    cache: Any = getattr(bot, "callback_data_cache", None)
    if value is None or not isinstance(cache, CallbackDataCache):
        return False
    access_time, buttons = decode_state(value)
    query: CallbackQuery = update.callback_query
    cache.load_persistence_data(([(uuid, access_time, dict(buttons))], {query.id: uuid}))
    pressed = pressed_keyboard(update)
    if pressed is not None and pressed[1] in buttons:
        set_callback_query_data(query, buttons[pressed[1]])
    message = query.message
    if isinstance(message, Message) and message.reply_markup is not None:
        for row in message.reply_markup.inline_keyboard:
            for button in row:
                data = button.callback_data
                if not isinstance(data, InvalidCallbackData):
                    continue
                text = data.callback_data
                if isinstance(text, str) and text[:_UUID] == uuid and text[_UUID:] in buttons:
                    button.update_callback_data(buttons[text[_UUID:]])
    return True


def outbox_preparer(bot: Any) -> Any:
    """The outbox's ``prepare`` for a bot with ``arbitrary_callback_data``: an inline
    keyboard of a queued call is put into the bot's cache as PTB does when it sends one (the
    outbox keeps the ids, which are JSON), and the keyboard is written with the update's
    completion (held calls) or with the open fenced transaction carrying the call (returned
    as its state write)."""

    def prepare(method: str, params: Dict[str, Any],
                in_transaction: bool) -> Tuple[Dict[str, Any], Tuple[StateWrite, ...]]:
        markup = params.get("reply_markup")
        cache: Any = getattr(bot, "callback_data_cache", None)
        if not isinstance(markup, InlineKeyboardMarkup) or not isinstance(
            cache, CallbackDataCache
        ):
            return params, ()
        # the base class's method: the fenced cache's own would record it a second time
        sent = CallbackDataCache.process_keyboard(cache, markup)
        if sent is markup:
            return params, ()
        params = dict(params, reply_markup=sent)
        session = active_session()
        keyboard = keyboard_of(markup, sent)
        if session is None or session.ended or session.keyboards is None or keyboard is None:
            return params, ()
        if in_transaction:
            return params, (keyboard_write(keyboard),)
        session.keyboards[keyboard[0]] = keyboard
        return params, ()

    return prepare
