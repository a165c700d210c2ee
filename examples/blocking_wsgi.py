#!/usr/bin/env python
"""A blocking booking bot without asyncio: a WSGI webhook, worker threads and SQLite.

For bots that are not built on python-telegram-bot's asyncio (older threaded bots, other
Telegram libraries, a Flask/Django app): :class:`ptb_fence.UpdateIntake` gives them the same
guarantees. Telegram POSTs each update to :func:`ptb_fence.webhook_app`, which answers 200 only
after the update is committed to the SQLite file (a wrong secret token gets 403 before the body is
read; a store failure gets 503, so Telegram delivers it again). The intake then claims the
update under a lease and calls ``handle_attempt(update, attempt)`` on a worker thread; the handler
writes the booking in ``with attempt.transaction(complete=True) as conn:``, which checks inside
the transaction that this attempt still owns the update and settles it in the same commit. The
reply is queued with ``attempt.outbox.reply_text`` inside that transaction: it commits with the
booking and the intake sends it after the commit (at least once; ``UpdateIntake(bot_token=...)``),
or it rolls back with it (a failed or stale attempt never replies). The "typing…" action and
``setWebhook`` go out directly over plain HTTP (``urllib``) to the Bot API.

The web server is the standard library's ``wsgiref`` made multi-threaded with
``socketserver.ThreadingMixIn``; any WSGI server works (gunicorn/uWSGI: serve
``webhook_app(intake, ...)`` and call ``intake.start()`` once per worker process; every process
may share the SQLite file on one machine).

Run it (Python 3.10+; install from a clone of the repository with ``python -m pip install -e .``)::

    export TELEGRAM_BOT_TOKEN=123456:ABC...
    export TELEGRAM_WEBHOOK_SECRET=$(python -c 'import secrets; print(secrets.token_urlsafe(32))')
    python examples/blocking_wsgi.py --port 8080 --set-webhook https://bot.example.com/telegram

(with a reverse proxy terminating TLS for that URL and forwarding to port 8080). Stop it with
Ctrl+C or SIGTERM: the server stops accepting, running handlers finish, the store is closed.

Offline, against the fake Bot API of ``ptb_fence.testing`` (no token and no secret needed: a
local ``--base-url`` uses the fake's token and a generated secret). In one terminal::

    python -m ptb_fence.testing serve

and in another (``--set-webhook`` makes the fake server post what you type there to us)::

    python examples/blocking_wsgi.py --db offline.sqlite3 --base-url http://127.0.0.1:8081/bot \\
        --listen 127.0.0.1 --port 8080 --set-webhook http://127.0.0.1:8080/

then type ``/book 10:00`` in the first terminal: it shows the bot's reply.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import secrets
import signal
import socketserver
import sqlite3
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Dict, List, Optional
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from ptb_fence import (
    Attempt,
    Exhaustion,
    OwnershipLost,
    SQLiteUpdateStore,
    UpdateIntake,
    default_retry,
    webhook_app,
)

LOGGER = logging.getLogger("booking_bot")

LOCAL_TOKEN = "123456:TEST-TOKEN"  # what ``python -m ptb_fence.testing serve`` accepts


def is_local(base_url: str) -> bool:
    """Whether ``base_url`` points at a Bot API on this machine (the fake one, offline)."""
    host = urllib.parse.urlsplit(base_url).hostname or ""
    return host in ("127.0.0.1", "localhost", "::1")


COMMAND = re.compile(r"/book(?:@\w+)?(?:\s+(\S+))?\s*")
SLOT = re.compile(r"(?:[01][0-9]|2[0-3]):[0-5][0-9]")

SCHEMA = (
    """
CREATE TABLE IF NOT EXISTS bookings (
    slot      TEXT PRIMARY KEY,   -- one booking per slot
    chat_id   INTEGER NOT NULL,
    update_id INTEGER NOT NULL,   -- not UNIQUE: Telegram may reuse an update_id after a week
    claim_id  TEXT NOT NULL,      -- the attempt that wrote it, for audits
    booked_at INTEGER NOT NULL    -- epoch milliseconds
)""",
    """
