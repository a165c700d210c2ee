"""A broadcast that survives a restart: one message to 120 users, each sent once.

It runs offline: a PTB Application over SQLite sends through ``FakeBotApi``, which enforces
Telegram's rate limits. The bot stops halfway, as a deploy would stop it. A new Application
on the same database starts the same broadcast again, as its start-up code would, and sends
only the rest. One user blocked the bot: ``handle_blocked`` hears of it.
"""

import asyncio
import tempfile
from collections import Counter
from typing import Any, List

from telegram.ext import Application

from ptb_fence import SQLiteUpdateStore
from ptb_fence.ptb import FencedUpdateProcessor
from ptb_fence.testing import FakeBotApi, RateLimits

USERS = range(1, 121)
blocked: List[int] = []


async def forget_user(broadcast: str, chat_id: int) -> None:
    blocked.append(chat_id)  # e.g. mark the user inactive in your own table


def build(path: str, telegram: FakeBotApi) -> Any:
    processor = FencedUpdateProcessor(SQLiteUpdateStore(path), handle_blocked=forget_user)
    builder = Application.builder().token(telegram.token).base_url(telegram.base_url)
    return processor.install(builder).build()


async def run(app: Any, *, deploy_after: float = 0.0) -> None:
    async with app:
        await app.start()
        processor = app.update_processor
        started = await processor.broadcast("spring-sale", USERS, text="20% off this week")
        print(f"recorded {started.total} recipients")
        for _ in range(600):
            await asyncio.sleep(0.1 if not deploy_after else deploy_after)
            progress = await processor.get_broadcast("spring-sale")
            if deploy_after or progress.done:
                break
        left = progress.pending + progress.sending
        if deploy_after:
            print(f"stopped halfway: {'some' if progress.sent else 'none'} sent, "
                  f"{'some' if left else 'none'} left")
        else:
            print(f"done: {progress.sent} sent, {progress.blocked} blocked, {left} left")
        await app.stop()


async def main() -> None:
    with tempfile.TemporaryDirectory() as folder, FakeBotApi(rate_limits=RateLimits()) as telegram:
        telegram.block(7)
        await run(build(f"{folder}/bot.db", telegram), deploy_after=2.0)  # a deploy stops it
        await run(build(f"{folder}/bot.db", telegram))  # the new process sends the rest
        copies = Counter(m["chat_id"] for m in telegram.sent_messages)
        print("users reached:", len(copies), "- most copies to one user:", max(copies.values()))
        print("blocked:", blocked, "- answered 429:", telegram.rate_limited)


if __name__ == "__main__":
    asyncio.run(main())
