"""``ptb-fence outbox`` (list, show, retry, drop) and the outbox counts of ``status``, run as
real processes (``python -m ptb_fence``) against real SQLite files and the real PostgreSQL
server.

The outbox is filled through the stores' public methods (an attempt's calls ride in the commit
that completes it; a sender claims, records sent, fails). Refusals must exit 2 with one line on
stderr and leave the outbox exactly as it was; a store that cannot be reached exits 3; a
password is never printed.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import sys
import time
from typing import Any, Dict, Iterator, List, Optional, Tuple

import psycopg2
import pytest

from ptb_fence import (
    AttemptEffects,
    Batch,
    Completed,
    OutboxCall,
    PostgresUpdateStore,
    SQLiteUpdateStore,
)
from ptb_fence.stores._outbox_sql import outbox_table_name

PASSWORD = "0utboxCl1Secret"
SENDER = "cli-test-sender"
MINUTE = 60_000


def now_ms() -> int:
    return int(time.time() * 1000)


def cli(*argv: str) -> Tuple[int, str, str]:
    """``python -m ptb_fence ARGV`` without the PTB_FENCE_* environment."""
    env = {k: v for k, v in os.environ.items() if k not in ("PTB_FENCE_STORE", "PTB_FENCE_TABLE")}
    done = subprocess.run([sys.executable, "-m", "ptb_fence", *argv], capture_output=True,
                          text=True, env=env, timeout=120)
    return done.returncode, done.stdout, done.stderr


class Outbox:
    """An update table with an outbox holding calls in every state, filled through the
    store's public methods; reads its outbox back with plain SQL.

    Calls (ids in this order): ``sent`` (chat 10, result ``message_id`` 77), ``blocked``
    (chat 11, failed: 403), ``acked`` (chat 12, failed and acknowledged), ``live`` (chat 13,
    sending under a live lease), ``lapsed`` (chat 14, sending, lease lapsed), ``unknown`` (no
    chat, at most once, failed: unknown outcome), ``first`` and ``second`` (chat 15, pending,
    in that order).
    """

    def __init__(self, kind: str, url: str, table: str, store: Any) -> None:
        self.kind = kind
        self.url = url
        self.table = table
        self.store = store
        self.now = now_ms()
        self.ids: Dict[str, int] = {}
        self._next_update = 5000
        self._fill()

    def args(self, *command: str) -> List[str]:
        return ["--store", self.url, "--table", self.table, *command]

    def _queue(self, name: str, chat: Optional[int], text: str, *,
               at_most_once: bool = False) -> int:
        update_id = self._next_update
        self._next_update += 1
        at = self.now - 10 * MINUTE
        assert self.store.add(update_id, json.dumps({"update_id": update_id}), at)
        identity = self.store.claim_owned(update_id, now=at, lease_until=at + MINUTE,
                                          max_attempts=3)
        assert identity is not None
        params = {"chat_id": chat if chat is not None else 99, "text": text}
        call = OutboxCall("sendMessage", json.dumps(params), chat, 0, at_most_once)
        assert self.store.commit(Batch(
            settlements=((identity, Completed(at)),), effects={identity: AttemptEffects((call,))}
        )).landed == (True,)
        [entry] = self.store.list_calls(limit=1, after_call_id=max(self.ids.values(), default=0))
        self.ids[name] = entry.call_id
        return entry.call_id

    def _claim(self, call_id: int, *, now: int, lease_until: int) -> None:
        claimed = self.store.claim_calls(now=now, lease_until=lease_until, limit=10,
                                         sender=SENDER)
        assert [e.call_id for e in claimed] == [call_id]

    def _fill(self) -> None:
        store, now = self.store, self.now
        call = self._queue("sent", 10, "your order 1 is paid")
        self._claim(call, now=now - 9 * MINUTE, lease_until=now - 8 * MINUTE)
        assert store.record_sent(
            [(call, SENDER, json.dumps({"message_id": 77, "chat": {"id": 10}}), now - 9 * MINUTE)]
        ) == [True]
        call = self._queue("blocked", 11, "hello")
        self._claim(call, now=now - 9 * MINUTE, lease_until=now - 8 * MINUTE)
        assert store.fail_call(call, SENDER, at=now - 9 * MINUTE,
                               error="Forbidden: bot was blocked by the user")
        call = self._queue("acked", 12, "hi")
        self._claim(call, now=now - 9 * MINUTE, lease_until=now - 8 * MINUTE)
        assert store.fail_call(call, SENDER, at=now - 9 * MINUTE,
                               error="BadRequest: Chat not found")
        assert store.acknowledge_send_failure(call, now - 8 * MINUTE)
        call = self._queue("live", 13, "being sent")
        self._claim(call, now=now - MINUTE, lease_until=now + 30 * MINUTE)
        call = self._queue("lapsed", 14, "stuck")
        self._claim(call, now=now - 5 * MINUTE, lease_until=now - 4 * MINUTE)
        call = self._queue("unknown", None, "maybe sent", at_most_once=True)
        # while the lapsed one's lease still held (else that one would be claimed again)
        self._claim(call, now=now - 4 * MINUTE - 30_000, lease_until=now + 30 * MINUTE)
        assert store.fail_call(call, SENDER, at=now - 4 * MINUTE - 30_000,
                               error="unknown outcome: TimedOut: Timed out")
        self._queue("first", 15, "first of chat 15")
        self._queue("second", 15, "second of chat 15")

    def snapshot(self) -> List[Tuple[Any, ...]]:
        sql = f'SELECT * FROM "{outbox_table_name(self.table)}" ORDER BY call_id'
        if self.kind == "sqlite":
            conn = sqlite3.connect(self.url[len("sqlite:///"):])
            try:
                return [tuple(r) for r in conn.execute(sql).fetchall()]
            finally:
                conn.close()
        conn = psycopg2.connect(self.url)
        try:
            with conn.cursor() as cur:
                cur.execute(sql)
                return [tuple(r) for r in cur.fetchall()]
        finally:
            conn.close()

    def drop_outbox(self) -> None:
        sql = f'DROP TABLE "{outbox_table_name(self.table)}"'
        if self.kind == "sqlite":
            conn = sqlite3.connect(self.url[len("sqlite:///"):])
            try:
                conn.execute(sql)
                conn.commit()
            finally:
                conn.close()
            return
        conn = psycopg2.connect(self.url)
        try:
            with conn.cursor() as cur:
                cur.execute(sql)
            conn.commit()
        finally:
            conn.close()


@pytest.fixture(params=["sqlite", "postgres"])
def outbox(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[Outbox]:
    if request.param == "sqlite":
        path = tmp_path / "bot.sqlite3"
        store: Any = SQLiteUpdateStore(str(path), "telegram_updates")
        url, table = f"sqlite:///{path}", "telegram_updates"
    else:
        url = request.getfixturevalue("pg_dsn")
        table = request.getfixturevalue("pg_table")
        store = PostgresUpdateStore(url, table)
    try:
        yield Outbox(request.param, url, table, store)
    finally:
        store.close()


def assert_refused(fx: Outbox, argv: List[str], *needles: str) -> str:
    """Exit 2, one line on stderr containing ``needles``, nothing on stdout, no change."""
    before = fx.snapshot()
    code, out, err = cli(*argv)
    assert code == 2, (argv, out, err)
    assert out == ""
    assert err.startswith("ptb-fence: error: ") and err.count("\n") == 1, err
    for needle in needles:
        assert needle in err, (needle, err)
    assert fx.snapshot() == before
    return err


def listed(out: str) -> List[Tuple[int, str]]:
    """(call id, state) of each line of the ``outbox list`` table."""
    rows = []
    for line in out.splitlines()[2:]:
        match = re.match(r"^\s*(\d+)\s+(pending|sending|sent|failed\*?)\s", line)
        if match:
            rows.append((int(match.group(1)), match.group(2)))
    return rows


# -- list / show -------------------------------------------------------------------------------
def test_list_shows_every_call_filters_by_state_and_pages(outbox: Outbox) -> None:
    ids = outbox.ids
    code, out, err = cli(*outbox.args("outbox", "list"))
    assert code == 0 and err == "", err
    assert out.splitlines()[0].split()[:6] == [
        "CALL_ID", "STATE", "UPDATE_ID", "ATTEMPT", "CHAT", "METHOD"]
    assert listed(out) == [
        (ids["sent"], "sent"), (ids["blocked"], "failed"), (ids["acked"], "failed*"),
        (ids["live"], "sending"), (ids["lapsed"], "sending"), (ids["unknown"], "failed"),
        (ids["first"], "pending"), (ids["second"], "pending"),
    ]
    assert "Forbidden: bot was blocked by the user" in out and "first of chat 15" in out
    assert out.splitlines()[-1] == "8 call(s) (failed*: failure acknowledged)"

    code, out, _ = cli(*outbox.args("outbox", "list", "--state", "failed"))
    assert code == 0
    assert [c for c, _ in listed(out)] == [ids["blocked"], ids["acked"], ids["unknown"]]

    code, out, _ = cli(*outbox.args("outbox", "list", "--limit", "3"))
    assert code == 0 and len(listed(out)) == 3
    assert f"next page: --after {ids['acked']}" in out.splitlines()[-1]

    code, out, _ = cli(*outbox.args("outbox", "list", "--after", str(ids["acked"]),
                                    "--limit", "3", "--json"))
    assert code == 0
    page = json.loads(out)
    assert page["outbox_table"] == outbox_table_name(outbox.table)
    assert [c["call_id"] for c in page["calls"]] == [ids["live"], ids["lapsed"], ids["unknown"]]
    assert page["next_after"] == ids["unknown"]
    unknown = page["calls"][2]
    assert unknown["state"] == "failed" and unknown["at_most_once"] is True
    assert unknown["chat_key"] is None and unknown["tries"] == 1
    assert unknown["error"] == "unknown outcome: TimedOut: Timed out"
    assert unknown["created_at_utc"].endswith("Z")
    assert "params" not in unknown  # list shows no parameters (show does)

    code, out, _ = cli(*outbox.args("outbox", "list", "--after", str(ids["second"])))
    assert code == 0 and out.strip() == (
        f"no calls in {outbox_table_name(outbox.table)!r} after call {ids['second']}")


def test_show_prints_the_call_its_parameters_and_result(outbox: Outbox) -> None:
    ids = outbox.ids
    code, out, err = cli(*outbox.args("outbox", "show", str(ids["sent"])))
    assert code == 0 and err == ""
    assert re.search(r"^state\s+sent$", out, re.M)
    assert re.search(r"^method\s+sendMessage$", out, re.M)
    assert re.search(r"^chat\s+10$", out, re.M)
    assert re.search(r"^queued by\s+update 5000, attempt 1, claim \w+, call 0 of the attempt$",
                     out, re.M), out
    assert re.search(r"^sent_at\s+\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} UTC \(sent\)$", out, re.M)
    assert '"text": "your order 1 is paid"' in out and '"message_id": 77' in out
    assert "outbox retry" not in out and "outbox drop" not in out

    code, out, _ = cli(*outbox.args("outbox", "show", str(ids["blocked"])))
    assert code == 0
    assert re.search(r"^state\s+failed$", out, re.M)
    assert re.search(r"^failed_at\s+.* UTC \(its failure is not yet acknowledged by "
                     r"handle_send_failure\)$", out, re.M), out
    assert f"send it again: ptb-fence outbox retry {ids['blocked']}" in out
    assert f"never send it: ptb-fence outbox drop {ids['blocked']}" in out

    code, out, _ = cli(*outbox.args("outbox", "show", str(ids["lapsed"])))
    assert code == 0
    assert re.search(r"^lease\s+.* UTC \(lapsed 4m \d\ds ago, the next sweep takes it over\)$",
                     out, re.M), out

    code, out, _ = cli(*outbox.args("outbox", "show", str(ids["sent"]), "--json"))
    assert code == 0
    data = json.loads(out)
    assert data["params"] == {"chat_id": 10, "text": "your order 1 is paid"}
    assert data["result"] == {"message_id": 77, "chat": {"id": 10}}
    assert (data["state"], data["tries"], data["update_id"], data["seq"]) == ("sent", 1, 5000, 0)
    assert data["sent_at"] == outbox.now - 9 * MINUTE

    assert_refused(outbox, outbox.args("outbox", "show", "999999"), "no call 999999 in the outbox")


# -- retry / drop ------------------------------------------------------------------------------
def test_retry_puts_a_failed_call_back_to_pending_and_a_sender_claims_it(outbox: Outbox) -> None:
    ids, store = outbox.ids, outbox.store
    code, out, err = cli("-v", *outbox.args("outbox", "retry", str(ids["blocked"])))
    assert code == 0, err
    assert out.splitlines()[0] == (
        f"call {ids['blocked']} (sendMessage to chat 11, queued by update 5001 attempt 1): "
        "failed -> pending, due now")
    assert "last error kept for the record: Forbidden: bot was blocked by the user" in out
    assert "outbox retry: call" in err  # -v logs the action
    entry = store.get_call(ids["blocked"])
    assert entry is not None and entry.state == "pending" and entry.tries == 1
    assert entry.error == "Forbidden: bot was blocked by the user"

    code, out, _ = cli(*outbox.args("outbox", "retry", str(ids["acked"])))
    assert code == 0 and "failed (acknowledged) -> pending" in out
    code, out, _ = cli(*outbox.args("outbox", "retry", str(ids["unknown"])))
    assert code == 0 and "warning: it was queued at most once" in out

    # a sender now claims them (due now), with the lapsed one and the first of chat 15
    claimed = store.claim_calls(now=now_ms(), lease_until=now_ms() + MINUTE, limit=20,
                                sender="next")
    assert [e.call_id for e in claimed] == [
        ids["blocked"], ids["acked"], ids["lapsed"], ids["unknown"], ids["first"]]
    assert all(not e.acknowledged for e in claimed)
    assert [e.tries for e in claimed] == [2, 2, 2, 2, 1]


def test_retry_refuses_what_is_not_failed_and_changes_nothing(outbox: Outbox) -> None:
    ids = outbox.ids
    assert_refused(outbox, outbox.args("outbox", "retry", str(ids["sent"])),
                   f"cannot retry call {ids['sent']}: it was sent at", "nothing changed")
    assert_refused(outbox, outbox.args("outbox", "retry", str(ids["live"])),
                   "it is being sent: a sender holds it under a lease until")
    assert_refused(outbox, outbox.args("outbox", "retry", str(ids["first"])),
                   "it is already pending")
    assert_refused(outbox, outbox.args("outbox", "retry", "424242"),
                   "no call 424242 in the outbox")
    assert_refused(outbox, outbox.args("outbox", "retry", "0"), "invalid call id '0'")
    assert_refused(outbox, outbox.args("outbox", "retry", "x1"), "invalid call id 'x1'")


def test_drop_deletes_a_pending_or_failed_call_and_frees_its_chat(outbox: Outbox) -> None:
    ids, store = outbox.ids, outbox.store
    # the first call of chat 15 holds the second
    code, out, err = cli(*outbox.args("outbox", "drop", str(ids["first"])))
    assert code == 0, err
    assert out.splitlines()[0].startswith(f"dropped call {ids['first']} (sendMessage to chat 15")
    assert "the calls of chat 15 queued after it no longer wait for it" in out
    assert store.get_call(ids["first"]) is None
    code, out, _ = cli(*outbox.args("outbox", "drop", str(ids["blocked"])))
    assert code == 0 and "no longer delivered to handle_send_failure" in out
    assert store.get_call(ids["blocked"]) is None

    claimed = store.claim_calls(now=now_ms(), lease_until=now_ms() + MINUTE, limit=20,
                                sender="next")
    assert [e.call_id for e in claimed] == [ids["lapsed"], ids["second"]]

    code, out, _ = cli(*outbox.args("outbox", "list", "--json"))
    assert ids["first"] not in [c["call_id"] for c in json.loads(out)["calls"]]


def test_drop_refuses_a_call_being_sent_or_sent_and_changes_nothing(outbox: Outbox) -> None:
    ids = outbox.ids
    assert_refused(outbox, outbox.args("outbox", "drop", str(ids["live"])),
                   f"cannot drop call {ids['live']}: it is being sent", "nothing changed")
    assert_refused(outbox, outbox.args("outbox", "drop", str(ids["lapsed"])),
                   "it is being sent")
    assert_refused(outbox, outbox.args("outbox", "drop", str(ids["sent"])),
                   "it was sent at", "a sent call is history")
    assert_refused(outbox, outbox.args("outbox", "drop", "777777"), "no call 777777")
    assert_refused(outbox, outbox.args("outbox", "list", "--state", "lost"),
                   "invalid state 'lost': one of pending, sending, sent, failed")
    assert_refused(outbox, outbox.args("outbox"), "SUBCOMMAND")


# -- status ------------------------------------------------------------------------------------
def test_status_shows_the_outbox_counts(outbox: Outbox) -> None:
    code, out, err = cli(*outbox.args("status"))
    assert code == 0 and err == ""
    for state, count in [("pending", 2), ("sending", 2), ("sent", 1), ("failed", 2),
                         ("failed, acknowledged", 1)]:
        assert re.search(rf"^{state}\s+{count}$", out, re.M), (state, out)
    assert re.search(r"^oldest unsent call\s+(9m 5\ds|10m 0\ds) \(queued .* UTC\)$", out, re.M), out
    assert "see the failed calls with `ptb-fence outbox list --state failed`" in out

    code, out, _ = cli(*outbox.args("status", "--json"))
    assert code == 0
    data = json.loads(out)["outbox"]
    assert data["table"] == outbox_table_name(outbox.table)
    assert data["counts"] == {"pending": 2, "sending": 2, "sent": 1, "failed": 2,
                              "failed_acknowledged": 1}
    assert data["oldest_unsent"]["created_at"] == outbox.now - 10 * MINUTE
    assert 590 <= data["oldest_unsent"]["age_seconds"] < 700
    assert data["missing"] is None


# -- a table without an outbox, a missing table, secrets ---------------------------------------
def test_a_table_without_an_outbox_is_refused_with_how_to_make_it(outbox: Outbox) -> None:
    outbox.drop_outbox()
    name = outbox_table_name(outbox.table)
    code, out, err = cli(*outbox.args("outbox", "list"))
    assert code == 2 and out == "" and err.count("\n") == 1, err
    assert f"has no outbox table {name!r}" in err
    if outbox.kind == "postgres":
        assert "create it with `ptb-fence migrate`" in err
    else:
        assert "SQLiteUpdateStore creates it when it opens the file" in err
    code, out, err = cli(*outbox.args("status", "--json"))
    assert code == 0, err
    data = json.loads(out)
    assert data["outbox"]["counts"] is None and name in data["outbox"]["missing"]
    assert data["total"] == 8  # the update table is reported as before
    code, out, _ = cli(*outbox.args("status"))
    assert code == 0 and f"outbox: none; table {outbox.table!r}" in out

    if outbox.kind == "postgres":
        code, out, err = cli(*outbox.args("migrate"))
        assert code == 0 and f"created the outbox table {name!r}" in out, (out, err)
    else:
        SQLiteUpdateStore(outbox.url[len("sqlite:///"):], outbox.table).close()
    code, out, err = cli(*outbox.args("outbox", "list"))
    assert code == 0 and out.startswith("no calls in"), (out, err)


def test_a_missing_table_is_refused_and_a_password_is_never_printed(
    pg_dsn: str, pg_table: str, tmp_path: Any
) -> None:
    user, rest = pg_dsn[len("postgresql://"):].split("@", 1)
    secret_dsn = f"postgresql://{user}:{PASSWORD}@{rest}"  # trust auth ignores the password
    code, out, err = cli("--store", secret_dsn, "--table", pg_table, "outbox", "list")
    assert code == 2 and out == "" and err.count("\n") == 1, err
    assert "no table" in err and "ptb-fence migrate" in err
    assert PASSWORD not in err and ":***@" in err
    code, out, err = cli("--store", f"postgresql://bob:{PASSWORD}@127.0.0.1:1/db",
                         "outbox", "show", "1")
    assert code == 3 and out == "" and err.count("\n") == 1, err
    assert PASSWORD not in err and "***" in err
    code, _, err = cli("--store", f"sqlite:///{tmp_path}/none.db", "outbox", "list")
    assert code == 2 and "no SQLite database at" in err
    assert not (tmp_path / "none.db").exists()
