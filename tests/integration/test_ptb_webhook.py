"""PTB's own webhook server (``Updater.start_webhook``, tornado) with the durable queue.

Updates are POSTed as Telegram does (:func:`ptb_fence.testing.post_to_webhook`, run in a thread
because the webhook server runs on the test's event loop). The store is read right after each
answer: a 200 means the row is committed.
"""

from __future__ import annotations

import asyncio
import socket
from collections import Counter
from typing import Any, List

from telegram import Update
from telegram.ext import Application, MessageHandler, filters

from ptb_fence import SQLiteUpdateStore
from ptb_fence.ptb import FencedUpdateProcessor
from ptb_fence.testing import FakeBotApi, make_message_update, post_to_webhook
from ptb_support import FAST, FlakyStore, build, recorded_ids, rows, run, wait_for

SECRET = "s3cret"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def _post(url: str, update: Any, secret: Any = SECRET) -> int:
    return await asyncio.to_thread(post_to_webhook, url, update, secret_token=secret, timeout=10)


def test_webhook_records_before_200_refuses_bad_secrets_and_answers_5xx_on_store_failure(
    tmp_path: Any,
) -> None:
    path = str(tmp_path / "updates.db")
    store = FlakyStore(SQLiteUpdateStore(path))
    handled: List[int] = []
    statuses: List[Any] = []

    async def on_message(update: Update, context: Any) -> None:
        assert context.attempt is not None
        handled.append(update.update_id)

    async def scenario(fake: FakeBotApi) -> None:
        processor = FencedUpdateProcessor(store, **FAST)
        app = build(processor, fake)
        app.add_handler(MessageHandler(filters.TEXT, on_message))
        port = _free_port()
        url = f"http://127.0.0.1:{port}/hook"
        async with app:
            await app.start()
            assert app.updater is not None
            await app.updater.start_webhook(
                listen="127.0.0.1",
                port=port,
                url_path="hook",
                secret_token=SECRET,
                webhook_url=url,
            )
            try:
                assert fake.webhook["url"] == url and fake.webhook["secret_token"] == SECRET
                # accepted: the row exists as soon as the 200 is back
                for i in range(5):
                    uid = 5000 + i
                    status = await _post(url, make_message_update(uid, chat_id=1 + i % 2, text="hi"))
                    statuses.append(("ok", uid, status, recorded_ids(path, [uid])))
                # wrong and missing secret: 403, nothing stored
                for secret in ("wrong", None):
                    status = await _post(url, make_message_update(6000, chat_id=1, text="x"), secret)
                    statuses.append(("secret", secret, status, recorded_ids(path, [6000])))
                # bodies that are not an update: refused by PTB (500 / 400), nothing stored
                for raw in ("not json", '{"foo": 1}', "[1, 2]"):
                    before = set(rows(path))
                    status = await _post(url, raw)
                    statuses.append(("invalid", raw, status, set(rows(path)) - before))
                # the store is down: 5xx (Telegram redelivers), nothing stored
                store.failing = True
                status = await _post(url, make_message_update(7000, chat_id=3, text="y"))
                statuses.append(("down", 7000, status, recorded_ids(path, [7000])))
                store.failing = False
                # Telegram's redelivery after recovery
                status = await _post(url, make_message_update(7000, chat_id=3, text="y"))
                statuses.append(("recovered", 7000, status, recorded_ids(path, [7000])))
                # a duplicate delivery (e.g. after a slow answer): 200, one row, handled once
                status = await _post(url, make_message_update(5000, chat_id=1, text="hi"))
                statuses.append(("duplicate", 5000, status, recorded_ids(path, [5000])))
                await wait_for("all handled", lambda: set(handled) >= set(range(5000, 5005)) | {7000})
                await wait_for("all settled",
                               lambda: {r[0] for r in rows(path).values()} == {"completed"})
                await asyncio.sleep(0.3)
            finally:
                await app.updater.stop()
                await app.stop()

    with FakeBotApi() as fake:
        run(scenario(fake))
    for kind, uid, status, recorded in statuses:
        if kind in ("ok", "recovered", "duplicate"):
            assert (status, recorded) == (200, {uid}), (kind, uid, status, recorded)
        elif kind == "invalid":  # PTB: 500 for a body that is not JSON, 400 for a non-update
            assert status in (400, 500) and recorded == set(), (kind, uid, status, recorded)
        elif kind == "secret":
            assert (status, recorded) == (403, set()), (kind, uid, status, recorded)
        else:
            assert 500 <= status < 600 and recorded == set(), (kind, uid, status, recorded)
    assert store.failed_adds == [7000]
    assert Counter(handled) == Counter(list(range(5000, 5005)) + [7000])
    assert set(rows(path)) == set(range(5000, 5005)) | {7000}


def test_custom_webhook_without_updater_records_on_update_queue_put(tmp_path: Any) -> None:
    """PTB's custom-webhook pattern (``.updater(None)``, the web framework calls
    ``await application.update_queue.put(Update.de_json(...))``): put returns after the
    commit; a store failure raises IngestError (answer 5xx) and nothing is queued."""
    from telegram.error import TelegramError

    from ptb_fence.ptb import IngestError

    path = str(tmp_path / "updates.db")
    store = FlakyStore(SQLiteUpdateStore(path))
    handled: List[int] = []

    async def on_message(update: Update, context: Any) -> None:
        handled.append(update.update_id)

    async def scenario(fake: FakeBotApi) -> None:
        for before in (True, False):  # .updater(None) before or after install
            processor = FencedUpdateProcessor(store, **FAST)
            builder = Application.builder().token(fake.token).base_url(fake.base_url)
            if before:
                builder = processor.install(builder.updater(None))
            else:
                builder = processor.install(builder).updater(None)
            app = builder.build()
            assert app.updater is None and app.update_queue is processor.queue
        processor = FencedUpdateProcessor(store, **FAST)
        app = processor.install(
            Application.builder().token(fake.token).base_url(fake.base_url).updater(None)
        ).build()
        app.add_handler(MessageHandler(filters.TEXT, on_message))
        async with app:
            await app.start()
            try:
                await app.update_queue.put(
                    Update.de_json(make_message_update(42, chat_id=1, text="x"), app.bot)
                )
                assert recorded_ids(path, [42]) == {42}
                store.failing = True
                try:
                    await app.update_queue.put(
                        Update.de_json(make_message_update(43, chat_id=1, text="y"), app.bot)
                    )
                except IngestError as exc:
                    assert isinstance(exc, TelegramError)
                else:
                    raise AssertionError("a store failure at ingest must raise IngestError")
                store.failing = False
                assert recorded_ids(path, [43]) == set()
                await wait_for("handled", lambda: handled == [42])
                await asyncio.sleep(0.3)
            finally:
                await app.stop()

    with FakeBotApi() as fake:
        run(scenario(fake))
    assert handled == [42]
