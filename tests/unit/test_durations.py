"""Duration options accept ``float | int | timedelta``; durations print for humans."""

from __future__ import annotations

import datetime as dt
import math
from typing import Any

import pytest

from ptb_fence import MemoryUpdateStore, RuntimeOptions, UpdateIntake
from ptb_fence._durations import duration_seconds, format_duration
from ptb_fence.ptb import FencedUpdateProcessor

DURATIONS = [
    "lease_seconds",
    "sweep_every_seconds",
    "pending_grace_seconds",
    "retain_seconds",
    "stop_timeout_seconds",
    "attempt_timeout_seconds",
    "outbox_max_age_seconds",
]


async def noop(*_: Any) -> None:
    return None


def test_every_seconds_option_is_covered() -> None:
    names = {name for name in RuntimeOptions.__dataclass_fields__ if name.endswith("_seconds")}
    assert names == set(DURATIONS)


@pytest.mark.parametrize("name", DURATIONS)
@pytest.mark.parametrize(
    "value, seconds",
    [(dt.timedelta(seconds=60), 60.0), (dt.timedelta(milliseconds=250), 0.25), (7, 7.0),
     (2.5, 2.5)],
)
def test_duration_options_accept_timedelta_int_and_float(
    name: str, value: Any, seconds: float
) -> None:
    options = RuntimeOptions(**{name: value})
    assert getattr(options, name) == seconds
    assert isinstance(getattr(options, name), float)
    intake = UpdateIntake(MemoryUpdateStore(), handle=noop, **{name: value})
    assert intake is not None


def test_processor_takes_a_timedelta_lease() -> None:
    processor = FencedUpdateProcessor(
        MemoryUpdateStore(), lease_seconds=dt.timedelta(seconds=60),
        sweep_every_seconds=dt.timedelta(seconds=1),
    )
    assert processor is not None


def test_lease_ms_from_timedelta() -> None:
    assert RuntimeOptions(lease_seconds=dt.timedelta(minutes=2)).lease_ms == 120_000


@pytest.mark.parametrize("name", DURATIONS)
@pytest.mark.parametrize(
    "value",
    [dt.timedelta(0), dt.timedelta(seconds=-1), 0, -1, math.nan, math.inf, True, None, "5",
     dt.datetime(2026, 1, 1)],
)
def test_bad_durations_name_the_option(name: str, value: Any) -> None:
    if name == "attempt_timeout_seconds" and value is None:
        assert RuntimeOptions(attempt_timeout_seconds=None).attempt_timeout_seconds is None
        return  # None switches the attempt timeout off
    with pytest.raises(ValueError, match=name) as info:
        RuntimeOptions(**{name: value})
    assert "timedelta" in str(info.value)


@pytest.mark.parametrize(
    "seconds, text",
    [
        (0, "0 ms"), (0.25, "250 ms"), (0.0004, "<1 ms"), (0.9996, "1 s"), (1, "1 s"),
        (5, "5 s"), (2.5, "2.5 s"), (59.96, "1m 00s"), (65, "1m 05s"), (3599.6, "1h 00m"),
        (3600, "1h 00m"), (5400, "1h 30m"), (86400 * 2 + 3 * 3600, "2d 03h"),
        (dt.timedelta(hours=1), "1h 00m"), (-5, "-5 s"), (math.inf, "inf"),
    ],
)
def test_format_duration(seconds: Any, text: str) -> None:
    assert format_duration(seconds) == text


def test_duration_seconds_helper() -> None:
    assert duration_seconds("x", dt.timedelta(seconds=1.5)) == 1.5
    with pytest.raises(ValueError, match="^x must be"):
        duration_seconds("x", "1")
