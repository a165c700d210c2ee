"""``python -m ptb_fence.testing serve``: run the fake Bot API for a bot you start yourself.

Example (two terminals, no token, no network)::

    python -m ptb_fence.testing serve --message "/book 10:00"
    python examples/polling_sqlite.py --base-url http://127.0.0.1:8081/bot

The server prints the token and base URL, injects each ``--message`` and each line typed on
stdin as a text message, and prints every request the bot makes other than polling.
See :doc:`/howto/testing-with-fakebotapi` for its commands and its update ids.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import urllib.error
from types import FrameType
from typing import Any, Optional, Sequence, TextIO

from ptb_fence.testing._fake_bot_api import FakeBotApi, RateLimits, post_to_webhook

__all__ = ["main"]

DEFAULT_PORT = 8081
DEFAULT_TOKEN = "123456:TEST-TOKEN"
_QUIET_METHODS = frozenset({"getupdates", "getme", "deletewebhook", "getwebhookinfo"})
_BUTTON = "!button"


def _update_id(value: str) -> int:
    """argparse type of ``--first-update-id``: a positive integer (offset 0 means none)."""
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise argparse.ArgumentTypeError(f"{value!r} is not a positive integer")
    return number


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m ptb_fence.testing",
        description="Offline helpers of ptb_fence.testing.",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    serve = commands.add_parser(
        "serve",
        help="run the fake Telegram Bot API on a local port",
        description=(
            "Run the fake Telegram Bot API on a local port for a bot you start yourself "
            "(--base-url http://HOST:PORT/bot, token as printed). Injects each --message and "
            "each stdin line as a text message ('@42 text' sends from chat 42; '!button DATA' "
            "presses the button with that callback data or text of the last inline keyboard "
            "the bot showed in the chat) and prints what the bot sends. Ctrl-C or SIGTERM "
            "stops it."
        ),
    )
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (127.0.0.1)")
    serve.add_argument(
        "--port", type=int, default=DEFAULT_PORT,
        help=f"port to listen on ({DEFAULT_PORT}; 0 picks a free one)",
    )
    serve.add_argument("--token", default=DEFAULT_TOKEN, help=f"bot token to accept ({DEFAULT_TOKEN})")
    serve.add_argument(
        "--message", action="append", default=[], metavar="TEXT",
        help="inject this text message at start (repeatable; '@42 text' for chat 42, "
        "'!button DATA' presses a button)",
    )
    serve.add_argument(
        "--chat-id", type=int, default=1, help="chat of injected messages without '@ID' (1)"
    )
    serve.add_argument(
        "--no-stdin", action="store_true", help="do not read messages from standard input"
    )
    serve.add_argument(
        "--first-update-id", type=_update_id, default=None, metavar="ID",
        help="the first update's id (default: from the milliseconds since the epoch, so "
        "each run has ids of its own and a kept database does not take them for "
        "redeliveries)",
    )
    serve.add_argument(
        "--rate-limits", action="store_true",
        help="enforce Telegram's flood limits: 30 messages per second in all, 1 per second "
        "per private chat, 20 per minute per group, 1000 per second paid broadcasts. A "
        "request over a limit is answered 429 with retry_after",
    )
    return parser


class _Server:
    """The running fake server plus its console: injects messages and button presses, prints
    what the bot sent."""

    __slots__ = ("chat_id", "fake", "hinted", "limited", "lock", "out", "seen", "stop")

    def __init__(self, fake: FakeBotApi, chat_id: int, out: TextIO) -> None:
        self.fake = fake
        self.chat_id = chat_id
        self.out = out
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.seen = 0
        self.limited = 0  # the 429 answers of the rate limits reported so far
        self.hinted = False  # the "!button" hint is printed with the first keyboard only

    def say(self, text: str) -> None:
        with self.lock:
            try:
                print(text, file=self.out, flush=True)
            except (BrokenPipeError, ValueError):  # output closed: keep serving quietly
                pass

    def inject(self, line: str) -> None:
        text = line.strip()
        if not text:
            return
        chat_id = self.chat_id
        if text.startswith("@"):
            head, _, rest = text.partition(" ")
            try:
                chat_id = int(head[1:])
                text = rest.strip()
            except ValueError:
                pass
            if not text:
                self.say(f"! nothing to send after {head!r}")
                return
        if text == _BUTTON or text.startswith(_BUTTON + " "):
            self._press(chat_id, text[len(_BUTTON):].strip())
            return
        update = self.fake.new_message_update(chat_id, text)
        self._deliver(update, f"from chat {chat_id}: {text}")

    def _press(self, chat_id: int, button: str) -> None:
        if not button:
            self.say(f"! say which button: {_BUTTON} CALLBACK_DATA (or the button's text)")
            return
        try:
            update = self.fake.new_button_press_update(chat_id, button)
        except LookupError as exc:
            self.say(f"! {exc}")
            return
        query = update["callback_query"]
        self._deliver(
            update,
            f"from chat {chat_id}: pressed {query['data']!r} under message "
            f"{query['message']['message_id']}",
        )

    def _deliver(self, update: "dict[str, Any]", what: str) -> None:
        """Queue ``update`` for polling, or post it to the webhook once one is set."""
        update_id = update["update_id"]
        webhook = self.fake.webhook
        if not webhook.get("url"):
            self.fake.inject(update)
            self.say(f"<- update {update_id} {what}")
            return
        secret = webhook.get("secret_token")
        try:
            status = post_to_webhook(
                webhook["url"], update, secret_token=str(secret) if secret else None
            )
        except (urllib.error.URLError, OSError) as exc:
            self.say(f"! update {update_id}: webhook {webhook['url']} unreachable: {exc}")
            return
        head, _, rest = what.partition(": ")
        self.say(f"<- update {update_id} {head} posted to the webhook (HTTP {status}): {rest}")

    def report_calls(self) -> None:
        calls = self.fake.calls
        for call in calls[self.seen:]:
            self._report(call.method, call.params)
        self.seen = len(calls)
        limited = self.fake.rate_limited
        if limited > self.limited:
            self.say(f"   (flood control answered 429, {limited} time(s) so far)")
            self.limited = limited

    def _report(self, method: str, params: "dict[str, Any]") -> None:
        key = method.lower()
        if key in _QUIET_METHODS:
            return
        if key == "sendmessage":
            self.say(f"-> sendMessage to chat {params.get('chat_id')}: {params.get('text')}")
        elif key == "setwebhook":
            self.say(f"-> setWebhook {params.get('url') or '(removed)'}")
        elif key in ("editmessagetext", "editmessagereplymarkup", "editmessagecaption"):
            where = (
                f"inline message {params['inline_message_id']}"
                if params.get("inline_message_id")
                else f"message {params.get('message_id')} in chat {params.get('chat_id')}"
            )
            text = params.get("text", params.get("caption"))
            self.say(f"-> {method} {where}" + (f": {text}" if text is not None else ""))
            if not params.get("inline_message_id") and not _keyboard(params):
                self.say("   (no inline keyboard now)")
        elif key == "answercallbackquery":
            text = params.get("text")
            shown = f": {text}" if text else " (no text)"
            if params.get("show_alert"):
                shown += " (as an alert)"
            self.say(f"-> answerCallbackQuery {params.get('callback_query_id')}{shown}")
        else:
            inline = bool(_keyboard(params))  # printed below, button by button
            fields = {k: v for k, v in params.items()
                      if not (k == "reply_markup" and inline)
                      and (not isinstance(v, dict) or "data" not in v)}
            self.say(f"-> {method} {json.dumps(fields, default=str, ensure_ascii=False)}")
        self._report_keyboard(params)

    def _report_keyboard(self, params: "dict[str, Any]") -> None:
        rows = _keyboard(params)
        if not rows:
            return
        for row in rows:
            self.say("   " + " ".join(_button_label(button) for button in row))
        if not self.hinted:
            self.hinted = True
            self.say(f"   (press one: {_BUTTON} CALLBACK_DATA, or @CHAT {_BUTTON} ... in "
                     "another chat)")


def _keyboard(params: "dict[str, Any]") -> "list[list[Any]]":
    """The rows of an inline keyboard in a request's ``reply_markup`` ([] if none)."""
    markup = params.get("reply_markup")
    rows = markup.get("inline_keyboard") if isinstance(markup, dict) else None
    return [row for row in rows if isinstance(row, list)] if isinstance(rows, list) else []


