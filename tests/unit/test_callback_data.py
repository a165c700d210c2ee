"""The callback-data cache under FencedPersistence, piece by piece against the installed PTB:
the keyboard a cache inserted, the press of a keyboard the cache does not hold resolved from
its stored row (the query and the buttons of its message), the body stored for a press PTB
could not resolve."""

from __future__ import annotations

import json
from typing import Any

from telegram import InlineKeyboardButton, InlineKeyboardMarkup, Update
from telegram.ext import ExtBot, InvalidCallbackData

from ptb_fence.ptb._bodies import update_body
from ptb_fence.ptb._callback_data import (
    keyboard_of,
    keyboard_write,
    outbox_preparer,
    pressed_keyboard,
    resolve_press,
)
from ptb_fence.testing import make_callback_query_update

TOKEN = "123456:ABCdef"


def _bot() -> Any:
    return ExtBot(TOKEN, arbitrary_callback_data=True)


def _press(bot: Any, data: str, markup: Any) -> Update:
    raw = make_callback_query_update(7, 5, data, bot_id=123456, message_id=3)
    raw["callback_query"]["message"]["reply_markup"] = markup.to_dict()
    # no sender: PTB then processes the buttons without asking the (offline) bot who it is
    raw["callback_query"]["message"].pop("from", None)
    update = Update.de_json(raw, bot)
    bot.insert_callback_data(update)
    return update


def test_a_keyboard_sent_elsewhere_resolves_from_its_row() -> None:
    sender = _bot()
    original = InlineKeyboardMarkup([[InlineKeyboardButton("a", callback_data={"a": 1}),
                                      InlineKeyboardButton("b", callback_data=("b", 2)),
                                      InlineKeyboardButton("u", url="https://example.org")]])
    sent = sender.callback_data_cache.process_keyboard(original)
    keyboard = keyboard_of(original, sent)
    assert keyboard is not None
    uuid, access_time, buttons = keyboard
    first = sent.inline_keyboard[0][0].callback_data
    assert first[:32] == uuid and buttons[first[32:]] == {"a": 1} and len(buttons) == 2
    write = keyboard_write(keyboard)
    assert write.key.kind == "callback" and write.key.key == uuid and write.version == 0

    other = _bot()  # another process: its cache has never seen the keyboard
    update = _press(other, first, sent)
    assert isinstance(update.callback_query.data, InvalidCallbackData)
    assert pressed_keyboard(update) == (uuid, first[32:])
    # stored while unresolved, the body keeps the button's id
    body = json.loads(update_body(update))
    assert body["callback_query"]["data"] == first and "_ptb_fence" not in body
    assert resolve_press(other, update, uuid, write.value)
    assert update.callback_query.data == {"a": 1}
    shown = update.callback_query.message.reply_markup.inline_keyboard[0]
    assert [b.callback_data for b in shown[:2]] == [{"a": 1}, ("b", 2)]
    # the cache learnt it: the next press resolves in memory; drop_data finds the query
    again = _press(other, sent.inline_keyboard[0][1].callback_data, sent)
    assert again.callback_query.data == ("b", 2) and pressed_keyboard(again) is None
    other.callback_data_cache.drop_data(update.callback_query)


def test_a_press_of_a_keyboard_without_a_row_stays_invalid() -> None:
    bot = _bot()
    markup = InlineKeyboardMarkup([[InlineKeyboardButton("a", callback_data="f" * 64)]])
    update = _press(bot, "f" * 64, markup)
    assert pressed_keyboard(update) == ("f" * 32, "f" * 32)
    assert not resolve_press(bot, update, "f" * 32, None)
    assert isinstance(update.callback_query.data, InvalidCallbackData)
    assert pressed_keyboard(Update.de_json(make_callback_query_update(
        8, 5, "short", bot_id=123456, message_id=3), bot)) is None  # never a cache id


def test_the_outbox_keeps_the_ids_of_a_queued_keyboard() -> None:
    bot = _bot()
    prepare = outbox_preparer(bot)
    markup = InlineKeyboardMarkup([[InlineKeyboardButton("a", callback_data=object())]])
    params, writes = prepare("sendMessage", {"chat_id": 5, "reply_markup": markup}, True)
    assert writes == ()  # no update being handled: nothing to write it with
    kept = params["reply_markup"].inline_keyboard[0][0].callback_data
    assert isinstance(kept, str) and len(kept) == 64
    plain = {"chat_id": 5, "text": "x"}
    assert prepare("sendMessage", plain, False) == (plain, ())
