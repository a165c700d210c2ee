"""``ptb-fence broadcast``: list, show, pause, resume and cancel the broadcasts a store keeps.

Broadcasts are kept by a store that declares ``StoreFeatures(broadcasts=True)``. These
commands call the store's own operations (``list_broadcasts``, ``set_broadcast_state``).
``show --watch`` refreshes a progress bar with the rate and the time left.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from ptb_fence._values import RECIPIENT_STATES, StoredBroadcast
from ptb_fence.cli._errors import Refused
from ptb_fence.cli._format import clip, format_age, format_time, iso_time, render_pairs, render_table
from ptb_fence.contract import StoreFeatures

__all__ = ["add_broadcast_parser", "broadcast_json", "require_broadcasts", "run_broadcast"]

_PROG = "ptb-fence"
_BAR = 30
_ACTIONS = {"pause": "paused", "resume": "active", "cancel": "cancelled"}


def add_broadcast_parser(
    add: Callable[[str, str], argparse.ArgumentParser],
    common: argparse.ArgumentParser,
    duration: Callable[[str], int],
) -> None:
    """Add ``broadcast`` and its subcommands.

    Args:
        add: Makes a top-level command (name, help) with the common options.
        common: The parent parser of the common options.
        duration: The argument type of ``--watch`` (milliseconds).
    """
    broadcast = add("broadcast", "the broadcasts in the store: list, show, pause, resume, cancel")
    broadcast.description = (
        "The broadcasts the store keeps (processor.broadcast, intake.broadcast), one row per "
        "recipient. Recipients: pending (waiting), sending (held by a sender), sent, failed "
        "(refused by Telegram), blocked (the user blocked the bot), cancelled. Times are UTC."
    )
    commands = broadcast.add_subparsers(
        dest="broadcast_command", metavar="SUBCOMMAND", parser_class=type(broadcast)
    )
    commands.required = True

    def command(name: str, help_text: str) -> argparse.ArgumentParser:
        sub: argparse.ArgumentParser = commands.add_parser(
            name, parents=[common], help=help_text, description=help_text
        )
        sub.add_argument("--json", action="store_true", help="print JSON")
        return sub

    command("list", "every broadcast by id, its state and its recipients per state")
    sub = command("show", "one broadcast: its call, its state and its progress")
    sub.add_argument("name", metavar="NAME")
    sub.add_argument(
        "--watch", nargs="?", type=duration, const=2_000, default=None, metavar="DURATION",
        help="refresh every DURATION (default 2s) with a progress bar and the time left, "
        "until it is done or Ctrl-C",
    )
    command("pause", "send nothing more of a broadcast until it is resumed").add_argument(
        "name", metavar="NAME")
    command("resume", "send the rest of a paused broadcast").add_argument(
        "name", metavar="NAME")
    command("cancel", "send nothing more of a broadcast, ever (its pending recipients are "
            "cancelled)").add_argument("name", metavar="NAME")


def require_broadcasts(store: Any) -> None:
    """Refuse a store that keeps no broadcasts, naming the fix.

    Raises:
        ptb_fence.cli._errors.Refused: The store does not declare
            ``StoreFeatures(broadcasts=True)``.
    """
    features = getattr(store, "features", None)
    if isinstance(features, StoreFeatures) and features.broadcasts:
        return
    raise Refused(
        f"{type(store).__name__} keeps no broadcasts (it does not declare "
        "StoreFeatures(broadcasts=True)): broadcasts need SQLiteUpdateStore or "
        "PostgresUpdateStore of a ptb_fence version with broadcasts (a PostgreSQL table made "
        f"before: run `{_PROG} migrate`)"
    )


def broadcast_json(broadcast: StoredBroadcast) -> Dict[str, Any]:
    """A broadcast as a JSON-ready dict, its recipients counted per state."""
    return {
        "broadcast_id": broadcast.broadcast_id,
        "name": broadcast.name,
        "state": broadcast.state,
        "done": broadcast.done,
        "method": broadcast.method,
        "params": json.loads(broadcast.params_json),
        "created_at": broadcast.created_at,
        "created_at_utc": iso_time(broadcast.created_at),
        "total": broadcast.total,
        "recipients": {state: getattr(broadcast, state) for state in RECIPIENT_STATES},
    }


def run_broadcast(
    args: argparse.Namespace,
    store: Any,
    *,
    now: Callable[[], int],
    out: Callable[[str], None],
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Run ``ptb-fence broadcast SUBCOMMAND`` on the store.

    Raises:
        ptb_fence.cli._errors.Refused: A store without broadcasts, an unknown broadcast, or a
            cancelled one asked to resume (nothing changed).
    """
    require_broadcasts(store)
    command = args.broadcast_command
    if command == "list":
        return _list(args, store, out)
    if command == "show":
        if args.watch is None:
            return _show(args, _require(store, args.name), out)
        return _watch(args, store, now, out, sleep)
    state = _ACTIONS[command]
    changed = store.set_broadcast_state(args.name, state, now())
    if changed is None:
        raise Refused(f"no broadcast named {args.name!r} in the store (see `{_PROG} "
                      "broadcast list`)")
    if changed.state != state:
        raise Refused(f"the broadcast {args.name!r} was cancelled: it stays cancelled")
    if args.json:
        out(json.dumps(broadcast_json(changed), indent=2, ensure_ascii=False))
    else:
        out(f"broadcast {changed.name!r} is {changed.state}: {_counts(changed)}")
    return 0