def _button_label(button: Any) -> str:
    """``[text]`` plus what pressing it does: ``-> callback_data``, or its URL."""
    if not isinstance(button, dict):
        return f"[{button}]"
    label = f"[{button.get('text', '')}"
    if isinstance(button.get("callback_data"), str):
        if button["callback_data"] != button.get("text"):
            label += f" -> {button['callback_data']}"
    elif button.get("url"):
        label += f" (url {button['url']})"
    else:
        label += " (not pressable here)"
    return label + "]"


def _read_stdin(server: _Server, stream: TextIO) -> None:
    try:
        for line in stream:
            if server.stop.is_set():
                return
            server.inject(line)
    except (OSError, ValueError):
        return


def serve(args: argparse.Namespace, out: TextIO = sys.stdout) -> int:
    """Run ``serve`` until SIGINT/SIGTERM. Returns the exit status."""
    try:
        # without --first-update-id, FakeBotApi's run-unique default (from the milliseconds
        # since the epoch): a bot whose database outlives this run takes the next run's
        # messages for new ones
        fake = FakeBotApi(
            args.token, host=args.host, port=args.port, first_update_id=args.first_update_id,
            rate_limits=RateLimits() if args.rate_limits else None,
        )
    except ValueError as exc:
        print(f"serve: error: {exc}", file=sys.stderr)
        return 2
    try:
        fake.start()
    except OSError as exc:
        print(
            f"serve: error: cannot listen on {args.host}:{args.port}: {exc.strerror or exc}; "
            "pick another --port",
            file=sys.stderr,
        )
        return 2
    server = _Server(fake, args.chat_id, out)

    def on_signal(signum: int, frame: Optional[FrameType]) -> None:
        server.stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        server.say(f"fake Bot API listening on {fake.url}")
        server.say(f"  token:    {fake.token}")
        server.say(f"  base URL: {fake.base_url}")
        server.say("point a bot at it, e.g.:")
        server.say(f"  python examples/polling_sqlite.py --base-url {fake.base_url}")
        if fake.token != DEFAULT_TOKEN:
            server.say(f"  (with TELEGRAM_BOT_TOKEN={fake.token})")
        server.say(f"update ids start at {fake.first_update_id}")
        if fake.rate_limits is not None:
            server.say("Telegram's flood limits are enforced (--rate-limits)")
        if not args.no_stdin:
            server.say(
                f"type a message and press Enter to send it from chat {args.chat_id} "
                f"('@42 text' for chat 42, '{_BUTTON} DATA' presses a button); Ctrl-C stops"
            )
        for text in args.message:
            server.inject(text)
        if not args.no_stdin:
            threading.Thread(
                target=_read_stdin, args=(server, sys.stdin), name="stdin", daemon=True
            ).start()
        while not server.stop.is_set():
            fake.wait_until(lambda: len(fake.calls) > server.seen or server.stop.is_set(), 0.5)
            server.report_calls()
        server.report_calls()
        server.say("stopped")
        return 0
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        fake.stop()


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run ``python -m ptb_fence.testing``.

    Args:
        argv: The arguments without the program name. :obj:`None` uses ``sys.argv[1:]``.

    Returns:
        :obj:`int`: The exit status (0 ok, 2 bad input or the port is taken).
    """
    args = _parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    if args.command == "serve":
        return serve(args)
    return 2  # pragma: no cover - argparse requires a command


if __name__ == "__main__":
    sys.exit(main())
