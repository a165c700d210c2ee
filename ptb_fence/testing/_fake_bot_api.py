"""A fake Telegram Bot API server for offline tests (standard library only)."""

from __future__ import annotations

import copy
import email.parser
import email.policy
import http.server
import json
import logging
import math
import re
import socket
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from ptb_fence.testing._updates import (
    make_bot_user,
    make_callback_query_update,
    make_chat,
    make_message,
    make_message_update,
)

__all__ = ["ApiCall", "FakeBotApi", "RateLimits", "post_to_webhook"]

_LOGGER = logging.getLogger(__name__)

_TOKEN_RE = re.compile(r"[0-9]+:[A-Za-z0-9_-]+")
_LONG_POLL_MAX_TIMEOUT = 50.0  # the Bot API clamps getUpdates' timeout to [0, 50]
_POLL_SLICE = 0.05  # wait_until re-evaluates its predicate at least this often


class _RunIds:
    """Where a :class:`FakeBotApi` without ``first_update_id`` starts numbering updates: the
    milliseconds since the epoch counted within 1000000000..1999999999 (see :meth:`first`),
    and above every id a fake of this process has assigned.

    A bot's store outlives the fake server (a script run twice, a test that starts a second
    fake against the same file): ids that restarted at a fixed number would be taken for
    redeliveries of the previous run's updates and dropped. The clock keeps the runs of
    different processes apart (unless one run used more ids than milliseconds passed before
    the next). The floor keeps apart the fakes of one process however quickly they follow each
    other. The range is Telegram's: its update ids stay below 2000000000 (32 bits), and a
    user's 32-bit ``update_id`` column (PostgreSQL ``INTEGER``) must take the fake's too. The
    count wraps every 11.6 days. A run that lands on the ids a kept store recorded that many
    days earlier is as unlikely as a few thousand ids out of a thousand million.
    """

    __slots__ = ()

    _lock = threading.Lock()
    _floor = 0  # above every update id a FakeBotApi of this process assigned itself

    @classmethod
    def first(cls) -> int:
        """The first id of a new fake: ``10**9 + (milliseconds since the epoch) % 10**9``,
        raised to the floor."""
        with cls._lock:
            return max(10**9 + int(time.time() * 1000) % 10**9, cls._floor)

    @classmethod
    def used(cls, update_id: int) -> None:
        with cls._lock:
            if update_id >= cls._floor:
                cls._floor = update_id + 1

# Parameters that are strings in the Bot API. PTB sends form fields JSON-encoded except strings,
# which it sends raw. These are kept as they are even when they look like JSON ("123").
_STRING_PARAMS = frozenset(
    {
        "text",
        "caption",
        "parse_mode",
        "url",
        "secret_token",
        "ip_address",
        "callback_query_id",
        "inline_message_id",
        "business_connection_id",
        "message_effect_id",
        "question",
        "title",
        "description",
        "short_description",
        "name",
        "emoji",
        "custom_title",
        "invite_link",
        "file_id",
        "data",
        "query",
        "payload",
        "currency",
        "provider_token",
        "start_parameter",
        "web_app_query_id",
        "pre_checkout_query_id",
        "shipping_query_id",
        "next_offset",
        "language_code",
    }
)

_NOT_MODIFIED = (
    "Bad Request: message is not modified: specified new message content and reply markup "
    "are exactly the same as a current content and reply markup of the message"
)
_REMEMBERED_CONTENTS = 1000
"""Messages per chat whose content the fake keeps (to refuse an edit that changes nothing)."""

_WEBHOOK_CONFLICT = (
    "Conflict: can't use getUpdates method while webhook is active; use deleteWebhook to delete "
    "the webhook first"
)
_POLL_CONFLICT = (
    "Conflict: terminated by other getUpdates request; make sure that only one bot instance is "
    "running"
)


@dataclass(frozen=True, slots=True)
class ApiCall:
    """One authorized request the fake server received, in arrival order.

    Attributes:
        method: The method name as it appeared in the URL (e.g. ``"getUpdates"``).
        params: The decoded parameters. Form fields are JSON-decoded except known string
            parameters (``text``, ``url``, ...). An uploaded file is a dict with the keys
            ``filename``, ``content_type`` and ``data`` (bytes).
    """

    method: str
    params: dict[str, Any]


@dataclass(slots=True)
class _Failure:
    count: int
    error_code: int
    description: str
    retry_after: int | None
    # "before" or "after" (the call's effect): drop the connection instead of answering
    cut: str | None = None
    migrate_to_chat_id: int | None = None


class _CutConnection(Exception):
    """The request is answered by dropping its connection (see :meth:`FakeBotApi.cut_next`)."""

    def __init__(self, *, after_effect: bool) -> None:
        super().__init__()
        self.after_effect = after_effect


class _ApiError(Exception):
    __slots__ = ("description", "error_code", "parameters")

    def __init__(
        self, error_code: int, description: str, parameters: dict[str, Any] | None = None
    ) -> None:
        super().__init__(description)
        self.error_code = error_code
        self.description = description
        self.parameters = parameters

    def body(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "ok": False,
            "error_code": self.error_code,
            "description": self.description,
        }
        if self.parameters:
            body["parameters"] = self.parameters
        return body


def _as_int(value: Any, default: int, name: str) -> int:
    if value is None or value == "":
        return default
    if isinstance(value, bool):
        return int(value)
    try:
        return int(value)
    except (TypeError, ValueError):
        try:
            return int(float(value))
        except (TypeError, ValueError):
            raise _ApiError(400, f"Bad Request: invalid {name} specified") from None


def _as_float(value: Any, default: float, name: str) -> float:
    if value is None or value == "":
        return default
    try:
        return float(value)
    except (TypeError, ValueError):
        raise _ApiError(400, f"Bad Request: invalid {name} specified") from None


def _clamp(value: float, low: float, high: float) -> float:
    return max(low, min(high, value))


def _decode_field(name: str, raw: str) -> Any:
    if name in _STRING_PARAMS:
        return raw
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def _inline_markup(params: dict[str, Any]) -> Any:
    """The inline keyboard a call gives its message (:obj:`None`: none, or another kind)."""
    markup = params.get("reply_markup")
    return markup if isinstance(markup, dict) and "inline_keyboard" in markup else None


def _chat_key(chat_id: Any) -> int | str:
    if isinstance(chat_id, bool):
        raise _ApiError(400, "Bad Request: chat not found")
    if isinstance(chat_id, int):
        return chat_id
    if isinstance(chat_id, str):
        try:
            return int(chat_id)
        except ValueError:
            if chat_id.startswith("@") and len(chat_id) > 1:
                return chat_id
    raise _ApiError(400, "Bad Request: chat not found")


# Methods that post a message to a chat count against the rate limits (see RateLimits).
_LIMITED_METHODS = frozenset({"copymessage", "copymessages", "forwardmessage", "forwardmessages"})
_SWEEP_EVERY = 1024
"""Admissions between two sweeps of idle chats' windows and ended chat holds."""


def _is_limited(key: str) -> bool:
    """Whether a method (lower case) posts a message to a chat, so rate limits count it."""
    if key.startswith("send"):
        return key != "sendchataction"
    return key in _LIMITED_METHODS


def _limited_chat(chat_id: Any) -> int | str | None:
    """The chat a limited call counts against (:obj:`None`: no valid ``chat_id``)."""
    try:
        chat = _chat_key(chat_id)
    except _ApiError:
        return None
    return None if chat == 0 else chat


