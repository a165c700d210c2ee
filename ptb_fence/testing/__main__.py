"""``python -m ptb_fence.testing serve``: run the fake Bot API for a bot you start yourself.

Example (two terminals, no token, no network)::

    python -m ptb_fence.testing serve --message "/book 10:00"
    python examples/polling_sqlite.py --base-url http://127.0.0.1:8081/bot

The server prints the token and base URL to use, injects each ``--message`` and each line typed
on stdin as a text message (``@42 text`` sends it from chat 42), forwards them to the webhook
instead once a bot called ``setWebhook``, and prints every request the bot makes other than
polling (``sendMessage`` with its text). Ctrl-C or SIGTERM stops it (exit status 0).
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

from ptb_fence.testing._fake_bot_api import FakeBotApi, post_to_webhook
from ptb_fence.testing._updates import make_message_update

__all__ = ["main"]

DEFAULT_PORT = 8081
DEFAULT_TOKEN = "123456:TEST-TOKEN"
_QUIET_METHODS = frozenset({"getupdates", "getme", "deletewebhook", "getwebhookinfo"})


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
            "each stdin line as a text message ('@42 text' sends from chat 42) and prints what "
            "the bot sends. Ctrl-C or SIGTERM stops it."
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
        help="inject this text message at start (repeatable; '@42 text' for chat 42)",
    )
    serve.add_argument(
        "--chat-id", type=int, default=1, help="chat of injected messages without '@ID' (1)"
    )
    serve.add_argument(
        "--no-stdin", action="store_true", help="do not read messages from standard input"
    )
    return parser


class _Server:
    """The running fake server plus its console: injects messages, prints what the bot sent."""

    __slots__ = ("chat_id", "fake", "lock", "next_update_id", "out", "seen", "stop")

    def __init__(self, fake: FakeBotApi, chat_id: int, out: TextIO) -> None:
        self.fake = fake
        self.chat_id = chat_id
        self.out = out
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.seen = 0
        self.next_update_id = 1_000_000  # ids of updates posted to a webhook

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
        webhook = self.fake.webhook
        if webhook.get("url"):
            self._post(webhook, chat_id, text)
            return
        update_id = self.fake.inject_message(chat_id=chat_id, text=text)
        self.say(f"<- update {update_id} from chat {chat_id}: {text}")

    def _post(self, webhook: "dict[str, Any]", chat_id: int, text: str) -> None:
        with self.lock:
            self.next_update_id += 1
            update_id = self.next_update_id
        update = make_message_update(update_id, chat_id, text, message_id=update_id)
        secret = webhook.get("secret_token")
        try:
            status = post_to_webhook(
                webhook["url"], update, secret_token=str(secret) if secret else None
            )
        except (urllib.error.URLError, OSError) as exc:
            self.say(f"! update {update_id}: webhook {webhook['url']} unreachable: {exc}")
            return
        self.say(
            f"<- update {update_id} from chat {chat_id} posted to the webhook "
            f"(HTTP {status}): {text}"
        )

    def report_calls(self) -> None:
        calls = self.fake.calls
        for call in calls[self.seen:]:
            self._report(call.method, call.params)
        self.seen = len(calls)

    def _report(self, method: str, params: "dict[str, Any]") -> None:
        key = method.lower()
        if key in _QUIET_METHODS:
            return
        if key == "sendmessage":
            self.say(f"-> sendMessage to chat {params.get('chat_id')}: {params.get('text')}")
        elif key == "setwebhook":
            self.say(f"-> setWebhook {params.get('url') or '(removed)'}")
        else:
            shown = {k: v for k, v in params.items() if not isinstance(v, dict) or "data" not in v}
            self.say(f"-> {method} {json.dumps(shown, default=str, ensure_ascii=False)}")


def _read_stdin(server: _Server, stream: TextIO) -> None:
    try:
        for line in stream:
            if server.stop.is_set():
                return
            server.inject(line)
    except (OSError, ValueError):
        return


def serve(args: argparse.Namespace, out: TextIO = sys.stdout) -> int:
    """Run ``serve`` until SIGINT/SIGTERM; the exit status."""
    try:
        fake = FakeBotApi(args.token, host=args.host, port=args.port)
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
        if not args.no_stdin:
            server.say(
                f"type a message and press Enter to send it from chat {args.chat_id} "
                "('@42 text' for chat 42); Ctrl-C stops"
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
        argv: The arguments without the program name; :obj:`None` uses ``sys.argv[1:]``.

    Returns:
        :obj:`int`: The exit status (0 ok, 2 bad input or the port is taken).
    """
    args = _parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    if args.command == "serve":
        return serve(args)
    return 2  # pragma: no cover - argparse requires a command


if __name__ == "__main__":
    sys.exit(main())
