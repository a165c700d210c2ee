"""Formatting for the ``ptb-fence`` command line: UTC times, ages, durations and text tables."""

from __future__ import annotations

import datetime as _dt
import json
import re
from typing import Any, List, Optional, Sequence

from ptb_fence._durations import format_duration

__all__ = [
    "clip",
    "format_age",
    "format_time",
    "iso_time",
    "one_line",
    "parse_duration",
    "pretty_body",
    "render_pairs",
    "render_table",
]

_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")


def parse_duration(text: str) -> int:
    """Parse a duration such as ``90s``, ``15m``, ``12h``, ``7d`` (also ``ms``, ``w``).

    Args:
        text (:obj:`str`): A positive number followed by one unit, with no spaces inside.

    Returns:
        :obj:`int`: The duration in milliseconds (at least 1).

    Raises:
        ValueError: The text is not such a duration, or it is zero.
    """
    match = _DURATION.fullmatch(text.strip().lower()) if isinstance(text, str) else None
    if match is None:
        raise ValueError(
            f"invalid duration {text!r}: write a positive number and one unit, "
            "e.g. 90s, 15m, 12h, 7d (units: ms, s, m, h, d, w)"
        )
    ms = int(float(match.group(1)) * _UNITS_MS[match.group(2)])
    if ms <= 0:
        raise ValueError(f"invalid duration {text!r}: it must be longer than zero")
    return ms


def _utc(ms: int) -> _dt.datetime:
    return _dt.datetime.fromtimestamp(ms / 1000.0, tz=_dt.timezone.utc)


def format_time(ms: Optional[int], *, millis: bool = False) -> str:
    """``2024-05-01 12:00:00`` (UTC) for epoch milliseconds, ``-`` for :obj:`None`.

    Args:
        ms (:obj:`int` | :obj:`None`): Epoch milliseconds.
        millis (:obj:`bool`, optional): Add ``.mmm`` and the ``UTC`` suffix.
    """
    if ms is None:
        return "-"
    try:
        moment = _utc(int(ms))
    except (OverflowError, OSError, ValueError):
        return f"{ms} ms"
    if millis:
        return moment.strftime("%Y-%m-%d %H:%M:%S.") + f"{moment.microsecond // 1000:03d} UTC"
    return moment.strftime("%Y-%m-%d %H:%M:%S")


def iso_time(ms: Optional[int]) -> Optional[str]:
    """ISO 8601 UTC text (``2024-05-01T12:00:00.123Z``) for JSON output.

    :obj:`None` stays :obj:`None`."""
    if ms is None:
        return None
    try:
        moment = _utc(int(ms))
    except (OverflowError, OSError, ValueError):
        return None
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def format_age(ms: int) -> str:
    """A short human duration of ``ms`` milliseconds.

    Examples are ``250 ms``, ``45 s``, ``2m 03s``, ``3h 05m`` and ``2d 04h``.
    From one second on it shows whole seconds (see :func:`ptb_fence._durations.format_duration`).
    """
    ms = int(ms)
    if ms < 0:
        return "-" + format_age(-ms)
    return format_duration(ms / 1000.0 if ms < 1000 else ms // 1000)


def one_line(text: Any) -> str:
    """``text`` with every run of whitespace (newlines included) collapsed to one space."""
    return " ".join(str(text).split())


def clip(text: Optional[str], width: int) -> str:
    """``text`` on one line, cut to ``width`` characters with ``…``.

    :obj:`None` gives ``-``."""
    if text is None or text == "":
        return "-"
    flat = one_line(text)
    if len(flat) <= width:
        return flat
    return flat[: max(width - 1, 0)] + "…"


def pretty_body(body: str) -> str:
    """The update's JSON text pretty-printed (2-space indent, keys in stored order).

    A body that is not JSON is returned as it is.
    """
    try:
        return json.dumps(json.loads(body), indent=2, ensure_ascii=False)
    except (ValueError, RecursionError):
        return body


def render_table(
    headers: Sequence[str], rows: Sequence[Sequence[Any]], *, right: Sequence[int] = ()
) -> str:
    """Render an aligned text table: a header line, a rule, one line per row.

    Args:
        headers: The column titles.
        rows: The cells (converted with :func:`str`).
        right: Indexes of columns to right-align (numbers).
    """
    cells: List[List[str]] = [[str(h) for h in headers]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(headers))]

    def line(values: List[str]) -> str:
        parts = [
            value.rjust(widths[i]) if i in right else value.ljust(widths[i])
            for i, value in enumerate(values)
        ]
        return "  ".join(parts).rstrip()

    out = [line(cells[0]), "  ".join("-" * w for w in widths)]
    out.extend(line(values) for values in cells[1:])
    return "\n".join(out)


def render_pairs(pairs: Sequence[Sequence[Any]]) -> str:
    """Render ``label  value`` lines with the labels padded to one width."""
    width = max((len(str(label)) for label, _ in pairs), default=0)
    return "\n".join(f"{str(label).ljust(width)}  {value}" for label, value in pairs)
