"""Hostile input at intake: refused clearly or recorded once, never stored as garbage or lost.

- Property-based fuzzing (hypothesis) of ``UpdateIntake.accept`` (bytes and str bodies, SQLite
  and memory stores), of ``webhook_app`` called directly with crafted environs (bodies, secrets,
  methods, Content-Length / Content-Type, terminated input) and through a real threaded wsgiref
  server, and of PTB's own webhook (``app.updater.start_webhook``) with the durable queue of a
  ``FencedUpdateProcessor`` over SQLite. Garbage is never stored (and, for ptb_fence's own
  intake, never answered 2xx); a valid update is stored exactly once, as received, with 200; the
  servers keep answering afterwards.
- SQL identifiers: bad table names are a ``ValueError`` before any SQL (SQLite file never
  created; no PostgreSQL table created or dropped).
- Secrets: compared with ``hmac.compare_digest``; never logged. DSN passwords: never in errors,
  reprs or logs.

Bodies are built by construction as valid (with the ``update_id`` they carry) or invalid; the
test never asks the code under test what is valid.
"""

from __future__ import annotations

import hmac
import io
import json
import logging
import os
import re
import socket
import sqlite3
import threading
import time
import traceback
import uuid
from collections import Counter
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Optional, Tuple

import psycopg2
import psycopg2.pool
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ptb_fence import (
    MemoryUpdateStore,
    PostgresUpdateStore,
    SQLiteUpdateStore,
    UpdateIntake,
    postgres_update_store_schema,
    webhook_app,
)
from ptb_fence.testing import FakeBotApi
from intake_http_support import PtbWebhookThread, ThreadedWsgi, domain_counts, http_post, table_rows

MAX_ID = 2**63 - 1
SECRET = "s3cr3t_Token-42"
HUGE = 2**62  # "now" / "pending_before" far in the future: due() lists every pending row
FUZZ = settings(
    deadline=None,
    database=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.large_base_example,
    ],
)


# -- bodies, built as valid or invalid by construction ------------------------------------------
@dataclass(frozen=True)
class Body:
    """A request body and what it is: ``uid`` is the update_id of a valid update, else None."""

    kind: str
    raw: bytes
    uid: Optional[int] = None

    def __repr__(self) -> str:  # keep hypothesis reports readable for 1 MiB bodies
        shown = self.raw if len(self.raw) <= 160 else self.raw[:120] + b"...(%d bytes)" % len(self.raw)
        return f"Body({self.kind}, {shown!r}, uid={self.uid})"


json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)  # any unicode, incl. NUL, emoji, RTL; never lone surrogates
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=5,
)
valid_ids = st.one_of(
    st.integers(min_value=0, max_value=MAX_ID),
    st.sampled_from([0, 1, 2**31 - 1, 2**31, 2**32, 2**53 + 1, 2**62, MAX_ID]),
)


def _dump(obj: Any, style: str, ensure_ascii: bool) -> str:
    if style == "compact":
        return json.dumps(obj, ensure_ascii=ensure_ascii, separators=(",", ":"))
    if style == "indent":
        return json.dumps(obj, ensure_ascii=ensure_ascii, indent=2)
    return json.dumps(obj, ensure_ascii=ensure_ascii)


@st.composite
def update_texts(draw: Any, key_prefix: str = "") -> Tuple[int, str]:
    """``(update_id, json_text)`` of a valid update with random extra fields anywhere."""
    uid = draw(valid_ids)
    keys = (
        st.text(min_size=1, max_size=12)
        .map(lambda k: key_prefix + k)
        .filter(lambda k: k != "update_id")
    )
    pairs = list(draw(st.dictionaries(keys, json_values, max_size=4)).items())
    pairs.insert(draw(st.integers(0, len(pairs))), ("update_id", uid))
    style = draw(st.sampled_from(["compact", "default", "indent"]))
    return uid, _dump(dict(pairs), style, draw(st.booleans()))


def valid_bodies(key_prefix: str = "") -> Any:
    return update_texts(key_prefix).map(lambda t: Body("valid", t[1].encode("utf-8"), t[0]))


BAD_ID_TOKENS = [
    "-1", "-9223372036854775808", str(2**63), str(2**64), "1" + "0" * 400, "-" + "9" * 30,
    "1.0", "0.0", "-0.0", "1e3", "1E3", "1e400", "-1e400", "5.5", "NaN", "Infinity", "-Infinity",
    "true", "false", "null", '"5"', '" 5"', '"abc"', '""', "[5]", "[]", "{}", '{"update_id": 5}',
]
bad_id_tokens = st.one_of(
    st.sampled_from(BAD_ID_TOKENS),
    st.integers(max_value=-1).map(str),
    st.integers(min_value=2**63, max_value=2**80).map(str),
    st.floats().map(json.dumps),  # 1.0, 1e+16, NaN, Infinity, ...: never an int
    json_values.filter(lambda v: not (type(v) is int and 0 <= v <= MAX_ID)).map(json.dumps),
)


@st.composite
def bad_id_bodies(draw: Any, tokens: Any = bad_id_tokens) -> Body:
    """An object whose update_id is present but not an int in [0, 2**63-1]."""
    token = draw(tokens)
    _, text = draw(update_texts())
    obj = json.loads(text)
    obj.pop("update_id")
    rest = json.dumps(obj)[1:]  # '}' or '"k": v, ...}'
    if draw(st.booleans()) or rest == "}":
        raw = '{"update_id": ' + token + ("" if rest == "}" else ", ") + rest
    else:  # the bad value last; as a duplicate key it also hides an earlier valid one
        valid_first = '"update_id": %d, ' % draw(valid_ids) if draw(st.booleans()) else ""
        raw = "{" + valid_first + rest[:-1] + ', "update_id": ' + token + "}"
    return Body("bad_id", raw.encode("utf-8"))


