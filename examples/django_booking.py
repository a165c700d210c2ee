#!/usr/bin/env python
"""A booking bot with the Django ORM: blocking long polling and :class:`ptb_fence.UpdateIntake`.

``/book 10:30`` books the slot ``10:30``. The main thread long-polls Telegram's ``getUpdates``
and hands every update to the intake, which commits it to the update store *before* the next
offset tells Telegram it arrived; worker threads then call ``handle_attempt(update, attempt)``.
The handler writes the booking with the Django ORM inside
``with attempt.transaction(connection=django.db.connection, complete=True):`` — a Django
``transaction.atomic()`` block in which ptb_fence first checks that this attempt still owns the
update (PostgreSQL: ``SELECT … FOR UPDATE``) and settles it as completed, so the booking and
the settlement are **one commit, made by Django**. Django gives each thread its own database
connection and closes it only at the end of a request: the handler calls
``django.db.close_old_connections()`` when it is done, as a Django view's request would.

The reply is queued with ``attempt.outbox.reply_text`` inside the atomic block: the outbox row is
inserted through Django's transaction, so it commits with the booking (the intake sends it after
the commit, at least once, with ``UpdateIntake(bot_token=...)``) or rolls back with it (a failed
or stale attempt never replies).

Django is configured in this script (``settings.configure``); in a Django project use your
settings and models. The update store lives in the same database as the bookings (a SQLite file,
or PostgreSQL with ``--dsn``): one transaction covers both.

Run it (Python 3.10+; ``python -m pip install -e . django``; for PostgreSQL also
``psycopg[binary]``)::

    export TELEGRAM_BOT_TOKEN=123456:ABC...
    python examples/django_booking.py --db bookings.sqlite3
    python examples/django_booking.py --dsn postgresql://user@localhost/bot

Offline, against the fake Bot API of ``ptb_fence.testing``. In one terminal::

    python -m ptb_fence.testing serve --message "/book 10:00" --message "/book 10:00"

and in another (it answers both, books 10:00 once, and exits)::

    python examples/django_booking.py --db offline.sqlite3 --base-url http://127.0.0.1:8081/bot --exit-after 2

``--crash-once`` makes the first attempt at each booking fail after its ORM write: the write is
rolled back with the transaction and the retry books the slot (attempt 2).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
import threading
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Dict, List, Optional

import django
from django.conf import settings

from ptb_fence import Attempt, Exhaustion, PostgresUpdateStore, SQLiteUpdateStore, UpdateIntake

LOGGER = logging.getLogger("django_booking")
LOCAL_TOKEN = "123456:TEST-TOKEN"  # what ``python -m ptb_fence.testing serve`` accepts
COMMAND = re.compile(r"/book(?:@\w+)?(?:\s+(\S+))?\s*")
SLOT = re.compile(r"(?:[01][0-9]|2[0-3]):[0-5][0-9]")


def database_settings(args: argparse.Namespace) -> Dict[str, Any]:
    """Django's ``DATABASES["default"]`` for ``--db`` (SQLite) or ``--dsn`` (PostgreSQL)."""
    if args.dsn:
        url = urllib.parse.urlsplit(args.dsn)
        return {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": url.path.lstrip("/"),
            "USER": urllib.parse.unquote(url.username or ""),
            "PASSWORD": urllib.parse.unquote(url.password or ""),
            "HOST": url.hostname or "",
            "PORT": str(url.port or ""),
        }
    return {"ENGINE": "django.db.backends.sqlite3", "NAME": args.db, "OPTIONS": {"timeout": 30}}


def call(base: str, method: str, **params: Any) -> Any:
    """One Bot API call over ``urllib`` (blocking); the result, or RuntimeError."""
    request = urllib.request.Request(
        base + method, data=json.dumps(params).encode(), method="POST",
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=params.get("timeout", 0) + 10) as response:
            payload = json.loads(response.read())
    except urllib.error.HTTPError as exc:
        payload = json.loads(exc.read() or b"{}")
    if not payload.get("ok"):
        raise RuntimeError(f"{method}: {payload.get('description')}")
    return payload["result"]


