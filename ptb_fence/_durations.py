"""Durations: accept ``float | int | timedelta`` options and print durations for humans.

python-telegram-bot 22 takes durations as ``int | datetime.timedelta`` (its ``TimePeriod``).
The duration options of ptb_fence accept the same and plain floats. :func:`format_duration` is the
one place that turns a duration into text (``250 ms``, ``5 s``, ``1h 00m``, ``2d 03h``), for the
command line and for log lines.
"""

from __future__ import annotations

import datetime as _dt
import math
from typing import Union

__all__ = ["Duration", "duration_seconds", "format_duration"]

Duration = Union[float, int, _dt.timedelta]
"""A duration option: seconds as :obj:`int`/:obj:`float`, or a :class:`datetime.timedelta`."""


def duration_seconds(name: str, value: object) -> float:
    """Validate a positive duration option and return it in seconds.

    Args:
        name: The option's name, used in the error message.
        value: Seconds (:obj:`int` or :obj:`float`, not :obj:`bool`) or a
            :class:`datetime.timedelta`.

    Returns:
        :obj:`float`: The duration in seconds (finite, > 0).

    Raises:
        ValueError: ``value`` is not a positive finite number of seconds or a positive
            ``timedelta`` (the message names the option and the value).
    """
    seconds: float
    if isinstance(value, _dt.timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    else:
        raise ValueError(
            f"{name} must be a positive number of seconds or a datetime.timedelta, "
            f"got {value!r}"
        )
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(
            f"{name} must be a positive number of seconds or a datetime.timedelta, "
            f"got {value!r}"
        )
    return seconds


def format_duration(seconds: Union[float, int, _dt.timedelta]) -> str:
    """A short human-readable duration.

    Below one second in milliseconds (``250 ms``), below a minute in seconds (``5 s``,
    ``2.5 s``), below an hour as minutes and seconds (``1m 05s``), below a day as hours and
    minutes (``1h 00m``), else days and hours (``2d 03h``). Negative durations get a ``-``.

    Args:
        seconds: Seconds or a :class:`datetime.timedelta`.

    Returns:
        :obj:`str`: The text. ``"inf"``/``"nan"`` for non-finite input.
    """
    value = seconds.total_seconds() if isinstance(seconds, _dt.timedelta) else float(seconds)
    if math.isnan(value):
        return "nan"
    if value < 0:
        return "-" + format_duration(-value)
    if math.isinf(value):
        return "inf"
    if value < 1:
        millis = round(value * 1000)
        if millis < 1000:
            return f"{millis} ms" if millis or value == 0 else "<1 ms"
        value = 1.0
    if value < 60:
        text = f"{value:.1f}".rstrip("0").rstrip(".")
        if text == "60":
            return "1m 00s"
        return f"{text} s"
    total = int(round(value))
    if total < 3600:
        return f"{total // 60}m {total % 60:02d}s"
    if total < 86400:
        return f"{total // 3600}h {total % 3600 // 60:02d}m"
    return f"{total // 86400}d {total % 86400 // 3600:02d}h"