@st.composite
def duplicate_key_bodies(draw: Any) -> Body:
    """A bad update_id followed by a valid one: JSON parsers keep the last (json, PTB, jsonb)."""
    uid, text = draw(update_texts())
    obj = json.loads(text)
    del obj["update_id"]
    obj["update_id"] = uid  # last
    shadowed = [t for t in BAD_ID_TOKENS if t not in ("NaN", "Infinity", "-Infinity")]
    token = draw(st.sampled_from(shadowed))
    return Body("valid", ('{"update_id": ' + token + ", " + json.dumps(obj)[1:]).encode(), uid)


not_objects = st.one_of(
    st.lists(json_values, max_size=4),
    json_scalars,
    st.just([{"update_id": 5}]),
).map(lambda v: Body("not_object", json.dumps(v).encode()))
near_miss_keys = st.sampled_from(
    [
        "Update_id", "update_id ", " update_id", "update-id", "updateId", "update_ID",
        "update_id\x00", "ｕpdate_id",
    ]
)
missing_id = st.one_of(
    st.dictionaries(st.text(max_size=10).filter(lambda k: k != "update_id"), json_values, max_size=5),
    st.builds(lambda k, v: {k: v}, near_miss_keys, valid_ids),
    valid_ids.map(lambda i: {"update": {"update_id": i}}),
).map(lambda d: Body("missing_id", json.dumps(d).encode()))
BAD_UTF8 = [
    b"\xff", b"\xfe", b"\xc0\xaf", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80", b"\xe2\x82", b"\x80",
    b"\xf4\x90\x80\x80",
]


@st.composite
def not_utf8(draw: Any) -> Body:
    uid, text = draw(update_texts())
    raw = json.dumps(json.loads(text) | {"zz": "Ω"}, ensure_ascii=False).encode()
    cut = raw.index("Ω".encode())  # inside a string value
    bad = draw(st.sampled_from(BAD_UTF8))
    return Body("not_utf8", raw[:cut] + bad + raw[cut:])


latin1 = valid_ids.map(
    lambda i: Body("not_utf8", ('{"update_id": %d, "t": "caf\xe9"}' % i).encode("latin-1"))
)
random_bytes = st.binary(max_size=200).filter(lambda b: not b.strip().startswith(b"{")).map(
    lambda b: Body("random", b)
)


@st.composite
def deep(draw: Any) -> Body:
    shape = draw(st.sampled_from(["list", "object", "inside"]))
    depth = draw(st.sampled_from([200, 10**4, 10**5] if shape == "inside" else [10**3, 10**4, 10**5]))
    if shape == "list":
        raw = "[" * depth + "]" * depth
    elif shape == "object":
        raw = '{"a":' * depth + "1" + "}" * depth
    else:  # a well-formed update with one absurdly deep field: refused, never a crash
        raw = '{"update_id": %d, "x": ' % draw(valid_ids) + "[" * depth + "]" * depth + "}"
    if shape == "inside" and depth < 10**4:
        return Body("deep_ok", raw.encode(), json.loads(raw)["update_id"])
    return Body("deep", raw.encode())


FRAMINGS = ["trailing", "two", "bom", "nul", "ctrl", "truncated", "nan_field", "big_int_field"]


@st.composite
def framing(draw: Any, how: str) -> Body:
    """Valid JSON text made invalid by what surrounds it (``how``)."""
    uid, text = draw(update_texts())
    compact = text.strip()
    if how == "trailing":
        raw = compact + draw(st.sampled_from([" x", ",", "}", "]", " 1", "\x00", "//c"]))
    elif how == "two":
        raw = compact + compact
    elif how == "bom":
        raw = "\ufeff" + compact
    elif how == "nul":
        raw = compact[:-1] + ', "n": "a\x00b"}' if compact != "{}" else "{\x00}"
    elif how == "ctrl":  # a raw control character inside a string (JSON requires escapes)
        raw = compact[:-1] + ', "c": "a' + draw(st.sampled_from(["\x01", "\n", "\t", "\x1f"])) + 'b"}'
    elif how == "truncated":
        raw = compact[: draw(st.integers(0, len(compact) - 1))]
    elif how == "nan_field":
        raw = compact[:-1] + ', "f": ' + draw(st.sampled_from(["NaN", "Infinity", "-Infinity"])) + "}"
    else:  # an integer Python refuses to parse (over 4300 digits)
        raw = compact[:-1] + ', "n": 1' + "0" * 5000 + "}"
    return Body(how, raw.encode("utf-8"))


GARBAGE_TEXTS = [
    b"", b" ", b"\n", b"\x00", b"null", b"0", b"[]", b"{}", b'""', b"false", b"{", b"}", b"nope",
]


def pick(*choices: Any) -> Any:
    """Each of ``choices`` (strategies) equally often (hypothesis' one_of favours early ones)."""
    return st.sampled_from(choices).flatmap(lambda strategy: strategy)


def weighted(percent: int, first: Any, other: Any) -> Any:
    """``first`` in about ``percent`` % of the examples, else ``other``."""
    return st.integers(0, 99).flatmap(lambda n: first if n < percent else other)


garbage = pick(
    bad_id_bodies(),
    bad_id_bodies(),
    not_objects,
    missing_id,
    not_utf8(),
    latin1,
    random_bytes,
    deep(),
    st.sampled_from(GARBAGE_TEXTS).map(lambda b: Body("literal", b)),
    *[framing(how) for how in FRAMINGS],
)
valid = pick(valid_bodies(), valid_bodies(), duplicate_key_bodies())
bodies = weighted(35, valid, garbage)