@dataclass(frozen=True, slots=True, kw_only=True)
class RateLimits:
    """Telegram's flood limits, enforced by :class:`FakeBotApi` when given as ``rate_limits=``.

    A limited method posts a message to a chat. These are every ``send*`` method except
    ``sendChatAction``, and ``copyMessage``, ``copyMessages``, ``forwardMessage`` and
    ``forwardMessages``. No other method is limited (``getMe``, ``getUpdates``, ``edit*``,
    ``delete*``, ``answerCallbackQuery``, ``setWebhook`` and the rest). A request counts once,
    however many messages it posts.

    A limited request counts against its chat's limit and against one bot-wide limit. A chat
    with an id above 0 is private. A chat with an id below 0 or an ``@username`` is a group.
    A request with ``"allow_paid_broadcast": true`` counts against the paid broadcast limit
    instead of the global limit. A request without a valid ``chat_id`` counts bot-wide only.

    Each limit is a sliding window. It counts the requests the fake admitted within its last
    window, at the moment they arrived. The limits are checked on arrival, before any
    :meth:`FakeBotApi.delay` or :meth:`FakeBotApi.hold`. A request that then fails takes its
    count back (a 400, a fault of :meth:`FakeBotApi.fail_next`, a cut before its effect). A
    request answered 429 does not count. So no window holds more than its limit of requests
    that took effect.

    A request over a limit is answered 429 ``Too Many Requests: retry after N`` with
    ``parameters.retry_after`` N, as Telegram does. It has no effect. The limit's scope is
    then held for N seconds: the bot for the global limit, the paid broadcasts for the paid
    limit, or the chat. Every limited request of a held scope is answered 429 too, with the
    seconds left of the hold. A hold of the bot refuses paid broadcasts as well. Requests
    inside a hold do not extend it.

    Attributes:
        global_limit: The requests the bot may send across all chats per ``global_window``.
        global_window: The seconds of the global limit's window.
        private_chat_limit: The requests per ``private_chat_window`` to one private chat.
        private_chat_window: The seconds of a private chat's window.
        group_limit: The requests per ``group_window`` to one group.
        group_window: The seconds of a group's window.
        paid_broadcast_limit: The paid broadcast requests per ``paid_broadcast_window``
            across all chats.
        paid_broadcast_window: The seconds of the paid broadcast limit's window.
        retry_after: The ``retry_after`` a request over a limit is answered with. By default
            it is the seconds until the window has room again, rounded up and at least 1.
        hold_grace_seconds: The seconds after a hold began during which a request is not
            counted in :attr:`FakeBotApi.requests_in_hold`. Such requests were often already
            in flight from other processes. They are answered 429 all the same.

    Raises:
        ValueError: If a limit is below 1, a window is not above 0, ``retry_after`` is below 1
            or ``hold_grace_seconds`` is below 0.
        TypeError: If a limit or ``retry_after`` is not an int.
    """

    global_limit: int = 30
    global_window: float = 1.0
    private_chat_limit: int = 1
    private_chat_window: float = 1.0
    group_limit: int = 20
    group_window: float = 60.0
    paid_broadcast_limit: int = 1000
    paid_broadcast_window: float = 1.0
    retry_after: int | None = None
    hold_grace_seconds: float = 0.0

    def __post_init__(self) -> None:
        counts: dict[str, int | None] = {
            "global_limit": self.global_limit,
            "private_chat_limit": self.private_chat_limit,
            "group_limit": self.group_limit,
            "paid_broadcast_limit": self.paid_broadcast_limit,
            "retry_after": self.retry_after,
        }
        for name, value in counts.items():
            if value is None and name == "retry_after":
                continue
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} must be an int, not {value!r}")
            if value < 1:
                raise ValueError(f"{name} must be >= 1, not {value!r}")
        for name, seconds in (
            ("global_window", self.global_window),
            ("private_chat_window", self.private_chat_window),
            ("group_window", self.group_window),
            ("paid_broadcast_window", self.paid_broadcast_window),
        ):
            if not seconds > 0:
                raise ValueError(f"{name} must be above 0 seconds, not {seconds!r}")
        if not self.hold_grace_seconds >= 0:
            raise ValueError(
                f"hold_grace_seconds must be >= 0, not {self.hold_grace_seconds!r}"
            )


class _Window:
    """A sliding window: the admission times of the requests it counts, oldest first."""

    __slots__ = ("limit", "seconds", "times")

    def __init__(self, limit: int, seconds: float) -> None:
        self.limit = limit
        self.seconds = seconds
        self.times: deque[float] = deque()

    def prune(self, now: float) -> None:
        """Drop the times that left the window by ``now``."""
        times = self.times
        horizon = now - self.seconds
        while times and times[0] <= horizon:
            times.popleft()

    def wait(self, now: float) -> float:
        """Seconds until the window has room for one more request (0: it has room now)."""
        self.prune(now)
        times = self.times
        if len(times) < self.limit:
            return 0.0
        return times[len(times) - self.limit] + self.seconds - now


@dataclass(slots=True)
class _Hold:
    """A scope answered 429 from ``started`` until ``until`` (monotonic seconds)."""

    started: float
    until: float


@dataclass(frozen=True, slots=True)
class _Ticket:
    """A limited request admitted at ``time``, counted in ``windows`` until it settles."""

    time: float
    windows: tuple[_Window, ...]
    chat: int | str | None


def _too_many_requests(retry_after: int) -> _ApiError:
    return _ApiError(
        429, f"Too Many Requests: retry after {retry_after}", {"retry_after": retry_after}
    )


class _RateLimiter:
    """The rate limits, holds and send times of one :class:`FakeBotApi` (thread-safe).

    Without limits it only keeps the send times and the holds :meth:`flood` starts.
    """

    __slots__ = (
        "_admissions",
        "_bot_hold",
        "_chat_holds",
        "_chats",
        "_flood",
        "_global",
        "_in_hold",
        "_limited",
        "_limits",
        "_lock",
        "_paid",
        "_paid_hold",
        "_sent",
    )

    def __init__(self, limits: RateLimits | None) -> None:
        self._limits = limits
        self._lock = threading.Lock()
        self._global = _Window(limits.global_limit, limits.global_window) if limits else None
        self._paid = (
            _Window(limits.paid_broadcast_limit, limits.paid_broadcast_window) if limits else None
        )
        self._chats: dict[int | str, _Window] = {}
        self._bot_hold: _Hold | None = None
        self._paid_hold: _Hold | None = None
        self._chat_holds: dict[int | str, _Hold] = {}
        self._flood: int | None = None
        self._limited = 0
        self._in_hold = 0
        self._admissions = 0
        self._sent: list[tuple[float, int | str | None]] = []

    @property
    def limits(self) -> RateLimits | None:
        return self._limits

    def flood(self, retry_after: int) -> None:
        with self._lock:
            self._flood = retry_after

    def counts(self) -> tuple[int, int]:
        """The 429 answers given and the requests that arrived inside a hold."""
        with self._lock:
            return self._limited, self._in_hold

    def sent_times(self, chat: int | str | None) -> list[float]:
        with self._lock:
            sent = list(self._sent)
        return sorted(at for at, to in sent if chat is None or to == chat)

    def admit(self, params: Mapping[str, Any]) -> _Ticket:
        """Count a limited request, or raise the 429 that refuses it."""
        paid = params.get("allow_paid_broadcast") is True
        chat = _limited_chat(params.get("chat_id"))
        with self._lock:
            now = time.monotonic()
            if self._flood is not None:
                retry_after, self._flood = self._flood, None
                self._bot_hold = _Hold(now, now + retry_after)
                raise self._refuse(retry_after)
            holds = (
                self._bot_hold,
                self._paid_hold if paid else None,
                self._chat_holds.get(chat) if chat is not None else None,
            )
            for hold in holds:
                if hold is not None and now < hold.until:
                    grace = self._limits.hold_grace_seconds if self._limits else 0.0
                    if now >= hold.started + grace:
                        self._in_hold += 1
                    raise self._refuse(max(1, math.ceil(hold.until - now)))
            if self._limits is None:
                return _Ticket(now, (), chat)
            return self._count(now, paid, chat, self._limits)

    def _count(
        self, now: float, paid: bool, chat: int | str | None, limits: RateLimits
    ) -> _Ticket:
        # Caller holds self._lock.
        bot_wide = self._paid if paid else self._global
        assert bot_wide is not None  # made with the limits
        windows = [bot_wide]
        wait = bot_wide.wait(now)
        if wait > 0:
            retry_after = limits.retry_after or max(1, math.ceil(wait))
            if paid:
                self._paid_hold = _Hold(now, now + retry_after)
            else:
                self._bot_hold = _Hold(now, now + retry_after)
            raise self._refuse(retry_after)
        if chat is not None:
            window = self._chats.get(chat)
            if window is None:
                private = isinstance(chat, int) and chat > 0
                window = self._chats[chat] = (
                    _Window(limits.private_chat_limit, limits.private_chat_window)
                    if private
                    else _Window(limits.group_limit, limits.group_window)
                )
            wait = window.wait(now)
            if wait > 0:
                retry_after = limits.retry_after or max(1, math.ceil(wait))
                self._chat_holds[chat] = _Hold(now, now + retry_after)
                raise self._refuse(retry_after)
            windows.append(window)
        for window in windows:
            window.times.append(now)
        self._admissions += 1
        if self._admissions % _SWEEP_EVERY == 0:
            self._sweep(now)
        return _Ticket(now, tuple(windows), chat)

    def _refuse(self, retry_after: int) -> _ApiError:
        # Caller holds self._lock.
        self._limited += 1
        return _too_many_requests(retry_after)

    def _sweep(self, now: float) -> None:
        # Caller holds self._lock. Forget the chats whose windows emptied and ended holds.
        for window in self._chats.values():
            window.prune(now)
        for chat in [chat for chat, window in self._chats.items() if not window.times]:
            del self._chats[chat]
        for chat in [chat for chat, hold in self._chat_holds.items() if hold.until <= now]:
            del self._chat_holds[chat]

    def settle(self, ticket: _Ticket, took_effect: bool) -> None:
        """Record an admitted request's send time, or take its count back if it failed."""
        with self._lock:
            if took_effect:
                self._sent.append((ticket.time, ticket.chat))
                return
            for window in ticket.windows:
                try:
                    window.times.remove(ticket.time)
                except ValueError:  # already out of the window
                    pass


