"""Test helpers: a fake Telegram Bot API, update builders and a fake idempotent payment API.

Run a real PTB :class:`~telegram.ext.Application` offline against :class:`FakeBotApi`::

    with FakeBotApi() as fake:
        app = Application.builder().token(fake.token).base_url(fake.base_url).build()
        ...

The servers are standard library only. The payment clients use httpx, which
python-telegram-bot brings. :mod:`ptb_fence` itself imports nothing from here.
"""

from ptb_fence.testing._fake_bot_api import ApiCall, FakeBotApi, RateLimits, post_to_webhook
from ptb_fence.testing._fake_payment_api import (
    FakePaymentApi,
    PaymentError,
    PaymentRequest,
    charge,
    charge_async,
)
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
    "FakePaymentApi",
    "PaymentError",
    "PaymentRequest",
    "RateLimits",
    "charge",
    "charge_async",
    "make_bot_user",
    "make_callback_query_update",
    "make_chat",
    "make_message",
    "make_message_update",
    "make_user",
    "post_to_webhook",
]
