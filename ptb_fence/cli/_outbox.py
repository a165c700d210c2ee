"""``ptb-fence outbox``: list, show, retry and drop the Bot API calls in a table's outbox.

The outbox holds the calls attempts queued (``attempt.outbox``). Each is sent only if the
commit that completed its attempt landed. These commands read it with plain SQL through
:class:`~ptb_fence.cli._inspect.TableInspector`, which never creates a table. ``retry`` and
``drop`` are the store's own conditional statements (``retry_failed_call``, ``drop_call``).
So a call being sent is never disturbed.
"""

from __future__ import annotations

import argparse
import json
import logging
from typing import Any, Callable, Dict, Optional

from ptb_fence._values import OUTBOX_STATES, OutboxEntry
from ptb_fence.cli._errors import Refused
from ptb_fence.cli._format import (
    clip,
    format_age,
    format_time,
    iso_time,
    one_line,
    render_pairs,
    render_table,
)
from ptb_fence.cli._inspect import TableInspector

__all__ = ["add_outbox_parser", "call_json", "run_outbox"]

_LOGGER = logging.getLogger("ptb_fence.cli")

_PROG = "ptb-fence"
_MAX_CALL_ID = 2**63 - 1
_ERROR_WIDTH = 40
_TEXT_WIDTH = 32


# -- arguments ---------------------------------------------------------------------------------
def _call_id(text: str) -> int:
    try:
        value = int(text, 10)
    except (TypeError, ValueError):
        value = 0
    if not 1 <= value <= _MAX_CALL_ID:
        raise argparse.ArgumentTypeError(
            f"invalid call id {text!r}: a call_id is a whole number from 1 to 2**63-1"
        )
    return value


def _call_state(text: str) -> str:
    if text not in OUTBOX_STATES:
        raise argparse.ArgumentTypeError(
            f"invalid state {text!r}: one of {', '.join(OUTBOX_STATES)}"
        )
    return text


def add_outbox_parser(
    add: Callable[[str, str], argparse.ArgumentParser],
    common: argparse.ArgumentParser,
    limit: Callable[[str], int],
) -> None:
    """Add ``outbox`` and its subcommands.

    Args:
        add: Makes a top-level command (name, help) with the common options.
        common: The parent parser of the common options (``--store``, ``--table``, ``-v``).
        limit: The argument type of ``--limit``.
    """
    outbox = add(
        "outbox", "the Bot API calls queued by attempts: list, show, retry a failed one, drop"
    )
    outbox.description = (
        "The outbox of the update table: the Bot API calls attempts queued with "
        "attempt.outbox, each sent only if the commit that completed its attempt landed. "
        "States: pending (waits until due), sending (claimed by a sender under a lease), sent, "
        "failed (a permanent refusal, an expiry or an unknown outcome of an at-most-once call)."
    )
    commands = outbox.add_subparsers(
        dest="outbox_command", metavar="SUBCOMMAND", parser_class=type(outbox)
    )
    commands.required = True

    def command(name: str, help_text: str) -> argparse.ArgumentParser:
        sub: argparse.ArgumentParser = commands.add_parser(
            name, parents=[common], help=help_text, description=help_text
        )
        return sub

    sub = command("list", "calls by call_id (no parameters or results)")
    sub.add_argument(
        "--state", type=_call_state, help=f"only calls in this state ({', '.join(OUTBOX_STATES)})"
    )
    sub.add_argument("--limit", type=limit, default=50, help="at most N calls (50)")
    sub.add_argument("--after", type=_call_id, metavar="CALL_ID", help="calls after this id")
    sub.add_argument("--json", action="store_true", help="print JSON")

    sub = command(
        "show", "one call: its attempt, chat, state, tries, error, times (UTC), parameters, result"
    )
    sub.add_argument("call_id", type=_call_id, metavar="CALL_ID")
    sub.add_argument("--json", action="store_true", help="print JSON")

    sub = command(
        "retry", "send a failed call again: it goes back to pending, due now (tries and error kept)"
    )
    sub.add_argument("call_id", type=_call_id, metavar="CALL_ID")
    sub.add_argument("--json", action="store_true", help="print JSON: the call as it was")

    sub = command(
        "drop", "delete a pending or failed call: it is never sent (a call being sent is refused)"
    )
    sub.add_argument("call_id", type=_call_id, metavar="CALL_ID")
    sub.add_argument("--json", action="store_true", help="print JSON: the call as it was")


