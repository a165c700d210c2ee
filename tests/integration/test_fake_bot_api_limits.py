"""FakeBotApi(rate_limits=...): Telegram's flood limits over real HTTP, holds and their counts."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import os
import re
import subprocess
import sys
import threading
import time
import urllib.error
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from telegram import Bot
from telegram.error import RetryAfter

from ptb_fence.testing import FakeBotApi, RateLimits
from runtime_support import post_json

pytestmark = [
    pytest.mark.timeout(60),
    # PTB 22.x warns inside RetryAfter about its future timedelta type. That is not ours to fix.
    pytest.mark.filterwarnings("ignore:.*retry_after.*:DeprecationWarning"),
]

ROOT = Path(__file__).resolve().parents[2]
LONG = 10.0  # seconds: a window no test outlives, so its computed retry_after is exactly 10
ROOMY = 1000  # a limit no test reaches


def call(fake: FakeBotApi, method: str, **params: Any) -> tuple[int, dict[str, Any]]:
    """POST ``params`` as JSON to the fake. Returns the HTTP status and the decoded body."""
    return post_json(f"{fake.base_url}{fake.token}/{method}", params)


def send(fake: FakeBotApi, chat_id: int | str, **params: Any) -> tuple[int, dict[str, Any]]:
    return call(fake, "sendMessage", chat_id=chat_id, text=params.pop("text", "hi"), **params)


def too_many(retry_after: int) -> dict[str, Any]:
    """Telegram's 429 body."""
    return {
        "ok": False,
        "error_code": 429,
        "description": f"Too Many Requests: retry after {retry_after}",
        "parameters": {"retry_after": retry_after},
    }


def retry_after_of(status_body: tuple[int, dict[str, Any]]) -> int:
    status, body = status_body
    assert status == 429, body
    assert body == too_many(body["parameters"]["retry_after"])
    return int(body["parameters"]["retry_after"])


@pytest.fixture
def fakes() -> Iterator[list[FakeBotApi]]:
    """The fakes a test starts with :func:`limited`, stopped after it."""
    started: list[FakeBotApi] = []
    yield started
    for fake in started:
        fake.stop()


def limited(fakes: list[FakeBotApi], **limits: Any) -> FakeBotApi:
    """Start a fake that enforces ``RateLimits(**limits)``."""
    fake = FakeBotApi(rate_limits=RateLimits(**limits)).start()
    fakes.append(fake)
    return fake


# ----------------------------------------------------------------------------- the value type


def test_rate_limits_defaults_are_telegrams_and_the_type_is_frozen() -> None:
    limits = RateLimits()
    assert (limits.global_limit, limits.global_window) == (30, 1.0)
    assert (limits.private_chat_limit, limits.private_chat_window) == (1, 1.0)
    assert (limits.group_limit, limits.group_window) == (20, 60.0)
    assert (limits.paid_broadcast_limit, limits.paid_broadcast_window) == (1000, 1.0)
    assert limits.retry_after is None and limits.hold_grace_seconds == 0.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        limits.global_limit = 5  # type: ignore[misc]
    assert not hasattr(limits, "__dict__")
    with pytest.raises(TypeError):
        RateLimits(30)  # type: ignore[call-arg]  # keyword only


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"global_limit": 0}, ValueError),
        ({"group_limit": 2.5}, TypeError),
        ({"private_chat_limit": True}, TypeError),
        ({"group_window": 0}, ValueError),
        ({"paid_broadcast_window": -1.0}, ValueError),
        ({"retry_after": 0}, ValueError),
        ({"retry_after": 1.5}, TypeError),
        ({"hold_grace_seconds": -0.1}, ValueError),
    ],
)
def test_rate_limits_refuse_bad_values(kwargs: dict[str, Any], error: type[Exception]) -> None:
    with pytest.raises(error):
        RateLimits(**kwargs)


