"""A fake payment API that honours idempotency keys, with a client for handlers.

The server is standard library only. The clients :func:`charge` and :func:`charge_async` use
httpx, which python-telegram-bot brings.
"""

from __future__ import annotations

import copy
import http.server
import json
import logging
import socket
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import httpx

__all__ = ["FakePaymentApi", "PaymentError", "PaymentRequest", "charge", "charge_async"]

_LOGGER = logging.getLogger(__name__)

MAX_KEY_LENGTH = 255
"""The longest ``Idempotency-Key`` the fake accepts (Stripe's limit)."""

_FIELDS = frozenset({"amount", "currency", "reference"})


@dataclass(frozen=True, slots=True)
class PaymentRequest:
    """One request to ``/charges`` that :class:`FakePaymentApi` received, in arrival order.

    Attributes:
        key: The ``Idempotency-Key`` header. It is :obj:`None` when the header was missing.
        body: The decoded JSON body. It is the raw text when the body is not JSON.
        status: The HTTP status the server answered. It is :obj:`None` when the answer was
            lost on purpose (see :meth:`FakePaymentApi.answer_lost_next`).
        time: When the request arrived, in seconds since the epoch.
        charge_id: The id of the charge the request created or found. It is :obj:`None` when
            the request touched no charge.
    """

    key: str | None
    body: Any
    status: int | None
    time: float
    charge_id: str | None


class PaymentError(Exception):
    """A charge request that got no successful answer.

    Attributes:
        status: The HTTP status of the answer. It is :obj:`None` when no answer arrived. Then
            the charge may or may not exist, and a retry with the same key tells.
        body: The decoded error body. It is :obj:`None` when no answer arrived or it was not
            JSON.
    """

    __slots__ = ("body", "status")

    def __init__(self, message: str, status: int | None, body: Any = None) -> None:
        super().__init__(message)
        self.status = status
        self.body = body


class _Answer(Exception):
    """Ends a request early with an error answer."""

    __slots__ = ("payload", "status")

    def __init__(self, status: int, kind: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.payload: dict[str, Any] = {"error": {"type": kind, "message": message}}


class _Server(http.server.ThreadingHTTPServer):
    """A threading HTTP server that can cut its open keep-alive connections on stop."""

    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True
    # the default backlog of 5 resets connections when many clients connect at once
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], api: FakePaymentApi) -> None:
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
        """Stay quiet when a client goes away."""
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
    """Routes ``POST /charges`` to :class:`FakePaymentApi`."""

    protocol_version = "HTTP/1.1"
    # headers and body go out in two writes, so Nagle's algorithm would delay the body
    disable_nagle_algorithm = True
    server: _Server

    def do_POST(self) -> None:  # noqa: N802 - name fixed by BaseHTTPRequestHandler
        self._serve("POST")

    def do_GET(self) -> None:  # noqa: N802 - name fixed by BaseHTTPRequestHandler
        self._serve("GET")

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - signature fixed
        _LOGGER.debug("%s - %s", self.address_string(), format % args)

    def _serve(self, method: str) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length > 0 else b""
        api = self.server.api
        status, payload = api._handle(  # pylint: disable=protected-access
            method, self.path, self.headers.get("Idempotency-Key"), body
        )
        delay = api.delay
        if delay > 0:
            time.sleep(delay)
        if status is None:
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
        except OSError:  # the client went away (e.g. a bot killed mid-request)
            self.close_connection = True


def _decode(body: bytes) -> Any:
    text = body.decode("utf-8", "replace")
    try:
        return json.loads(text)
    except ValueError:
        return text


def _parameters(body: Any) -> dict[str, Any]:
    """The charge parameters of a request body, or an error answer."""
    if not isinstance(body, dict):
        raise _Answer(400, "invalid_request_error", "the body must be a JSON object")
    unknown = sorted(set(body) - _FIELDS)
    if unknown:
        raise _Answer(400, "invalid_request_error", f"unknown parameters: {', '.join(unknown)}")
    amount = body.get("amount")
    if isinstance(amount, bool) or not isinstance(amount, int) or amount < 1:
        raise _Answer(400, "invalid_request_error", "amount must be a positive integer")
    currency = body.get("currency")
    if not isinstance(currency, str) or not currency:
        raise _Answer(400, "invalid_request_error", "currency must be a non-empty string")
    reference = body.get("reference")
    if reference is not None and not isinstance(reference, str):
        raise _Answer(400, "invalid_request_error", "reference must be a string or null")
    return {"amount": amount, "currency": currency, "reference": reference}


