"""Tests of ptb_fence.testing: the fake Bot API against a real PTB Application and raw HTTP."""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from typing import Any

import pytest
from telegram import InlineKeyboardButton, InlineKeyboardMarkup, Message, Update
from telegram.error import InvalidToken, NetworkError, RetryAfter, TelegramError
from telegram.ext import (
    Application,
    ApplicationBuilder,
    CallbackQueryHandler,
    ContextTypes,
    MessageHandler,
    filters,
)

from ptb_fence.testing import (
    FakeBotApi,
    make_callback_query_update,
    make_message_update,
    post_to_webhook,
)
from runtime_support import post_json

pytestmark = [
    pytest.mark.timeout(60),
    # PTB 22.x warns inside RetryAfter about its future timedelta type. That is not ours to fix.
    pytest.mark.filterwarnings("ignore:.*retry_after.*:DeprecationWarning"),
]

WAIT = 5.0  # seconds; the upper bound of every wait below


# ----------------------------------------------------------------------------- helpers


def call(
    fake: FakeBotApi, method: str, token: str | None = None, **params: Any
) -> tuple[int, dict[str, Any]]:
    """POST ``params`` as JSON to the fake. Returns the HTTP status and the decoded body."""
    return post_json(f"{fake.base_url}{token or fake.token}/{method}", params, timeout=60)


def ids_of(result: list[dict[str, Any]]) -> list[int]:
    return [update["update_id"] for update in result]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def build_app(fake: FakeBotApi, token: str | None = None) -> Application:  # type: ignore[type-arg]
    return (
        ApplicationBuilder()
        .token(token or fake.token)
        .base_url(fake.base_url)
        .base_file_url(fake.base_file_url)
        .build()
    )


