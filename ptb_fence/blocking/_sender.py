"""HttpxSender: the blocking front end's way to send an outbox call (a blocking httpx client)."""

from __future__ import annotations

import json
import threading
from http import HTTPStatus
from typing import Any, Dict, Optional

__all__ = ["DEFAULT_BASE_URL", "HttpxSender"]

DEFAULT_BASE_URL = "https://api.telegram.org/bot"
"""The Bot API's base URL, to which the token is appended (as PTB's ``base_url``)."""


class HttpxSender:
    """``send(method, params)`` for the outbox dispatcher of an
    :class:`~ptb_fence.UpdateIntake`: a POST of the parameters as JSON to
    ``{base_url}{token}/{method}`` on one blocking ``httpx.Client`` (thread-safe, pooled).

    Answers map to python-telegram-bot's exceptions as PTB's own request does, so the
    dispatcher decides alike for both front ends: a ``retry_after`` → ``RetryAfter``,
    ``migrate_to_chat_id`` → ``ChatMigrated``, 403 → ``Forbidden``, 400 → ``BadRequest``,
    401/404 → ``InvalidToken``, 409 → ``Conflict``, other statuses → ``NetworkError``; an httpx
    timeout → ``TimedOut`` and another httpx error → ``NetworkError``, each raised *from* the
    httpx error (which tells whether the request left).

    Args:
        token: The bot's token.
        base_url: The Bot API base URL the token is appended to.
        timeout: Seconds for connecting, writing and reading one call.
    """

    __slots__ = ("_client", "_lock", "_prefix", "_timeout")

    def __init__(self, token: str, base_url: str = DEFAULT_BASE_URL, timeout: float = 10.0) -> None:
        if not isinstance(token, str) or not token:
            raise ValueError("bot_token must be the bot's token text")
        self._prefix = f"{base_url}{token}/"
        self._timeout = timeout
        self._client: Optional[Any] = None
        self._lock = threading.Lock()

    def _http(self) -> Any:
        with self._lock:
            if self._client is None:
                import httpx

                self._client = httpx.Client(timeout=httpx.Timeout(self._timeout, pool=5.0))
            return self._client

    def close(self) -> None:
        """Close the HTTP client (a later call opens a new one)."""
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()

    def __call__(self, method: str, params: Dict[str, Any]) -> Any:
        """Send one call; the Bot API's ``result``, or the PTB exception for the answer."""
        import httpx
        from telegram import error

        try:
            response = self._http().post(self._prefix + method, json=params)
        except httpx.TimeoutException as exc:
            raise error.TimedOut(f"{method}: {type(exc).__name__}: {exc}") from exc
        except httpx.HTTPError as exc:
            raise error.NetworkError(f"httpx.{type(exc).__name__}: {exc}") from exc
        code = response.status_code
        try:
            data = json.loads(response.content)
        except ValueError:
            data = None
        if 200 <= code <= 299 and isinstance(data, dict) and data.get("ok"):
            return data.get("result")
        try:
            message = f"{HTTPStatus(code).phrase} ({code})"
        except ValueError:
            message = f"Unknown HTTPError ({code})"
        if isinstance(data, dict):
            message = data.get("description") or message
            parameters = data.get("parameters") or {}
            if isinstance(parameters, dict):
                if parameters.get("migrate_to_chat_id"):
                    raise error.ChatMigrated(parameters["migrate_to_chat_id"])
                if parameters.get("retry_after"):
                    raise error.RetryAfter(parameters["retry_after"])
        if code == HTTPStatus.FORBIDDEN:
            raise error.Forbidden(message)
        if code in (HTTPStatus.NOT_FOUND, HTTPStatus.UNAUTHORIZED):
            raise error.InvalidToken(message)
        if code == HTTPStatus.BAD_REQUEST:
            raise error.BadRequest(message)
        if code == HTTPStatus.CONFLICT:
            raise error.Conflict(message)
        raise error.NetworkError(message)