class FakePaymentApi:
    """A fake payment API on localhost that applies each idempotency key once.

    It serves ``POST /charges`` in a daemon thread. The body is a JSON object with ``amount``
    (a positive int), ``currency`` (a string) and an optional ``reference`` (a string). The
    ``Idempotency-Key`` header is required. A request without it answers 400. So does a key
    longer than 255 characters or a malformed body. Errors are JSON objects
    ``{"error": {"type": ..., "message": ...}}``.

    The first request of a key creates a charge and answers it with 200::

        {"id": "ch_1", "amount": 100, "currency": "XTR", "reference": "order-7",
         "idempotency_key": "<key>"}

    A later request with the same key and the same parameters answers the same charge with 200
    and creates nothing. The same key with other parameters answers 409, as Stripe does.
    Requests of one key are serialized, so concurrent retries create one charge.

    What happened is readable: :attr:`charges`, :attr:`requests`, :attr:`count`,
    :meth:`charges_by_key` and :meth:`charges_for`. Faults to test against are
    :meth:`fail_next` (an error before any effect), :meth:`answer_lost_next` (an effect whose
    answer is lost) and :attr:`delay` (a slow answer).

    The server listens on a real port, so bots in other processes can send to :attr:`url`::

        with FakePaymentApi() as pay:
            charge(pay.url, key="order-7", amount=100)
            charge(pay.url, key="order-7", amount=100)  # the same charge again
            assert pay.count == 1

    Args:
        host: The interface to listen on.
        port: The TCP port. ``0`` picks a free one.
        delay: Seconds every request waits before its answer goes out (see :attr:`delay`).

    Raises:
        ValueError: If ``delay`` is negative.
    """

    __slots__ = (
        "_answers_lost",
        "_by_key",
        "_charges",
        "_delay",
        "_failures",
        "_host",
        "_lock",
        "_port",
        "_requests",
        "_server",
        "_thread",
    )

    def __init__(self, *, host: str = "127.0.0.1", port: int = 0, delay: float = 0.0) -> None:
        self._host = host
        self._port = port
        self._lock = threading.Lock()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._charges: list[dict[str, Any]] = []
        self._by_key: dict[str, dict[str, Any]] = {}
        self._requests: list[PaymentRequest] = []
        self._failures: list[int] = []  # one status per request still to fail
        self._answers_lost = 0
        self._delay = 0.0
        self.delay = delay

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> FakePaymentApi:
        """Start serving in a daemon thread.

        Returns:
            This server.

        Raises:
            RuntimeError: If it is already running.
            OSError: If the port cannot be bound.
        """
        with self._lock:
            if self._server is not None:
                raise RuntimeError("FakePaymentApi is already running")
            server = _Server((self._host, self._port), self)
            self._port = server.server_address[1]
            self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"FakePaymentApi:{self._port}",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving, close connections and free the port.

        The recorded charges are kept. :meth:`start` serves them again on the same port.
        Calling :meth:`stop` on a stopped server does nothing.
        """
        with self._lock:
            server = self._server
            self._server = None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        server.cut_connections()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> FakePaymentApi:
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
        with self._lock:
            return self._server is not None

    @property
    def url(self) -> str:
        """The server root, e.g. ``"http://127.0.0.1:PORT"``.

        Raises:
            RuntimeError: If the server has not started yet and was given no port.
        """
        if not self._port:
            raise RuntimeError(
                "FakePaymentApi has no port yet: call start() (or use 'with FakePaymentApi() "
                "as pay:') before reading its url"
            )
        return f"http://{self._host}:{self._port}"

    # ------------------------------------------------------------------ records

    @property
    def charges(self) -> list[dict[str, Any]]:
        """Copies of the created charges, in the order they were created."""
        with self._lock:
            return copy.deepcopy(self._charges)

    @property
    def requests(self) -> list[PaymentRequest]:
        """Every request to the server, in arrival order, faulty ones included."""
        with self._lock:
            return list(self._requests)

    @property
    def count(self) -> int:
        """How many charges were created."""
        with self._lock:
            return len(self._charges)

    def charges_by_key(self) -> dict[str, dict[str, Any]]:
        """Copies of the created charges by their idempotency key.

        Returns:
            A dict from key to charge, in the order the charges were created.
        """
        with self._lock:
            return copy.deepcopy(self._by_key)

    def charges_for(self, reference: str | None) -> list[dict[str, Any]]:
        """Copies of the charges created with ``reference``, in the order they were created.

        Args:
            reference: The ``reference`` of the request body. :obj:`None` picks the charges
                made without one.

        Returns:
            The matching charges. More than one means the reference was charged twice under
            different keys.
        """
        with self._lock:
            return [copy.deepcopy(c) for c in self._charges if c["reference"] == reference]

    # ------------------------------------------------------------------ faults

    @property
    def delay(self) -> float:
        """Seconds every request waits before its answer goes out (a slow payment API).

        The wait comes after the request's effect. A charge already exists while its answer
        waits. A client that gives up or dies in that time leaves a charge behind. Set it at
        any time. ``0`` answers at once.
        """
        with self._lock:
            return self._delay

    @delay.setter
    def delay(self, seconds: float) -> None:
        seconds = float(seconds)
        if seconds < 0:
            raise ValueError("delay must be >= 0")
        with self._lock:
            self._delay = seconds

    def fail_next(self, n: int = 1, status: int = 500) -> None:
        """Make the next ``n`` requests fail before they have any effect.

        Each such request answers ``status`` with a JSON error of type ``"api_error"``. It
        creates no charge and uses up no key. A retry with the same key creates the charge
        then. The requests are recorded in :attr:`requests`. Calls add up. Failures queued
        here come before any :meth:`answer_lost_next`.

        Args:
            n: How many requests fail.
            status: Their HTTP status, from 400 to 599.

        Raises:
            ValueError: If ``n`` is below 1 or ``status`` is no error status.
        """
        if n < 1:
            raise ValueError("n must be >= 1")
        if not 400 <= status <= 599:
            raise ValueError("status must be an HTTP error status (400 to 599)")
        with self._lock:
            self._failures.extend([status] * n)

    def answer_lost_next(self, n: int = 1) -> None:
        """Make the next ``n`` requests that answer a charge lose their answer.

        The charge is created, or found for a known key, as usual. Then the server closes the
        connection without answering. The client sees an error and cannot tell whether the
        charge exists. This is a crash of the network after the effect. A retry with the same
        key and body gets the same charge and creates nothing. Requests answered with an
        error (400, 409 or :meth:`fail_next`) do not count. The lost answers are recorded in
        :attr:`requests` with the status :obj:`None`. Calls add up.

        Args:
            n: How many answers are lost.

        Raises:
            ValueError: If ``n`` is below 1.
        """
        if n < 1:
            raise ValueError("n must be >= 1")
        with self._lock:
            self._answers_lost += n

    # ------------------------------------------------------------------ serving

    def _handle(
        self, method: str, path: str, key: str | None, raw: bytes
    ) -> tuple[int | None, Any]:
        """The status and payload of one request. A status of :obj:`None` means no answer."""
        body = _decode(raw)
        path = path.split("?", 1)[0].rstrip("/")
        with self._lock:
            status: int | None
            charge_id: str | None = None
            try:
                if path != "/charges":
                    raise _Answer(404, "invalid_request_error", f"no route {path or '/'}")
                if method != "POST":
                    raise _Answer(405, "invalid_request_error", "use POST /charges")
                if self._failures:
                    code = self._failures.pop(0)
                    raise _Answer(code, "api_error", "injected failure (fail_next)")
                found = self._charge(key, body)
                charge_id = found["id"]
                payload: Any = copy.deepcopy(found)
                status = 200
                if self._answers_lost:
                    self._answers_lost -= 1
                    status = None
            except _Answer as answer:
                status, payload = answer.status, answer.payload
            self._requests.append(
                PaymentRequest(
                    key=key, body=body, status=status, time=time.time(), charge_id=charge_id
                )
            )
        return status, payload

    def _charge(self, key: str | None, body: Any) -> dict[str, Any]:
        """The charge of ``key``, created if the key is new. The caller holds the lock."""
        if not key:
            raise _Answer(400, "invalid_request_error", "the Idempotency-Key header is required")
        if len(key) > MAX_KEY_LENGTH:
            raise _Answer(
                400,
                "invalid_request_error",
                f"the Idempotency-Key is longer than {MAX_KEY_LENGTH} characters",
            )
        parameters = _parameters(body)
        known = self._by_key.get(key)
        if known is not None:
            if any(known[name] != value for name, value in parameters.items()):
                raise _Answer(
                    409,
                    "idempotency_error",
                    "this Idempotency-Key was used with other parameters",
                )
            return known
        created = {"id": f"ch_{len(self._charges) + 1}", **parameters, "idempotency_key": key}
        self._charges.append(created)
        self._by_key[key] = created
        return created


# ---------------------------------------------------------------------- clients


def _request(
    key: str, amount: int, currency: str, reference: str | None
) -> tuple[dict[str, str], dict[str, Any]]:
    if not isinstance(key, str) or not key:
        raise ValueError("key must be a non-empty string")
    body: dict[str, Any] = {"amount": amount, "currency": currency}
    if reference is not None:
        body["reference"] = reference
    return {"Idempotency-Key": key}, body


def _charges_url(url: str) -> str:
    return url.rstrip("/") + "/charges"


def _result(response: httpx.Response) -> dict[str, Any]:
    try:
        decoded: Any = response.json()
    except ValueError:
        decoded = None
    if not response.is_success:
        message = ""
        if isinstance(decoded, Mapping) and isinstance(decoded.get("error"), Mapping):
            message = str(decoded["error"].get("message", ""))
        raise PaymentError(
            f"charge failed with HTTP {response.status_code}"
            + (f": {message}" if message else ""),
            response.status_code,
            decoded,
        )
    if not isinstance(decoded, dict):
        raise PaymentError("charge answered no JSON object", response.status_code, decoded)
    return decoded


def _no_answer(error: httpx.HTTPError) -> PaymentError:
    return PaymentError(
        f"charge got no answer, retry with the same key to learn whether it was applied "
        f"({type(error).__name__}: {str(error).rstrip('.')})",
        None,
    )


def charge(
    url: str,
    key: str,
    amount: int,
    currency: str = "XTR",
    reference: str | None = None,
    timeout: float = 5.0,
) -> dict[str, Any]:
    """Charge through a :class:`FakePaymentApi` and wait for the answer.

    Use the same ``key`` for every retry of one payment, e.g. an effect key. The API then
    applies it once.

    Args:
        url: The server root, :attr:`FakePaymentApi.url`.
        key: The idempotency key, sent as the ``Idempotency-Key`` header.
        amount: The amount, a positive integer in the currency's smallest unit.
        currency: The currency code. ``"XTR"`` is Telegram Stars.
        reference: Your own reference for the charge, e.g. an order id.
        timeout: Seconds to wait for the connection and for the answer.

    Returns:
        The charge, with ``id``, ``amount``, ``currency``, ``reference`` and
        ``idempotency_key``.

    Raises:
        PaymentError: If the answer is no success (its ``status`` is set) or no answer
            arrived (its ``status`` is :obj:`None`).
        ValueError: If ``key`` is empty.
    """
    headers, body = _request(key, amount, currency, reference)
    try:
        with httpx.Client(timeout=timeout) as client:
            response = client.post(_charges_url(url), json=body, headers=headers)
    except httpx.HTTPError as error:
        raise _no_answer(error) from error
    return _result(response)


async def charge_async(
    url: str,
    key: str,
    amount: int,
    currency: str = "XTR",
    reference: str | None = None,
    timeout: float = 5.0,
) -> dict[str, Any]:
    """Charge through a :class:`FakePaymentApi` without blocking the event loop.

    It takes the same arguments as :func:`charge` and behaves the same.

    Args:
        url: The server root, :attr:`FakePaymentApi.url`.
        key: The idempotency key, sent as the ``Idempotency-Key`` header.
        amount: The amount, a positive integer in the currency's smallest unit.
        currency: The currency code. ``"XTR"`` is Telegram Stars.
        reference: Your own reference for the charge, e.g. an order id.
        timeout: Seconds to wait for the connection and for the answer.

    Returns:
        The charge, with ``id``, ``amount``, ``currency``, ``reference`` and
        ``idempotency_key``.

    Raises:
        PaymentError: If the answer is no success (its ``status`` is set) or no answer
            arrived (its ``status`` is :obj:`None`).
        ValueError: If ``key`` is empty.
    """
    headers, body = _request(key, amount, currency, reference)
    try:
        async with httpx.AsyncClient(timeout=timeout) as client:
            response = await client.post(_charges_url(url), json=body, headers=headers)
    except httpx.HTTPError as error:
        raise _no_answer(error) from error
    return _result(response)