def test_fake_refuses_rate_limits_of_another_type_and_flood_checks_its_argument() -> None:
    with pytest.raises(TypeError):
        FakeBotApi(rate_limits={"global_limit": 1})  # type: ignore[arg-type]
    fake = FakeBotApi()
    assert fake.rate_limits is None
    with pytest.raises(ValueError):
        fake.flood(0)
    with pytest.raises(TypeError):
        fake.flood(2.5)  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- the limits


def test_over_the_global_limit_is_429_with_retry_after_and_has_no_effect(
    fakes: list[FakeBotApi],
) -> None:
    fake = limited(fakes, global_limit=3, global_window=LONG, private_chat_limit=ROOMY)
    for chat in (1, 2, 3):
        assert send(fake, chat)[0] == 200
    assert retry_after_of(send(fake, 4, text="over")) == 10
    assert [m["chat_id"] for m in fake.sent_messages] == [1, 2, 3]
    assert [c.params["chat_id"] for c in fake.effective_calls] == [1, 2, 3]
    assert len(fake.calls) == 4  # the refused request is still recorded as received
    assert len(fake.sent_times()) == 3
    assert fake.sent_times(4) == []
    assert (fake.rate_limited, fake.requests_in_hold) == (1, 0)
    # the bot is held: another chat is refused too, with the seconds left, and counted
    assert 9 <= retry_after_of(send(fake, 5)) <= 10
    assert (fake.rate_limited, fake.requests_in_hold) == (2, 1)
    assert len(fake.sent_messages) == 3


def test_per_private_chat_limit_holds_that_chat_only(fakes: list[FakeBotApi]) -> None:
    fake = limited(fakes, private_chat_limit=2, private_chat_window=LONG)
    assert send(fake, 7)[0] == 200
    assert send(fake, 7)[0] == 200
    assert retry_after_of(send(fake, 7)) == 10
    assert send(fake, 8)[0] == 200  # another chat is not held
    assert retry_after_of(send(fake, "7")) in (9, 10)  # the same chat, its id as a string
    assert retry_after_of(send(fake, 7)) in (9, 10)
    assert (fake.rate_limited, fake.requests_in_hold) == (3, 2)
    assert len(fake.sent_times(7)) == 2 and len(fake.sent_times("7")) == 2
    assert len(fake.sent_times(8)) == 1
    assert [m["chat_id"] for m in fake.sent_messages] == [7, 7, 8]


def test_per_group_limit_counts_groups_and_usernames_over_a_minute(
    fakes: list[FakeBotApi],
) -> None:
    fake = limited(fakes, group_limit=3)
    assert fake.rate_limits == RateLimits(group_limit=3)
    for _ in range(3):
        assert send(fake, -100123)[0] == 200
    assert retry_after_of(send(fake, -100123)) == 60  # the default group window
    for _ in range(3):
        assert send(fake, "@channel")[0] == 200
    assert retry_after_of(send(fake, "@channel")) == 60
    assert send(fake, 9)[0] == 200  # a private chat has its own limit
    assert len(fake.sent_messages) == 7


def test_a_hold_ends_after_retry_after_and_only_requests_inside_it_count(
    fakes: list[FakeBotApi],
) -> None:
    fake = limited(fakes, private_chat_limit=1, private_chat_window=0.2)
    assert send(fake, 11)[0] == 200
    assert retry_after_of(send(fake, 11)) == 1  # the window frees in 0.2 s: at least 1
    started = time.monotonic()
    time.sleep(0.4)  # the window has room again, the announced hold has not ended
    assert retry_after_of(send(fake, 11)) == 1
    assert fake.requests_in_hold == 1
    time.sleep(max(0.0, started + 1.1 - time.monotonic()))
    assert send(fake, 11)[0] == 200
    assert (fake.rate_limited, fake.requests_in_hold) == (2, 1)
    assert len(fake.sent_times(11)) == 2