def pending_ids(store: Any) -> "Counter[int]":
    return Counter(r.update_id for r in store.due(now=HUGE, pending_before=HUGE, limit=10**6))


# -- UpdateIntake.accept ------------------------------------------------------------------------
@pytest.fixture(params=["sqlite", "memory"])
def unstarted_intake(request: Any, tmp_path: Any) -> Iterator[UpdateIntake]:
    """An intake that is never started: every recorded update stays pending (due lists it)."""
    store: Any = (
        SQLiteUpdateStore(str(tmp_path / "u.db")) if request.param == "sqlite" else MemoryUpdateStore()
    )
    intake = UpdateIntake(store, handle=lambda update: None)
    yield intake
    intake.close()
    store.close()


@settings(FUZZ, max_examples=200)
@given(body=bodies, as_str=st.booleans())
def test_accept_stores_valid_updates_once_and_never_garbage(
    unstarted_intake: UpdateIntake, body: Body, as_str: bool
) -> None:
    intake, store = unstarted_intake, unstarted_intake.store
    before = pending_ids(store)
    payload: Any = body.raw
    if as_str:
        try:
            payload = body.raw.decode("utf-8")
        except UnicodeDecodeError:
            pass
    result = intake.accept(payload)
    after = pending_ids(store)
    if body.uid is None:
        assert result == "invalid", body
        assert after == before, "garbage was stored"
        return
    fresh = body.uid not in before
    assert result == ("accepted" if fresh else "duplicate"), body
    assert after == (before + Counter([body.uid]) if fresh else before)
    assert max(after.values(), default=0) <= 1
    if fresh:  # recorded as received
        stored = {r.update_id: r.body for r in store.due(now=HUGE, pending_before=HUGE, limit=10**6)}
        assert stored[body.uid] == body.raw.decode("utf-8")
    assert intake.accept(payload) == "duplicate"  # a redelivery never makes a second row
    assert pending_ids(store) == after


@pytest.mark.parametrize(
    "text",
    [
        '{"update_id": 1, "x": "\ud800"}',  # a lone surrogate: not encodable as UTF-8
        '{"update_id": 2, "x": "\udfff\ud800"}',
        '{"update_id": 3, "f": NaN}',
        '{"update_id": 4, "f": -Infinity}',
    ],
)
def test_str_bodies_that_no_store_can_hold_are_invalid_not_a_store_error(
    unstarted_intake: UpdateIntake, text: str
) -> None:
    # regression: a lone surrogate reached the store and raised UnicodeEncodeError from accept()
    # (which means "store down, do not acknowledge"); NaN/Infinity are not JSON
    assert unstarted_intake.accept(text) == "invalid"
    assert pending_ids(unstarted_intake.store) == Counter()


def test_escaped_oddities_in_valid_json_are_kept_as_received(unstarted_intake: UpdateIntake) -> None:
    text = '{"update_id": 9, "a": "\\ud800", "b": "\\u0000", "c": "\\ud83d\\ude00", "d": -0.0}'
    assert unstarted_intake.accept(text.encode()) == "accepted"
    [row] = unstarted_intake.store.due(now=HUGE, pending_before=HUGE, limit=10)
    assert (row.update_id, row.body) == (9, text)


# -- webhook_app, called directly ---------------------------------------------------------------
class SpyInput:
    """A ``wsgi.input`` that counts reads."""

    def __init__(self, data: bytes) -> None:
        self._io = io.BytesIO(data)
        self.reads = 0

    def read(self, *args: Any) -> bytes:
        self.reads += 1
        return self._io.read(*args)

    def readline(self, *args: Any) -> bytes:
        self.reads += 1
        return self._io.readline(*args)


def call(app: Any, environ: Dict[str, Any]) -> Tuple[int, Dict[str, str], bytes]:
    seen: Dict[str, Any] = {}

    def start_response(status: str, headers: List[Tuple[str, str]], exc_info: Any = None) -> Any:
        seen["status"], seen["headers"] = status, dict(headers)
        return lambda data: None

    reply = b"".join(app(environ, start_response))
    assert seen["headers"]["Content-Length"] == str(len(reply))
    return int(seen["status"].split()[0]), seen["headers"], reply


def _over_the_wire(value: str) -> str:
    """A header value as a WSGI server hands it over: the UTF-8 bytes decoded as latin-1."""
    return value.encode("utf-8").decode("latin-1")


wrong_secrets = st.one_of(
    st.sampled_from(
        [
            "",
            SECRET[:-1],
            SECRET + "x",
            SECRET.upper(),
            SECRET.lower(),
            " " + SECRET,
            SECRET + " ",
            SECRET + "\x00",
            "x" * 10_000,
            SECRET * 20,
            "s3cr3t_Token-4\u0662",  # a non-ASCII digit in the last place
        ]
        + [SECRET[:-1] + c for c in "0123456789ABZabz_-" if c != SECRET[-1]]
    ),
    st.text(alphabet="ABCabc0189_-", min_size=1, max_size=300),
    st.text(min_size=1, max_size=40),  # unicode
).filter(lambda s: s != SECRET)
secrets_given = weighted(70, st.just(SECRET), pick(st.none(), wrong_secrets))
wire_secrets = secrets_given.filter(lambda s: s is None or all(c >= " " or c == "\t" for c in s))
METHODS = ["GET", "PUT", "DELETE", "HEAD", "OPTIONS", "PATCH", "BREW", "post"]
CONTENT_TYPES = [None, "application/json", "text/plain", "application/x-www-form-urlencoded",
                 "application/json; charset=latin-1", "multipart/form-data; boundary=x", "\u00ff/\u00ff"]