def parse_args(argv: Optional[List[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    parser.add_argument("--db", default="bookings.sqlite3", help="SQLite file (created if missing)")
    parser.add_argument("--dsn", default="", help="PostgreSQL instead of SQLite")
    parser.add_argument("--table", default="telegram_updates", help="the update store's table")
    parser.add_argument("--bookings-table", default="django_bookings", help="the bookings table")
    parser.add_argument("--base-url", default="https://api.telegram.org/bot")
    parser.add_argument("--exit-after", type=int, default=None, metavar="N",
                        help="stop after N updates were handled (for tests and demos)")
    parser.add_argument("--crash-once", action="store_true",
                        help="fail each booking's first attempt after its ORM write")
    return parser.parse_args(argv)


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    host = urllib.parse.urlsplit(args.base_url).hostname or ""
    token = os.environ.get("TELEGRAM_BOT_TOKEN") or (
        LOCAL_TOKEN if host in ("127.0.0.1", "localhost", "::1") else None)
    if not token:
        print("set TELEGRAM_BOT_TOKEN, or pass --base-url http://127.0.0.1:8081/bot to use "
              "`python -m ptb_fence.testing serve`", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("apscheduler").setLevel(logging.WARNING)
    base = f"{args.base_url.rstrip('/')}{token}/"

    # -- Django, configured here instead of a settings module --------------------------------
    settings.configure(
        DATABASES={"default": database_settings(args)},
        # CONN_MAX_AGE 0: close_old_connections() below closes each thread's connection
        # when its handler is done
        USE_TZ=True,
    )
    django.setup()
    from django.db import close_old_connections, connection, models

    class Booking(models.Model):  # type: ignore[misc]  # Django ships no type hints
        slot = models.CharField(max_length=5, unique=True)  # one booking per slot
        chat_id = models.BigIntegerField()
        update_id = models.BigIntegerField()
        attempt = models.IntegerField()  # the attempt that wrote it, for audits

        class Meta:
            app_label = "bookings"
            db_table = args.bookings_table

    if args.bookings_table not in connection.introspection.table_names():
        with connection.schema_editor() as editor:  # a project would use a migration
            editor.create_model(Booking)
    connection.close()  # the main thread only polls from here on

    store: Any = (PostgresUpdateStore(args.dsn, args.table) if args.dsn
                  else SQLiteUpdateStore(args.db, table=args.table))
    stop = threading.Event()
    handled = [0]
    lock = threading.Lock()

    replies: List[Any] = []  # outbox calls whose sending --exit-after waits for

    def one_done() -> None:
        with lock:
            handled[0] += 1
            if args.exit_after is not None and handled[0] >= args.exit_after:
                stop.set()

    def when_sent(reply: Any) -> None:
        # counted once sent (or failed): a stop hands unsent calls to the next start
        with lock:
            replies.append(reply)

    def count_sent() -> None:
        with lock:
            waiting = list(replies)
        for reply in waiting:
            entry = intake.outbox_call(reply)  # None while a held call's id is not known
            if entry is not None and entry.state in ("sent", "failed"):
                with lock:
                    replies.remove(reply)
                one_done()

    # -- the handler (worker threads) -------------------------------------------------------
    def handle_attempt(update: Dict[str, Any], attempt: Attempt) -> None:
        """One attempt at one update; raise to fail it (it is retried), return to complete."""
        try:
            message = update.get("message") or {}
            command = COMMAND.fullmatch(message.get("text") or "")
            if command is None:
                return
            chat_id, slot = message["chat"]["id"], command.group(1) or ""
            if not SLOT.fullmatch(slot):
                # no transaction here: the attempt holds the call, and the commit that
                # completes the update (after this returns) writes it
                when_sent(attempt.outbox.reply_text("Usage: /book HH:MM"))
                return
            # An atomic() block on this thread's connection: ptb_fence checks ownership and
            # settles the update in it; Django commits it all when the block ends. Do not call
            # it inside another atomic() (it would commit later): that is refused.
            with attempt.transaction(connection=connection, complete=True):
                _, booked = Booking.objects.get_or_create(
                    slot=slot,
                    defaults={"chat_id": chat_id, "update_id": attempt.update_id,
                              "attempt": attempt.attempt},
                )
                if args.crash_once and attempt.attempt == 1:
                    raise RuntimeError("crashing after the ORM write (--crash-once)")
                # inserted into the outbox through Django's transaction: sent iff this
                # commit lands (the crash above rolls it back with the booking)
                text = f"Booked {slot} for you." if booked else f"Sorry, {slot} is already taken."
                reply = attempt.outbox.reply_text(text)
            LOGGER.info("update %s: %s %s", attempt.update_id, "booked" if booked else "taken",
                        slot)
            when_sent(reply)
        finally:
            close_old_connections()  # this worker thread's Django connection

    def handle_exhaustion(exhaustion: Exhaustion) -> None:
        LOGGER.error("update %s gave up: %s", exhaustion.update_id, exhaustion.error)
        one_done()

    # bot_token: the intake sends the outbox's calls itself
    intake = UpdateIntake(store, handle_attempt=handle_attempt,
                          handle_exhaustion=handle_exhaustion,
                          bot_token=token, bot_base_url=args.base_url)
    intake.start()
    LOGGER.info("polling")
    offset = 0
    try:
        while not stop.is_set():
            for update in call(base, "getUpdates", offset=offset, timeout=1):
                intake.accept(json.dumps(update))  # committed before the next offset
                offset = update["update_id"] + 1
            count_sent()
        call(base, "getUpdates", offset=offset, timeout=0)  # confirm the last ones
    except KeyboardInterrupt:
        pass
    finally:
        intake.close()
        store.close()
    LOGGER.info("stopped after %d update(s)", handled[0])
    return 0


if __name__ == "__main__":
    sys.exit(main())
