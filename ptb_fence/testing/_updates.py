"""Builders for realistic Telegram update dicts (as the Bot API sends them).

Every function returns a fresh plain ``dict`` that :meth:`telegram.Update.de_json` accepts and
that :func:`json.dumps` can serialize. The shapes follow the Bot API: a private chat has the same
id as its user, a negative id is a group (a supergroup below ``-10**12``), commands carry a
``bot_command`` entity so that :class:`telegram.ext.CommandHandler` matches them.
"""

from __future__ import annotations

import time
from typing import Any

__all__ = [
    "DEFAULT_GROUP_USER_ID",
    "make_bot_user",
    "make_callback_query_update",
    "make_chat",
    "make_message",
    "make_message_update",
    "make_user",
]

DEFAULT_GROUP_USER_ID = 424242
"""The sender used for messages in group chats when no ``user_id`` is given."""

_SUPERGROUP_BELOW = -(10**12)


def _now() -> int:
    return int(time.time())


def make_user(
    user_id: int,
    *,
    is_bot: bool = False,
    first_name: str | None = None,
    username: str | None = None,
    language_code: str | None = "en",
) -> dict[str, Any]:
    """Build a Bot API ``User`` object.

    Args:
        user_id: The user's id (positive).
        is_bot: Whether the user is a bot.
        first_name: The first name. Defaults to ``"User <id>"``.
        username: The username without ``@``. Defaults to ``"user<id>"``.
        language_code: The IETF language tag. :obj:`None` leaves the field out.

    Returns:
        The ``User`` dict.
    """
    user: dict[str, Any] = {
        "id": user_id,
        "is_bot": is_bot,
        "first_name": first_name if first_name is not None else f"User {user_id}",
        "username": username if username is not None else f"user{user_id}",
    }
    if language_code is not None and not is_bot:
        user["language_code"] = language_code
    return user


def make_bot_user(
    bot_id: int, *, username: str = "fake_test_bot", get_me: bool = False
) -> dict[str, Any]:
    """Build the ``User`` object of a bot.

    Args:
        bot_id: The bot's id (the number before ``:`` in its token).
        username: The bot's username without ``@``.
        get_me: Add the fields only ``getMe`` reports (``can_join_groups``, ...). Leave it
            :obj:`False` for the ``from`` of a message the bot sent.

    Returns:
        The ``User`` dict.
    """
    user = make_user(bot_id, is_bot=True, first_name="Fake Bot", username=username)
    if not get_me:
        return user
    user.update(
        {
            "can_join_groups": True,
            "can_read_all_group_messages": False,
            "supports_inline_queries": False,
            "can_connect_to_business": False,
            "has_main_web_app": False,
        }
    )
    return user


def make_chat(chat_id: int | str) -> dict[str, Any]:
    """Build a Bot API ``Chat`` object for a chat id.

    Args:
        chat_id: A positive id is a private chat with the user of the same id. A negative id is a
            group, or a supergroup when it is below ``-10**12``. A string ``"@name"`` is a public
            channel.

    Returns:
        The ``Chat`` dict.
    """
    if isinstance(chat_id, str):
        name = chat_id.lstrip("@")
        return {"id": -1009999999999, "type": "channel", "title": name, "username": name}
    if chat_id > 0:
        return {
            "id": chat_id,
            "type": "private",
            "first_name": f"User {chat_id}",
            "username": f"user{chat_id}",
        }
    if chat_id < _SUPERGROUP_BELOW:
        return {"id": chat_id, "type": "supergroup", "title": f"Supergroup {-chat_id}"}
    return {"id": chat_id, "type": "group", "title": f"Group {-chat_id}"}


def _utf16_len(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2


def _command_entities(text: str) -> list[dict[str, Any]]:
    if not text.startswith("/") or len(text) < 2:
        return []
    command = text.split(maxsplit=1)[0]
    return [{"type": "bot_command", "offset": 0, "length": _utf16_len(command)}]


def make_message(
    *,
    message_id: int,
    chat_id: int | str,
    text: str | None = None,
    user_id: int | None = None,
    sender: dict[str, Any] | None = None,
    date: int | None = None,
) -> dict[str, Any]:
    """Build a Bot API ``Message`` object.

    Args:
        message_id: The message id (unique per chat).
        chat_id: The chat id, as for :func:`make_chat`.
        text: The text. A leading ``/command`` gets a ``bot_command`` entity. :obj:`None` leaves
            ``text`` out (e.g. for a media message).
        user_id: The sender's id. Defaults to ``chat_id`` in a private chat and to
            :data:`DEFAULT_GROUP_USER_ID` elsewhere. Ignored when ``sender`` is given.
        sender: A complete ``User`` dict for ``from`` (e.g. from :func:`make_bot_user`). Channel
            posts have no sender: pass a string ``chat_id`` and leave both out.
        date: Unix time in seconds. Defaults to now.

    Returns:
        The ``Message`` dict.
    """
    chat = make_chat(chat_id)
    message: dict[str, Any] = {
        "message_id": message_id,
        "date": _now() if date is None else date,
        "chat": chat,
    }
    if sender is not None:
        message["from"] = dict(sender)
    elif chat["type"] != "channel" or user_id is not None:
        if user_id is None:
            user_id = chat["id"] if chat["type"] == "private" else DEFAULT_GROUP_USER_ID
        message["from"] = make_user(user_id)
    if text is not None:
        message["text"] = text
        entities = _command_entities(text)
        if entities:
            message["entities"] = entities
    return message


def make_message_update(
    update_id: int,
    chat_id: int,
    text: str,
    *,
    message_id: int = 1,
    user_id: int | None = None,
    date: int | None = None,
) -> dict[str, Any]:
    """Build an update carrying a new text message from a user.

    Args:
        update_id: The update's id.
        chat_id: The chat the message was sent in (see :func:`make_chat`).
        text: The message text.
        message_id: The message id.
        user_id: The sender (see :func:`make_message`).
        date: Unix time in seconds. Defaults to now.

    Returns:
        ``{"update_id": ..., "message": {...}}``.
    """
    return {
        "update_id": update_id,
        "message": make_message(
            message_id=message_id, chat_id=chat_id, text=text, user_id=user_id, date=date
        ),
    }


def make_callback_query_update(
    update_id: int,
    chat_id: int,
    data: str,
    *,
    bot_id: int,
    message_id: int = 1,
    user_id: int | None = None,
    query_id: str | None = None,
    message_text: str = "Choose:",
    date: int | None = None,
) -> dict[str, Any]:
    """Build an update for a press of an inline button under a message the bot sent.

    Args:
        update_id: The update's id.
        chat_id: The chat of the message with the button.
        data: The button's ``callback_data``.
        bot_id: The bot's user id (the sender of the message with the button).
        message_id: The id of the message with the button.
        user_id: Who pressed it. Defaults as in :func:`make_message`.
        query_id: The callback query id. Defaults to a value derived from ``update_id``.
        message_text: The text of the message with the button.
        date: Unix time in seconds of that message. Defaults to now.

    Returns:
        ``{"update_id": ..., "callback_query": {...}}``.
    """
    message = make_message(
        message_id=message_id,
        chat_id=chat_id,
        text=message_text,
        sender=make_bot_user(bot_id),
        date=date,
    )
    if user_id is None:
        user_id = chat_id if chat_id > 0 else DEFAULT_GROUP_USER_ID
    return {
        "update_id": update_id,
        "callback_query": {
            "id": query_id if query_id is not None else f"cbq{update_id}",
            "from": make_user(user_id),
            "message": message,
            "chat_instance": f"ci{abs(chat_id)}",
            "data": data,
        },
    }
