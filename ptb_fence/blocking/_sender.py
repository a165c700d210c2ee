"""HttpxSender: the blocking front end's way to send an outbox call (a blocking httpx client)."""

from __future__ import annotations

import json
import threading
from http import HTTPStatus
from typing import Any, Dict, Optional, Tuple

from ptb_fence.runtime._bot_answers import answer_error

__all__ = ["DEFAULT_BASE_URL", "HttpxSender"]

DEFAULT_BASE_URL = "https://api.telegram.org/bot"
"""The Bot API's base URL, to which the token is appended (as PTB's ``base_url``)."""


class HttpxSender:
    """``send(method, params)`` for the outbox dispatcher of an
    :class:`~ptb_fence.UpdateIntake`: a POST of the parameters as JSON to
    ``{base_url}{token}/{method}`` on one blocking ``httpx.Client`` (thread-safe, pooled).

    Answers map to python-telegram-bot's exceptions as PTB's own request does
    (:func:`~ptb_fence.runtime._bot_answers.answer_error`), so the dispatcher decides alike
    for both front ends from one table. A 401/404 names the method once the token is known
    good, as for PTB's initialized bot (``EndPointNotFound``: a method Telegram does not
    have fails at once). The first such answer checks the token with ``getMe``. Before that
    it is ``InvalidToken`` (retried: the operator fixes the token). An httpx timeout →
    ``TimedOut`` and another httpx error → ``NetworkError``, each raised *from* the httpx
    error (which tells whether the request left).

    Args:
        token: The bot's token.
        base_url: The Bot API base URL the token is appended to.
        timeout: Seconds for connecting, writing and reading one call.
    """

    __slots__ = ("_client", "_lock", "_prefix", "_timeout", "_token_good")

    def __init__(self, token: str, base_url: str = DEFAULT_BASE_URL, timeout: float = 10.0) -> None:
        if not isinstance(token, str) or not token:
            raise ValueError("bot_token must be the bot's token text")
        self._prefix = f"{base_url}{token}/"
        self._timeout = timeout
        self._client: Optional[Any] = None
        self._lock = threading.Lock()
        self._token_good = False  # a call answered ok: the token works

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
        """Send one call and return the Bot API's ``result``, or raise PTB's exception for it."""
        code, data = self._post(method, params)
        if 200 <= code <= 299 and isinstance(data, dict) and data.get("ok"):
            self._token_good = True
            return data.get("result")
        if code in (HTTPStatus.NOT_FOUND, HTTPStatus.UNAUTHORIZED) and not self._token_good:
            self._check_token()
        raise answer_error(method, code, data, token_known_good=self._token_good)

    def _check_token(self) -> None:
        """Learn whether the token works (``getMe``), as PTB's bot does at its start."""
        try:
            code, data = self._post("getMe", {})
        except Exception:  # no answer: the token stays unknown, the call is retried
            return
        if 200 <= code <= 299 and isinstance(data, dict) and data.get("ok"):
            self._token_good = True

    def _post(self, method: str, params: Dict[str, Any]) -> Tuple[int, Any]:
        """One POST: its HTTP status and JSON answer (:obj:`None`: not JSON)."""
        import httpx
        from telegram import error

        try:
            response = self._http().post(self._prefix + method, json=params)
        except httpx.TimeoutException as exc:
            raise error.TimedOut(f"{method}: {type(exc).__name__}: {exc}") from exc
        except httpx.HTTPError as exc:
            raise error.NetworkError(f"httpx.{type(exc).__name__}: {exc}") from exc
        try:
            data = json.loads(response.content)
        except ValueError:
            data = None
        return response.status_code, data