BAD_LENGTHS = ["abc", "-1", "+5", "1_0", "0x10", "1e3", "5 5", "\u0665", "\u00b2", "1.0", "--1"]


@st.composite
def requests(draw: Any) -> Tuple[Dict[str, Any], SpyInput, Body, Tuple[int, ...]]:
    """A crafted environ, its input stream, the body, and the acceptable status codes.

    The expected statuses follow the webhook's checks in order: method, secret (before reading),
    Content-Length, size bound, validity.
    """
    big = Body("big", b'{"update_id": 1, "x": "' + b"a" * (1 << 20) + b'"}')  # a valid update, 1 MiB+
    body = draw(weighted(93, bodies, st.just(big)))
    method = draw(weighted(85, st.just("POST"), st.sampled_from(METHODS)))
    secret = draw(secrets_given)
    other_modes = st.sampled_from(["missing", "bad", "huge", "short", "long", "padded"])
    length_mode = draw(weighted(55, st.just("exact"), other_modes))
    terminated = draw(st.booleans())
    stream_data = body.raw
    env: Dict[str, Any] = {
        "REQUEST_METHOD": method,
        "PATH_INFO": "/telegram",
        "SERVER_NAME": "test",
        "SERVER_PORT": "80",
        "wsgi.url_scheme": "http",
    }
    if terminated:
        env["wsgi.input_terminated"] = True
    ctype = draw(st.sampled_from(CONTENT_TYPES))
    if ctype is not None:
        env["CONTENT_TYPE"] = _over_the_wire(ctype)
    if secret is not None:
        env["HTTP_X_TELEGRAM_BOT_API_SECRET_TOKEN"] = _over_the_wire(secret)
    noise = st.sampled_from(["HTTP_X_FORWARDED_FOR", "HTTP_COOKIE", "QUERY_STRING"])
    env.update(draw(st.dictionaries(noise, st.text(max_size=20).map(_over_the_wire), max_size=2)))
    too_big = len(body.raw) > 1024 * 1024
    expected: Tuple[int, ...]
    if length_mode == "exact":
        env["CONTENT_LENGTH"] = str(len(body.raw))
        expected = (413,) if too_big else ((200,) if body.uid is not None else (400,))
    elif length_mode == "padded":
        before_digits = draw(st.sampled_from([" ", "\t", "0", "00"]))
        after_digits = draw(st.sampled_from(["", " ", "\t"]))
        env["CONTENT_LENGTH"] = before_digits + str(len(body.raw)) + after_digits
        expected = (413,) if too_big else ((200,) if body.uid is not None else (400,))
    elif length_mode == "missing":
        if draw(st.booleans()):
            env["CONTENT_LENGTH"] = draw(st.sampled_from(["", " "]))
        if not terminated:
            expected = (411,)
        else:
            expected = (413,) if too_big else ((200,) if body.uid is not None else (400,))
    elif length_mode == "bad":
        env["CONTENT_LENGTH"] = _over_the_wire(draw(st.sampled_from(BAD_LENGTHS)))
        expected = (400,)
    elif length_mode == "huge":
        huge = [str(1024 * 1024 + 1), str(10**12), "9" * 50, "9" * 5000]
        env["CONTENT_LENGTH"] = draw(st.sampled_from(huge))
        expected = (413,)
    elif length_mode == "short":
        # a valid update cut short: never a whole JSON object, so never stored
        body = draw(valid_bodies())
        stream_data = body.raw.strip()
        env["CONTENT_LENGTH"] = str(draw(st.integers(0, len(stream_data) - 1)))
        body = Body("truncated", stream_data)  # what the app sees is a prefix: invalid
        expected = (400,)
    else:  # "long": the stream ends before Content-Length bytes
        claimed = len(body.raw) + draw(st.integers(1, 1000))
        env["CONTENT_LENGTH"] = str(claimed)
        expected = (413,) if claimed > 1024 * 1024 else (400,)
    if method.upper() != "POST":  # a lowercase "post" is taken as POST
        expected = (405,)
    elif secret != SECRET:
        expected = (403,)
    stream = SpyInput(stream_data)
    env["wsgi.input"] = stream
    return env, stream, body, expected


@pytest.fixture
def direct_app(tmp_path: Any) -> Iterator[Tuple[Any, UpdateIntake]]:
    store = SQLiteUpdateStore(str(tmp_path / "w.db"))
    intake = UpdateIntake(store, handle=lambda update: None)  # not started: rows stay pending
    yield webhook_app(intake, secret_token=SECRET), intake
    intake.close()
    store.close()


@settings(FUZZ, max_examples=300)
@given(request=requests())
def test_webhook_app_direct_fuzz(direct_app: Tuple[Any, UpdateIntake], request: Any) -> None:
    app, intake = direct_app
    env, stream, body, expected = request
    before = pending_ids(intake.store)
    status, headers, reply = call(app, env)
    after = pending_ids(intake.store)
    assert status in expected, (status, reply, body, {k: v for k, v in env.items() if k != "wsgi.input"})
    if status in (403, 405):
        assert stream.reads == 0, "the body was read before the method/secret check"
    if status == 405:
        assert headers["Allow"] == "POST"
    if status == 200:
        fresh = body.uid not in before
        assert reply == (b"accepted\n" if fresh else b"duplicate\n")
        assert after == (before + Counter([body.uid]) if fresh else before)
    else:
        assert after == before, f"{status} but something was stored"


