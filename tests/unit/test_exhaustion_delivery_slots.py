"""The shared exhaustion delivery decisions never strand a due exhaustion until the next sweep.

Deterministic, no threads: a fake runtime (a list of due exhaustions behind the same rotating
page cursor as :meth:`Runtime.exhaustion_page`) and the front ends' contract played step by
step: a delivery ends with ``finish`` then ``more_due``, and what ``more_due`` returned is
admitted later (the PTB processor admits on the event loop, ``UpdateIntake`` on the thread
that ended, after ``more_due`` returned), so two deliveries ending together may both fetch a
page before either is admitted.
"""

from __future__ import annotations

from typing import Dict, List, Optional

from ptb_fence import Exhaustion
from ptb_fence.runtime._exhaustions import ExhaustionDeliveries


class _FakeRuntime:
    """The runtime surface ``ExhaustionDeliveries`` uses, over an in-memory list."""

    def __init__(self, update_ids: List[int]) -> None:
        self.due: Dict[int, Exhaustion] = {u: _exhaustion(u) for u in update_ids}
        self.cursor: Optional[int] = None

    def exhaustion_page(self, limit: int) -> List[Exhaustion]:
        after = self.cursor
        page = [self.due[u] for u in sorted(self.due) if after is None or u > after][:limit]
        self.cursor = None if len(page) < limit else page[-1].update_id
        return page

    def acknowledge(self, exhaustion: Exhaustion) -> bool:
        return self.due.pop(exhaustion.update_id, None) is not None

    def exhaustion_failed(self, error: BaseException, exhaustion: Exhaustion) -> None:
        pass

    def report_store_error(self, error: BaseException, step: str) -> None:
        raise AssertionError(f"unexpected store error at {step}: {error!r}")


def _exhaustion(update_id: int) -> Exhaustion:
    return Exhaustion(update_id, 1, f"claim-{update_id}", "{}", 0, "final failure")


def _ids(exhaustions: List[Exhaustion]) -> List[int]:
    return [e.update_id for e in exhaustions]


def test_exhaustions_left_out_by_pages_fetched_together_are_delivered_as_slots_free() -> None:
    """Two pages fetched before either is admitted: the second does not fit and is left out
    (the cursor already past it). Before, a later short page ended the deliveries and the
    left-out exhaustions waited for the next sweep; now the deliveries that end start them."""
    runtime = _FakeRuntime([1, 2, 3, 4, 5, 6, 7])
    decisions = ExhaustionDeliveries(runtime, limit=2)  # type: ignore[arg-type]
    delivered: List[int] = []

    def admit(exhaustions: List[Exhaustion]) -> List[int]:
        admitted = _ids(decisions.admit(exhaustions))
        delivered.extend(admitted)
        return admitted

    # 1 and 2 recorded and delivered at once (from settle), 3..7 while both slots are busy
    assert admit([runtime.due[1], runtime.due[2]]) == [1, 2]
    for update_id in (3, 4, 5, 6, 7):
        assert admit([runtime.due[update_id]]) == []
    # 1 and 2 end together: both fetch a page before either page is admitted
    decisions.finish(_exhaustion(1), None)
    decisions.finish(_exhaustion(2), None)
    first, second = decisions.more_due(), decisions.more_due()
    assert admit(first) == [3, 4]
    admit(second)  # the slots are full again: nothing of it starts now
    # then every delivery that ends asks for more, until none runs
    while decisions.running:
        running = [u for u in delivered if u in runtime.due]
        decisions.finish(_exhaustion(running[0]), None)
        admit(decisions.more_due())
    assert sorted(delivered) == [1, 2, 3, 4, 5, 6, 7]  # each once
    assert runtime.due == {}  # none left for the next sweep


def test_an_exhaustion_recorded_behind_the_cursor_while_full_is_delivered_as_slots_free() -> None:
    """An exhaustion recorded while every slot is busy and the sweep's pages are past its
    ``update_id``: the deliveries that end start it, though the page cursor wraps round (a short
    page) before it is reached again."""
    runtime = _FakeRuntime([10, 11, 12, 13])
    decisions = ExhaustionDeliveries(runtime, limit=2)  # type: ignore[arg-type]
    delivered: List[int] = []

    def admit(exhaustions: List[Exhaustion]) -> List[int]:
        admitted = _ids(decisions.admit(exhaustions))
        delivered.extend(admitted)
        return admitted

    assert admit(decisions.due()) == [10, 11]  # a sweep: the cursor is past 11
    runtime.due[5] = _exhaustion(5)  # recorded now (its update settled), slots full
    assert admit([runtime.due[5]]) == []
    while decisions.running:
        running = [u for u in delivered if u in runtime.due]
        decisions.finish(_exhaustion(running[0]), None)
        admit(decisions.more_due())
    assert sorted(delivered) == [5, 10, 11, 12, 13]
    assert runtime.due == {}
