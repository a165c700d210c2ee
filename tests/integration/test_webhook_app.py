"""webhook_app: under a real WSGI server (wsgiref) and with hand-made environs."""

from __future__ import annotations

import http.client
import io
import json
import threading
import time
from typing import Any, Dict, Iterator, List, Optional, Tuple
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import pytest

from ptb_fence import MemoryUpdateStore, UpdateIntake, webhook_app
from ptb_fence.contract import DURABLE_METHODS
from runtime_support import FakeClock, StoreDown, StoreWrapper, body, row

SECRET = "s3cr3t_Token-42"


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, *args: Any) -> None:  # keep test output clean
        pass


class Server:
    """A wsgiref server on 127.0.0.1 (free port) in a thread."""

    def __init__(self, app: Any) -> None:
        self.httpd: WSGIServer = make_server("127.0.0.1", 0, app, handler_class=_QuietHandler)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05})
        self.thread.daemon = True
        self.thread.start()

    def request(
        self,
        method: str,
        payload: Optional[bytes] = None,
        headers: Optional[Dict[str, str]] = None,
    ) -> Tuple[int, Dict[str, str], bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
        try:
            conn.request(method, "/telegram", body=payload, headers=headers or {})
            response = conn.getresponse()
            return response.status, dict(response.getheaders()), response.read()
        finally:
            conn.close()

    def post(self, payload: bytes, secret: Optional[str] = SECRET) -> Tuple[int, Dict[str, str], bytes]:
        headers = {"Content-Type": "application/json"}
        if secret is not None:
            headers["X-Telegram-Bot-Api-Secret-Token"] = secret
        return self.request("POST", payload, headers)

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(5)


@pytest.fixture
def served(intakes) -> Iterator[Tuple[Server, StoreWrapper, UpdateIntake, List[Any]]]:
    store = StoreWrapper(methods=DURABLE_METHODS)  # the seed's levels: one add per update
    runs: List[Any] = []
    intake = UpdateIntake(store, handle=runs.append, clock=FakeClock())
    intakes.append(intake)
    intake.start()
    server = Server(webhook_app(intake, secret_token=SECRET, max_body_bytes=4096))
    yield server, store, intake, runs
    server.close()


class ExplodingInput:
    """A wsgi.input that fails the test if anything reads it."""

    def __init__(self) -> None:
        self.touched = False

    def _boom(self, *args: Any) -> bytes:
        self.touched = True
        raise AssertionError("the body was read")

    read = readline = readlines = _boom

    def __iter__(self) -> Any:
        return self._boom()


def call(app: Any, environ: Dict[str, Any]) -> Tuple[str, Dict[str, str], bytes]:
    seen: Dict[str, Any] = {}

    def start_response(status: str, headers: List[Tuple[str, str]], exc_info: Any = None) -> Any:
        seen["status"], seen["headers"] = status, dict(headers)
        return lambda data: None

    result = b"".join(app(environ, start_response))
    return seen["status"], seen["headers"], result


def environ(
    method: str = "POST",
    secret: Optional[str] = SECRET,
    payload: Optional[bytes] = None,
    stream: Any = None,
    content_length: Optional[str] = None,
) -> Dict[str, Any]:
    env: Dict[str, Any] = {
        "REQUEST_METHOD": method,
        "PATH_INFO": "/",
        "SERVER_NAME": "test",
        "SERVER_PORT": "80",
        "wsgi.url_scheme": "http",
        "wsgi.input": stream if stream is not None else io.BytesIO(payload or b""),
    }
    if content_length is not None:
        env["CONTENT_LENGTH"] = content_length
    elif payload is not None:
        env["CONTENT_LENGTH"] = str(len(payload))
    if secret is not None:
        env["HTTP_X_TELEGRAM_BOT_API_SECRET_TOKEN"] = secret
    return env


# -- over a real WSGI server ------------------------------------------------------------------
@pytest.mark.parametrize("method", ["GET", "PUT", "DELETE"])
def test_non_post_is_405_with_allow_post(served, method: str) -> None:  # noqa: ANN001
    server, store, _, _ = served
    status, headers, _ = server.request(method, headers={"X-Telegram-Bot-Api-Secret-Token": SECRET})
    assert status == 405 and headers["Allow"] == "POST"
    assert store.count("add") == 0


@pytest.mark.parametrize("secret", [None, "", "wrong", SECRET + "x", SECRET.lower(), SECRET[:-1] + "3"])
def test_wrong_or_missing_secret_is_403_and_nothing_stored(served, secret: Optional[str]) -> None:  # noqa: ANN001
    server, store, _, _ = served
    status, _, _ = server.post(body(1).encode(), secret=secret)
    assert status == 403
    assert store.count("add") == 0 and row(store, 1) is None


def test_accepted_then_duplicate_are_200_and_the_row_exists_at_200(served) -> None:  # noqa: ANN001
    server, store, intake, runs = served

    def slow_add(original: Any, *args: Any) -> Any:
        time.sleep(0.05)  # a slow commit: the answer must still come after it
        return original(*args)

    store.hooks["add"] = slow_add
    status, _, reply = server.post(body(7).encode())
    assert status == 200 and reply.strip() == b"accepted"
    assert row(store, 7) is not None  # committed before the 200
    status, _, reply = server.post(body(7).encode())
    assert status == 200 and reply.strip() == b"duplicate"
    assert intake.idle(5)
    assert [u["update_id"] for u in runs] == [7]
    assert row(store, 7).state == "completed"


@pytest.mark.parametrize(
    "payload",
    [b"not json", b"[]", b"{}", b'{"update_id": -5}', b'{"update_id": "5"}', b"\xff\xfe"],
)
def test_invalid_body_is_400_and_nothing_stored(served, payload: bytes) -> None:  # noqa: ANN001
    server, store, _, _ = served
    status, _, _ = server.post(payload)
    assert status == 400
    assert store.count("add") == 0


def test_body_over_the_bound_is_413(served) -> None:  # noqa: ANN001
    server, store, _, _ = served
    big = json.dumps({"update_id": 1, "pad": "x" * 5000}).encode()
    status, _, _ = server.post(big)
    assert status == 413
    assert store.count("add") == 0


def test_store_failure_is_5xx_and_nothing_stored_then_redelivery_works(served) -> None:  # noqa: ANN001
    server, store, intake, runs = served
    store.fail["add"] = StoreDown("database unavailable")
    status, headers, _ = server.post(body(3).encode())
    assert 500 <= status < 600
    assert row(store, 3) is None
    del store.fail["add"]
    status, _, _ = server.post(body(3).encode())  # Telegram redelivers
    assert status == 200
    assert intake.idle(5)
    assert [u["update_id"] for u in runs] == [3]


# -- direct environ calls ---------------------------------------------------------------------
@pytest.fixture
def app_and_store() -> Tuple[Any, StoreWrapper]:
    store = StoreWrapper(methods=DURABLE_METHODS)
    intake = UpdateIntake(store, handle=lambda u: None, clock=FakeClock())  # not started
    return webhook_app(intake, secret_token=SECRET), store


@pytest.mark.parametrize("secret", [None, "", "nope", SECRET.upper(), "é" + SECRET])
def test_403_does_not_read_the_body(app_and_store, secret: Optional[str]) -> None:  # noqa: ANN001
    app, store = app_and_store
    stream = ExplodingInput()
    status, _, _ = call(app, environ(secret=secret, stream=stream, content_length="20"))
    assert status.startswith("403")
    assert not stream.touched
    assert store.count("add") == 0


def test_405_does_not_read_the_body(app_and_store) -> None:  # noqa: ANN001
    app, _ = app_and_store
    stream = ExplodingInput()
    status, headers, _ = call(app, environ(method="GET", stream=stream, content_length="20"))
    assert status.startswith("405") and headers["Allow"] == "POST"
    assert not stream.touched


def test_huge_content_length_is_413_without_reading(app_and_store) -> None:  # noqa: ANN001
    app, store = app_and_store
    stream = ExplodingInput()
    status, _, _ = call(app, environ(stream=stream, content_length=str(10**12)))
    assert status.startswith("413")
    assert not stream.touched and store.count("add") == 0


@pytest.mark.parametrize(
    ("content_length", "payload", "expected"),
    [
        ("abc", b"{}", "400"),
        ("-1", b"{}", "400"),
        ("100", b'{"update_id": 1}', "400"),  # the body ends early
        (None, b"", "411"),  # no Content-Length and no terminated input
    ],
)
def test_bad_content_length(app_and_store, content_length, payload, expected) -> None:  # noqa: ANN001
    app, store = app_and_store
    env = environ(payload=payload)
    env.pop("CONTENT_LENGTH", None)
    if content_length is not None:
        env["CONTENT_LENGTH"] = content_length
    status, _, _ = call(app, env)
    assert status.startswith(expected)
    assert store.count("add") == 0


def test_direct_call_accepts_and_records(app_and_store) -> None:  # noqa: ANN001
    app, store = app_and_store
    payload = body(11).encode()
    status, _, reply = call(app, environ(payload=payload))
    assert status.startswith("200") and reply.strip() == b"accepted"
    assert row(store, 11).body == payload.decode()
    status, _, reply = call(app, environ(payload=payload))
    assert status.startswith("200") and reply.strip() == b"duplicate"


@pytest.mark.parametrize(
    "secret",
    ["", "has space", "a" * 257, "é", "semi;colon", b"bytes", None, 123],
    ids=repr,
)
def test_invalid_secret_token_argument(secret: Any) -> None:
    intake = UpdateIntake(MemoryUpdateStore(), handle=lambda u: None)
    with pytest.raises(ValueError, match="secret_token"):
        webhook_app(intake, secret_token=secret)


def test_valid_secret_token_edge_lengths() -> None:
    intake = UpdateIntake(MemoryUpdateStore(), handle=lambda u: None)
    webhook_app(intake, secret_token="a")
    webhook_app(intake, secret_token="A-z_0" * 51 + "x")  # 256 characters


@pytest.mark.parametrize("bound", [0, -1, True, 1.5])
def test_invalid_max_body_bytes(bound: Any) -> None:
    intake = UpdateIntake(MemoryUpdateStore(), handle=lambda u: None)
    with pytest.raises(ValueError, match="max_body_bytes"):
        webhook_app(intake, secret_token=SECRET, max_body_bytes=bound)


def test_an_intake_without_accept_is_refused() -> None:
    with pytest.raises(TypeError, match="accept"):
        webhook_app(object(), secret_token=SECRET)


def test_concurrent_posts_of_the_same_update_record_it_once(intakes) -> None:
    from socketserver import ThreadingMixIn

    class ThreadingServer(ThreadingMixIn, WSGIServer):
        daemon_threads = True
        # a listen backlog for all 16 posters at once: socketserver's default of 5 let the
        # kernel fall back to SYN cookies and drop (reset) connections whenever this thread was
        # slow to accept, e.g. on a loaded machine
        request_queue_size = 64

    store = StoreWrapper()
    runs: List[Any] = []
    lock = threading.Lock()

    def handle(update: Any) -> None:
        with lock:
            runs.append(update["update_id"])

    intake = UpdateIntake(store, handle=handle, clock=FakeClock())
    intakes.append(intake)
    intake.start()
    app = webhook_app(intake, secret_token=SECRET)
    httpd = make_server("127.0.0.1", 0, app, server_class=ThreadingServer, handler_class=_QuietHandler)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    server = Server.__new__(Server)
    server.httpd, server.port, server.thread = httpd, httpd.server_address[1], thread
    answers: List[Tuple[int, bytes]] = []

    def post(uid: int) -> None:
        status, _, reply = server.post(body(uid).encode())
        with lock:
            answers.append((status, reply.strip()))

    try:
        posters = [threading.Thread(target=post, args=(uid,)) for uid in [5] * 8 + list(range(10, 18))]
        for poster in posters:
            poster.start()
        for poster in posters:
            poster.join(10)
    finally:
        server.close()
    assert intake.idle(5)
    assert all(status == 200 for status, _ in answers) and len(answers) == 16
    replies = [reply for _, reply in answers]
    assert replies.count(b"accepted") == 9 and replies.count(b"duplicate") == 7
    assert sorted(runs) == [5] + list(range(10, 18))
