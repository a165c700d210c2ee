"""Test helpers: a fake Telegram Bot API server and builders for realistic updates.

Run a real PTB :class:`~telegram.ext.Application` offline against :class:`FakeBotApi`::

    from ptb_fence.testing import FakeBotApi

    with FakeBotApi() as fake:
        app = Application.builder().token(fake.token).base_url(fake.base_url).build()
        ...

Standard library only; nothing here is imported by :mod:`ptb_fence` itself.
"""

from ptb_fence.testing._fake_bot_api import ApiCall, FakeBotApi, post_to_webhook
from ptb_fence.testing._updates import (
    DEFAULT_GROUP_USER_ID,
    make_bot_user,
    make_callback_query_update,
    make_chat,
    make_message,
    make_message_update,
    make_user,
)

__all__ = [
    "DEFAULT_GROUP_USER_ID",
    "ApiCall",
    "FakeBotApi",
    "make_bot_user",
    "make_callback_query_update",
    "make_chat",
    "make_message",
    "make_message_update",
    "make_user",
    "post_to_webhook",
]