# -- values ------------------------------------------------------------------------------------
def _decoded(text: Optional[str]) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return text


def call_json(entry: OutboxEntry, *, full: bool = False) -> Dict[str, Any]:
    """A call as a JSON-ready dict, with times as epoch ms and as ISO 8601 UTC.

    ``full`` adds the parameters and the result (decoded JSON)."""
    data: Dict[str, Any] = {
        "call_id": entry.call_id,
        "state": entry.state,
        "acknowledged": entry.acknowledged,
        "update_id": entry.update_id,
        "attempt": entry.attempt,
        "claim_id": entry.claim_id,
        "seq": entry.seq,
        "chat_key": entry.chat_key,
        "method": entry.method,
        "at_most_once": entry.at_most_once,
        "tries": entry.tries,
        "created_at": entry.created_at,
        "created_at_utc": iso_time(entry.created_at),
        "due_at": entry.due_at,
        "due_at_utc": iso_time(entry.due_at),
        "sent_at": entry.sent_at,
        "sent_at_utc": iso_time(entry.sent_at),
        "error": entry.error,
    }
    if full:
        data["params"] = _decoded(entry.params_json)
        data["result"] = _decoded(entry.result_json)
    return data


def _state_label(entry: OutboxEntry) -> str:
    if entry.state == "failed" and entry.acknowledged:
        return "failed (acknowledged)"
    return entry.state


def _what(entry: OutboxEntry) -> str:
    chat = f"chat {entry.chat_key}" if entry.chat_key is not None else "no chat"
    return f"{entry.method} to {chat}, queued by update {entry.update_id} attempt {entry.attempt}"


def _text_of(entry: OutboxEntry) -> str:
    params = _decoded(entry.params_json)
    if isinstance(params, dict):
        for key in ("text", "caption"):
            if isinstance(params.get(key), str):
                return clip(params[key], _TEXT_WIDTH)
    return "-"


def _time_label(entry: OutboxEntry, now: int) -> str:
    """The time that matters for the call's state, with what it means."""
    if entry.state == "sent":
        return f"{format_time(entry.sent_at, millis=True)} (sent)"
    when = format_time(entry.due_at, millis=True)
    delta = entry.due_at - now
    if entry.state == "pending":
        note = f"due in {format_age(delta)}" if delta > 0 else "due now"
    elif entry.state == "sending":
        note = (
            f"held for {format_age(delta)} more" if delta >= 0
            else f"lapsed {format_age(-delta)} ago, the next sweep takes it over"
        )
    elif entry.acknowledged:
        note = "its failure was delivered and acknowledged then"
    else:
        note = "its failure is not yet acknowledged by handle_send_failure"
    return f"{when} ({note})"


def _time_name(entry: OutboxEntry) -> str:
    if entry.state == "failed":
        return "acknowledged_at" if entry.acknowledged else "failed_at"
    return {"sent": "sent_at", "sending": "lease"}.get(entry.state, "due_at")


# -- commands ----------------------------------------------------------------------------------
def run_outbox(
    args: argparse.Namespace,
    inspector: TableInspector,
    *,
    now: int,
    out: Callable[[str], None],
) -> int:
    """Run ``ptb-fence outbox SUBCOMMAND`` on the inspector's table.

    Raises:
        ptb_fence.cli._errors.Refused: No outbox table, an unknown call, or a refused action
            (nothing changed).
    """
    inspector.require_outbox()
    command = args.outbox_command
    if command == "list":
        return _list(args, inspector, out)
    if command == "show":
        return _show(args, inspector, now, out)
    if command == "retry":
        return _retry(args, inspector, now, out)
    return _drop(args, inspector, out)


