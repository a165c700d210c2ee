"""The named-statement loader (ptb_fence/stores/_queries.py) and the dialects' .sql files."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Dict

import pytest

from ptb_fence.stores._queries import QuerySet, parse_queries

GOOD = """\
-- the file's own comment, ignored

-- claim --
-- Take one row.
UPDATE {table} SET state = 'processing'
-- a comment inside the statement stays with it
WHERE update_id = %(update_id)s

-- count --
-- How many rows.
SELECT count(*) FROM {table}
"""


def test_blocks_are_read_with_their_purpose() -> None:
    queries = parse_queries(GOOD, "good.sql")
    assert list(queries) == ["claim", "count"]
    assert queries["claim"].purpose == "Take one row."
    assert queries["claim"].text.splitlines() == [
        "UPDATE {table} SET state = 'processing'",
        "-- a comment inside the statement stays with it",
        "WHERE update_id = %(update_id)s",
    ]
    assert queries["count"].text == "SELECT count(*) FROM {table}"


@pytest.mark.parametrize(
    "text, error",
    [
        ("-- a --\n-- One.\nSELECT 1\n-- a --\n-- Two.\nSELECT 2\n", "'a' is defined twice"),
        ("-- a --\nSELECT 1\n", "'a' lacks its '-- purpose' line"),
        ("-- a --\n-- b --\nSELECT 1\n", "'a' lacks its '-- purpose' line"),
        ("-- a --\n", "'a' lacks its '-- purpose' line"),
        ("-- a --\n-- One.\n\n-- b --\n-- Two.\nSELECT 2\n", "'a' is empty"),
    ],
)
def test_malformed_files_fail_loudly(text: str, error: str) -> None:
    with pytest.raises(ValueError, match=re.escape(error)):
        parse_queries(text, "bad.sql")


def _package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, files: Dict[str, str]) -> str:
    """A real package ``name`` in ``tmp_path`` holding ``files``, importable for the test."""
    folder = tmp_path / name
    folder.mkdir()
    (folder / "__init__.py").write_text("", encoding="utf-8")
    for file, text in files.items():
        (folder / file).write_text(text, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


@pytest.fixture
def good(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> QuerySet:
    package = _package(tmp_path, monkeypatch, "queries_good_pkg", {"good.sql": GOOD})
    return QuerySet("test", package, ("good.sql",))


def test_fill_quotes_validated_names_and_formats_integer_keys(good: QuerySet) -> None:
    filled = good.fill({"table": "Bot_Updates"}, {})
    assert filled["count"] == 'SELECT count(*) FROM "Bot_Updates"'
    assert filled.purpose("count") == "How many rows."
    assert "%(update_id)s" in filled["claim"]  # values stay driver placeholders
    with pytest.raises(KeyError, match="no test statement named 'missing'"):
        filled["missing"]


@pytest.mark.parametrize("bad", ['x"; DROP TABLE t; --', "1abc", "a b", "", "a" * 129, 'a"b'])
def test_fill_refuses_names_that_are_not_valid_table_names(good: QuerySet, bad: str) -> None:
    with pytest.raises(ValueError, match="invalid table or index name"):
        good.fill({"table": bad}, {})


def test_fill_refuses_a_placeholder_nothing_fills_and_keys_that_are_not_ints(
    good: QuerySet,
) -> None:
    with pytest.raises(ValueError, match=r"statement 'claim': nothing fills \{table\}"):
        good.fill({}, {})
    with pytest.raises(ValueError, match="is not an int"):
        good.fill({"table": "t"}, {"key": "1; DROP"})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="is not an int"):
        good.fill({"table": "t"}, {"key": True})


def test_a_name_defined_in_two_files_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = _package(tmp_path, monkeypatch, "queries_twice_pkg", {"a.sql": GOOD, "b.sql": GOOD})
    with pytest.raises(ValueError, match="'claim' is defined twice"):
        QuerySet("test", package, ("a.sql", "b.sql"))


def test_every_postgres_statement_is_filled_and_named_once() -> None:
    from ptb_fence.stores.postgres._sql import FILES, schema_sql, statements

    filled = statements("bot_updates")
    assert len(filled) > 60
    for name in filled:
        text = filled[name]
        assert not re.search(r"\{[a-z_]+\}", text), name
        assert filled.purpose(name), name
        # the batches need no text that depends on their size
        assert "%s" not in text, name
    assert 'CREATE TABLE IF NOT EXISTS "bot_updates"' in schema_sql("bot_updates")
    assert len(FILES) == len(set(FILES))


def test_every_sqlite_statement_is_filled_and_named_once() -> None:
    from ptb_fence.stores.sqlite._sql import statements

    filled = statements("bot_updates")
    assert len(filled) > 60
    for name in filled:
        assert not re.search(r"\{[a-z_]+\}", filled[name]), name
        assert filled.purpose(name), name
        assert "?" not in filled[name], name  # named parameters only, batches as JSON
    # a long table's derived names (SQLite keeps <table>_state_due_at_idx as it is)
    long = statements("t" * 63)
    assert f'"{"t" * 63}_state_due_at_idx"' in long["create_index"]


def test_comment_lines_right_after_the_purpose_are_notes_not_sent() -> None:
    queries = parse_queries(
        "-- a --\n-- One.\n-- why it is so\n-- and more\nSELECT 1\n-- kept\n"
        "-- b --\n-- Two.\n\n-- kept: a blank line first\nSELECT 2\n",
        "notes.sql",
    )
    assert queries["a"].text == "SELECT 1\n-- kept"
    assert queries["a"].notes == "why it is so\nand more"
    assert queries["b"].text == "-- kept: a blank line first\nSELECT 2"
    assert queries["b"].notes == ""


def test_each_postgres_index_is_built_concurrently_as_the_migration_builds_it() -> None:
    """build_<key> is index_<key> with CONCURRENTLY, drop_<key> drops the same name."""
    from ptb_fence.stores.postgres._sql import INDEXES, index_names, schema_sql, statements

    filled, schema = statements("bot_updates"), schema_sql("bot_updates")
    for (key, name, _owner), same in zip(index_names("bot_updates"), INDEXES):
        assert key == same
        index = filled["index_" + key]
        kind = "UNIQUE INDEX" if "CREATE UNIQUE INDEX" in index else "INDEX"
        assert index in schema and f"CREATE {kind} IF NOT EXISTS {name} ON " in index
        assert filled["build_" + key] + ";" == index.replace(
            f"CREATE {kind} IF NOT EXISTS", f"CREATE {kind} CONCURRENTLY IF NOT EXISTS")
        assert filled["drop_" + key] == f"DROP INDEX CONCURRENTLY IF EXISTS {name}"