# -- webhook_app behind a real threaded wsgiref server ------------------------------------------
@pytest.fixture(scope="module")
def wsgi_server(tmp_path_factory: Any) -> Iterator[Tuple[ThreadedWsgi, UpdateIntake, "Counter[int]"]]:
    path = str(tmp_path_factory.mktemp("wsgi") / "w.db")
    store = SQLiteUpdateStore(path)
    handled: "Counter[int]" = Counter()
    lock = threading.Lock()

    def handle(update: Dict[str, Any]) -> None:
        with lock:
            handled[update["update_id"]] += 1

    intake = UpdateIntake(
        store, handle=handle, lease_seconds=5, sweep_every_seconds=0.2, pending_grace_seconds=0.2
    )
    intake.start()
    server = ThreadedWsgi(webhook_app(intake, secret_token=SECRET))
    yield server, intake, handled
    server.close()
    intake.close()
    store.close()


_probe_ids = iter(range(10**15, 10**15 + 10**6))


def _still_answers(port: int, path: str) -> None:
    uid = next(_probe_ids)
    status, reply = http_post(port, "/telegram", json.dumps({"update_id": uid}).encode(),
                              {"X-Telegram-Bot-Api-Secret-Token": SECRET})
    assert (status, reply) == (200, b"accepted\n"), "the server stopped answering valid updates"
    assert _all_ids(path)[uid] == 1


def _all_ids(path: str) -> "Counter[int]":
    conn = sqlite3.connect(path, timeout=10)
    try:
        return Counter(r[0] for r in conn.execute("SELECT update_id FROM telegram_updates"))
    finally:
        conn.close()


@settings(FUZZ, max_examples=60)
@given(body=bodies, secret=wire_secrets, ctype=st.sampled_from(CONTENT_TYPES))
def test_webhook_app_over_wsgiref_fuzz(
    wsgi_server: Any, body: Body, secret: Optional[str], ctype: Optional[str]
) -> None:
    server, intake, _ = wsgi_server
    path = intake.store.path
    before = _all_ids(path)
    headers: Dict[str, Any] = {}
    if secret is not None:
        headers["X-Telegram-Bot-Api-Secret-Token"] = secret.encode("utf-8")
    if ctype is not None:
        headers["Content-Type"] = ctype.encode("utf-8")
    status, reply = http_post(server.port, "/telegram", body.raw, headers)
    after = _all_ids(path)
    # wsgiref strips header whitespace; anything else that differs is a wrong secret
    right = secret is not None and secret.strip(" \t") == SECRET
    if not right:
        assert status == 403 and after == before, (status, secret)
    elif body.uid is None:
        assert status == 400 and after == before, (status, reply, body)
    else:
        fresh = body.uid not in before
        assert (status, reply) == (200, b"accepted\n" if fresh else b"duplicate\n"), body
        assert after == (before + Counter([body.uid]) if fresh else before)
    _still_answers(server.port, intake.store.path)


def _raw_exchange(port: int, request: bytes, *, half_close: bool = True) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(request)
        if half_close:
            sock.shutdown(socket.SHUT_WR)
        chunks = []
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
    return b"".join(chunks)


@pytest.mark.parametrize(
    ("head", "payload", "status"),
    [
        (b"Content-Length: 500\r\n", b'{"update_id": 77}', b"400"),  # the client stops early
        (b"", b'{"update_id": 78}', b"411"),  # no Content-Length (wsgiref: no chunked input)
        (b"Transfer-Encoding: chunked\r\n", b'11\r\n{"update_id": 79}\r\n0\r\n\r\n', b"411"),
        (b"Content-Length: 1_7\r\n", b'{"update_id": 80}', b"400"),
        (b"Content-Length: +17\r\n", b'{"update_id": 81}', b"400"),
        (b"Content-Length: 5\r\n", b'{"update_id": 82}', b"400"),  # only '{"upd' is the body
    ],
)
def test_broken_framing_over_a_real_socket(
    wsgi_server: Any, head: bytes, payload: bytes, status: bytes
) -> None:
    server, intake, _ = wsgi_server
    before = _all_ids(intake.store.path)
    request = (
        b"POST /telegram HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
        b"X-Telegram-Bot-Api-Secret-Token: " + SECRET.encode() + b"\r\n" + head + b"\r\n" + payload
    )
    answer = _raw_exchange(server.port, request)
    assert answer.split(b" ", 2)[1] == status, answer[:200]
    assert _all_ids(intake.store.path) == before
    _still_answers(server.port, intake.store.path)


def test_wsgiref_server_handled_every_accepted_update_once(wsgi_server: Any) -> None:
    server, intake, handled = wsgi_server
    for _ in range(3):
        _still_answers(server.port, intake.store.path)
    ids = _all_ids(intake.store.path)
    assert max(ids.values()) == 1
    end = time.monotonic() + 10
    while set(handled) != set(ids) and time.monotonic() < end:
        time.sleep(0.05)
    assert intake.idle(10)
    assert set(handled) == set(ids) and max(handled.values()) == 1