class Recorder:
    """A plain PTB handler that records what it handled and replies."""

    def __init__(self) -> None:
        self.handled: list[tuple[int, str]] = []
        self.release: asyncio.Event | None = None

    async def on_text(self, update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        assert update.effective_message is not None and update.effective_chat is not None
        if self.release is not None:
            await self.release.wait()
        text = update.effective_message.text or ""
        self.handled.append((update.update_id, text))
        await context.bot.send_message(update.effective_chat.id, f"echo: {text}")

    def handled_ids(self) -> list[int]:
        return [update_id for update_id, _ in self.handled]


@contextlib.asynccontextmanager
async def polling(
    app: Application, **kwargs: Any  # type: ignore[type-arg]
) -> AsyncIterator[Application]:  # type: ignore[type-arg]
    """Run ``app`` with ``Updater.start_polling`` (long polling, 2 s) until the block ends."""
    async with app:
        await app.start()
        assert app.updater is not None
        await app.updater.start_polling(poll_interval=0, timeout=2, **kwargs)
        try:
            yield app
        finally:
            await app.updater.stop()
            await app.stop()


def wait(fake: FakeBotApi, predicate: Any, timeout: float = WAIT) -> "asyncio.Future[bool]":
    """Run ``fake.wait_until`` in a worker thread (keeps the event loop free)."""
    return asyncio.ensure_future(asyncio.to_thread(fake.wait_until, predicate, timeout))


def run(coro: Any, timeout: float = 20.0) -> Any:
    return asyncio.run(asyncio.wait_for(coro, timeout))


@pytest.fixture
def fake() -> Any:
    with FakeBotApi() as server:
        yield server


@pytest.fixture
def fake_from_1000() -> Any:
    """A fake with deterministic update ids (1000, 1001, ...) for tests that name them."""
    with FakeBotApi(first_update_id=1000) as server:
        yield server


# ----------------------------------------------------------------------------- real PTB


def test_ptb_polling_handles_every_update_replies_and_confirms_by_offset(
    fake: FakeBotApi,
) -> None:
    before = [fake.inject_message(11, f"early {i}") for i in range(3)]
    recorder = Recorder()
    app = build_app(fake)
    app.add_handler(MessageHandler(filters.TEXT, recorder.on_text))

    async def scenario() -> list[int]:
        async with polling(app):
            after = [fake.inject_message(-22, f"late {i}", user_id=7) for i in range(3)]
            assert await wait(fake, lambda: len(recorder.handled) >= 6)
            assert await asyncio.to_thread(fake.wait_for_sent, 6, WAIT)
            assert await asyncio.to_thread(fake.wait_confirmed, before + after, WAIT)
            return after

    after = run(scenario())
    injected = before + after
    assert sorted(recorder.handled_ids()) == sorted(injected)
    assert len(recorder.handled) == 6  # each exactly once
    assert sorted(text for _, text in recorder.handled) == sorted(
        [f"early {i}" for i in range(3)] + [f"late {i}" for i in range(3)]
    )
    sent = fake.sent_messages
    assert sorted((m["chat_id"], m["text"]) for m in sent) == sorted(
        [(11, f"echo: early {i}") for i in range(3)] + [(-22, f"echo: late {i}") for i in range(3)]
    )
    assert all(isinstance(m["message_id"], int) for m in sent)
    assert fake.confirmed_update_ids == set(recorder.handled_ids())
    assert fake.pending_update_ids == []
    methods = [c.method for c in fake.calls]
    assert methods[0] == "getMe"
    assert methods.index("deleteWebhook") < methods.index("getUpdates")
    offsets = [p.get("offset", 0) for p in fake.calls_to("getUpdates")]
    assert offsets[0] == 0 and offsets == sorted(offsets)  # PTB only moves the offset forward
    assert max(offsets) == max(injected) + 1  # the cleanup call on stop confirms the last batch


def test_ptb_confirms_a_batch_before_it_is_handled(fake: FakeBotApi) -> None:
    """The durability gap ptb_fence closes: the next getUpdates confirms what a handler still
    holds."""
    recorder = Recorder()
    seen_at_confirm: list[tuple[list[int], list[int]]] = []
    fake.on_confirm = lambda ids: seen_at_confirm.append((ids, recorder.handled_ids()))
    app = build_app(fake)
    app.add_handler(MessageHandler(filters.TEXT, recorder.on_text))

    async def scenario() -> None:
        recorder.release = asyncio.Event()
        async with polling(app):
            update_id = fake.inject_message(5, "slow")
            assert await asyncio.to_thread(fake.wait_confirmed, [update_id], WAIT)
            assert recorder.handled == []  # confirmed while the handler is still blocked
            recorder.release.set()
            assert await wait(fake, lambda: len(recorder.handled) == 1)

    run(scenario())
    assert seen_at_confirm and seen_at_confirm[0][1] == []
    assert [ids for ids, _ in seen_at_confirm] == [[recorder.handled_ids()[0]]]
    assert fake.hook_errors == []


def test_ptb_retries_the_same_offset_after_get_updates_errors_and_loses_nothing(
    fake: FakeBotApi,
) -> None:
    injected = [fake.inject_message(3, f"m{i}") for i in range(4)]
    fake.fail_next("getUpdates")  # 500 -> NetworkError: on_err_cb, sleep 1 s, same offset
    fake.fail_next("getUpdates", retry_after=1)  # 429 -> RetryAfter: sleep 1.5 s, same offset
    recorder = Recorder()
    errors: list[TelegramError] = []
    app = build_app(fake)
    app.add_handler(MessageHandler(filters.TEXT, recorder.on_text))

    async def scenario() -> None:
        async with polling(app, error_callback=errors.append):
            assert await wait(fake, lambda: len(recorder.handled) == 4)
            assert await asyncio.to_thread(fake.wait_confirmed, injected, WAIT)

    run(scenario())
    assert sorted(recorder.handled_ids()) == injected
    assert len(recorder.handled) == 4
    assert [type(e) for e in errors] == [NetworkError]  # RetryAfter bypasses error_callback
    offsets = [p.get("offset", 0) for p in fake.calls_to("getUpdates")]
    assert offsets[:3] == [0, 0, 0]  # two failures, then the same offset succeeds


def test_wrong_token_is_401_and_ptb_raises_invalid_token(fake: FakeBotApi) -> None:
    status, body = call(fake, "getMe", token="999:WRONG")
    assert (status, body) == (
        401,
        {"ok": False, "error_code": 401, "description": "Unauthorized"},
    )
    status, body = call(fake, "getMe")
    assert status == 200 and body["ok"] and body["result"]["id"] == 123456

    async def scenario() -> None:
        app = build_app(fake, token="999:WRONG")
        with pytest.raises(InvalidToken):
            await app.initialize()
        await app.shutdown()

    run(scenario())
    assert [c.method for c in fake.calls] == ["getMe"]  # unauthorized calls are not recorded


def test_ptb_callback_query_send_document_and_send_errors(fake: FakeBotApi) -> None:
    answered: list[str] = []

    async def on_button(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        assert update.callback_query is not None
        await update.callback_query.answer("ok")
        answered.append(update.callback_query.data or "")

    app = build_app(fake)
    app.add_handler(CallbackQueryHandler(on_button))

    async def scenario() -> None:
        async with polling(app):
            bot = app.bot
            markup = InlineKeyboardMarkup([[InlineKeyboardButton("Yes", callback_data="y")]])
            message = await bot.send_message(8, "123", reply_markup=markup)
            assert message.text == "123" and message.chat.id == 8
            assert message.reply_markup == markup
            assert message.from_user is not None and message.from_user.is_bot
            fake.inject_callback_query(8, "y")
            assert await wait(fake, lambda: answered == ["y"])
            document = await bot.send_document(8, document=b"hello", filename="a.txt")
            assert document.chat.id == 8 and document.message_id > message.message_id
            fake.fail_next("sendMessage", retry_after=3)
            with pytest.raises(RetryAfter):
                await bot.send_message(8, "flood")
            fake.delay("sendMessage", 0.3)
            started = time.monotonic()
            await bot.send_message(8, "slow")
            assert time.monotonic() - started >= 0.29

    run(scenario())
    sent = fake.calls_to("sendMessage")
    assert sent[0]["text"] == "123"  # a string parameter stays a string
    assert sent[0]["chat_id"] == 8
    button = {"text": "Yes", "callback_data": "y"}
    assert sent[0]["reply_markup"] == {"inline_keyboard": [[button]]}
    assert [m["text"] for m in fake.sent_messages] == ["123", "slow"]  # the failed one is not sent
    assert fake.answered_callback_queries[0]["text"] == "ok"
    upload = fake.calls_to("sendDocument")[0]
    assert upload["chat_id"] == 8
    assert upload["document"]["filename"] == "a.txt" and upload["document"]["data"] == b"hello"


def test_ptb_webhook_receives_post_to_webhook_with_secret(fake: FakeBotApi) -> None:
    recorder = Recorder()
    app = build_app(fake)
    app.add_handler(MessageHandler(filters.TEXT, recorder.on_text))
    port = free_port()
    hook_url = f"http://127.0.0.1:{port}/hook"

    async def scenario() -> tuple[int, int, int]:
        async with app:
            await app.start()
            assert app.updater is not None
            await app.updater.start_webhook(
                listen="127.0.0.1",
                port=port,
                url_path="hook",
                webhook_url=hook_url,
                secret_token="s3cret",
                max_connections=5,
            )
            try:
                update = make_message_update(77, 9, "via webhook")
                good = await asyncio.to_thread(
                    post_to_webhook, hook_url, update, secret_token="s3cret"
                )
                bad = await asyncio.to_thread(post_to_webhook, hook_url, update, secret_token="no")
                status, _ = await asyncio.to_thread(call, fake, "getUpdates")
                assert await asyncio.to_thread(fake.wait_for_sent, 1, WAIT)
            finally:
                await app.updater.stop()
                await app.stop()
            return good, bad, status

    good, bad, get_updates_status = run(scenario())
    assert (good, bad, get_updates_status) == (200, 403, 409)
    assert recorder.handled == [(77, "via webhook")]
    assert fake.sent_messages[0]["text"] == "echo: via webhook"
    assert fake.webhook["url"] == hook_url
    assert fake.webhook["secret_token"] == "s3cret"
    assert fake.webhook["max_connections"] == 5


class FailingPutQueue(asyncio.Queue):  # type: ignore[type-arg]
    """An update queue whose ``put`` number ``at`` raises ``exc`` (like a store down at ingest)."""

    def __init__(self, exc: BaseException, at: int) -> None:
        super().__init__()
        self.exc = exc
        self.at = at
        self.puts = 0

    async def put(self, item: Any) -> None:
        self.puts += 1
        if self.puts == self.at:
            raise self.exc
        await super().put(item)


def test_ptb_telegram_error_from_update_queue_put_retries_the_same_offset(
    fake: FakeBotApi,
) -> None:
    """PTB 22.8 fact the durable ingest relies on: a TelegramError from ``put`` does not advance
    the offset; the loop re-fetches and re-puts the WHOLE batch (earlier items twice)."""
    ids = [fake.inject_message(4, f"m{i}") for i in range(3)]
    recorder = Recorder()
    errors: list[TelegramError] = []
    app = (
        ApplicationBuilder()
        .token(fake.token)
        .base_url(fake.base_url)
        .update_queue(FailingPutQueue(TelegramError("store down"), at=2))
        .build()
    )
    app.add_handler(MessageHandler(filters.TEXT, recorder.on_text))

    async def scenario() -> None:
        async with polling(app, error_callback=errors.append):
            assert await wait(fake, lambda: len(recorder.handled) >= 4)
            assert await asyncio.to_thread(fake.wait_confirmed, ids, WAIT)

    run(scenario())
    assert recorder.handled_ids() == [ids[0], ids[0], ids[1], ids[2]]  # a duplicate, no loss
    assert [str(e) for e in errors] == ["store down"]
    assert [p.get("offset", 0) for p in fake.calls_to("getUpdates")][:2] == [0, 0]


def test_ptb_other_exception_from_update_queue_put_kills_polling_silently(
    fake: FakeBotApi,
) -> None:
    """PTB 22.8 fact: any non-TelegramError from ``put`` ends the polling task for good; nothing
    is logged until ``Updater.stop()`` re-raises it (and then skips its confirming cleanup)."""
    ids = [fake.inject_message(4, f"m{i}") for i in range(3)]
    recorder = Recorder()
    app = (
        ApplicationBuilder()
        .token(fake.token)
        .base_url(fake.base_url)
        .update_queue(FailingPutQueue(RuntimeError("boom"), at=2))
        .build()
    )
    app.add_handler(MessageHandler(filters.TEXT, recorder.on_text))

    async def scenario() -> None:
        async with app:
            await app.start()
            assert app.updater is not None
            await app.updater.start_polling(poll_interval=0, timeout=2)
            assert await wait(fake, lambda: len(recorder.handled) == 1)
            fake.inject_message(4, "late")
            polls = len(fake.calls_to("getUpdates"))
            assert not await wait(fake, lambda: len(fake.calls_to("getUpdates")) > polls, 0.5)
            with pytest.raises(RuntimeError, match="boom"):
                await app.updater.stop()
            await app.stop()

    run(scenario())
    assert recorder.handled_ids() == [ids[0]]
    assert [p.get("offset", 0) for p in fake.calls_to("getUpdates")] == [0]  # no cleanup call
    assert fake.confirmed_update_ids == set() and len(fake.pending_update_ids) == 4


# ----------------------------------------------------------------------------- raw HTTP


def test_get_updates_offset_confirms_limit_and_timeout(fake_from_1000: FakeBotApi) -> None:
    fake = fake_from_1000
    ids = [fake.inject({"message": {"text": str(i)}}) for i in range(5)]
    assert ids == [1000, 1001, 1002, 1003, 1004]

    status, body = call(fake, "getUpdates", limit=2)
    assert status == 200 and ids_of(body["result"]) == ids[:2]
    assert fake.confirmed_update_ids == set()  # no offset: nothing confirmed, nothing lost
    assert ids_of(call(fake, "getUpdates")[1]["result"]) == ids

    # offset=N confirms every id < N before answering with ids >= N.
    assert ids_of(call(fake, "getUpdates", offset=ids[2], limit=2)[1]["result"]) == ids[2:4]
    assert fake.confirmed_update_ids == set(ids[:2])
    assert fake.pending_update_ids == ids[2:]
    # confirmed updates never come back, not even with offset 0
    assert ids_of(call(fake, "getUpdates", offset=0)[1]["result"]) == ids[2:]
    # an offset above an id only returns ids >= offset (and confirms the rest)
    assert ids_of(call(fake, "getUpdates", offset=ids[4])[1]["result"]) == [ids[4]]
    assert fake.confirmed_update_ids == set(ids[:4])
    # a limit outside 1..100 is clamped
    fake.inject({"message": {"text": "x"}})
    assert len(call(fake, "getUpdates", limit=0)[1]["result"]) == 1

    # timeout: an empty long poll waits, then answers []
    started = time.monotonic()
    status, body = call(fake, "getUpdates", offset=9999, timeout=0.4)
    elapsed = time.monotonic() - started
    assert (status, body) == (200, {"ok": True, "result": []})
    assert 0.35 <= elapsed < 3
    assert fake.pending_update_ids == []


def test_negative_offset_conflicts_and_drop_pending_updates(fake: FakeBotApi) -> None:
    ids = [fake.inject({"message": {"text": str(i)}}) for i in range(4)]
    assert ids_of(call(fake, "getUpdates", offset=-1)[1]["result"]) == [ids[3]]
    assert fake.confirmed_update_ids == set(ids[:3])

    assert call(fake, "setWebhook", url="https://example.invalid/hook", secret_token="t")[0] == 200
    status, body = call(fake, "getUpdates")
    assert status == 409 and body["description"].startswith("Conflict: can't use getUpdates")
    info = call(fake, "getWebhookInfo")[1]["result"]
    assert info["url"] == "https://example.invalid/hook" and info["pending_update_count"] == 1

    deleted = call(fake, "deleteWebhook", drop_pending_updates=True)
    assert deleted == (200, {"ok": True, "result": True})
    assert fake.pending_update_ids == [] and fake.dropped_update_ids == {ids[3]}
    assert call(fake, "getWebhookInfo")[1]["result"]["url"] == ""
    assert call(fake, "getUpdates")[1]["result"] == []

    bad = call(fake, "setWebhook", url="https://x.invalid", secret_token="has space")
    assert bad[0] == 400
    assert call(fake, "sendMessage", chat_id=1)[0] == 400  # text is empty
    assert call(fake, "someFutureMethod", x=1)[1] == {"ok": True, "result": True}
    assert call(fake, "logOut")[1]["result"] is True and call(fake, "close")[1]["result"] is True
    status, body = urllib_get(f"{fake.url}/nothing-here")
    assert status == 404 and body["error_code"] == 404


def urllib_get(url: str) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(url, timeout=WAIT) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as exc:
        return exc.code, json.load(exc)


def test_long_poll_returns_early_on_inject_and_a_newer_poll_ends_it(fake: FakeBotApi) -> None:
    results: dict[str, Any] = {}

    def poll(name: str, **params: Any) -> None:
        started = time.monotonic()
        results[name] = (call(fake, "getUpdates", **params), time.monotonic() - started)

    first = threading.Thread(target=poll, args=("first",), kwargs={"timeout": 10})
    first.start()
    assert fake.wait_until(lambda: len(fake.calls) == 1, WAIT)
    time.sleep(0.2)
    update_id = fake.inject_message(1, "wake up")
    first.join(WAIT)
    (status, body), elapsed = results["first"]
    assert status == 200 and ids_of(body["result"]) == [update_id]
    assert elapsed < 2  # not the 10 s timeout

    second = threading.Thread(
        target=poll, args=("second",), kwargs={"offset": update_id + 1, "timeout": 10}
    )
    second.start()
    assert fake.wait_until(lambda: len(fake.calls) == 2, WAIT)
    time.sleep(0.1)
    status, body = call(fake, "getUpdates", offset=update_id + 1)  # a second bot instance
    second.join(WAIT)
    (old_status, old_body), old_elapsed = results["second"]
    assert (status, body) == (200, {"ok": True, "result": []})
    assert old_status == 409 and old_body["description"].startswith("Conflict: terminated")
    assert old_elapsed < 2
    assert fake.confirmed_update_ids == {update_id}


def test_stop_ends_a_long_poll_and_restart_keeps_port_and_state() -> None:
    fake = FakeBotApi(first_update_id=50).start()
    try:
        update_id = fake.inject_message(1, "kept")
        base_url = fake.base_url
        results: list[Any] = []

        def poll() -> None:
            try:
                results.append(call(fake, "getUpdates", offset=update_id + 1, timeout=30))
            except (urllib.error.URLError, OSError) as exc:  # connection cut on stop
                results.append(exc)

        thread = threading.Thread(target=poll)
        thread.start()
        assert fake.wait_until(lambda: len(fake.calls) == 1, WAIT)
        started = time.monotonic()
        fake.stop()
        thread.join(WAIT)
        assert not thread.is_alive() and time.monotonic() - started < 3
        # the long poll answered [] (or its connection was cut): it did not wait 30 s
        assert results[0] == (200, {"ok": True, "result": []}) or isinstance(results[0], OSError)
        with pytest.raises(urllib.error.URLError):
            call(fake, "getMe")

        fake.start()
        assert fake.base_url == base_url
        assert fake.confirmed_update_ids == {update_id}
        assert fake.inject({"message": {"text": "after"}}) == update_id + 1
        assert ids_of(call(fake, "getUpdates")[1]["result"]) == [update_id + 1]
    finally:
        fake.stop()


def test_on_confirm_sees_ids_before_they_are_dropped_and_a_failing_hook_confirms_nothing(
    fake: FakeBotApi,
) -> None:
    ids = [fake.inject({"message": {"text": str(i)}}) for i in range(3)]
    seen: list[tuple[list[int], list[int]]] = []
    fake.on_confirm = lambda batch: seen.append((batch, fake.pending_update_ids))
    call(fake, "getUpdates", offset=ids[2])
    assert seen == [(ids[:2], ids)]  # still pending while the hook runs
    assert fake.pending_update_ids == [ids[2]]

    def refuse(batch: list[int]) -> None:
        raise AssertionError(f"store lacks {batch}")

    fake.on_confirm = refuse
    status, body = call(fake, "getUpdates", offset=ids[2] + 1)
    assert status == 500 and "store lacks" in body["description"]
    assert fake.pending_update_ids == [ids[2]]  # nothing confirmed
    assert [str(e) for e in fake.hook_errors] == [f"store lacks {[ids[2]]}"]


def test_fail_next_counts_and_forms(fake: FakeBotApi) -> None:
    fake.fail_next("getme", 2, error_code=502)
    fake.fail_next("getMe", error_code=400, description="Bad Request: nope")
    assert [call(fake, "getMe")[0] for _ in range(4)] == [502, 502, 400, 200]
    fake.fail_next("getUpdates", retry_after=7)
    update_id = fake.inject_message(2, "x")
    status, body = call(fake, "getUpdates", offset=update_id + 1)
    assert status == 429 and body["parameters"] == {"retry_after": 7}
    assert fake.pending_update_ids == [update_id]  # a failed call confirms nothing
    with pytest.raises(ValueError):
        fake.fail_next("getMe", 0)
    assert len(fake.calls_to("getMe")) == 4


def raw_post(fake: FakeBotApi, method: str, **params: Any) -> tuple[int, dict[str, Any]]:
    """POST ``params`` as JSON over one keep-alive connection (http.client) and answer the
    status and body; a dropped connection raises :exc:`http.client.RemoteDisconnected`."""
    connection = http.client.HTTPConnection("127.0.0.1", int(fake.url.rsplit(":", 1)[1]),
                                            timeout=30)
    try:
        connection.request("POST", f"/bot{fake.token}/{method}", body=json.dumps(params),
                           headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


def test_cut_next_drops_the_connection_after_or_without_the_effect(fake: FakeBotApi) -> None:
    fake.cut_next("sendmessage", 2, after_effect=True)
    fake.cut_next("sendMessage", after_effect=False)
    for text in ("one", "two", "three"):
        with pytest.raises(http.client.RemoteDisconnected):
            raw_post(fake, "sendMessage", chat_id=5, text=text)
    status, body = raw_post(fake, "sendMessage", chat_id=5, text="four")
    assert status == 200 and body["ok"] is True
    # the first two had their effect (a message id each), the third none; all were received
    assert [(m["text"], m["message_id"]) for m in fake.sent_messages] == [
        ("one", 1), ("two", 2), ("four", 3)]
    assert [c["text"] for c in fake.calls_to("sendMessage")] == ["one", "two", "three", "four"]
    assert body["result"]["message_id"] == 3
    with pytest.raises(ValueError):
        fake.cut_next("sendMessage", 0, after_effect=True)


def test_effective_calls_list_what_took_effect_once_per_time(fake: FakeBotApi) -> None:
    """Failed, refused and cut-before calls are in ``calls`` only; a call cut after its effect
    and a repeat of it are both in ``effective_calls`` (the user saw it twice)."""
    fake.fail_next("sendMessage", error_code=500)
    fake.cut_next("sendMessage", after_effect=False)
    fake.cut_next("sendMessage", after_effect=True)
    assert raw_post(fake, "sendMessage", chat_id=5, text="failed")[0] == 500
    for text in ("cut before", "cut after"):
        with pytest.raises(http.client.RemoteDisconnected):
            raw_post(fake, "sendMessage", chat_id=5, text=text)
    assert raw_post(fake, "sendMessage", chat_id=5, text="cut after")[0] == 200
    assert raw_post(fake, "sendMessage", chat_id=5, text=" ")[0] == 400  # empty: refused
    assert raw_post(fake, "answerCallbackQuery", callback_query_id="q1")[0] == 200
    effective = fake.effective_calls
    assert [(c.method, c.params.get("text")) for c in effective] == [
        ("sendMessage", "cut after"), ("sendMessage", "cut after"), ("answerCallbackQuery", None)]
    assert len(fake.calls) == 6
    effective[0].params["text"] = "changed"  # a copy
    assert fake.effective_calls[0].params["text"] == "cut after"


def test_an_edit_that_changes_nothing_is_refused_as_telegram_does(fake: FakeBotApi) -> None:
    """A real PTB bot: editing a message to the text and keyboard it shows raises PTB's
    BadRequest ("Message is not modified"); a change of text or of keyboard is accepted."""
    from telegram.error import BadRequest

    async def scenario() -> None:
        app = build_app(fake)
        async with app:
            keyboard = InlineKeyboardMarkup([[InlineKeyboardButton("A", callback_data="a")]])
            sent = await app.bot.send_message(7, "pick", reply_markup=keyboard)
            with pytest.raises(BadRequest, match="[Mm]essage is not modified"):
                await app.bot.edit_message_text("pick", 7, sent.message_id, reply_markup=keyboard)
            with pytest.raises(BadRequest, match="[Mm]essage is not modified"):
                await app.bot.edit_message_reply_markup(7, sent.message_id, reply_markup=keyboard)
            await app.bot.edit_message_text("pick", 7, sent.message_id)  # keyboard removed
            with pytest.raises(BadRequest, match="[Mm]essage is not modified"):
                await app.bot.edit_message_text("pick", 7, sent.message_id)
            await app.bot.edit_message_text("picked", 7, sent.message_id)
            photo = await app.bot.send_photo(7, "https://example.org/p.jpg", caption="c")
            with pytest.raises(BadRequest, match="[Mm]essage is not modified"):
                await app.bot.edit_message_caption(7, photo.message_id, caption="c")

    run(scenario())
    edits = [c for c in fake.effective_calls if c.method.startswith("edit")]
    assert [c.params.get("text") for c in edits] == ["pick", "picked"]


def test_cut_next_and_fail_next_apply_in_the_order_queued(fake: FakeBotApi) -> None:
    fake.fail_next("sendMessage", error_code=403, description="Forbidden: bot was blocked")
    fake.cut_next("sendMessage", after_effect=False)
    fake.fail_next("sendMessage", retry_after=2)
    status, body = raw_post(fake, "sendMessage", chat_id=5, text="a")
    assert (status, body["description"]) == (403, "Forbidden: bot was blocked")
    with pytest.raises(http.client.RemoteDisconnected):
        raw_post(fake, "sendMessage", chat_id=5, text="b")
    status, body = raw_post(fake, "sendMessage", chat_id=5, text="c")
    assert status == 429 and body["parameters"] == {"retry_after": 2}
    assert raw_post(fake, "sendMessage", chat_id=5, text="d")[0] == 200
    assert [m["text"] for m in fake.sent_messages] == ["d"]


def test_hold_keeps_calls_unanswered_until_release_and_others_go_through(
    fake: FakeBotApi,
) -> None:
    fake.hold("sendmessage")
    answers: list[tuple[int, dict[str, Any]]] = []
    senders = [threading.Thread(target=lambda t=text: answers.append(
        raw_post(fake, "sendMessage", chat_id=5, text=t))) for text in ("one", "two")]
    for sender in senders:
        sender.start()
    assert fake.wait_until(lambda: len(fake.calls_to("sendMessage")) == 2, WAIT)
    assert raw_post(fake, "getMe")[0] == 200  # other methods are not held
    time.sleep(0.2)
    assert not answers and not fake.sent_messages  # received, no effect, no answer
    fake.release("sendMessage")
    for sender in senders:
        sender.join(WAIT)
    assert sorted(m["text"] for m in fake.sent_messages) == ["one", "two"]
    assert [status for status, _ in answers] == [200, 200]
    assert raw_post(fake, "sendMessage", chat_id=5, text="three")[0] == 200  # not held now


def test_cut_get_updates_after_its_effect_confirms_and_hands_out_unseen_updates(
    fake: FakeBotApi,
) -> None:
    first = fake.inject_message(3, "x")
    second = fake.inject_message(3, "y")
    fake.cut_next("getUpdates", after_effect=True)
    with pytest.raises(http.client.RemoteDisconnected):
        raw_post(fake, "getUpdates", offset=first + 1)
    assert fake.confirmed_update_ids == {first}  # the offset took effect
    assert fake.pending_update_ids == [second]  # handed out, never seen: served again
    fake.cut_next("getUpdates", after_effect=False)
    with pytest.raises(http.client.RemoteDisconnected):
        raw_post(fake, "getUpdates", offset=second + 1)
    assert fake.confirmed_update_ids == {first}
    status, body = raw_post(fake, "getUpdates", offset=second)
    assert status == 200 and ids_of(body["result"]) == [second]


def test_ptb_sees_a_cut_connection_as_a_network_error_and_keeps_working(
    fake: FakeBotApi,
) -> None:
    app = build_app(fake)

    async def scenario() -> None:
        async with app:
            bot = app.bot
            fake.cut_next("sendMessage", after_effect=True)
            with pytest.raises(NetworkError) as lost_answer:
                await bot.send_message(9, "delivered, answer lost")
            fake.cut_next("sendMessage", after_effect=False)
            with pytest.raises(NetworkError) as lost_request:
                await bot.send_message(9, "never delivered")
            # the same exception either way: the client cannot tell the outcomes apart
            assert type(lost_answer.value) is type(lost_request.value)
            message = await bot.send_message(9, "after")
            assert message.text == "after"

    run(scenario())
    assert [m["text"] for m in fake.sent_messages] == ["delivered, answer lost", "after"]
    assert len(fake.calls_to("sendMessage")) == 3


def test_inject_validation_and_ids() -> None:
    with pytest.raises(ValueError, match="token"):
        FakeBotApi("not-a-token")
    fake = FakeBotApi(first_update_id=1000)  # deterministic ids, below the explicit one
    with pytest.raises(RuntimeError, match="start"):
        _ = fake.base_url
    assert fake.first_update_id == 1000
    assert fake.inject({"update_id": 5000, "message": {}}) == 5000
    assert fake.inject({}) == 5001  # later ids continue above an explicit one
    with pytest.raises(ValueError, match="already pending"):
        fake.inject({"update_id": 5000})
    for bad in (0, -3, "7", True):
        with pytest.raises(ValueError, match="positive int"):
            fake.inject({"update_id": bad})
    with pytest.raises(TypeError):
        fake.inject({"x": object()})
    assert fake.wait_confirmed([5000], timeout=0.1) is False
    assert fake.wait_for_sent(1, timeout=0.1) is False
    for bad_first in (0, -1):
        with pytest.raises(ValueError, match="first_update_id must be >= 1"):
            FakeBotApi(first_update_id=bad_first)


def test_update_ids_are_unique_per_run_by_default() -> None:
    """Without ``first_update_id`` a fake numbers updates from the milliseconds since the
    epoch, counted within 1000000000..1999999999 (Telegram's range: a 32-bit ``update_id``
    column takes them), and above every id an earlier fake of this process assigned, however
    soon it follows; message ids restart at 1 in each (so a kept store needs the update ids
    to differ)."""
    before = int(time.time() * 1000)
    first = FakeBotApi()
    after = int(time.time() * 1000)
    if before % 10**9 <= after % 10**9:  # not across the 11.6-day wrap
        assert 10**9 + before % 10**9 <= first.first_update_id
    assert 10**9 <= first.first_update_id < 2 * 10**9
    used = [first.inject_message(1, f"m{i}") for i in range(50)]
    second = FakeBotApi()  # made within the same millisecond, most likely
    assert second.first_update_id > max(used)
    assert second.inject_message(1, "again") > max(used)
    built = second.new_message_update(1, "x")
    assert built["message"]["message_id"] == 2  # message ids are per fake and chat
    third = FakeBotApi()
    assert third.first_update_id > built["update_id"]  # built ones count too


def test_update_builders_parse_as_ptb_updates() -> None:
    private = Update.de_json(make_message_update(1, 42, "/start payload", message_id=3), None)
    assert private.effective_chat is not None and private.effective_chat.type == "private"
    assert private.effective_user is not None and private.effective_user.id == 42
    assert private.message is not None and private.message.message_id == 3
    assert filters.COMMAND.check_update(private)  # a bot_command entity at offset 0
    assert private.message.text is not None and private.message.parse_entities() == {
        private.message.entities[0]: "/start"
    }

    group = Update.de_json(make_message_update(2, -100, "hello"), None)
    assert group.effective_chat is not None and group.effective_chat.type == "group"
    assert group.effective_user is not None and group.effective_user.id > 0
    supergroup = Update.de_json(make_message_update(3, -1001234567890, "hi", user_id=9), None)
    assert supergroup.effective_chat is not None and supergroup.effective_chat.type == "supergroup"
    assert supergroup.effective_user is not None and supergroup.effective_user.id == 9

    query = Update.de_json(make_callback_query_update(4, 42, "btn", bot_id=123), None)
    assert query.callback_query is not None and query.callback_query.data == "btn"
    assert query.effective_user is not None and query.effective_user.id == 42
    message = query.callback_query.message
    assert isinstance(message, Message) and message.from_user is not None
    assert message.from_user.id == 123


def test_press_button_of_the_last_keyboard_a_real_ptb_bot_showed(fake: FakeBotApi) -> None:
    """``press_button`` presses a button of the keyboard the bot showed last in the chat (by
    callback data, else by text); an edit without ``reply_markup`` removes the keyboard, as in
    Telegram; ``new_*_update`` build updates with the same id sequence without queueing."""
    pressed: list[tuple[int, str, bool]] = []

    async def on_press(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        query = update.callback_query
        assert query is not None and query.data is not None and query.message is not None
        has_keyboard = getattr(query.message, "reply_markup", None) is not None
        pressed.append((query.message.message_id, query.data, has_keyboard))
        await query.answer("ok")
        if query.data == "done":
            await query.edit_message_text("finished")  # no reply_markup: keyboard gone

    async def scenario() -> None:
        app = build_app(fake)
        app.add_handler(CallbackQueryHandler(on_press))
        async with polling(app):
            keyboard = InlineKeyboardMarkup([[InlineKeyboardButton("A", callback_data="a"),
                                              InlineKeyboardButton("Done", callback_data="done")]])
            old = await app.bot.send_message(7, "first", reply_markup=keyboard)
            last = await app.bot.send_message(7, "second", reply_markup=keyboard)
            assert fake.last_keyboard(7) == {
                "message_id": last.message_id, "text": "second",
                "inline_keyboard": [[{"text": "A", "callback_data": "a"},
                                     {"text": "Done", "callback_data": "done"}]]}
            fake.press_button(7, "a")
            fake.press_button(7, "Done")  # by its text
            # the edit removes the second message's keyboard: the first one's is the last now
            assert await wait(fake, lambda: len(pressed) == 2 and (
                fake.last_keyboard(7) or {}).get("message_id") == old.message_id)
            await app.bot.edit_message_reply_markup(7, old.message_id)
            assert fake.last_keyboard(7) is None

    run(scenario())
    assert pressed == [(2, "a", True), (2, "done", True)]
    assert [a["text"] for a in fake.answered_callback_queries] == ["ok", "ok"]
    with pytest.raises(LookupError, match="shows no inline keyboard in chat 7"):
        fake.press_button(7, "a")
    with pytest.raises(LookupError, match="no inline keyboard in chat 8"):
        fake.new_button_press_update(8, "a")
    first = fake.new_message_update(9, "hi")
    second = fake.inject_message(9, "again")
    assert second == first["update_id"] + 1  # one sequence, queued or not
    assert fake.pending_update_ids == [second]  # the built one was not queued


def test_press_button_names_the_buttons_it_has() -> None:
    with FakeBotApi() as fake:
        status, body = call(fake, "sendMessage", chat_id=3, text="menu", reply_markup={
            "inline_keyboard": [[{"text": "Go", "callback_data": "go"},
                                 {"text": "Docs", "url": "https://example.org"}]]})
        assert status == 200, body
        with pytest.raises(LookupError, match="buttons with callback data: 'go'"):
            fake.press_button(3, "Docs")  # a URL button sends no callback query
        update_id = fake.press_button(3, "go", user_id=99)
        status, body = call(fake, "getUpdates")
        (queued,) = body["result"]
        assert queued["update_id"] == update_id
        query = queued["callback_query"]
        assert (query["data"], query["from"]["id"], query["message"]["text"]) == ("go", 99, "menu")
        assert query["message"]["reply_markup"]["inline_keyboard"][0][0]["callback_data"] == "go"