class _Server(http.server.ThreadingHTTPServer):
    """A threading HTTP server that can cut its open keep-alive connections on stop."""

    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True
    # the default backlog of 5 resets connections when many bots and senders connect at once
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], api: FakeBotApi) -> None:
        self.api = api
        self.connections: set[socket.socket] = set()
        self.connections_lock = threading.Lock()
        super().__init__(address, _Handler)

    def get_request(self) -> tuple[socket.socket, Any]:
        sock, address = super().get_request()
        with self.connections_lock:
            self.connections.add(sock)
        return sock, address

    def shutdown_request(self, request: Any) -> None:
        with self.connections_lock:
            self.connections.discard(request)
        super().shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Stay quiet when a client goes away (a killed bot resets its connections)."""
        error = sys.exc_info()[1]
        if isinstance(error, (ConnectionError, TimeoutError)):
            return
        super().handle_error(request, client_address)

    def cut_connections(self) -> None:
        with self.connections_lock:
            connections = list(self.connections)
        for sock in connections:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class _Handler(http.server.BaseHTTPRequestHandler):
    """Routes ``/bot<token>/<method>`` to :class:`FakeBotApi`."""

    protocol_version = "HTTP/1.1"
    # headers and body go out in two writes: with Nagle's algorithm on, the body waits for
    # the client's delayed ACK (~40 ms per answer on Linux), which made every call slow
    disable_nagle_algorithm = True
    server: _Server

    def do_POST(self) -> None:  # noqa: N802 - name fixed by BaseHTTPRequestHandler
        self._serve()

    def do_GET(self) -> None:  # noqa: N802 - name fixed by BaseHTTPRequestHandler
        self._serve()

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - signature fixed
        _LOGGER.debug("%s - %s", self.address_string(), format % args)

    def _serve(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length > 0 else b""
        try:
            status, payload = self.server.api._handle(  # pylint: disable=protected-access
                self.path, self.headers.get("Content-Type", ""), body
            )
        except _CutConnection:
            # no answer at all: the client sees its connection closed after its request left
            self.close_connection = True
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            return
        data = json.dumps(payload).encode("utf-8")
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except OSError:  # the client went away (e.g. PTB cancelled a long poll on stop)
            self.close_connection = True


def _parse_params(query: str, content_type: str, body: bytes) -> dict[str, Any]:
    params: dict[str, Any] = {
        key: _decode_field(key, value)
        for key, value in urllib.parse.parse_qsl(query, keep_blank_values=True)
    }
    mime = content_type.split(";", 1)[0].strip().lower()
    if not body:
        return params
    if mime == "application/json":
        try:
            decoded = json.loads(body.decode("utf-8"))
        except ValueError:
            raise _ApiError(400, "Bad Request: can't parse JSON object") from None
        if not isinstance(decoded, dict):
            raise _ApiError(400, "Bad Request: JSON object expected")
        params.update(decoded)
    elif mime == "multipart/form-data":
        raw = b"Content-Type: " + content_type.encode("latin-1") + b"\r\n\r\n" + body
        message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(raw)
        for part in message.iter_parts():
            name = part.get_param("name", header="content-disposition")
            if not isinstance(name, str):
                continue
            data = part.get_payload(decode=True)
            data = data if isinstance(data, bytes) else b""
            filename = part.get_filename()
            if filename is not None or part.get_content_type() != "text/plain":
                params[name] = {
                    "filename": filename,
                    "content_type": part.get_content_type(),
                    "data": data,
                }
            else:
                params[name] = _decode_field(name, data.decode("utf-8", "replace"))
    else:  # application/x-www-form-urlencoded and anything else form-like
        text = body.decode("utf-8", "replace")
        for key, value in urllib.parse.parse_qsl(text, keep_blank_values=True):
            params[key] = _decode_field(key, value)
    return params


class FakeBotApi:
    """A fake Telegram Bot API server on localhost for offline tests of real PTB applications.

    It serves ``/bot<token>/<method>`` in a daemon thread and accepts JSON, form and multipart
    bodies. It answers ``{"ok": true, "result": ...}`` or an error with the matching HTTP
    status, so PTB raises the same exceptions as against Telegram. A wrong token answers 401.

    ``getUpdates`` behaves like Telegram's. An ``offset`` confirms, i.e. drops, every earlier
    update. ``limit`` and a long-polling ``timeout`` are honoured. A newer ``getUpdates`` ends a
    waiting one with 409 Conflict, and so does any ``getUpdates`` while a webhook is set.
    ``allowed_updates`` is recorded but does not filter.

    The common methods answer realistic results: ``getMe``, the webhook methods, ``send*``,
    ``editMessage*``, ``answerCallbackQuery`` and more. Any other method answers ``true``.
    Messages the bot sends with an inline keyboard are remembered per chat, and
    :meth:`press_button` presses a button of the last one. An edit that changes nothing answers
    400 ``message is not modified``, as Telegram does.

    What happened is readable: :attr:`calls`, :attr:`effective_calls`, :attr:`sent_messages`,
    :attr:`answered_callback_queries` and :meth:`calls_to`. Faults to test against are
    :meth:`fail_next` (an error answer), :meth:`cut_next` (a dropped connection),
    :meth:`delay` (a slow answer) and :meth:`hold` (no answer until :meth:`release`).

    With ``rate_limits`` it enforces Telegram's flood limits (see :class:`RateLimits`). A
    request over a limit is answered 429 with ``retry_after`` and has no effect. Then
    :attr:`rate_limited`, :attr:`requests_in_hold` and :meth:`sent_times` tell how a client
    paced itself. :meth:`flood` starts a bot-wide flood hold, with or without limits.

    Use it as a context manager, or call :meth:`start` and :meth:`stop`. It can be started again
    after :meth:`stop` on the same port with its state kept, to simulate an outage::

        with FakeBotApi() as fake:
            app = ApplicationBuilder().token(fake.token).base_url(fake.base_url).build()
            update_id = fake.inject_message(chat_id=42, text="hi")
            # Run the application here. Then wait until it confirmed the update:
            # fake.wait_confirmed([update_id], timeout=5)

    Args:
        token: The bot token the server accepts (``"<digits>:<letters, digits, _ or ->"``).
        host: The interface to listen on.
        port: The TCP port. ``0`` picks a free one.
        first_update_id: The id :meth:`inject` gives the first update that has none. By
            default it comes from the clock and lies above every id an earlier
            :class:`FakeBotApi` of this process assigned. So each run has ids of its own, and a
            bot whose store outlives the fake takes a new run's updates for new ones. With a
            fixed first id, a kept store takes a new run's messages for redeliveries.
        rate_limits: The flood limits to enforce. :obj:`None` (the default) enforces none.

    Attributes:
        on_confirm: Called in the server thread with the ids a ``getUpdates`` offset is about to
            confirm, *before* they are dropped (so a test can check at that moment that the bot
            already stored them). If it raises, the exception is recorded in
            :attr:`hook_errors`, nothing is confirmed and that ``getUpdates`` answers 500.

    Raises:
        ValueError: If the token does not look like a bot token, or ``first_update_id`` is
            below 1.
        TypeError: If ``first_update_id`` is neither an int nor :obj:`None`, or
            ``rate_limits`` is neither a :class:`RateLimits` nor :obj:`None`.
    """

    __slots__ = (
        "_callback_answers",
        "_calls",
        "_cond",
        "_confirmed",
        "_contents",
        "_delays",
        "_dropped",
        "_effective",
        "_epoch",
        "_failures",
        "_blocked",
        "_first_update_id",
        "_holds",
        "_hook_errors",
        "_host",
        "_keyboards",
        "_limiter",
        "_message_ids",
        "_next_update_id",
        "_pending",
        "_poll_generation",
        "_port",
        "_running",
        "_sent",
        "_server",
        "_thread",
        "_token",
        "_version",
        "_webhook",
        "on_confirm",
    )

    def __init__(
        self,
        token: str = "123456:TEST-TOKEN",
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        first_update_id: int | None = None,
        rate_limits: RateLimits | None = None,
    ) -> None:
        if not isinstance(token, str) or not _TOKEN_RE.fullmatch(token):
            raise ValueError(
                f"token {token!r} does not look like a bot token; use '<digits>:<secret>', "
                "e.g. '123456:TEST-TOKEN'"
            )
        if first_update_id is None:
            first_update_id = _RunIds.first()
        elif isinstance(first_update_id, bool) or not isinstance(first_update_id, int):
            raise TypeError(f"first_update_id must be an int or None, not {first_update_id!r}")
        elif first_update_id < 1:
            raise ValueError("first_update_id must be >= 1 (offset 0 means 'no offset')")
        if rate_limits is not None and not isinstance(rate_limits, RateLimits):
            raise TypeError(f"rate_limits must be a RateLimits or None, not {rate_limits!r}")
        self._token = token
        self._host = host
        self._port = port
        self._cond = threading.Condition(threading.Lock())
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._running = False
        self._epoch = 0
        self._version = 0
        self._poll_generation = 0
        self._first_update_id = first_update_id
        self._next_update_id = first_update_id
        self._pending: dict[int, dict[str, Any]] = {}
        self._confirmed: set[int] = set()
        self._dropped: set[int] = set()
        self._sent: list[dict[str, Any]] = []
        self._calls: list[ApiCall] = []
        self._effective: list[ApiCall] = []
        # per chat, what the bot's messages show (text or caption, entities, inline keyboard),
        # newest last: an edit that would change nothing is refused, as Telegram does
        self._contents: dict[int | str, dict[int, tuple[Any, Any, Any]]] = {}
        self._callback_answers: list[dict[str, Any]] = []
        self._webhook: dict[str, Any] = {"url": ""}
        self._failures: dict[str, deque[_Failure]] = {}
        self._blocked: set[str] = set()
        self._delays: dict[str, float] = {}
        self._holds: set[str] = set()
        self._message_ids: dict[int | str, int] = {}
        # per chat, the bot's messages that carry an inline keyboard now (message id -> text
        # and keyboard), the one sent or edited last at the end
        self._keyboards: dict[int | str, dict[int, dict[str, Any]]] = {}
        self._hook_errors: list[BaseException] = []
        self._limiter = _RateLimiter(rate_limits)
        self.on_confirm: Callable[[list[int]], None] | None = None

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> FakeBotApi:
        """Start serving in a daemon thread.

        Returns:
            This server.

        Raises:
            RuntimeError: If it is already running.
            OSError: If the port cannot be bound.
        """
        with self._cond:
            if self._running:
                raise RuntimeError("FakeBotApi is already running")
        server = _Server((self._host, self._port), self)
        self._port = server.server_address[1]
        with self._cond:
            self._server = server
            self._running = True
            self._epoch += 1
            self._bump()
        self._thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"FakeBotApi:{self._port}",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving: end long polls (they answer ``[]``), close connections, free the port.

        The recorded state is kept. :meth:`start` serves it again on the same port. Calling
        :meth:`stop` on a stopped server does nothing.
        """
        with self._cond:
            if not self._running:
                return
            self._running = False
            server = self._server
            self._server = None
            self._bump()
        if server is not None:
            server.shutdown()
            server.server_close()
            server.cut_connections()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> FakeBotApi:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        """Whether the server is serving."""
        with self._cond:
            return self._running

    # ------------------------------------------------------------------ addresses

    def _require_port(self) -> int:
        if not self._port:
            raise RuntimeError(
                "FakeBotApi has no port yet: call start() (or use 'with FakeBotApi() as fake:') "
                "before reading its URLs"
            )
        return self._port

    @property
    def token(self) -> str:
        """The bot token the server accepts."""
        return self._token

    @property
    def url(self) -> str:
        """The server root, e.g. ``"http://127.0.0.1:PORT"``."""
        return f"http://{self._host}:{self._require_port()}"

    @property
    def base_url(self) -> str:
        """:obj:`str`: The value for ``ApplicationBuilder().base_url(...)``, ``"<url>/bot"``."""
        return f"{self.url}/bot"

    @property
    def base_file_url(self) -> str:
        """:obj:`str`: The value for ``ApplicationBuilder().base_file_url(...)``,
        ``"<url>/file/bot"``."""
        return f"{self.url}/file/bot"

    @property
    def first_update_id(self) -> int:
        """:obj:`int`: The id the first update without one got (or gets). It is
        ``first_update_id``, or the run-unique default chosen when the server was made."""
        return self._first_update_id

    @property
    def bot_user(self) -> dict[str, Any]:
        """The ``User`` dict ``getMe`` returns (id from the token)."""
        return make_bot_user(self._bot_id(), get_me=True)

    def _bot_id(self) -> int:
        return int(self._token.split(":", 1)[0])

    # ------------------------------------------------------------------ injection

    def inject(self, update: Mapping[str, Any]) -> int:
        """Queue an update for ``getUpdates`` and wake waiting long polls.

        Args:
            update: The update dict. Without ``update_id`` the next id is assigned (ids increase
                from ``first_update_id``). With one, later assigned ids continue above it.

        Returns:
            The update's id.

        Raises:
            ValueError: If ``update_id`` is not a positive int or is already pending.
            TypeError: If the update is not JSON-serializable.
        """
        body = json.loads(json.dumps(dict(update)))
        with self._cond:
            return self._inject_locked(body)

    def _inject_locked(self, body: dict[str, Any]) -> int:
        # Caller holds self._cond.
        update_id = body.get("update_id")
        if update_id is None:
            update_id = self._take_update_id()
            body["update_id"] = update_id
        elif isinstance(update_id, bool) or not isinstance(update_id, int) or update_id < 1:
            raise ValueError(f"update_id must be a positive int, not {update_id!r}")
        if update_id in self._pending:
            raise ValueError(f"update {update_id} is already pending")
        self._next_update_id = max(self._next_update_id, update_id + 1)
        self._pending[update_id] = body
        self._bump()
        return update_id

    def _next_message_id(self, chat_key: int | str) -> int:
        # Caller holds self._cond. Message ids are per chat and shared by both directions.
        message_id = self._message_ids.get(chat_key, 0) + 1
        self._message_ids[chat_key] = message_id
        return message_id

    def inject_message(self, chat_id: int, text: str, *, user_id: int | None = None) -> int:
        """Queue a text message update (see :func:`~ptb_fence.testing.make_message_update`).

        Args:
            chat_id: The chat. Positive is private (sender = chat), negative is a group.
            text: The text. A leading ``/command`` gets a ``bot_command`` entity.
            user_id: The sender. Defaults to the chat's user (private) or a fixed group member.

        Returns:
            The update's id.
        """
        with self._cond:
            return self._inject_locked(self._new_message_update(chat_id, text, user_id))

    def new_message_update(
        self, chat_id: int, text: str, *, user_id: int | None = None
    ) -> dict[str, Any]:
        """Build the text message update :meth:`inject_message` would queue, without queueing
        it (e.g. to post it to a webhook with :func:`post_to_webhook`).

        It takes the next update id and the chat's next message id, as :meth:`inject_message`
        does, so the ids stay unique whichever way the updates reach the bot.

        Args:
            chat_id: The chat (as for :meth:`inject_message`).
            text: The text.
            user_id: The sender (as for :meth:`inject_message`).

        Returns:
            The update dict.
        """
        with self._cond:
            return self._new_message_update(chat_id, text, user_id)

    def _new_message_update(
        self, chat_id: int, text: str, user_id: int | None
    ) -> dict[str, Any]:
        # Caller holds self._cond.
        return make_message_update(
            self._take_update_id(), chat_id, text,
            message_id=self._next_message_id(chat_id), user_id=user_id,
        )

    def _take_update_id(self) -> int:
        # Caller holds self._cond. An id handed out is never handed out again, queued or not
        # (nor by a later fake of this process, where ids the caller chose do not count).
        update_id = self._next_update_id
        self._next_update_id += 1
        _RunIds.used(update_id)
        return update_id

    def inject_callback_query(
        self,
        chat_id: int,
        data: str,
        *,
        user_id: int | None = None,
        message_id: int | None = None,
    ) -> int:
        """Queue a callback query update for a button under a message of the bot.

        Args:
            chat_id: The chat of the message with the button.
            data: The button's ``callback_data``.
            user_id: Who pressed it (defaults as in :meth:`inject_message`).
            message_id: The message with the button. Defaults to the last message id in the chat.

        Returns:
            The update's id.
        """
        with self._cond:
            if message_id is None:
                message_id = self._message_ids.get(chat_id) or self._next_message_id(chat_id)
            update = make_callback_query_update(
                self._take_update_id(),
                chat_id,
                data,
                bot_id=self._bot_id(),
                message_id=message_id,
                user_id=user_id,
            )
            return self._inject_locked(update)

    def last_keyboard(self, chat_id: int | str) -> dict[str, Any] | None:
        """The inline keyboard the bot sent or edited last in a chat, if it still shows one.

        Args:
            chat_id: The chat.

        Returns:
            ``{"message_id": ..., "text": ..., "inline_keyboard": [[button, ...], ...]}``
            (copies, ``text`` being the message's text or caption, ``""`` if none), or
            :obj:`None` when no message of the bot in the chat has an inline keyboard.
        """
        with self._cond:
            shown = self._keyboards.get(_chat_key(chat_id))
            if not shown:
                return None
            message_id, info = next(reversed(shown.items()))
            return {"message_id": message_id, **copy.deepcopy(info)}

    def press_button(
        self, chat_id: int, button: str, *, user_id: int | None = None
    ) -> int:
        """Queue the press of a button of the last inline keyboard the bot showed in a chat.

        Args:
            chat_id: The chat (see :meth:`last_keyboard`).
            button: The button's ``callback_data``, or else its text.
            user_id: Who pressed it (defaults as in :meth:`inject_message`).

        Returns:
            The update's id.

        Raises:
            LookupError: If the chat shows no inline keyboard, or it has no such button with
                ``callback_data`` (the message lists the buttons it has).
        """
        with self._cond:
            return self._inject_locked(self._new_button_press(chat_id, button, user_id))

    def new_button_press_update(
        self, chat_id: int, button: str, *, user_id: int | None = None
    ) -> dict[str, Any]:
        """Build the callback query update :meth:`press_button` would queue, without queueing
        it (e.g. to post it to a webhook with :func:`post_to_webhook`).

        Args:
            chat_id: The chat.
            button: The button's ``callback_data``, or else its text.
            user_id: Who pressed it.

        Returns:
            The update dict. Its ``callback_query.message`` is the message with the keyboard.

        Raises:
            LookupError: As :meth:`press_button`.
        """
        with self._cond:
            return self._new_button_press(chat_id, button, user_id)

    def _new_button_press(
        self, chat_id: int, button: str, user_id: int | None
    ) -> dict[str, Any]:
        # Caller holds self._cond.
        shown = self._keyboards.get(chat_id)
        if not shown:
            raise LookupError(f"the bot shows no inline keyboard in chat {chat_id}")
        message_id, info = next(reversed(shown.items()))
        buttons = [b for row in info["inline_keyboard"] for b in row if isinstance(b, dict)]
        pressable = [b for b in buttons if isinstance(b.get("callback_data"), str)]
        found = next((b for b in pressable if b["callback_data"] == button), None) or next(
            (b for b in pressable if b.get("text") == button), None
        )
        if found is None:
            names = ", ".join(repr(b["callback_data"]) for b in pressable) or "none"
            raise LookupError(
                f"no button {button!r} in chat {chat_id}'s last keyboard (message "
                f"{message_id}); buttons with callback data: {names}"
            )
        update = make_callback_query_update(
            self._take_update_id(),
            chat_id,
            found["callback_data"],
            bot_id=self._bot_id(),
            message_id=message_id,
            user_id=user_id,
            message_text=info["text"],
        )
        message = update["callback_query"]["message"]
        message["reply_markup"] = {"inline_keyboard": copy.deepcopy(info["inline_keyboard"])}
        if not info["text"]:
            del message["text"]
        return update

    # ------------------------------------------------------------------ faults

    def fail_next(
        self,
        method: str,
        count: int = 1,
        *,
        error_code: int | None = None,
        description: str | None = None,
        retry_after: int | None = None,
        migrate_to_chat_id: int | None = None,
    ) -> None:
        """Make the next ``count`` calls of ``method`` fail before they have any effect (see
        :meth:`cut_next` for a call whose answer is lost instead).

        A failed ``getUpdates`` confirms nothing and returns nothing. The call is still recorded
        in :attr:`calls`. PTB maps the answer to an exception by HTTP status: 401/404 →
        ``InvalidToken``, 400 → ``BadRequest``, 403 → ``Forbidden``, 409 → ``Conflict``, other
        codes → ``NetworkError``. Any ``retry_after`` → ``RetryAfter``. Any
        ``migrate_to_chat_id`` → ``ChatMigrated``.

        Args:
            method: The method name (case-insensitive, e.g. ``"getUpdates"``).
            count: How many calls fail.
            error_code: The HTTP status and ``error_code``. Defaults to 429 when ``retry_after``
                is given, else 500.
            description: The error description. A Telegram-like default fits the code.
            retry_after: Seconds for ``parameters.retry_after`` (flood control).
            migrate_to_chat_id: ``parameters.migrate_to_chat_id`` (the group became a
                supergroup). With it the code defaults to 400.
        """
        if count < 1:
            raise ValueError("count must be >= 1")
        code = error_code if error_code is not None else (
            429 if retry_after else 400 if migrate_to_chat_id else 500)
        if description is None:
            if retry_after:
                description = f"Too Many Requests: retry after {retry_after}"
            else:
                description = {
                    400: "Bad Request",
                    401: "Unauthorized",
                    403: "Forbidden",
                    404: "Not Found",
                    409: "Conflict",
                    502: "Bad Gateway",
                }.get(code, "Internal Server Error")
        with self._cond:
            self._failures.setdefault(method.lower(), deque()).append(
                _Failure(count, code, description, retry_after,
                         migrate_to_chat_id=migrate_to_chat_id)
            )

    def block(self, *chat_ids: int | str) -> None:
        """Make these chats' users block the bot: every ``send*``, copy or forward to one of
        them fails with 403 ``Forbidden: bot was blocked by the user`` and has no effect."""
        with self._cond:
            self._blocked.update(str(chat) for chat in chat_ids)

    def cut_next(self, method: str, count: int = 1, *, after_effect: bool) -> None:
        """Make the next ``count`` calls of ``method`` lose their answer: the server reads the
        request, then drops the connection without answering (an unknown outcome).

        The client sees its connection closed after its request left (PTB raises
        :exc:`telegram.error.NetworkError`). It cannot tell whether the call had its effect.
        Which one happened is chosen here:

        * ``after_effect=True``: the call had its effect before the connection dropped, as when
          Telegram's answer is lost on the way back. A ``sendMessage`` is in
          :attr:`sent_messages` with its ``message_id`` taken. A ``getUpdates`` with an offset
          confirmed (dropped) the updates below it and handed out updates the client never
          received.
        * ``after_effect=False``: the call had no effect, as when the request was lost before
          Telegram acted on it.

        Either way the call is recorded in :attr:`calls`. Faults of one method (these and
        :meth:`fail_next`) apply in the order they were queued.

        Args:
            method: The method name (case-insensitive, e.g. ``"sendMessage"``).
            count: How many calls lose their answer.
            after_effect: Whether each such call takes effect before its connection drops.
        """
        if count < 1:
            raise ValueError("count must be >= 1")
        with self._cond:
            self._failures.setdefault(method.lower(), deque()).append(
                _Failure(count, 0, "", None, "after" if after_effect else "before")
            )

    def delay(self, method: str, seconds: float) -> None:
        """Make every later call of ``method`` wait ``seconds`` before it is handled.

        The wait ends early when the server stops. ``seconds <= 0`` removes the delay.

        Args:
            method: The method name (case-insensitive).
            seconds: The delay.
        """
        with self._cond:
            if seconds > 0:
                self._delays[method.lower()] = float(seconds)
            else:
                self._delays.pop(method.lower(), None)

    def hold(self, method: str) -> None:
        """Keep every call of ``method`` that is waiting or arrives from now on unanswered
        until :meth:`release`. The hold comes after its :meth:`delay`, if any, and before any
        fault of :meth:`fail_next` or :meth:`cut_next`. The rate limits come before both. A
        request they refuse is answered 429 at once.

        A held call is in :attr:`calls` at once and has no effect until it is released (a
        held ``sendMessage`` is in :attr:`sent_messages` only after). Unlike a :meth:`delay`,
        the answers go out when the test says: e.g. a client's requests all in flight
        and none answered, whatever the machine's speed. The wait ends early when the server
        stops.

        Args:
            method: The method name (case-insensitive).
        """
        with self._cond:
            self._holds.add(method.lower())

    def release(self, method: str) -> None:
        """Answer the calls of ``method`` that :meth:`hold` keeps waiting, and stop holding.

        Args:
            method: The method name (case-insensitive).
        """
        with self._cond:
            self._holds.discard(method.lower())
            self._bump()

    def flood(self, retry_after: int = 5) -> None:
        """Answer the next limited request 429 and hold the whole bot for ``retry_after``.

        This is Telegram's flood control of a bot. The next request of a limited method (see
        :class:`RateLimits`) is answered 429 ``Too Many Requests: retry after N`` with
        ``parameters.retry_after``. That answer begins a bot-wide hold of ``retry_after``
        seconds. Every limited request within it is answered 429 too and counted in
        :attr:`requests_in_hold`. It works with or without ``rate_limits``.

        Args:
            retry_after: The seconds of the hold, as the 429 announces them.

        Raises:
            TypeError: If ``retry_after`` is not an int.
            ValueError: If ``retry_after`` is below 1.
        """
        if isinstance(retry_after, bool) or not isinstance(retry_after, int):
            raise TypeError(f"retry_after must be an int, not {retry_after!r}")
        if retry_after < 1:
            raise ValueError(f"retry_after must be >= 1, not {retry_after!r}")
        self._limiter.flood(retry_after)

    # ------------------------------------------------------------------ observation

    @property
    def sent_messages(self) -> list[dict[str, Any]]:
        """Copies of the ``sendMessage`` parameters in order, plus the ``message_id`` given."""
        with self._cond:
            return copy.deepcopy(self._sent)

    @property
    def answered_callback_queries(self) -> list[dict[str, Any]]:
        """Copies of the ``answerCallbackQuery`` parameters in order."""
        with self._cond:
            return copy.deepcopy(self._callback_answers)

    @property
    def calls(self) -> list[ApiCall]:
        """Every authorized request in arrival order (copies), failed ones included."""
        with self._cond:
            return [ApiCall(call.method, copy.deepcopy(call.params)) for call in self._calls]

    @property
    def effective_calls(self) -> list[ApiCall]:
        """List[:class:`ApiCall`]: The requests that took effect, in the order they did
        (copies). They were answered ``ok``, or cut by :meth:`cut_next` after their effect.

        Left out: calls :meth:`fail_next` failed, calls cut before their effect, held calls
        not released yet, and calls Telegram refuses (an unknown chat, an empty text, an edit
        that changes nothing). What a chat's user saw is here, once per time it happened: a
        reply sent twice is here twice, a refused one is not.
        """
        with self._cond:
            return [ApiCall(call.method, copy.deepcopy(call.params)) for call in self._effective]

    def calls_to(self, method: str) -> list[dict[str, Any]]:
        """The parameters of every call of ``method`` (case-insensitive), in order.

        Args:
            method: The method name.

        Returns:
            Copies of the parameter dicts.
        """
        wanted = method.lower()
        return [call.params for call in self.calls if call.method.lower() == wanted]

    @property
    def confirmed_update_ids(self) -> set[int]:
        """The ids confirmed by a ``getUpdates`` offset (never returned again)."""
        with self._cond:
            return set(self._confirmed)

    @property
    def dropped_update_ids(self) -> set[int]:
        """The ids dropped unconfirmed by ``drop_pending_updates``."""
        with self._cond:
            return set(self._dropped)

    @property
    def pending_update_ids(self) -> list[int]:
        """The ids injected and not yet confirmed or dropped, in queue order."""
        with self._cond:
            return list(self._pending)

    @property
    def webhook(self) -> dict[str, Any]:
        """The webhook settings last set (``url`` is ``""`` when none is set).

        Keys as sent to ``setWebhook``: ``url``, ``secret_token``, ``max_connections``,
        ``allowed_updates``, ``ip_address``, ``drop_pending_updates`` (only those given).
        """
        with self._cond:
            return copy.deepcopy(self._webhook)

    @property
    def rate_limits(self) -> RateLimits | None:
        """:class:`RateLimits`: The limits the server enforces. It is :obj:`None` (the default)
        when it enforces none."""
        return self._limiter.limits

    @property
    def rate_limited(self) -> int:
        """:obj:`int`: How many requests the rate limits and :meth:`flood` answered 429.

        Requests inside a hold are included. Faults of :meth:`fail_next` are not.
        """
        return self._limiter.counts()[0]

    @property
    def requests_in_hold(self) -> int:
        """:obj:`int`: How many limited requests arrived inside an announced hold.

        A hold begins when a 429 of a scope (the bot, the paid broadcasts or a chat) is
        answered. It ends ``retry_after`` seconds later. A request of that scope in between is
        counted, unless it came within :attr:`RateLimits.hold_grace_seconds` of the 429. A
        client that honours ``retry_after`` keeps this at 0. The 429 that begins a hold is not
        counted.
        """
        return self._limiter.counts()[1]

    def sent_times(self, chat_id: int | str | None = None) -> list[float]:
        """The :func:`time.monotonic` times of the limited requests that took effect, in order.

        A time is the moment the request arrived (see :class:`RateLimits`). The times are
        recorded with or without ``rate_limits``. A sustained send rate is
        ``(len(times) - 1) / (times[-1] - times[0])`` over a busy stretch. Divided by
        :attr:`RateLimits.global_limit` per :attr:`RateLimits.global_window`, it is a share
        of the limit.

        Args:
            chat_id: Only the requests to this chat. :obj:`None` gives all of them.

        Returns:
            The times, oldest first.
        """
        chat = None if chat_id is None else _limited_chat(chat_id)
        if chat_id is not None and chat is None:
            return []
        return self._limiter.sent_times(chat)

    @property
    def hook_errors(self) -> list[BaseException]:
        """Exceptions raised by :attr:`on_confirm` (a test should assert this is empty)."""
        with self._cond:
            return list(self._hook_errors)

    def wait_until(self, predicate: Callable[[], object], timeout: float = 5.0) -> bool:
        """Wait until ``predicate()`` is true, re-checking on every change and every 50 ms.

        The predicate runs in the calling thread without the server's lock, so it may read
        this server's properties or anything else (a store, a list a handler fills).

        Args:
            predicate: A callable without arguments.
            timeout: The most seconds to wait.

        Returns:
            Whether the predicate became true in time.
        """
        deadline = time.monotonic() + timeout
        while True:
            with self._cond:
                version = self._version
            if predicate():
                return True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            with self._cond:
                if self._version == version:
                    self._cond.wait(min(remaining, _POLL_SLICE))

    def wait_for_sent(self, n: int, timeout: float = 5.0) -> bool:
        """Wait until at least ``n`` messages were sent with ``sendMessage``.

        Args:
            n: The number of messages.
            timeout: The most seconds to wait.

        Returns:
            Whether that many were sent in time.
        """
        return self.wait_until(lambda: self._count_sent() >= n, timeout)

    def _count_sent(self) -> int:
        with self._cond:
            return len(self._sent)

    def wait_confirmed(self, update_ids: Iterable[int], timeout: float = 5.0) -> bool:
        """Wait until all ``update_ids`` are confirmed by a ``getUpdates`` offset.

        Args:
            update_ids: The ids.
            timeout: The most seconds to wait.

        Returns:
            Whether all were confirmed in time.
        """
        wanted = set(update_ids)
        return self.wait_until(lambda: wanted <= self._confirmed_view(), timeout)

    def _confirmed_view(self) -> set[int]:
        with self._cond:
            return set(self._confirmed)

    # ------------------------------------------------------------------ request handling

    def _bump(self) -> None:
        # Caller holds self._cond.
        self._version += 1
        self._cond.notify_all()

    def _handle(self, path: str, content_type: str, body: bytes) -> tuple[int, dict[str, Any]]:
        """Handle one request (server thread). Returns the HTTP status and the JSON body."""
        with self._cond:
            epoch = self._epoch
        try:
            result = self._route(path, content_type, body, epoch)
        except _ApiError as exc:
            return exc.error_code, exc.body()
        except _CutConnection:
            raise
        except Exception as exc:  # pragma: no cover - a bug in the fake. Surface it
            _LOGGER.exception("FakeBotApi failed to handle %s", path)
            return 500, {
                "ok": False,
                "error_code": 500,
                "description": f"Internal Server Error: {type(exc).__name__}: {exc}",
            }
        return 200, {"ok": True, "result": result}

    def _route(self, path: str, content_type: str, body: bytes, epoch: int) -> Any:
        split = urllib.parse.urlsplit(path)
        parts = split.path.split("/")
        # ['', 'bot<token>', '<method>']
        if len(parts) != 3 or not parts[1].startswith("bot") or parts[1] == "bot":
            raise _ApiError(404, "Not Found")
        if parts[1][3:] != self._token:
            raise _ApiError(401, "Unauthorized")
        method = parts[2]
        if not method:
            raise _ApiError(404, "Not Found")
        params = _parse_params(split.query, content_type, body)
        key = method.lower()
        with self._cond:
            self._calls.append(ApiCall(method, params))
            self._bump()
        if not _is_limited(key):
            return self._answer(method, key, params, epoch)
        # counted on arrival (or refused with 429 at once), taken back if it has no effect
        ticket = self._limiter.admit(params)
        took_effect = False
        try:
            result = self._answer(method, key, params, epoch)
            took_effect = True
            return result
        except _CutConnection as exc:
            took_effect = exc.after_effect
            raise
        finally:
            self._limiter.settle(ticket, took_effect)

    def _answer(self, method: str, key: str, params: dict[str, Any], epoch: int) -> Any:
        """Wait out the call's delay and hold, then apply its next fault, if any, else its
        effect. Returns its result."""
        with self._cond:
            delay = self._delays.get(key, 0.0)
        if delay:
            with self._cond:
                self._cond.wait_for(lambda: self._stale(epoch), timeout=delay)
        with self._cond:
            self._cond.wait_for(lambda: key not in self._holds or self._stale(epoch))
        fault: _Failure | None = None
        with self._cond:
            if (self._blocked and str(params.get("chat_id")) in self._blocked
                    and (key.startswith("send") or key.startswith(("copy", "forward")))):
                raise _ApiError(403, "Forbidden: bot was blocked by the user", {})
            failures = self._failures.get(key)
            if failures:
                fault = failures[0]
                fault.count -= 1
                if fault.count <= 0:
                    failures.popleft()
        if fault is None:
            result = self._dispatch(key, params, epoch)
            self._took_effect(method, params)
            return result
        if fault.cut == "after":
            self._dispatch(key, params, epoch)
            self._took_effect(method, params)
        if fault.cut is not None:
            raise _CutConnection(after_effect=fault.cut == "after")
        parameters: dict[str, Any] = {}
        if fault.retry_after:
            parameters["retry_after"] = fault.retry_after
        if fault.migrate_to_chat_id:
            parameters["migrate_to_chat_id"] = fault.migrate_to_chat_id
        raise _ApiError(fault.error_code, fault.description, parameters)

    def _took_effect(self, method: str, params: dict[str, Any]) -> None:
        with self._cond:
            self._effective.append(ApiCall(method, params))

    def _stale(self, epoch: int) -> bool:
        # Caller holds self._cond. True once the server stopped (or restarted) since the request.
        return not self._running or self._epoch != epoch

    def _dispatch(self, key: str, params: dict[str, Any], epoch: int) -> Any:
        if key == "getupdates":
            return self._get_updates(params, epoch)
        if key == "getme":
            return self.bot_user
        if key == "sendmessage":
            return self._send_message(params)
        if key == "setwebhook":
            return self._set_webhook(params)
        if key == "deletewebhook":
            with self._cond:
                self._webhook = {"url": ""}
                if params.get("drop_pending_updates") is True:
                    self._drop_pending()
                self._bump()
            return True
        if key == "getwebhookinfo":
            with self._cond:
                info: dict[str, Any] = {
                    "url": self._webhook.get("url", ""),
                    "has_custom_certificate": False,
                    "pending_update_count": len(self._pending),
                }
                if info["url"]:
                    info["max_connections"] = self._webhook.get("max_connections", 40)
                    if self._webhook.get("allowed_updates") is not None:
                        info["allowed_updates"] = self._webhook["allowed_updates"]
                    if self._webhook.get("ip_address"):
                        info["ip_address"] = self._webhook["ip_address"]
            return info
        if key == "answercallbackquery":
            if not params.get("callback_query_id"):
                raise _ApiError(400, "Bad Request: query_id_invalid")
            with self._cond:
                self._callback_answers.append(params)
                self._bump()
            return True
        if key == "copymessage":
            chat = _chat_key(params.get("chat_id"))
            with self._cond:
                return {"message_id": self._next_message_id(chat)}
        if key == "sendchataction":
            return True
        if key == "sendmediagroup":
            return [self._message_result(params)]
        if key.startswith("send") or key == "forwardmessage":
            message = self._message_result(params)
            self._track_keyboard(message, params, edit=False)
            self._remember_content(message, params)
            return message
        if key.startswith("editmessage"):
            if params.get("inline_message_id"):
                return True
            self._edit_content(key, params)
            message = self._message_result(params, message_id=params.get("message_id"))
            self._track_keyboard(message, params, edit=True)
            return message
        return True  # logOut, close and every other method

    def _message_result(
        self, params: dict[str, Any], *, message_id: Any = None
    ) -> dict[str, Any]:
        chat = _chat_key(params.get("chat_id"))
        with self._cond:
            if message_id is None:
                message_id = self._next_message_id(chat)
        message = make_message(
            message_id=_as_int(message_id, 1, "message_id"),
            chat_id=chat,
            text=params["text"] if isinstance(params.get("text"), str) else None,
            sender=make_bot_user(self._bot_id()),
        )
        if isinstance(params.get("caption"), str):
            message["caption"] = params["caption"]
        if isinstance(params.get("entities"), list):
            message["entities"] = params["entities"]
        markup = params.get("reply_markup")
        if isinstance(markup, dict) and "inline_keyboard" in markup:
            message["reply_markup"] = markup
        return message

    def _remember_content(self, message: dict[str, Any], params: dict[str, Any]) -> None:
        """Keep what a message the bot sent shows (for :meth:`_edit_content`)."""
        text = params.get("text") if "text" in params else params.get("caption")
        entities = params.get("entities") if "text" in params else params.get("caption_entities")
        content = (text, entities, _inline_markup(params))
        self._keep_content(_chat_key(params.get("chat_id")), message["message_id"], content)

    def _keep_content(
        self, chat: int | str, message_id: int, content: tuple[Any, Any, Any]
    ) -> None:
        with self._cond:
            shown = self._contents.setdefault(chat, {})
            shown.pop(message_id, None)
            shown[message_id] = content
            while len(shown) > _REMEMBERED_CONTENTS:
                del shown[next(iter(shown))]

    def _edit_content(self, key: str, params: dict[str, Any]) -> None:
        """Refuse an ``editMessageText``/``editMessageCaption``/``editMessageReplyMarkup`` of
        a message the fake knows whose content and inline keyboard it would leave as they
        are (Telegram: 400 ``message is not modified``). Else keep the new content."""
        chat = _chat_key(params.get("chat_id"))
        message_id = _as_int(params.get("message_id"), 0, "message_id")
        with self._cond:
            current = self._contents.get(chat, {}).get(message_id)
        markup = _inline_markup(params)
        if key == "editmessagetext":
            new = (params.get("text"), params.get("entities"), markup)
        elif key == "editmessagecaption":
            new = (params.get("caption"), params.get("caption_entities"), markup)
        elif key == "editmessagereplymarkup":
            new = (None, None, markup) if current is None else (current[0], current[1], markup)
        else:
            return
        if new == current:
            raise _ApiError(400, _NOT_MODIFIED)
        self._keep_content(chat, message_id, new)

    def _track_keyboard(
        self, message: dict[str, Any], params: dict[str, Any], *, edit: bool
    ) -> None:
        """Remember which of the bot's messages show an inline keyboard (for
        :meth:`press_button`). As in Telegram, an edit without ``reply_markup`` removes it."""
        chat = _chat_key(params.get("chat_id"))  # as the chat's message ids are kept
        message_id = message["message_id"]
        markup = message.get("reply_markup")
        with self._cond:
            shown = self._keyboards.setdefault(chat, {})
            before = shown.pop(message_id, None)
            if markup is None:
                if not shown:
                    del self._keyboards[chat]
                return
            text = message.get("text", message.get("caption"))
            if text is None:
                text = before["text"] if edit and before is not None else ""
            shown[message_id] = {"text": text, "inline_keyboard": markup["inline_keyboard"]}
            while len(shown) > 20:  # a long chat keeps only its newest keyboards
                del shown[next(iter(shown))]

    def _send_message(self, params: dict[str, Any]) -> dict[str, Any]:
        if params.get("chat_id") in (None, ""):
            raise _ApiError(400, "Bad Request: chat_id is empty")
        chat = _chat_key(params["chat_id"])
        text = params.get("text")
        if not isinstance(text, str) or not text.strip():
            raise _ApiError(400, "Bad Request: message text is empty")
        with self._cond:
            message_id = self._next_message_id(chat)
        message = self._message_result(params, message_id=message_id)
        self._track_keyboard(message, params, edit=False)
        self._remember_content(message, params)
        with self._cond:
            self._sent.append(dict(params, message_id=message_id))
            self._bump()
        return message

    def _set_webhook(self, params: dict[str, Any]) -> bool:
        url = params.get("url")
        if not isinstance(url, str):
            raise _ApiError(400, "Bad Request: bad webhook: URL must be a string")
        secret = params.get("secret_token")
        if secret is not None and not re.fullmatch(r"[A-Za-z0-9_-]{1,256}", str(secret)):
            raise _ApiError(400, "Bad Request: secret token contains unallowed characters")
        with self._cond:
            settings: dict[str, Any] = {"url": url}
            for name in (
                "secret_token",
                "max_connections",
                "allowed_updates",
                "ip_address",
                "drop_pending_updates",
            ):
                if name in params:
                    settings[name] = params[name]
            self._webhook = settings if url else {"url": ""}
            if params.get("drop_pending_updates") is True:
                self._drop_pending()
            self._bump()
        return True

    def _drop_pending(self) -> None:
        # Caller holds self._cond.
        self._dropped.update(self._pending)
        self._pending.clear()

    def _get_updates(self, params: dict[str, Any], epoch: int) -> list[dict[str, Any]]:
        offset = _as_int(params.get("offset"), 0, "offset")
        limit = int(_clamp(_as_int(params.get("limit"), 100, "limit"), 1, 100))
        timeout = _clamp(
            _as_float(params.get("timeout"), 0.0, "timeout"), 0.0, _LONG_POLL_MAX_TIMEOUT
        )
        with self._cond:
            if self._webhook.get("url"):
                raise _ApiError(409, _WEBHOOK_CONFLICT)
            self._poll_generation += 1
            generation = self._poll_generation
            self._bump()  # a waiting getUpdates sees the newer one and answers 409
            if offset > 0:
                to_confirm = [uid for uid in self._pending if uid < offset]
            elif offset < 0:
                to_confirm = list(self._pending)[:offset]
            else:
                to_confirm = []
        if to_confirm:
            hook = self.on_confirm
            if hook is not None:
                try:
                    hook(list(to_confirm))
                except Exception as exc:  # noqa: BLE001 - reported through hook_errors
                    with self._cond:
                        self._hook_errors.append(exc)
                        self._bump()
                    raise _ApiError(
                        500, f"Internal Server Error: on_confirm failed: {exc!r}"
                    ) from exc
            with self._cond:
                for update_id in to_confirm:
                    if self._pending.pop(update_id, None) is not None:
                        self._confirmed.add(update_id)
                self._bump()
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                if self._poll_generation != generation:
                    raise _ApiError(409, _POLL_CONFLICT)
                batch = [
                    update
                    for update_id, update in self._pending.items()
                    if offset <= 0 or update_id >= offset
                ][:limit]
                remaining = deadline - time.monotonic()
                if batch or remaining <= 0:
                    return batch
                if self._stale(epoch):
                    return []
                self._cond.wait(remaining)