def test_paid_broadcasts_have_their_own_bot_wide_limit(fakes: list[FakeBotApi]) -> None:
    fake = limited(
        fakes, global_limit=2, global_window=LONG, paid_broadcast_limit=4,
        paid_broadcast_window=LONG, private_chat_limit=ROOMY,
    )
    for chat in range(1, 5):
        assert send(fake, chat, allow_paid_broadcast=True)[0] == 200
    assert retry_after_of(send(fake, 5, allow_paid_broadcast=True)) == 10
    # unpaid messages count against the global limit only, which the paid ones left empty
    assert send(fake, 6)[0] == 200
    assert send(fake, 7)[0] == 200
    assert retry_after_of(send(fake, 8)) == 10
    assert fake.requests_in_hold == 0
    assert send(fake, 9, allow_paid_broadcast=True)[0] == 429  # inside both holds
    assert (fake.rate_limited, fake.requests_in_hold) == (3, 1)
    assert [m["chat_id"] for m in fake.sent_messages] == [1, 2, 3, 4, 6, 7]


def test_a_request_that_fails_does_not_count(fakes: list[FakeBotApi]) -> None:
    fake = limited(fakes, private_chat_limit=1, private_chat_window=LONG)
    assert send(fake, 12, text="")[0] == 400  # Telegram refuses an empty text
    fake.fail_next("sendMessage", error_code=502)
    assert send(fake, 12)[0] == 502
    fake.cut_next("sendMessage", after_effect=False)
    with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
        send(fake, 12)
    assert send(fake, 12)[0] == 200  # the first request that took effect
    assert retry_after_of(send(fake, 12)) == 10
    fake.cut_next("sendMessage", after_effect=True)
    with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
        send(fake, 13)
    assert retry_after_of(send(fake, 13)) == 10  # the cut request took effect: it counts
    assert fake.rate_limited == 2


def test_methods_that_post_no_message_are_never_limited(fakes: list[FakeBotApi]) -> None:
    fake = limited(fakes, global_limit=1, global_window=LONG, private_chat_limit=1, group_limit=1)
    assert send(fake, 14)[0] == 200
    assert send(fake, 15)[0] == 429  # the bot is held now
    fake.flood(retry_after=30)
    unlimited: list[tuple[str, dict[str, Any]]] = [
        ("getMe", {}),
        ("getUpdates", {"timeout": 0}),
        ("answerCallbackQuery", {"callback_query_id": "q"}),
        ("editMessageText", {"chat_id": 14, "message_id": 1, "text": "changed"}),
        ("deleteMessage", {"chat_id": 14, "message_id": 1}),
        ("sendChatAction", {"chat_id": 14, "action": "typing"}),
        ("setWebhook", {"url": ""}),
        ("deleteWebhook", {}),
        ("getChat", {"chat_id": 14}),
    ]
    for round_ in range(3):
        for method, params in unlimited:
            if method == "editMessageText":  # an edit that changes nothing is refused
                params = dict(params, text=f"changed {round_}")
            status, body = call(fake, method, **params)
            assert status == 200, (method, body)
    assert fake.rate_limited == 1
    assert retry_after_of(send(fake, 16)) == 30  # the flood was kept for a limited method


@pytest.mark.parametrize(
    ("method", "params"),
    [
        ("sendPhoto", {"photo": "file-id"}),
        ("sendDocument", {"document": "file-id"}),
        ("sendMediaGroup", {"media": []}),
        ("sendPoll", {"question": "?", "options": ["a", "b"]}),
        ("copyMessage", {"from_chat_id": 1, "message_id": 1}),
        ("forwardMessage", {"from_chat_id": 1, "message_id": 1}),
        ("copyMessages", {"from_chat_id": 1, "message_ids": [1]}),
        ("forwardMessages", {"from_chat_id": 1, "message_ids": [1]}),
    ],
)
def test_every_method_that_posts_a_message_counts(method: str, params: dict[str, Any]) -> None:
    limits = RateLimits(private_chat_limit=1, private_chat_window=LONG)
    with FakeBotApi(rate_limits=limits) as fake:
        assert call(fake, method, chat_id=17, **params)[0] == 200
        assert retry_after_of(call(fake, method, chat_id=17, **params)) == 10
        assert retry_after_of(send(fake, 17)) in (9, 10)  # one limit for every such method
        assert len(fake.sent_times(17)) == 1