CREATE TABLE IF NOT EXISTS booking_exhaustions (
    update_id    INTEGER NOT NULL,
    attempt      INTEGER NOT NULL,
    claim_id     TEXT NOT NULL,
    exhausted_at INTEGER NOT NULL,
    error        TEXT,
    body         TEXT NOT NULL,
    PRIMARY KEY (update_id, attempt, claim_id)  -- delivered at least once: stored once
)""",
)


# -- a minimal Bot API client ------------------------------------------------------------------
class BotApiError(Exception):
    """The Bot API refused a call (``{"ok": false, ...}``) or could not be reached."""

    def __init__(self, method: str, error_code: int, description: str,
                 retry_after: Optional[float] = None) -> None:
        super().__init__(f"{method}: {error_code} {description}")
        self.error_code = error_code
        self.description = description
        # ptb_fence.default_retry reads ``retry_after`` (seconds) and waits at least that long
        self.retry_after = retry_after


class BotApi:
    """Calls Bot API methods with JSON over ``urllib`` (blocking, thread-safe)."""

    def __init__(self, base_url: str, token: str, timeout: float = 10.0) -> None:
        self._url = f"{base_url.rstrip('/')}{token}/"
        self._timeout = timeout

    def call(self, method: str, **params: Any) -> Any:
        request = urllib.request.Request(
            self._url + method,
            data=json.dumps(params).encode("utf-8"),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        try:
            with urllib.request.urlopen(request, timeout=self._timeout) as response:
                payload = json.loads(response.read())
        except urllib.error.HTTPError as exc:  # 4xx/5xx still carry the Bot API's JSON
            try:
                payload = json.loads(exc.read())
            except ValueError:
                raise BotApiError(method, exc.code, exc.reason) from None
        except (urllib.error.URLError, OSError) as exc:
            raise BotApiError(method, 0, f"network error: {exc}") from exc
        if not payload.get("ok"):
            retry_after = (payload.get("parameters") or {}).get("retry_after")
            raise BotApiError(method, int(payload.get("error_code", 0)),
                              str(payload.get("description", "")), retry_after)
        return payload.get("result")


def retry_policy(error: BaseException, attempt: int) -> Optional[float]:
    """Seconds until the next attempt, or None to give up (the update becomes an exhaustion).

    400 and 403 answers (bad request, chat not found, bot blocked by the user) come back the
    same however often we try; everything else backs off as ptb_fence's default does
    (5 s, 20 s, 80 s, ... and at least Telegram's ``retry_after``).
    """
    if isinstance(error, BotApiError) and error.error_code in (400, 403):
        return None
    return default_retry(error, attempt)


# -- the web server ----------------------------------------------------------------------------
class ThreadingWSGIServer(socketserver.ThreadingMixIn, WSGIServer):
    """wsgiref's server, one thread per request (Telegram opens up to 40 connections)."""

    daemon_threads = True  # a hanging request cannot block the process from exiting


class QuietHandler(WSGIRequestHandler):
    """Request lines go to our logger at DEBUG instead of stderr."""

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        LOGGER.debug("%s - %s", self.address_string(), format % args)


class ExitAfter:
    """``--exit-after N``: set ``stop`` after N updates were handled (thread-safe); an update
    with a reply counts once its reply was sent, since a stop hands unsent outbox calls to the
    next start."""

    def __init__(self, limit: Optional[int], stop: threading.Event) -> None:
        self._limit = limit
        self._stop = stop
        self._count = 0
        self._lock = threading.Lock()
        self._replies: List[Any] = []

    def when_sent(self, reply: Any) -> None:
        """Count one update once its outbox call ``reply`` was sent (or failed)."""
        if self._limit is not None:
            with self._lock:
                self._replies.append(reply)

    def count_sent(self, intake: UpdateIntake) -> None:
        """Count the updates whose replies went out since the last look (main thread)."""
        with self._lock:
            waiting = list(self._replies)
        for reply in waiting:
            entry = intake.outbox_call(reply)  # None while a held call's id is not known
            if entry is not None and entry.state in ("sent", "failed"):
                with self._lock:
                    self._replies.remove(reply)
                self.one_done()

    def one_done(self) -> None:
        with self._lock:
            self._count += 1
            if self._limit is not None and self._count == self._limit:
                LOGGER.info("handled %d update(s); --exit-after reached, stopping", self._count)
                self._stop.set()


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--db", default="bookings.sqlite3", help="SQLite file (created if missing)")
    parser.add_argument(
        "--base-url",
        default="https://api.telegram.org/bot",
        help="Bot API base URL (the token is appended); point it at a fake server for tests",
    )
    parser.add_argument("--listen", default="0.0.0.0", help="address to listen on")
    parser.add_argument("--port", type=int, default=8080, help="port to listen on")
    parser.add_argument("--set-webhook", metavar="URL",
                        help="call setWebhook with this public URL and the secret at start")
    parser.add_argument("--lease-seconds", type=float, default=120.0, help="lease per attempt")
    parser.add_argument("--sweep-every", type=float, default=30.0, help="sweep interval (s)")
    parser.add_argument("--max-attempts", type=int, default=5, help="attempts per update")
    parser.add_argument("--workers", type=int, default=8, help="handler threads")
    parser.add_argument(
        "--exit-after", type=int, default=None, metavar="N",
        help="stop after N updates were handled by this process (for tests and demos)",
    )
    parser.add_argument("--verbose", action="store_true", help="log at DEBUG level")
    return parser.parse_args(argv)


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    local = is_local(args.base_url)
    token = os.environ.get("TELEGRAM_BOT_TOKEN") or (LOCAL_TOKEN if local else None)
    # offline, the fake Bot API learns the secret from our setWebhook call
    secret = os.environ.get("TELEGRAM_WEBHOOK_SECRET") or (
        secrets.token_urlsafe(32) if local else None
    )
    missing = [
        what
        for what, value in (
            ("TELEGRAM_BOT_TOKEN (your bot's token, from @BotFather)", token),
            ("TELEGRAM_WEBHOOK_SECRET (1-256 characters of A-Z a-z 0-9 _ -)", secret),
        )
        if not value
    ]
    if missing:
        print("set " + " and ".join(missing) + "; or, offline, pass --base-url "
              "http://127.0.0.1:8081/bot to use `python -m ptb_fence.testing serve`",
              file=sys.stderr)
        return 2
    assert token is not None and secret is not None
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format=f"%(asctime)s [{os.getpid()}] %(levelname)s %(threadName)s %(name)s: %(message)s",
    )
    logging.getLogger("apscheduler").setLevel(logging.WARNING)

    api = BotApi(args.base_url, token)
    store = SQLiteUpdateStore(args.db)
    with store.transaction() as conn:  # our tables live in the store's file
        for statement in SCHEMA:
            conn.execute(statement)

    stop = threading.Event()
    exit_after = ExitAfter(args.exit_after, stop)

    # -- the handlers (worker threads) -------------------------------------------------------
    def handle_attempt(update: Dict[str, Any], attempt: Attempt) -> None:
        """One attempt at one update. Raise to fail it (it is retried per retry_policy);
        return to complete it. It may run more than once for one update."""
        message = update.get("message")
        if not isinstance(message, dict) or not isinstance(message.get("text"), str):
            return  # not for us: returning settles the update as completed
        command = COMMAND.fullmatch(message["text"])
        if command is None:
            return
        chat_id = message["chat"]["id"]
        slot = command.group(1) or ""
        if not SLOT.fullmatch(slot):
            # no transaction here: the attempt holds the call, and the commit that completes
            # the update (after this returns) writes it
            exit_after.when_sent(attempt.outbox.reply_text("Usage: /book HH:MM, e.g. /book 10:30"))
            return

        # A user who blocked the bot answers 403 here: no retries (retry_policy), the update
        # becomes an exhaustion (handle_exhaustion below) and no slot is booked.
        api.call("sendChatAction", chat_id=chat_id, action="typing")

        try:
            # BEGIN IMMEDIATE on this thread's connection to the store's file; ptb_fence checks
            # that this attempt still owns the update, we write, and complete=True settles the
            # update in the same COMMIT. Do not commit or roll back `conn` yourself; do no
            # network calls in here (the SQLite write lock is held).
            with attempt.transaction(complete=True) as conn:
                cursor = conn.execute(
                    "INSERT INTO bookings (slot, chat_id, update_id, claim_id, booked_at) "
                    "VALUES (?, ?, ?, ?, ?) ON CONFLICT (slot) DO NOTHING",
                    (slot, chat_id, attempt.update_id, attempt.claim_id, int(time.time() * 1000)),
                )
                booked = cursor.rowcount == 1
                # inserted into the outbox by this same transaction: sent after the COMMIT iff
                # it lands (no network call in here: the intake sends it later)
                text = f"Booked {slot} for you." if booked else f"Sorry, {slot} is already taken."
                reply = attempt.outbox.reply_text(text)
        except OwnershipLost:
            # Our lease lapsed (this process stalled) and another attempt owns the update;
            # everything above was rolled back. Raising ends this attempt quietly.
            LOGGER.warning("update %s: attempt %s lost its lease; not booking",
                           attempt.update_id, attempt.attempt)
            raise

        LOGGER.info("update %s: %s %s", attempt.update_id, "booked" if booked else "taken", slot)
        exit_after.when_sent(reply)

    def handle_exhaustion(exhaustion: Exhaustion) -> None:
        """Called at least once per exhaustion (also after a restart); acknowledged when it
        returns. Store it once, keyed by its full identity."""
        with store.transaction() as conn:
            cursor = conn.execute(
                "INSERT INTO booking_exhaustions "
                "(update_id, attempt, claim_id, exhausted_at, error, body) "
                "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (update_id, attempt, claim_id) DO NOTHING",
                (exhaustion.update_id, exhaustion.attempt, exhaustion.claim_id,
                 exhaustion.exhausted_at, exhaustion.error, exhaustion.body),
            )
            first_time = cursor.rowcount == 1
        if first_time:
            LOGGER.error("update %s gave up after attempt %s: %s", exhaustion.update_id,
                         exhaustion.attempt, exhaustion.error)
            exit_after.one_done()

    intake = UpdateIntake(
        store,
        handle_attempt=handle_attempt,
        handle_exhaustion=handle_exhaustion,
        retry=retry_policy,
        max_attempts=args.max_attempts,
        lease_seconds=args.lease_seconds,
        sweep_every_seconds=args.sweep_every,
        max_concurrent=args.workers,
        # the intake sends the outbox's calls itself
        bot_token=token,
        bot_base_url=args.base_url,
    )
    app = webhook_app(intake, secret_token=secret)
    server = make_server(args.listen, args.port, app,
                         server_class=ThreadingWSGIServer, handler_class=QuietHandler)

    # SIGINT/SIGTERM are only noted; the main thread sees them within 0.5 s and does the orderly
    # shutdown below. (Not stop.set(): a handler runs on the main thread, maybe while that
    # thread holds the lock inside stop.wait(), and would wait for it forever.)
    signalled: List[int] = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda signum, frame: signalled.append(signum))

    intake.start()  # lease keeper, sweep; handles updates recorded before a crash
    serving = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2},
                               name="wsgi-server", daemon=True)
    serving.start()
    LOGGER.info("webhook listening on %s:%s (records in %s)", args.listen,
                server.server_address[1], args.db)
    if args.set_webhook:
        api.call("setWebhook", url=args.set_webhook, secret_token=secret,
                 allowed_updates=["message"])
        LOGGER.info("webhook set to %s", args.set_webhook)
    try:
        while not signalled and not stop.wait(0.5):
            exit_after.count_sent(intake)
    finally:
        LOGGER.info("stopping")
        server.shutdown()        # no new requests (returns once serve_forever has stopped)
        server.server_close()
        intake.close()           # no new attempts; waits for running handlers
        store.close()
    LOGGER.info("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
