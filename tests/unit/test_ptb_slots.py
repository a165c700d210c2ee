"""The processor's concurrency slots: bounded, first come first served, cancellation-safe."""

from __future__ import annotations

import asyncio
from typing import List

import pytest

from ptb_fence.ptb._slots import Slots


def test_no_more_than_count_hold_a_slot_at_once() -> None:
    """Forty tasks share four slots: at most four run at a time, all of them run."""
    async def main() -> int:
        slots = Slots(4)
        running = peak = 0
        done = 0

        async def work() -> None:
            nonlocal running, peak, done
            await slots.acquire()
            try:
                running += 1
                peak = max(peak, running)
                await asyncio.sleep(0.001)
                running -= 1
                done += 1
            finally:
                slots.release()

        await asyncio.gather(*(work() for _ in range(40)))
        assert done == 40 and slots.free == 4
        return peak

    assert asyncio.run(main()) == 4


def test_waiters_get_the_slot_in_the_order_they_asked() -> None:
    """A released slot goes to the oldest waiter, and a newcomer does not overtake it."""
    async def main() -> List[int]:
        slots = Slots(1)
        order: List[int] = []
        await slots.acquire()

        async def wait(n: int) -> None:
            await slots.acquire()
            order.append(n)
            slots.release()

        tasks = [asyncio.create_task(wait(n)) for n in range(5)]
        await asyncio.sleep(0)  # all five wait now
        slots.release()
        late = asyncio.create_task(wait(99))  # asks after the release: behind the five
        await asyncio.gather(*tasks, late)
        return order

    assert asyncio.run(main()) == [0, 1, 2, 3, 4, 99]


def test_a_cancelled_wait_holds_no_slot_and_leaves_the_queue() -> None:
    async def main() -> None:
        slots = Slots(1)
        await slots.acquire()
        waiter = asyncio.create_task(slots.acquire())
        await asyncio.sleep(0)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        slots.release()
        assert slots.free == 1
        await asyncio.wait_for(slots.acquire(), 1)  # the slot is free, not owed to anyone
        assert slots.free == 0

    asyncio.run(main())


def test_a_slot_handed_to_a_wait_cancelled_at_that_moment_passes_on() -> None:
    """The release hands the slot over, then the waiter is cancelled before it runs: the
    slot goes to the next waiter, not lost."""
    async def main() -> None:
        slots = Slots(1)
        await slots.acquire()
        first = asyncio.create_task(slots.acquire())
        second = asyncio.create_task(slots.acquire())
        await asyncio.sleep(0)
        slots.release()  # handed to first, which has not run yet
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        await asyncio.wait_for(second, 1)  # second got the slot first gave up
        assert slots.free == 0
        slots.release()
        assert slots.free == 1

    asyncio.run(main())