def post_to_webhook(
    url: str,
    update: Mapping[str, Any] | str | bytes,
    *,
    secret_token: str | None = None,
    timeout: float = 10.0,
) -> int:
    """POST one update to a webhook as Telegram does and return the HTTP status.

    The body is the update as JSON (``Content-Type: application/json``), with the header
    ``X-Telegram-Bot-Api-Secret-Token`` when ``secret_token`` is given. Proxy settings from the
    environment are ignored.

    Args:
        url: The webhook URL.
        update: The update dict. A ``str`` or ``bytes`` is sent as the raw body (to test bad
            input).
        secret_token: The secret token to send.
        timeout: Seconds to wait for the answer.

    Returns:
        The HTTP status code (also for 4xx/5xx answers).

    Raises:
        urllib.error.URLError: If the webhook cannot be reached.
        TimeoutError: If it does not answer in time.
    """
    if isinstance(update, bytes):
        data = update
    elif isinstance(update, str):
        data = update.encode("utf-8")
    else:
        data = json.dumps(dict(update)).encode("utf-8")
    request = urllib.request.Request(
        url, data=data, method="POST", headers={"Content-Type": "application/json"}
    )
    if secret_token is not None:
        request.add_header("X-Telegram-Bot-Api-Secret-Token", secret_token)
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(request, timeout=timeout) as response:
            response.read()
            return int(response.status)
    except urllib.error.HTTPError as exc:
        exc.read()
        return int(exc.code)