def test_without_rate_limits_nothing_is_limited_but_send_times_are_kept() -> None:
    with FakeBotApi() as fake:
        for _ in range(40):
            assert send(fake, 18)[0] == 200
        assert fake.rate_limited == 0 and fake.requests_in_hold == 0
        times = fake.sent_times(18)
        assert len(times) == 40 and times == sorted(times)


# ----------------------------------------------------------------------------- flood


def test_flood_answers_the_next_limited_request_and_holds_the_bot() -> None:
    with FakeBotApi() as fake:  # flood needs no rate limits
        assert send(fake, 19)[0] == 200
        fake.flood(retry_after=5)
        assert call(fake, "getMe")[0] == 200  # not limited: the flood waits for a send
        assert retry_after_of(send(fake, 19)) == 5
        assert fake.requests_in_hold == 0  # the announcing 429 is not inside the hold
        assert retry_after_of(send(fake, -5)) in (4, 5)
        assert retry_after_of(call(fake, "copyMessage", chat_id=20, from_chat_id=19,
                                   message_id=1)) in (4, 5)
        assert (fake.rate_limited, fake.requests_in_hold) == (3, 2)
        assert [m["chat_id"] for m in fake.sent_messages] == [19]


def test_a_flood_hold_ends_and_the_grace_leaves_requests_in_flight_uncounted() -> None:
    with FakeBotApi(rate_limits=RateLimits(hold_grace_seconds=0.3)) as fake:
        fake.flood(retry_after=1)
        started = time.monotonic()
        assert retry_after_of(send(fake, 21)) == 1
        assert send(fake, 22)[0] == 429  # within the grace: already in flight
        assert fake.requests_in_hold == 0
        time.sleep(max(0.0, started + 0.5 - time.monotonic()))
        assert send(fake, 23)[0] == 429
        assert fake.requests_in_hold == 1
        time.sleep(max(0.0, started + 1.1 - time.monotonic()))
        assert send(fake, 24)[0] == 200
        assert (fake.rate_limited, fake.requests_in_hold) == (3, 1)


def test_ptb_raises_retry_after_with_the_fakes_seconds() -> None:
    async def run(fake: FakeBotApi) -> int:
        async with Bot(fake.token, base_url=fake.base_url) as bot:
            await bot.send_message(25, "first")
            with pytest.raises(RetryAfter) as caught:
                await bot.send_message(25, "second")
        retry_after: Any = caught.value.retry_after
        if isinstance(retry_after, datetime.timedelta):
            return int(retry_after.total_seconds())
        return int(retry_after)

    with FakeBotApi(rate_limits=RateLimits(private_chat_window=LONG)) as fake:
        assert asyncio.run(run(fake)) == 10
        assert [m["text"] for m in fake.sent_messages] == ["first"]


# ----------------------------------------------------------------------------- threads


def hammer(
    fake: FakeBotApi, chats: list[int | str], seconds: float, threads: int = 8
) -> dict[int, int]:
    """Send from ``threads`` threads for ``seconds``, each to the chats in turn. Returns the
    count of each HTTP status."""
    statuses: dict[int, int] = {}
    lock = threading.Lock()
    deadline = time.monotonic() + seconds

    def run(offset: int) -> None:
        n = offset
        while time.monotonic() < deadline:
            status, _ = send(fake, chats[n % len(chats)])
            n += 1
            with lock:
                statuses[status] = statuses.get(status, 0) + 1

    workers = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return statuses


