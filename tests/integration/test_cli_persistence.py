"""``ptb-fence persistence import/export/show``: a PicklePersistence file written by
python-telegram-bot itself goes into the store (SQLite, PostgreSQL) exactly, ``show`` prints one
user's, chat's or conversation's state, ``export`` writes a file PTB's PicklePersistence reads
back the same, existing state is refused without ``--replace``."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any, Tuple

import pytest
from telegram.ext import PicklePersistence

from ptb_fence import PostgresUpdateStore, SQLiteUpdateStore, StateKey
from ptb_fence._state_codec import conversation_state_key, decode_state
from ptb_fence.cli import main


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> Tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def ptb_pickle(path: Path) -> None:
    """A file PTB's own PicklePersistence wrote: two users, a chat, bot_data and a
    conversation with two keys (one ended: PTB keeps None for it)."""

    async def write() -> None:
        persistence = PicklePersistence(filepath=path)
        await persistence.get_user_data()  # loads (creates) the file's data
        await persistence.update_user_data(5, {"slot": "10:00", "n": 3})
        await persistence.update_user_data(6, {"tags": {"a", "b"}})
        await persistence.update_chat_data(-100, {"title": "Zoë's"})
        await persistence.update_bot_data({"bookings": 2})
        await persistence.update_conversation("booking", (5, 5), 2)
        await persistence.update_conversation("booking", (6, 6), None)
        await persistence.flush()

    asyncio.run(write())


@pytest.fixture(params=["sqlite", "postgres"])
def target(request: Any, tmp_path: Path) -> Any:
    if request.param == "sqlite":
        path = tmp_path / "bot.db"
        SQLiteUpdateStore(str(path)).close()
        url = f"sqlite:///{path}"
        yield url, "telegram_updates", lambda: SQLiteUpdateStore(str(path))
        return
    dsn, table = request.getfixturevalue("pg_dsn"), request.getfixturevalue("pg_table")
    PostgresUpdateStore(dsn, table=table).due(now=0, pending_before=0, limit=1)
    yield dsn, table, lambda: PostgresUpdateStore(dsn, table=table)


def test_import_of_a_real_pickle_file_then_show_and_export(
    target: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url, table, open_store = target
    pickle_file = tmp_path / "bot.pickle"
    ptb_pickle(pickle_file)
    common = ("--store", url, "--table", table)
    code, out, err = run(capsys, "persistence", "import", str(pickle_file), *common)
    assert code == 0, err
    assert "imported 5 state row(s)" in out and "1 bot, 1 chat, 1 conversation, 2 user" in out
    store = open_store()
    try:
        got = store.read_state([StateKey("user", "", "5"), StateKey("user", "", "6"),
                                StateKey("chat", "", "-100"), StateKey("bot"),
                                conversation_state_key("booking", (5, 5)),
                                conversation_state_key("booking", (6, 6))])
        assert {k: decode_state(e.value) for k, e in got.items()} == {
            StateKey("user", "", "5"): {"slot": "10:00", "n": 3},
            StateKey("user", "", "6"): {"tags": {"a", "b"}},
            StateKey("chat", "", "-100"): {"title": "Zoë's"},
            StateKey("bot"): {"bookings": 2},
            conversation_state_key("booking", (5, 5)): 2,
        }
        assert all(e.version == 1 for e in got.values())
    finally:
        store.close()

    # again (an import that stopped, run once more): the rows holding the file's state stay
    code, out, err = run(capsys, "persistence", "import", str(pickle_file), *common)
    assert code == 0 and "imported 5 state row(s)" in out, err
    store = open_store()
    try:
        assert all(e.version == 1 for e in store.read_state(list(got)).values())
    finally:
        store.close()

    # a file whose state differs: refused (nothing changed), then replaced at the current
    # versions (only the rows that differ)
    changed = tmp_path / "changed.pickle"
    ptb_pickle(changed)

    async def change() -> None:
        persistence = PicklePersistence(filepath=changed)
        await persistence.get_conversations("booking")  # loads the file's data
        await persistence.update_conversation("booking", (5, 5), 3)
        await persistence.flush()

    asyncio.run(change())
    code, out, err = run(capsys, "persistence", "import", str(changed), *common)
    assert code == 2 and "--replace" in err and "conversation booking [5,5]" in err and out == ""
    code, out, err = run(capsys, "persistence", "show", "--conversation", "booking", *common)
    assert code == 0 and " 1 " in out
    code, out, err = run(capsys, "persistence", "import", str(changed), "--replace", *common)
    assert code == 0, err

    code, out, err = run(capsys, "persistence", "show", "--user", "5", *common)
    assert code == 0 and "user" in out and "'slot': '10:00'" in out and " 1 " in out
    code, out, err = run(capsys, "persistence", "show", "--conversation", "booking",
                         "--key", "[5, 5]", "--json", *common)
    assert code == 0, err
    assert json.loads(out) == [{"kind": "conversation", "name": "booking", "key": "[5,5]",
                                "version": 2, "deleted": False, "value": "3"}]
    code, out, err = run(capsys, "persistence", "show", "--chat", "42", *common)
    assert code == 0 and "no state stored" in out

    exported = tmp_path / "out.pickle"
    code, out, err = run(capsys, "persistence", "export", str(exported), *common)
    assert code == 0 and "exported 5 state row(s)" in out

    async def read_back() -> Any:
        persistence = PicklePersistence(filepath=exported)
        return (await persistence.get_user_data(), await persistence.get_chat_data(),
                await persistence.get_bot_data(), await persistence.get_conversations("booking"))

    users, chats, bot, conversations = asyncio.run(read_back())
    assert users == {5: {"slot": "10:00", "n": 3}, 6: {"tags": {"a", "b"}}}
    assert chats == {-100: {"title": "Zoë's"}} and bot == {"bookings": 2}
    assert conversations == {(5, 5): 3}


def test_import_refuses_a_missing_or_foreign_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bot.db"
    SQLiteUpdateStore(str(path)).close()
    common = ("--store", f"sqlite:///{path}")
    code, _, err = run(capsys, "persistence", "import", str(tmp_path / "none.pickle"), *common)
    assert code == 2 and "no PicklePersistence file" in err
    junk = tmp_path / "junk.pickle"
    junk.write_bytes(b"not a pickle")
    code, _, err = run(capsys, "persistence", "import", str(junk), *common)
    assert code == 2 and "junk.pickle" in err


def test_the_callback_data_cache_moves_with_import_and_export(
    target: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """PTB's PicklePersistence keeps the keyboards of the callback-data cache
    (``arbitrary_callback_data``): import writes one ``callback`` row per keyboard, as
    FencedPersistence keeps them, and export gives them back in PTB's format."""
    from ptb_fence.ptb._callback_data import keyboard_key

    url, table, open_store = target
    pickle_file = tmp_path / "cb.pickle"

    async def write() -> None:
        persistence = PicklePersistence(filepath=pickle_file)
        await persistence.get_callback_data()
        await persistence.update_callback_data(
            ([("kb1", 1700000000.5, {"b1": ("slot", 10), "b2": frozenset({"x"})}),
              ("kb2", 1700000001.0, {"c1": "yes"})], {"query-7": "kb1"})
        )
        await persistence.flush()

    asyncio.run(write())
    common = ("--store", url, "--table", table)
    code, out, err = run(capsys, "persistence", "import", str(pickle_file), *common)
    assert code == 0, err
    assert "imported 2 state row(s)" in out and "2 callback" in out
    store = open_store()
    try:
        got = store.read_state([keyboard_key("kb1"), keyboard_key("kb2")])
        assert {k.key: decode_state(e.value) for k, e in got.items()} == {
            "kb1": (1700000000.5, {"b1": ("slot", 10), "b2": frozenset({"x"})}),
            "kb2": (1700000001.0, {"c1": "yes"}),
        }
    finally:
        store.close()
    exported = tmp_path / "cb-out.pickle"
    code, out, err = run(capsys, "persistence", "export", str(exported), *common)
    assert code == 0 and "exported 2 state row(s)" in out

    async def read_back() -> Any:
        return await PicklePersistence(filepath=exported).get_callback_data()

    keyboards, queries = asyncio.run(read_back())
    assert sorted(keyboards) == [
        ("kb1", 1700000000.5, {"b1": ("slot", 10), "b2": frozenset({"x"})}),
        ("kb2", 1700000001.0, {"c1": "yes"}),
    ] and queries == {}


def test_import_of_a_file_of_a_bot_that_stored_no_chat_data(
    target: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A bot with ``PersistenceInput(chat_data=False)`` never loads chat_data: PTB writes None
    for it (and for bot_data). The import takes the users and ignores the kinds not stored."""
    from telegram.ext import PersistenceInput

    url, table, open_store = target
    pickle_file = tmp_path / "users_only.pickle"

    async def write() -> None:
        persistence = PicklePersistence(
            filepath=pickle_file,
            store_data=PersistenceInput(chat_data=False, bot_data=False, callback_data=False),
        )
        await persistence.update_user_data(5, {"slot": "10:00"})
        await persistence.flush()

    asyncio.run(write())
    code, out, err = run(capsys, "persistence", "import", str(pickle_file),
                         "--store", url, "--table", table)
    assert code == 0, err
    assert "imported 1 state row(s)" in out, out
    store = open_store()
    try:
        got = store.read_state([StateKey("user", "", "5")])
        assert {k: decode_state(e.value) for k, e in got.items()} == {
            StateKey("user", "", "5"): {"slot": "10:00"}}
    finally:
        store.close()