def _list(args: argparse.Namespace, inspector: TableInspector, out: Callable[[str], None]) -> int:
    calls = inspector.calls(state=args.state, limit=args.limit, after=args.after)
    more = len(calls) >= args.limit
    if args.json:
        out(json.dumps(
            {
                "outbox_table": inspector.outbox_table,
                "calls": [call_json(entry) for entry in calls],
                "next_after": calls[-1].call_id if more and calls else None,
            },
            indent=2, ensure_ascii=False,
        ))
        return 0
    if not calls:
        what = f"{args.state} calls" if args.state else "calls"
        out(f"no {what} in {inspector.outbox_table!r}"
            + (f" after call {args.after}" if args.after is not None else ""))
        return 0
    out(render_table(
        ("CALL_ID", "STATE", "UPDATE_ID", "ATTEMPT", "CHAT", "METHOD", "TRIES", "CREATED (UTC)",
         "SENT (UTC)", "TEXT", "ERROR"),
        [
            (
                entry.call_id,
                "failed*" if entry.state == "failed" and entry.acknowledged else entry.state,
                entry.update_id,
                entry.attempt,
                "-" if entry.chat_key is None else entry.chat_key,
                entry.method,
                entry.tries,
                format_time(entry.created_at),
                format_time(entry.sent_at),
                _text_of(entry),
                clip(entry.error, _ERROR_WIDTH),
            )
            for entry in calls
        ],
        right=(0, 2, 3, 4, 6),
    ))
    summary = f"{len(calls)} call(s)"
    if more:
        summary += f"; next page: --after {calls[-1].call_id}"
    if any(entry.state == "failed" and entry.acknowledged for entry in calls):
        summary += " (failed*: failure acknowledged)"
    out(summary)
    return 0


def _show(
    args: argparse.Namespace, inspector: TableInspector, now: int, out: Callable[[str], None]
) -> int:
    entry = _require_call(inspector, args.call_id)
    if args.json:
        out(json.dumps(call_json(entry, full=True), indent=2, ensure_ascii=False))
        return 0
    created = format_time(entry.created_at, millis=True)
    created += f" ({format_age(max(now - entry.created_at, 0))} ago)"
    out(render_pairs([
        ("call_id", entry.call_id),
        ("state", _state_label(entry)),
        ("method", entry.method),
        ("chat", "-" if entry.chat_key is None else entry.chat_key),
        ("queued by", f"update {entry.update_id}, attempt {entry.attempt}, claim "
                      f"{entry.claim_id}, call {entry.seq} of the attempt"),
        ("delivery", "at most once (an unknown outcome fails it)" if entry.at_most_once
                     else "at least once (an unknown outcome sends it again)"),
        ("tries", entry.tries),
        ("created_at", created),
        (_time_name(entry), _time_label(entry, now)),
        ("error", one_line(entry.error) if entry.error else "-"),
    ]))
    out("params:")
    out(_pretty(entry.params_json))
    if entry.result_json is not None:
        out("result:")
        out(_pretty(entry.result_json))
    if entry.state == "failed":
        out("")
        out(f"send it again: {_PROG} outbox retry {entry.call_id}")
    if entry.state in ("failed", "pending"):
        out(f"never send it: {_PROG} outbox drop {entry.call_id}")
    return 0


def _pretty(text: str) -> str:
    try:
        return json.dumps(json.loads(text), indent=2, ensure_ascii=False)
    except (ValueError, RecursionError):
        return text


def _require_call(inspector: TableInspector, call_id: int) -> OutboxEntry:
    entry = inspector.call(call_id)
    if entry is None:
        raise Refused(f"no call {call_id} in the outbox {inspector.outbox_table!r}")
    return entry