# -- PTB's own webhook (tornado) with the durable queue -----------------------------------------
# PTB's handler (not ours) answers: 403 unless Content-Type is exactly "application/json" and the
# secret matches ("!=" comparison); 500 for a body that is not UTF-8 / not JSON / too deep; 400
# when Update.de_json fails (not an object, missing update_id, malformed known fields); and it
# puts whatever update_id the JSON had into the queue, where the durable queue drops an id that
# is not an int in [0, 2**63-1] without recording it: PTB then answers 200 (Telegram never
# sends such ids; a 200 at least stops a redelivery loop).
PTB_STATUS: "Counter[Tuple[str, int]]" = Counter()
ptb_garbage = pick(
    bad_id_bodies(),
    bad_id_bodies(),
    not_objects,
    missing_id,
    not_utf8(),
    latin1,
    random_bytes,
    deep().filter(lambda b: b.uid is None),
    st.sampled_from(GARBAGE_TEXTS).map(lambda b: Body("literal", b)),
    *[framing(how) for how in FRAMINGS if how != "nan_field"],  # PTB takes NaN in other fields
)
ptb_secrets = weighted(80, st.just(SECRET), pick(st.none(), wrong_secrets.filter(
    lambda s: s.strip(" \t") != SECRET and all(c >= " " or c == "\t" for c in s)
)))


@pytest.fixture(scope="module")
def ptb_webhook(tmp_path_factory: Any) -> Iterator[PtbWebhookThread]:
    path = str(tmp_path_factory.mktemp("ptb") / "ptb.db")
    with FakeBotApi() as fake:
        hook = PtbWebhookThread(path, fake, SECRET)
        with hook:
            yield hook


@settings(FUZZ, max_examples=150)
@given(
    body=weighted(40, valid_bodies(key_prefix="x_"), ptb_garbage),
    secret=ptb_secrets,
    ctype=weighted(
        85,
        st.just("application/json"),
        st.sampled_from([None, "text/plain", "application/json; charset=utf-8"]),
    ),
)
def test_ptb_webhook_fuzz_never_stores_garbage_and_keeps_answering(
    ptb_webhook: PtbWebhookThread, body: Body, secret: Optional[str], ctype: Optional[str]
) -> None:
    hook = ptb_webhook
    before = Counter(table_rows(hook.path).keys())
    headers: Dict[str, Any] = {}
    if ctype is not None:
        headers["Content-Type"] = ctype
    if secret is not None:
        headers["X-Telegram-Bot-Api-Secret-Token"] = secret.encode("utf-8")
    status, _ = hook.post(body.raw, headers)
    after = Counter(table_rows(hook.path).keys())
    PTB_STATUS[(body.kind, status)] += 1
    if body.uid is not None and secret == SECRET and ctype == "application/json":
        assert status == 200, body
        assert after == (before + Counter([body.uid]) if body.uid not in before else before)
    else:
        if body.kind != "bad_id":  # bad ids are dropped by our queue, so PTB answers 200
            assert status != 200, f"PTB answered 200 for garbage {body!r}"
        assert after == before, f"{status} and something was stored for {body!r}"
    # the server survives: a valid update is still recorded with 200
    uid = next(_probe_ids)
    assert hook.post(json.dumps({"update_id": uid}).encode())[0] == 200
    assert uid in table_rows(hook.path)


def _raw_ptb(port: int, head: bytes, payload: bytes, *, half_close: bool) -> bytes:
    request = (
        b"POST /hook HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\n"
        b"X-Telegram-Bot-Api-Secret-Token: " + SECRET.encode() + b"\r\n" + head + b"\r\n" + payload
    )
    # tornado drops the answer when the client half-closes: only do it for a body that ends early
    return _raw_exchange(port, request, half_close=half_close).split(b"\r\n", 1)[0]


_BIG_PTB = b'{"update_id": 7000009, "x_big": "' + b"a" * (2 << 20) + b'"}'


@pytest.mark.parametrize(
    ("head", "payload", "stored", "statuses"),
    [
        (b"Content-Length: 500\r\n", b'{"update_id": 7000001}', False, (b"", b"400")),
        (b"", b'{"update_id": 7000002}', False, (b"500", b"400", b"411")),
        (
            b"Transfer-Encoding: chunked\r\n",
            b'16\r\n{"update_id": 7000003}\r\n0\r\n\r\n',
            True,
            (b"200",),
        ),
        (b"Content-Length: 2_2\r\n", b'{"update_id": 7000004}', False, (b"400",)),
        (b"Content-Length: +22\r\n", b'{"update_id": 7000005}', False, (b"400",)),
        (b"Content-Length: -1\r\n", b'{"update_id": 7000006}', False, (b"400",)),
        (b"Content-Length: 5\r\n", b'{"update_id": 7000007}', False, (b"500", b"400")),
        (b"Content-Length: 22\r\nContent-Length: 23\r\n", b'{"update_id": 7000008} ', False, (b"400",)),
        (b"Content-Length: %d\r\n" % (2 << 20), b"[" * (2 << 20), False, (b"500", b"400")),
        (b"Content-Length: %d\r\n" % len(_BIG_PTB), _BIG_PTB, True, (b"200",)),
    ],
    ids=["ends-early", "no-length", "chunked", "1_0", "+n", "negative", "shorter", "two-lengths",
         "2MiB-garbage", "2MiB-valid"],
)
def test_ptb_webhook_framing(
    ptb_webhook: PtbWebhookThread, head: bytes, payload: bytes, stored: bool, statuses: Tuple[bytes, ...]
) -> None:
    hook = ptb_webhook
    before = set(table_rows(hook.path))
    line = _raw_ptb(hook.port, head, payload, half_close=b"500\r\n" in head)
    status = line.split(b" ")[1] if line else b""
    PTB_STATUS[("framing:" + head.decode()[:22].strip(), int(status or 0))] += 1
    assert status in statuses, line
    new = set(table_rows(hook.path)) - before
    assert len(new) == (1 if stored else 0), new
    uid = next(_probe_ids)
    assert hook.post(json.dumps({"update_id": uid}).encode())[0] == 200, "PTB's server stopped answering"


