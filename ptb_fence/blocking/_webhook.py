"""webhook_app: a WSGI application for Telegram webhooks in front of an UpdateIntake."""

from __future__ import annotations

import hmac
import logging
import re
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

__all__ = ["DEFAULT_MAX_BODY_BYTES", "webhook_app"]

_LOGGER = logging.getLogger("ptb_fence.webhook")

DEFAULT_MAX_BODY_BYTES = 1024 * 1024
"""Bodies larger than this (bytes) are refused with 413."""

_SECRET = re.compile(r"[A-Za-z0-9_-]{1,256}")
_DIGITS = re.compile(r"[0-9]+")

StartResponse = Callable[[str, List[Tuple[str, str]]], Any]


def _reply(
    start_response: StartResponse,
    status: str,
    body: bytes,
    extra: Optional[List[Tuple[str, str]]] = None,
) -> Iterable[bytes]:
    headers = [("Content-Type", "text/plain; charset=utf-8"), ("Content-Length", str(len(body)))]
    start_response(status, headers + (extra or []))
    return [body]


def _read_body(environ: Dict[str, Any], limit: int) -> "bytes | str":
    """Read the request body. Returns the bytes or a status line to answer with."""
    stream = environ.get("wsgi.input")
    raw_length = environ.get("CONTENT_LENGTH") or ""
    if raw_length.strip() == "":
        if not environ.get("wsgi.input_terminated") or stream is None:
            return "411 Length Required"
        data = stream.read(limit + 1)
        return "413 Payload Too Large" if len(data) > limit else data
    digits = raw_length.strip()
    # Content-Length is 1*DIGIT (RFC 9110). int() would also take "1_0", "+5" or "٥".
    if _DIGITS.fullmatch(digits) is None:
        return "400 Bad Request"
    if len(digits.lstrip("0")) > len(str(limit)) or int(digits) > limit:
        return "413 Payload Too Large"
    length = int(digits)
    if stream is None:
        return "400 Bad Request"
    chunks = []
    remaining = length
    while remaining > 0:
        chunk = stream.read(remaining)
        if not chunk:
            return "400 Bad Request"
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def webhook_app(
    intake: Any,
    *,
    secret_token: Optional[str] = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    allow_no_secret_token: bool = False,
) -> Callable[[Dict[str, Any], StartResponse], Iterable[bytes]]:
    """Build a WSGI application that records Telegram webhook updates through ``intake``.

    It answers 405 to a non-POST (``Allow: POST``). It answers 403 to a missing or wrong
    ``X-Telegram-Bot-Api-Secret-Token`` (compared in constant time, before the body is read).
    It answers 413 to a body over ``max_body_bytes`` and 400 to a body that is no update.
    It answers 200 to an accepted or duplicate update, only after the row is committed.
    It answers 503 to a store failure, so Telegram redelivers.

    Args:
        intake (:class:`~ptb_fence.UpdateIntake`): Anything with ``accept(body)``.
        secret_token (:obj:`str`): The secret given to ``setWebhook`` (1–256 characters of
            ``A-Z a-z 0-9 _ -``).
        max_body_bytes (:obj:`int`): The body size bound (default 1 MiB).
        allow_no_secret_token (:obj:`bool`): Accept requests without checking a secret: only
            behind a proxy that checks them itself (default :obj:`False`).

    Raises:
        ValueError: ``secret_token`` is not a valid Telegram secret (none given, without
            ``allow_no_secret_token=True``), or ``max_body_bytes`` is not positive.
    """
    if secret_token is None and not allow_no_secret_token:
        raise ValueError(
            "webhook_app() without secret_token: anyone who finds the webhook's URL can post "
            "forged updates, and they would be recorded and handled. Pass secret_token=... "
            "(1-256 characters of A-Z, a-z, 0-9, _ and -, e.g. secrets.token_urlsafe(32)) and "
            "give the same to setWebhook; requests without it get 403. Behind a proxy that "
            "checks the requests itself, pass allow_no_secret_token=True instead"
        )
    if secret_token is not None and (
        not isinstance(secret_token, str) or _SECRET.fullmatch(secret_token) is None
    ):
        raise ValueError(
            "secret_token must be 1-256 characters of A-Z, a-z, 0-9, _ and - (the value you "
            "pass to setWebhook)"
        )
    if isinstance(max_body_bytes, bool) or not isinstance(max_body_bytes, int) or max_body_bytes <= 0:
        raise ValueError(f"max_body_bytes must be a positive integer, got {max_body_bytes!r}")
    if not callable(getattr(intake, "accept", None)):
        raise TypeError("webhook_app needs an intake with accept(body), e.g. UpdateIntake")
    expected = None if secret_token is None else secret_token.encode("ascii")

    def app(environ: Dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        if environ.get("REQUEST_METHOD", "GET").upper() != "POST":
            return _reply(start_response, "405 Method Not Allowed", b"POST only\n", [("Allow", "POST")])
        if expected is not None:
            given = environ.get("HTTP_X_TELEGRAM_BOT_API_SECRET_TOKEN")
            given_bytes = given.encode("latin-1", "replace") if isinstance(given, str) else b""
            if not hmac.compare_digest(given_bytes, expected):
                return _reply(start_response, "403 Forbidden", b"forbidden\n")
        body = _read_body(environ, max_body_bytes)
        if isinstance(body, str):
            return _reply(start_response, body, body[4:].encode() + b"\n")
        try:
            result = intake.accept(body)
        except Exception as exc:
            _LOGGER.error("could not record a webhook update (%s); answering 503", type(exc).__name__)
            return _reply(
                start_response,
                "503 Service Unavailable",
                b"update not recorded; retry\n",
                [("Retry-After", "1")],
            )
        if result == "invalid":
            return _reply(start_response, "400 Bad Request", b"not a Telegram update\n")
        return _reply(start_response, "200 OK", f"{result}\n".encode())

    return app