def _require(store: Any, name: str) -> StoredBroadcast:
    found = store.list_broadcasts(name)
    if not found:
        raise Refused(f"no broadcast named {name!r} in the store (see `{_PROG} broadcast "
                      "list`)")
    return found[0]  # type: ignore[no-any-return]


def _counts(broadcast: StoredBroadcast) -> str:
    return ", ".join(f"{getattr(broadcast, state)} {state}" for state in RECIPIENT_STATES
                     if getattr(broadcast, state)) or "no recipients"


def _list(args: argparse.Namespace, store: Any, out: Callable[[str], None]) -> int:
    found: List[StoredBroadcast] = list(store.list_broadcasts())
    if args.json:
        out(json.dumps({"broadcasts": [broadcast_json(b) for b in found]}, indent=2,
                       ensure_ascii=False))
        return 0
    if not found:
        out("no broadcasts")
        return 0
    out(render_table(
        ("ID", "NAME", "STATE", "TOTAL", "SENT", "PENDING", "FAILED", "BLOCKED", "CANCELLED",
         "STARTED (UTC)"),
        [(b.broadcast_id, clip(b.name, 32), "done" if b.done and b.state == "active"
          else b.state, b.total, b.sent, b.pending + b.sending, b.failed, b.blocked,
          b.cancelled, format_time(b.created_at)) for b in found],
        right=(0, 3, 4, 5, 6, 7, 8),
    ))
    return 0


def _show(args: argparse.Namespace, broadcast: StoredBroadcast,
          out: Callable[[str], None]) -> int:
    if args.json:
        out(json.dumps(broadcast_json(broadcast), indent=2, ensure_ascii=False))
        return 0
    out(render_pairs([
        ("broadcast", f"{broadcast.name!r} (id {broadcast.broadcast_id})"),
        ("state", broadcast.state + (" (done)" if broadcast.done else "")),
        ("call", f"{broadcast.method} {clip(broadcast.params_json, 80)}"),
        ("started", format_time(broadcast.created_at, millis=True)),
        ("recipients", f"{broadcast.total}: {_counts(broadcast)}"),
    ]))
    return 0


def _progress(broadcast: StoredBroadcast, rate: Optional[float]) -> str:
    """A progress bar with the share settled, the rate and the time left."""
    settled = broadcast.total - broadcast.pending - broadcast.sending
    share = settled / broadcast.total if broadcast.total else 1.0
    filled = int(round(share * _BAR))
    left = broadcast.pending + broadcast.sending
    if broadcast.done:
        tail = "done"
    elif broadcast.state != "active":
        tail = broadcast.state
    elif rate:
        tail = f"{rate:.1f}/s, about {format_age(int(left / rate * 1000))} left"
    else:
        tail = "waiting for a sender"
    return (f"[{'#' * filled}{'.' * (_BAR - filled)}] {share:6.1%} {settled}/{broadcast.total} "
            f"({broadcast.sent} sent, {broadcast.failed} failed, {broadcast.blocked} blocked) "
            f"{tail}")


def _watch(args: argparse.Namespace, store: Any, now: Callable[[], int],
           out: Callable[[str], None], sleep: Callable[[float], None]) -> int:
    seen: Optional[Tuple[int, int]] = None  # (time, settled) of the refresh before
    try:
        while True:
            broadcast = _require(store, args.name)
            at = now()
            settled = broadcast.total - broadcast.pending - broadcast.sending
            rate = None
            if seen is not None and at > seen[0]:
                rate = (settled - seen[1]) * 1000.0 / (at - seen[0])
            seen = (at, settled)
            if args.json:
                out(json.dumps({"now": at, "rate_per_second": rate,
                                **broadcast_json(broadcast)}, ensure_ascii=False))
            else:
                out(_progress(broadcast, rate))
            if broadcast.done or broadcast.state == "cancelled":
                return 0
            sleep(args.watch / 1000.0)
    except KeyboardInterrupt:  # the operator's way to end a watch: not an error
        if not args.json:
            print(file=sys.stderr)
        return 0