def _refusal(entry: OutboxEntry, action: str) -> str:
    if entry.state == "sending":
        return (
            f"it is being sent: a sender holds it under a lease until "
            f"{format_time(entry.due_at, millis=True)} (a lapsed lease is taken over by the "
            f"next sweep); {action} only when it is not being sent"
        )
    if entry.state == "sent":
        return (
            f"it was sent at {format_time(entry.sent_at, millis=True)}; a sent call is "
            "history (`ptb-fence prune` deletes it with the update rows)"
        )
    return f"its state is {entry.state!r}"


def _log(action: str, entry: OutboxEntry, table: str, text: str) -> None:
    _LOGGER.info(
        "outbox %s: call %s (%s) %s", action, entry.call_id, _what(entry), text,
        extra={
            "call_id": entry.call_id,
            "update_id": entry.update_id,
            "attempt": entry.attempt,
            "claim_id": entry.claim_id,
            "previous_state": entry.state,
            "table": table,
        },
    )


def _retry(
    args: argparse.Namespace, inspector: TableInspector, now: int, out: Callable[[str], None]
) -> int:
    before, changed = inspector.retry_call(args.call_id, now)
    if before is None:
        raise Refused(f"no call {args.call_id} in the outbox {inspector.outbox_table!r}")
    if not changed:
        if before.state == "failed":
            raise Refused(
                f"call {before.call_id} changed while it was being retried; nothing changed "
                f"(look again with `{_PROG} outbox show {before.call_id}`)"
            )
        if before.state == "pending":
            why = "it is already pending: it is sent when due"
        else:
            why = _refusal(before, "retry it")
        raise Refused(
            f"cannot retry call {before.call_id}: {why}; retry only sends a failed call again; "
            "nothing changed"
        )
    _log("retry", before, inspector.table, "failed -> pending")
    if args.json:
        out(json.dumps({"retried": before.call_id, "before": call_json(before),
                        "state": "pending"}, indent=2, ensure_ascii=False))
        return 0
    out(f"call {before.call_id} ({_what(before)}): {_state_label(before)} -> pending, due now")
    out(f"tries so far: {before.tries} (kept)")
    if before.error:
        out(f"last error kept for the record: {clip(before.error, 200)}")
    if before.at_most_once:
        out(
            "warning: it was queued at most once; if its last try reached Telegram (an unknown "
            "outcome), it is sent a second time"
        )
    if before.chat_key is not None:
        out(
            f"it keeps its place in chat {before.chat_key}: calls of that chat queued after it "
            "and not yet sent wait until it is sent or fails again"
        )
    out("a running bot's dispatcher sends it at its next sweep")
    return 0


def _drop(args: argparse.Namespace, inspector: TableInspector, out: Callable[[str], None]) -> int:
    before, changed = inspector.drop_call(args.call_id)
    if before is None:
        raise Refused(f"no call {args.call_id} in the outbox {inspector.outbox_table!r}")
    if not changed:
        if before.state in ("pending", "failed"):
            raise Refused(
                f"call {before.call_id} changed while it was being dropped; nothing changed "
                f"(look again with `{_PROG} outbox show {before.call_id}`)"
            )
        raise Refused(
            f"cannot drop call {before.call_id}: {_refusal(before, 'drop it')}; drop only "
            "deletes pending or failed calls; nothing changed"
        )
    _log("drop", before, inspector.table, f"{before.state}: deleted, never sent")
    if args.json:
        out(json.dumps({"dropped": before.call_id, "before": call_json(before)}, indent=2,
                       ensure_ascii=False))
        return 0
    out(f"dropped call {before.call_id} ({_what(before)}), {_state_label(before)}: it is never "
        "sent")
    if before.state == "failed" and not before.acknowledged:
        out("its failure is no longer delivered to handle_send_failure")
    if before.chat_key is not None and before.state == "pending":
        out(f"the calls of chat {before.chat_key} queued after it no longer wait for it")
    return 0
