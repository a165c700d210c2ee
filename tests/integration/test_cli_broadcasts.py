"""``ptb-fence broadcast list|show|pause|resume|cancel`` on the broadcasts a store keeps.

The subcommands run on a :class:`MemoryUpdateStore` through ``run_broadcast`` with the real
parser, and through ``main([...])`` on SQLite and PostgreSQL.
"""

from __future__ import annotations

import json
from typing import Any, List, Tuple

import pytest

from ptb_fence import MemoryUpdateStore, PostgresUpdateStore, RecipientOutcome, SQLiteUpdateStore
from ptb_fence.cli import build_parser, main
from ptb_fence.cli._broadcasts import run_broadcast
from ptb_fence.cli._errors import Refused

NOW = 1_700_000_000_000


def seeded(store: Any) -> Any:
    """A broadcast to 100 chats: 25 sent, 1 blocked, 4 held by a sender, 70 pending."""
    started = store.start_broadcast("spring", "sendMessage", '{"text":"20% off"}', NOW)
    store.add_recipients(started.broadcast_id, list(range(1, 101)), NOW)
    held = store.claim_recipients("s", now=NOW, lease_until=NOW + 60_000, limit=30)
    store.settle_recipients("s", [RecipientOutcome(r.broadcast_id, r.chat_id, "sent")
                                  for r in held[:25]]
                            + [RecipientOutcome(held[25].broadcast_id, held[25].chat_id,
                                                "blocked", error="Forbidden")], NOW)
    return store


def run(store: Any, *argv: str, ticks: Any = None) -> Tuple[int, str]:
    lines: List[str] = []
    args = build_parser().parse_args(["broadcast", *argv])
    clock = iter(ticks or [NOW] * 100)
    status = run_broadcast(args, store, now=lambda: next(clock), out=lines.append,
                           sleep=lambda seconds: None)
    return status, "\n".join(lines)


def test_list_and_show_count_the_recipients_per_state() -> None:
    store = seeded(MemoryUpdateStore())
    status, text = run(store, "list")
    assert status == 0
    header, _, row = text.splitlines()
    assert header.split()[:9] == ["ID", "NAME", "STATE", "TOTAL", "SENT", "PENDING", "FAILED",
                                  "BLOCKED", "CANCELLED"]
    assert row.split()[:9] == ["1", "spring", "active", "100", "25", "74", "0", "1", "0"]
    status, text = run(store, "show", "spring")
    assert "sendMessage {\"text\":\"20% off\"}" in text
    assert "100: 70 pending, 4 sending, 25 sent, 1 blocked" in text
    status, text = run(store, "show", "spring", "--json")
    data = json.loads(text)
    assert data["recipients"] == {"pending": 70, "sending": 4, "sent": 25, "failed": 0,
                                  "blocked": 1, "cancelled": 0}
    assert data["params"] == {"text": "20% off"} and data["done"] is False


def test_pause_resume_and_cancel_change_the_state_and_say_so() -> None:
    store = seeded(MemoryUpdateStore())
    assert run(store, "pause", "spring")[1].startswith("broadcast 'spring' is paused")
    assert store.claim_recipients("t", now=NOW + 1, lease_until=NOW + 2, limit=5) == []
    assert run(store, "resume", "spring")[1].startswith("broadcast 'spring' is active")
    status, text = run(store, "cancel", "spring", "--json")
    assert json.loads(text)["recipients"]["cancelled"] == 70
    with pytest.raises(Refused, match="stays cancelled"):
        run(store, "resume", "spring")
    with pytest.raises(Refused, match="no broadcast named 'autumn'"):
        run(store, "pause", "autumn")
    with pytest.raises(Refused, match="no broadcast named 'autumn'"):
        run(store, "show", "autumn")


def test_watch_shows_a_bar_the_rate_and_the_time_left_and_ends_when_done() -> None:
    store = seeded(MemoryUpdateStore())
    sent_per_refresh = iter([0, 20, 20, 20, 14])
    clock = iter(NOW + 2_000 * n for n in range(100))

    class Moving:
        """The store, with 20 more recipients sent between refreshes."""

        features = store.features

        def list_broadcasts(self, name: Any = None) -> Any:
            more = next(sent_per_refresh)
            held = store.claim_recipients("w", now=NOW + 60_001, lease_until=NOW + 120_000,
                                          limit=more) if more else []
            store.settle_recipients("w", [RecipientOutcome(r.broadcast_id, r.chat_id, "sent")
                                          for r in held], NOW)
            return store.list_broadcasts(name)

    lines: List[str] = []
    args = build_parser().parse_args(["broadcast", "show", "spring", "--watch", "2s"])
    status = run_broadcast(args, Moving(), now=lambda: next(clock), out=lines.append,
                           sleep=lambda seconds: None)
    assert status == 0
    assert lines[0].startswith("[") and "26/100" in lines[0]
    assert "46/100" in lines[1] and "10.0/s, about " in lines[1] and lines[1].endswith("left")
    assert lines[-1].endswith("done") and "100/100" in lines[-1]


def test_a_store_without_broadcasts_is_refused_with_the_fix() -> None:
    import dataclasses

    store = MemoryUpdateStore()
    store.features = dataclasses.replace(store.features, broadcasts=False)
    with pytest.raises(Refused, match="keeps no broadcasts"):
        run(store, "list")


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_the_command_line_on_sqlite_and_postgres(kind: str, tmp_path: Any, request: Any,
                                                 capsys: Any) -> None:
    if kind == "sqlite":
        url = f"sqlite:///{tmp_path}/bot.db"
        store: Any = SQLiteUpdateStore(str(tmp_path / "bot.db"))
        table: List[str] = []
    else:
        url = request.getfixturevalue("pg_dsn")
        name = request.getfixturevalue("pg_table")
        store = PostgresUpdateStore(url, table=name)
        table = ["--table", name]
    try:
        seeded(store)
    finally:
        store.close()
    assert main(["--store", url, *table, "broadcast", "pause", "spring"]) == 0
    assert "is paused" in capsys.readouterr().out
    assert main(["--store", url, *table, "broadcast", "list", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)["broadcasts"]
    assert [(b["name"], b["state"], b["total"]) for b in listed] == [("spring", "paused", 100)]
    assert main(["--store", url, *table, "broadcast", "resume", "nope"]) != 0
    assert "no broadcast named 'nope'" in capsys.readouterr().err
