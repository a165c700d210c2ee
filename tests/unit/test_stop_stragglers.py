"""The stop cancels only the tasks still processing an update at its deadline: a task that
was processing when the stop began waiting and has moved on since (PTB's update fetcher with
``max_concurrent=1`` processes in its own task, then waits for the queue's next item) is left
alone, or PTB's ``stop()`` would end with that CancelledError."""

from __future__ import annotations

import asyncio
from typing import Any, List

from ptb_fence.ptb._stopping import Stopping


def test_a_task_that_finished_processing_meanwhile_is_not_cancelled() -> None:
    stopping = Stopping(runtime=None, threads=None, handlers=None)  # type: ignore[arg-type]
    outcome: List[Any] = []

    async def fetcher(moved_on: asyncio.Event, next_item: asyncio.Event) -> None:
        task = stopping.processing()
        await asyncio.sleep(0.05)  # the update is processed while the stop waits
        stopping.processed(task)
        moved_on.set()
        try:
            await next_item.wait()  # as PTB's fetcher waits in update_queue.get()
            outcome.append("got the next item")
        except asyncio.CancelledError:
            outcome.append("cancelled")
            raise

    async def main() -> None:
        moved_on, next_item = asyncio.Event(), asyncio.Event()
        task = asyncio.create_task(fetcher(moved_on, next_item))
        await asyncio.sleep(0)  # it is processing now
        loop = asyncio.get_running_loop()
        await stopping._abandon_stragglers(loop.time() + 0.2)
        assert moved_on.is_set()
        next_item.set()
        await task

    asyncio.run(main())
    assert outcome == ["got the next item"]


def test_a_task_still_processing_at_the_deadline_is_cancelled() -> None:
    stopping = Stopping(runtime=None, threads=None, handlers=None)  # type: ignore[arg-type]
    ended: List[str] = []

    async def stuck() -> None:
        task = stopping.processing()
        try:
            await asyncio.sleep(30)  # waiting for a store that does not answer
        except asyncio.CancelledError:
            ended.append("abandoned" if stopping.end_abandoned(task) else "cancelled by another")
        finally:
            stopping.processed(task)

    async def main() -> None:
        task = asyncio.create_task(stuck())
        await asyncio.sleep(0)
        loop = asyncio.get_running_loop()
        await stopping._abandon_stragglers(loop.time() + 0.05)
        await asyncio.wait_for(task, 5)

    asyncio.run(main())
    assert ended == ["abandoned"]
