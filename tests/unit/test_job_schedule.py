"""A durable job's schedule: kept as JSON, its runs computed by APScheduler's triggers, missed
runs coalesced into one."""

from __future__ import annotations

import datetime as dtm
import json
import zoneinfo

import pytest

from ptb_fence import UsageError
from ptb_fence.runtime._job_callbacks import (
    callback_reference,
    register_job_callback,
    resolve_callback,
)
from ptb_fence.runtime._job_schedule import JobSchedule

UTC = dtm.timezone.utc
NOW = dtm.datetime(2026, 12, 7, 6, 0, tzinfo=UTC)  # a Monday
MS = int(NOW.timestamp() * 1000)
MINUTE = 60_000


def at(ms: int) -> dtm.datetime:
    return dtm.datetime.fromtimestamp(ms / 1000, tz=UTC)


def test_once_runs_once_at_its_time() -> None:
    schedule = JobSchedule.once(NOW + dtm.timedelta(seconds=3))
    assert schedule.first(MS) == MS + 3000
    assert schedule.after(MS + 3000, MS + 3000) == (None, 0)
    assert not schedule.repeats


def test_an_interval_coalesces_the_runs_missed_while_down() -> None:
    schedule = JobSchedule.interval(60, NOW, NOW + dtm.timedelta(minutes=10))
    assert schedule.first(MS) == MS
    assert schedule.after(MS, MS) == (MS + MINUTE, 0)
    # down for 3.5 minutes: the run due at +1 fires now, +2 and +3 are coalesced into it
    assert schedule.after(MS + MINUTE, MS + 3 * MINUTE + 30_000) == (MS + 4 * MINUTE, 2)
    assert schedule.after(MS + 10 * MINUTE, MS + 10 * MINUTE) == (None, 0)  # past its last


def test_calendar_runs_follow_the_time_zone() -> None:
    berlin = zoneinfo.ZoneInfo("Europe/Berlin")
    schedule = JobSchedule.cron({"day_of_week": "mon,tue", "hour": 10, "minute": 0,
                                 "second": 0}, berlin)
    first = schedule.first(MS)
    assert first is not None and at(first) == dtm.datetime(2026, 12, 7, 9, 0, tzinfo=UTC)
    # nine days later: Tuesday 8, Monday 14 and Tuesday 15 were missed, Monday 21 is next
    later, skipped = schedule.after(first, first + 9 * 86_400_000)
    assert later is not None and at(later) == dtm.datetime(2026, 12, 21, 9, 0, tzinfo=UTC)
    assert skipped == 3


def test_a_schedule_is_kept_as_json_and_read_back_equal() -> None:
    for schedule in (
        JobSchedule.once(NOW),
        JobSchedule.interval(5, NOW),
        JobSchedule.cron({"day": "last", "hour": 8}, zoneinfo.ZoneInfo("Asia/Tokyo")),
    ):
        text = schedule.text()
        assert json.loads(text)["kind"] == schedule.kind
        assert JobSchedule.from_text(text) == schedule


def test_run_custom_triggers_by_name_and_the_rest_refused() -> None:
    cron = JobSchedule.from_trigger_kwargs({"trigger": "cron", "minute": "*/5"}, NOW)
    assert cron.kind == "cron" and cron.first(MS) == MS and cron.first(MS + 1) == MS + 5 * MINUTE
    every = JobSchedule.from_trigger_kwargs({"trigger": "interval", "minutes": 2}, NOW)
    assert every.first(MS) == MS + 2 * MINUTE
    date = JobSchedule.from_trigger_kwargs({"trigger": "date", "run_date": NOW}, NOW)
    assert date.first(MS) == MS
    with pytest.raises(UsageError, match="by name"):
        JobSchedule.from_trigger_kwargs({"trigger": object()}, NOW)
    with pytest.raises(UsageError, match="jitter"):
        JobSchedule.from_trigger_kwargs({"trigger": "cron", "minute": 1, "jitter": 5}, NOW)
    with pytest.raises(UsageError, match="unknown cron fields"):
        JobSchedule.cron({"minutes": 1}, UTC)
    with pytest.raises(ValueError, match="positive"):
        JobSchedule.interval(0, NOW)


async def module_level_callback(context: object) -> None:
    """A job callback another process finds by its import path."""


def test_a_callback_is_kept_by_its_import_path_or_a_registered_name() -> None:
    reference = callback_reference(module_level_callback)
    assert reference == f"{__name__}:module_level_callback"
    assert resolve_callback(reference) is module_level_callback

    async def nested(context: object) -> None:
        pass

    register_job_callback("test-job-schedule-nested", nested)
    assert callback_reference(nested) == "name:test-job-schedule-nested"
    assert resolve_callback("name:test-job-schedule-nested") is nested
    with pytest.raises(ValueError, match="taken"):
        register_job_callback("test-job-schedule-nested", module_level_callback)


def test_a_callback_another_process_cannot_find_is_refused_with_the_fix() -> None:
    class Holder:
        async def method(self, context: object) -> None:
            pass

    def make() -> object:
        async def inner(context: object) -> None:
            pass
        return inner

    for callback, why in ((lambda context: None, "lambda"), (make(), "nested function"),
                          (Holder().method, "bound method")):
        with pytest.raises(UsageError, match=why) as caught:
            callback_reference(callback)  # type: ignore[arg-type]
        assert "register_job_callback" in str(caught.value)
    with pytest.raises(LookupError, match="renamed or removed"):
        resolve_callback(f"{__name__}:gone_in_a_deploy")
    with pytest.raises(LookupError, match="register it"):
        resolve_callback("name:never-registered")


def test_a_job_run_takes_its_turn_in_its_jobs_chat() -> None:
    """Both front ends order a durable job's run with its job's chat (else its user)."""
    from telegram import Update

    from ptb_fence.runtime._chats import chat_key, update_chat_key
    from ptb_fence.runtime._durable_jobs import JobRun, run_update_id

    run = JobRun(3, 1, 0, "nudge", "m:f", "", 77, 5)
    update_id = run_update_id(3, 1)
    data = json.loads(run.body(update_id))
    assert chat_key(data) == 77 and update_chat_key(Update.de_json(data, None)) == 77
    no_chat = json.loads(JobRun(3, 1, 0, "n", "m:f", "", None, 5).body(update_id))
    assert chat_key(no_chat) == 5 == update_chat_key(Update.de_json(no_chat, None))
    alone = json.loads(JobRun(3, 1, 0, "n", "m:f", "", None, None).body(update_id))
    assert chat_key(alone) == ("update", update_id) == update_chat_key(Update.de_json(alone,
                                                                                       None))