def most_in_a_window(times: list[float], seconds: float) -> int:
    """The most times within any half-open stretch of ``seconds``."""
    most, start = 0, 0
    for end, at in enumerate(times):
        while at - times[start] >= seconds:
            start += 1
        most = max(most, end - start + 1)
    return most


def test_concurrent_senders_never_get_more_than_a_chats_limit() -> None:
    limits = RateLimits(group_limit=5, group_window=LONG)
    with FakeBotApi(rate_limits=limits) as fake:
        statuses = hammer(fake, [-42], seconds=0.5)
        assert statuses.get(200) == 5
        assert set(statuses) == {200, 429}
        assert len(fake.sent_messages) == 5 and len(fake.sent_times(-42)) == 5
        assert fake.rate_limited == statuses[429]
        assert fake.requests_in_hold == statuses[429] - 1  # all but the announcing 429


def test_requests_in_flight_count_against_the_limit_before_they_are_answered(
    fakes: list[FakeBotApi],
) -> None:
    fake = limited(fakes, group_limit=5, group_window=LONG)
    fake.hold("sendMessage")  # the admitted requests wait unanswered
    statuses: list[int] = []

    def one() -> None:
        status, _ = send(fake, -43)
        statuses.append(status)

    workers = [threading.Thread(target=one) for _ in range(8)]
    for worker in workers:
        worker.start()
    assert fake.wait_until(lambda: len(statuses) == 3, timeout=10)
    assert statuses == [429, 429, 429]  # refused at once while the other five are held
    assert fake.sent_messages == [] and fake.rate_limited == 3
    fake.release("sendMessage")
    for worker in workers:
        worker.join()
    assert sorted(statuses) == [200] * 5 + [429] * 3
    assert len(fake.sent_messages) == 5 and len(fake.sent_times(-43)) == 5


def test_concurrent_senders_stay_within_the_global_limit_in_every_window() -> None:
    # retry_after 1 with a window of 0.25 s: the bot sends again in bursts after each hold
    limits = RateLimits(global_limit=10, global_window=0.25, private_chat_limit=ROOMY)
    with FakeBotApi(rate_limits=limits) as fake:
        statuses = hammer(fake, list(range(100, 140)), seconds=2.5)
        times = fake.sent_times()
        assert set(statuses) == {200, 429}
        assert statuses[200] == len(times) == len(fake.sent_messages)
        assert statuses[200] >= 20  # a burst before the first hold and one after it
        assert most_in_a_window(times, 0.25) == 10
        assert fake.rate_limited == statuses[429]
        assert len(fake.calls) == statuses[200] + statuses[429]


def test_the_window_check_bites() -> None:
    assert most_in_a_window([0.0, 0.1, 0.2, 0.3], 0.25) == 3
    assert most_in_a_window([0.0, 0.25, 0.5], 0.25) == 1


# ----------------------------------------------------------------------------- the CLI


@pytest.mark.slow
def test_serve_rate_limits_flag_enforces_telegrams_limits(tmp_path: Path) -> None:
    log = tmp_path / "serve.log"
    env = dict(os.environ, PYTHONUNBUFFERED="1",
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "ptb_fence.testing", "serve", "--port", "0", "--no-stdin",
             "--rate-limits"],
            stdout=out, stderr=subprocess.STDOUT, env=env,
        )
    try:
        deadline = time.monotonic() + 30
        while not (found := re.search(r"listening on (http://\S+)", log.read_text())):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        url = found.group(1)

        def served(chat_id: int) -> tuple[int, dict[str, Any]]:
            return post_json(f"{url}/bot123456:TEST-TOKEN/sendMessage",
                             {"chat_id": chat_id, "text": "hi"})

        assert served(26)[0] == 200
        assert retry_after_of(served(26)) == 1  # one message per second per private chat
        while "flood control answered 429" not in log.read_text():
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        assert "flood limits are enforced" in log.read_text()
    finally:
        proc.terminate()
        proc.wait(timeout=10)