def test_ptb_webhook_handled_every_recorded_update_exactly_once(ptb_webhook: PtbWebhookThread) -> None:
    hook = ptb_webhook
    if PTB_STATUS:  # what PTB's handler answered during the fuzz run (visible with -s)
        print("\nPTB webhook answers (body kind, status):", dict(sorted(PTB_STATUS.items())))
    for uid in (next(_probe_ids), next(_probe_ids)):
        assert hook.post(json.dumps({"update_id": uid}).encode())[0] == 200
    ids = set(table_rows(hook.path))
    end = time.monotonic() + 20
    while time.monotonic() < end and (
        set(hook.handled_snapshot()) != ids
        or {state for state, _ in table_rows(hook.path).values()} != {"completed"}
    ):
        time.sleep(0.05)
    assert set(hook.handled_snapshot()) == ids
    assert max(hook.handled_snapshot().values()) == 1
    assert domain_counts(hook.path) == Counter({i: 1 for i in ids})
    assert {state for state, _ in table_rows(hook.path).values()} == {"completed"}


PTB_PASSTHROUGH_IDS = [b"-1", b"1.0", b"1e3", b"true", b"NaN", b'"5"', b'7, "update_id": -3']


def test_ptb_webhook_refuses_update_ids_that_are_not_ints(tmp_path: Any) -> None:
    # regression: the durable queue stored update.update_id unchecked and SQLite coerced it
    # ('5' -> 5, 1.0 -> 1, None/NaN -> a fresh rowid that Telegram's next real update then
    # collided with, so that update was answered "duplicate" and lost)
    path = str(tmp_path / "ptb.db")
    stored: Dict[bytes, Any] = {}
    with FakeBotApi() as fake, PtbWebhookThread(path, fake, SECRET) as hook:
        assert hook.post(b'{"update_id": 100}')[0] == 200
        for token in [b"null"] + PTB_PASSTHROUGH_IDS:
            before = set(table_rows(path))
            status, _ = hook.post(b'{"update_id": ' + token + b"}")
            new = set(table_rows(path)) - before
            if new:
                stored[token] = (status, new)
            if token == b"null":
                # Telegram's next update (ids increase by one) must not be lost as a duplicate
                assert hook.post(b'{"update_id": 101, "x_real": true}')[0] == 200
                real_body = table_rows(path)[101][1]
    assert stored == {}, f"stored garbage (token: (status, ids)): {stored}"
    assert "x_real" in real_body, "a real update was dropped as a duplicate of a garbage row"


# -- SQL identifiers ----------------------------------------------------------------------------
BAD_TABLES: List[Any] = [
    "x; DROP TABLE y",
    'a"b',
    "a'b",
    "t--",
    "t;",
    "t/*",
    "tablé",
    "表",
    "ｔ",  # fullwidth t
    "a" * 64,
    "1abc",
    "9",
    "",
    " ",
    "a b",
    "a.b",
    "public.t",
    "t\x00",
    "t\n",
    "a" * 63 + "\n",
    "\u0661",
    None,
    b"telegram_updates",
    123,
    ["t"],
]


@pytest.mark.parametrize("name", BAD_TABLES, ids=repr)
def test_bad_table_names_are_refused_before_any_sql_sqlite(tmp_path: Any, name: Any) -> None:
    path = tmp_path / "never.db"
    with pytest.raises(ValueError, match="table name"):
        SQLiteUpdateStore(str(path), table=name)
    assert not os.path.exists(path), "SQLite opened the file: SQL ran before the check"
    with pytest.raises(ValueError, match="table name"):
        postgres_update_store_schema(name)


def _relations(dsn: str) -> "set[str]":
    conn = psycopg2.connect(dsn)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT relname FROM pg_class WHERE relnamespace = 'public'::regnamespace")
            return {r[0] for r in cur.fetchall()}
    finally:
        conn.close()


def test_bad_table_names_are_refused_before_any_sql_postgres(pg_dsn: str, pg_tables: List[str]) -> None:
    victim = "y_" + uuid.uuid4().hex[:12]
    pg_tables.append(victim)
    conn = psycopg2.connect(pg_dsn)
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute(f"CREATE TABLE {victim} (v int)")
    conn.close()
    hostile = BAD_TABLES + [
        f"x; DROP TABLE {victim}", f'{victim}"; DROP TABLE "{victim}', f"{victim} --"
    ]
    pool = psycopg2.pool.ThreadedConnectionPool(0, 2, pg_dsn)
    before = _relations(pg_dsn)
    try:
        for name in hostile:
            for source in (pg_dsn, pool, "postgresql://postgres@127.0.0.1:1/test"):
                for create in (True, False):
                    with pytest.raises(ValueError, match="table name"):
                        PostgresUpdateStore(source, name, create_table=create)
            with pytest.raises(ValueError, match="table name"):
                postgres_update_store_schema(name)
        untouched = getattr(pool, "_used") == {} and getattr(pool, "_pool") == []
        assert untouched, "the store took a connection from the pool"
    finally:
        pool.closeall()
    after = _relations(pg_dsn)
    assert victim in after
    # other tests may create tables meanwhile; none may be named after a hostile name
    created = after - before
    assert not created & ({str(n) for n in hostile} | {str(n).lower() for n in hostile})
    assert not any(r in ("x", "y", "t", "a", "ab") for r in created)


