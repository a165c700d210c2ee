"""``Stats.attempts_running`` and the ended counters agree in every snapshot: an attempt is
never shown running and ended at once, which a dashboard computing "in flight" (started minus
ended minus running) or an alert on ``attempts_running`` would otherwise misread.

A thread scrapes ``stats()`` in a loop while real front ends handle updates that complete
(grouped completions) and fail once (settled one by one, then retried): a real PTB Application
polling :class:`ptb_fence.testing.FakeBotApi`, and a real :class:`ptb_fence.UpdateIntake`. In
every snapshot ``attempts_running + sum(attempts_ended) <= attempts_started``. Before the
gauge was counted beside the ended counters, the processor counted a completion ended while its
handler still counted as running (the whole group commit long), and a scrape saw both.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Dict, List, Set

from telegram import Update
from telegram.ext import MessageHandler, filters

from ptb_fence import SQLiteUpdateStore, Stats, UpdateIntake
from ptb_fence.ptb import FencedUpdateProcessor
from ptb_fence.testing import FakeBotApi
from ptb_support import FAST, build, polling, run, wait_for, wait_sync
from runtime_support import body

UPDATES = 300


def _retry(error: BaseException, attempt: int) -> float:
    return 0.02


class Scraper:
    """Snapshots ``stats()`` on a thread of its own until stopped; keeps the inconsistent ones."""

    def __init__(self, stats: Callable[[], Stats]) -> None:
        self._stats = stats
        self._stop = threading.Event()
        self.snapshots = 0
        self.busy = 0  # snapshots that showed a handler running
        self.saw_busy = threading.Event()  # set at the first of them
        self.bad: List[str] = []
        self._thread = threading.Thread(target=self._loop, name="scraper", daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            stats = self._stats()
            self.snapshots += 1
            ended = sum(stats.attempts_ended.values())
            if stats.attempts_running:
                self.busy += 1
                self.saw_busy.set()
            if stats.attempts_running < 0 or (
                stats.attempts_running + ended > stats.attempts_started
            ):
                self.bad.append(
                    f"running={stats.attempts_running} ended={dict(stats.attempts_ended)} "
                    f"started={stats.attempts_started}"
                )

    def __enter__(self) -> "Scraper":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(10)


def _assert_failures_counted(final: Stats, failing: int) -> None:
    """Each update that fails once counts one ``failed`` attempt, unless that attempt's lease
    lapsed first (a loaded machine, 1 s leases): then it ends ``lost`` and its update is retried
    all the same. So ``failed`` is exact when nothing was lost, and short by at most ``lost``."""
    failed, lost = final.attempts_ended["failed"], final.attempts_ended["lost"]
    assert failing - lost <= failed <= failing, (failed, lost, failing)


def test_a_ptb_processor_never_shows_an_attempt_running_and_ended(tmp_path: Any) -> None:
    store = SQLiteUpdateStore(str(tmp_path / "updates.db"))
    handled: Dict[int, int] = {}

    async def on_message(update: Update, context: Any) -> None:
        handled[update.update_id] = handled.get(update.update_id, 0) + 1
        if update.update_id % 5 == 0 and handled[update.update_id] == 1:
            raise RuntimeError("fails once")

    processor = FencedUpdateProcessor(
        store, max_concurrent=16, max_attempts=2, retry=_retry, **FAST
    )

    async def scenario(fake: FakeBotApi) -> Stats:
        app = build(processor, fake)
        app.add_handler(MessageHandler(filters.TEXT, on_message))
        ids = [fake.inject_message(chat_id=1 + i % 40, text=f"m{i}") for i in range(UPDATES)]
        failing = sum(1 for u in ids if u % 5 == 0)
        with Scraper(processor.stats) as scraper:
            async with polling(app):
                await wait_for(
                    "every update completed",
                    lambda: processor.stats().attempts_ended["completed"] >= UPDATES,
                    timeout=90,
                )
        assert scraper.bad == [], scraper.bad[:5]
        assert scraper.snapshots >= 100 and scraper.busy >= 1, (scraper.snapshots, scraper.busy)
        final = processor.stats()
        _assert_failures_counted(final, failing)
        return final

    with FakeBotApi() as fake:
        final = run(scenario(fake), timeout=120)
    assert set(handled) and all(count in (1, 2) for count in handled.values())
    assert final.attempts_running == 0
    assert final.attempts_started == sum(final.attempts_ended.values())


def test_an_intake_never_shows_an_attempt_running_and_ended(tmp_path: Any) -> None:
    store = SQLiteUpdateStore(str(tmp_path / "updates.db"))
    seen: Set[int] = set()
    lock = threading.Lock()

    scraping: List[Scraper] = []

    def handle(update: Dict[str, Any], attempt: Any) -> None:
        update_id = update["update_id"]
        with lock:
            first = update_id not in seen
            seen.add(update_id)
        if update_id == 1:
            # the handlers are instant: one stays running until a snapshot saw it (on a
            # loaded machine the scraper could otherwise see none)
            scraping[0].saw_busy.wait(10)
        if update_id % 5 == 0 and first:
            raise RuntimeError("fails once")

    intake = UpdateIntake(store, handle_attempt=handle, handle_exhaustion=lambda e: None,
                          max_concurrent=8, max_attempts=2, retry=_retry, **FAST)
    intake.start()
    try:
        with Scraper(intake.stats) as scraper:
            scraping.append(scraper)
            for update_id in range(1, UPDATES + 1):
                assert intake.accept(body(update_id, chat=update_id % 40)) == "accepted"
            wait_sync(
                "every update completed",
                lambda: intake.stats().attempts_ended["completed"] >= UPDATES,
                timeout=90,
            )
        final = intake.stats()
    finally:
        intake.close()
    assert scraper.bad == [], scraper.bad[:5]
    assert scraper.snapshots >= 100 and scraper.busy >= 1, (scraper.snapshots, scraper.busy)
    _assert_failures_counted(final, UPDATES // 5)
    assert final.attempts_running == 0
    assert final.attempts_started == sum(final.attempts_ended.values())