@settings(FUZZ, max_examples=200)
@given(
    name=st.one_of(
        st.text(max_size=70), st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,62}", fullmatch=True)
    )
)
def test_table_name_rule_property(tmp_path: Any, name: str) -> None:
    ok = re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,62}", name) is not None
    if ok:
        sql = postgres_update_store_schema(name)
        assert f'"{name}"' in sql
        PostgresUpdateStore("postgresql://postgres@127.0.0.1:1/test", name).close()  # lazy: no connect
    else:
        with pytest.raises(ValueError, match="table name"):
            postgres_update_store_schema(name)
        with pytest.raises(ValueError, match="table name"):
            PostgresUpdateStore("postgresql://postgres@127.0.0.1:1/test", name)
        path = tmp_path / ("n" + uuid.uuid4().hex + ".db")
        with pytest.raises(ValueError, match="table name"):
            SQLiteUpdateStore(str(path), name)
        assert not path.exists()


# -- secrets ------------------------------------------------------------------------------------
def test_the_secret_is_checked_with_hmac_compare_digest(monkeypatch: Any, tmp_path: Any) -> None:
    calls: List[Tuple[Any, Any]] = []
    real = hmac.compare_digest

    def spy(a: Any, b: Any) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", spy)
    store = SQLiteUpdateStore(str(tmp_path / "s.db"))
    app = webhook_app(UpdateIntake(store, handle=lambda u: None), secret_token=SECRET)
    for given_secret in (SECRET, SECRET[:-1] + "3", "", None, "é"):
        env = {
            "REQUEST_METHOD": "POST",
            "CONTENT_LENGTH": "17",
            "wsgi.input": io.BytesIO(b'{"update_id": 1}\n'),
        }
        if given_secret is not None:
            env["HTTP_X_TELEGRAM_BOT_API_SECRET_TOKEN"] = _over_the_wire(given_secret)
        status, _, _ = call(app, env)
        assert status == (200 if given_secret == SECRET else 403)
    assert len(calls) == 5 and all(b == SECRET.encode() for _, b in calls)
    assert all(isinstance(a, bytes) for a, _ in calls)
    store.close()


@pytest.mark.parametrize(
    "given_secret",
    ["wrong-secret-value", SECRET[:-1] + "X", SECRET + SECRET, "\u00e9\u00e9secret\u00e9", "Z" * 300],
)
def test_a_wrong_secret_is_never_logged(caplog: Any, tmp_path: Any, given_secret: str) -> None:
    caplog.set_level(logging.DEBUG)
    store = SQLiteUpdateStore(str(tmp_path / "s.db"))
    intake = UpdateIntake(store, handle=lambda u: None)
    intake.start()
    try:
        with ThreadedWsgi(webhook_app(intake, secret_token=SECRET)) as server:
            status, _ = http_post(server.port, "/", b'{"update_id": 3}',
                                  {"X-Telegram-Bot-Api-Secret-Token": given_secret.encode("utf-8")})
            assert status == 403
            right = {"X-Telegram-Bot-Api-Secret-Token": SECRET}
            status, _ = http_post(server.port, "/", b"garbage", right)
            assert status == 400
    finally:
        intake.close()
        store.close()
    logged = "\n".join(f"{r.getMessage()} {r.args!r} {r.__dict__!r}" for r in caplog.records)
    assert SECRET not in logged and given_secret not in logged
    assert given_secret.encode("utf-8").decode("latin-1") not in logged


PASSWORD = "S3cretPw"
CLOSED_PORT_DSNS = [
    f"postgresql://postgres:{PASSWORD}@127.0.0.1:1/test",
    f"postgresql://postgres:{PASSWORD}@127.0.0.1:1/test?connect_timeout=2",
    f"host=127.0.0.1 port=1 dbname=test user=postgres password={PASSWORD}",
    f"host=127.0.0.1 port=1 dbname=test user=postgres password='{PASSWORD} x'",
]


@pytest.mark.parametrize("dsn", CLOSED_PORT_DSNS)
def test_dsn_password_never_in_errors_reprs_or_logs(caplog: Any, dsn: str) -> None:
    caplog.set_level(logging.DEBUG)
    texts: List[str] = []
    store = PostgresUpdateStore(dsn, pool_timeout=2)
    texts += [repr(store), str(store)]
    with pytest.raises(psycopg2.Error) as info:
        store.add(1, '{"update_id": 1}', 1)
    texts += [repr(info.value), str(info.value), "".join(traceback.format_exception(info.value))]
    # the same failure through the intake (accept propagates; sweep reports) and the webhook (503)
    errors: List[Any] = []
    intake = UpdateIntake(store, handle=lambda u: None, on_store_error=lambda e, step: errors.append(e))
    with pytest.raises(psycopg2.Error) as info2:
        intake.accept(b'{"update_id": 2}')
    texts.append("".join(traceback.format_exception(info2.value)))
    intake.start()
    intake.close()
    texts += [repr(e) for e in errors] + ["".join(traceback.format_exception(e)) for e in errors]
    env = {
        "REQUEST_METHOD": "POST",
        "CONTENT_LENGTH": "16",
        "HTTP_X_TELEGRAM_BOT_API_SECRET_TOKEN": SECRET,
        "wsgi.input": io.BytesIO(b'{"update_id": 3}'),
    }
    status, _, reply = call(webhook_app(intake, secret_token=SECRET), env)
    assert status == 503
    texts.append(reply.decode())
    store.close()
    for record in caplog.records:
        texts.append(record.getMessage())
        if record.exc_info:
            texts.append("".join(traceback.format_exception(*record.exc_info)))
    texts.append(caplog.text)
    assert errors, "the sweep's store error was not reported"
    leaked = [t for t in texts if PASSWORD in t]
    assert not leaked, leaked[0]
