"""Named SQL statements, read from the ``.sql`` files packaged with each store's dialect.

A file holds blocks, each a ``-- name --`` line, a ``-- purpose`` line, then the statement up
to the next block. Comment lines right after the purpose line are notes on the statement, not
sent with it (a blank line first keeps them in). Text before the first block is the file's own.

A statement names the tables it runs on with placeholders such as ``{table}`` or
``{outbox}``: :meth:`QuerySet.fill` puts in each name validated and double-quoted, and keys
derived from them (advisory-lock numbers, plain integers). Values never reach the text: they
go through the driver's placeholders (``%(name)s``, ``:name``, ``?``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
import importlib
from pathlib import Path
from typing import Dict, Iterator, List, Mapping, Tuple

__all__ = ["Query", "QuerySet", "Statements", "load", "parse_queries"]

_HEADER = re.compile(r"-- ([a-z][a-z0-9_]*) --")
_PURPOSE = re.compile(r"-- (\S.*)")
_PLACEHOLDER = re.compile(r"\{([a-z][a-z0-9_]*)\}")
# The rule of table names (stores/_names.py), with room for the suffixes of derived names
# (a SQLite index is named <table>_state_due_at_idx whatever the table's length).
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")


@dataclass(frozen=True)
class Query:
    """One named statement as written in its file (placeholders not filled)."""

    name: str
    purpose: str
    text: str
    notes: str = ""


def parse_queries(text: str, source: str) -> Dict[str, Query]:
    """The statements of one ``.sql`` file by name.

    Args:
        text: The file's text.
        source: The file's name, for errors.

    Raises:
        ValueError: A name given twice, a block without its purpose line, or an empty one.
    """
    found: Dict[str, Query] = {}
    name = purpose = ""
    body: List[str] = []

    def close() -> None:
        if not name:
            return
        notes = 0
        while notes < len(body) and body[notes].startswith("--"):
            notes += 1
        statement = "\n".join(body[notes:]).strip()
        if not statement:
            raise ValueError(f"{source}: statement {name!r} is empty")
        found[name] = Query(
            name, purpose, statement, "\n".join(line[2:].strip() for line in body[:notes])
        )

    lines = text.splitlines()
    index = 0
    while index < len(lines):
        header = _HEADER.fullmatch(lines[index].rstrip())
        if header is None:
            if name:
                body.append(lines[index])
            index += 1
            continue
        close()
        name = header.group(1)
        if name in found:
            raise ValueError(f"{source}: statement {name!r} is defined twice")
        purpose_line = lines[index + 1].rstrip() if index + 1 < len(lines) else ""
        match = _PURPOSE.fullmatch(purpose_line)
        if match is None or _HEADER.fullmatch(purpose_line):
            raise ValueError(f"{source}: statement {name!r} lacks its '-- purpose' line")
        purpose = match.group(1)
        body = []
        index += 2
    close()
    return found


class Statements:
    """The statements of one dialect with every placeholder filled, by name."""

    __slots__ = ("_purposes", "_texts", "dialect")

    def __init__(self, dialect: str, texts: Dict[str, str], purposes: Dict[str, str]) -> None:
        self.dialect = dialect
        self._texts = texts
        self._purposes = purposes

    def __getitem__(self, name: str) -> str:
        try:
            return self._texts[name]
        except KeyError:
            raise KeyError(f"no {self.dialect} statement named {name!r}") from None

    def __contains__(self, name: object) -> bool:
        return name in self._texts

    def __iter__(self) -> Iterator[str]:
        return iter(self._texts)

    def __len__(self) -> int:
        return len(self._texts)

    def purpose(self, name: str) -> str:
        """The one-line purpose written above the statement ``name``."""
        self[name]  # the same error for an unknown name
        return self._purposes[name]


class QuerySet:
    """The parsed statements of one dialect, from one or more packaged ``.sql`` files.

    Args:
        dialect: ``"postgresql"`` or ``"sqlite"`` (for errors).
        package: The package holding the files.
        files: The file names, read in order (a name defined in two files is refused).
    """

    __slots__ = ("dialect", "queries")

    def __init__(self, dialect: str, package: str, files: Tuple[str, ...]) -> None:
        self.dialect = dialect
        self.queries: Dict[str, Query] = {}
        for file in files:
            # a plain file next to the package's modules: importlib.resources would import
            # more of the standard library here, which a process that dropped its privileges
            # (the liveness tests' other OS user) may no longer read
            folder = Path(str(importlib.import_module(package).__file__)).parent
            text = (folder / file).read_text(encoding="utf-8")
            for name, query in parse_queries(text, f"{package}/{file}").items():
                if name in self.queries:
                    raise ValueError(f"{package}/{file}: statement {name!r} is defined twice")
                self.queries[name] = query

    def fill(self, names: Mapping[str, str], keys: Mapping[str, int]) -> Statements:
        """Every statement with its placeholders filled.

        Args:
            names: Placeholder -> table or index name, validated (letters, digits and
                underscores, not starting with a digit) and double-quoted.
            keys: Placeholder -> integer derived from the names (lock keys, constants).

        Raises:
            ValueError: An invalid name, or a placeholder that neither mapping fills.
        """
        values: Dict[str, str] = {}
        for placeholder, name in names.items():
            if not isinstance(name, str) or _NAME.fullmatch(name) is None:
                raise ValueError(f"invalid table or index name {name!r} for {{{placeholder}}}")
            values[placeholder] = f'"{name}"'
        for placeholder, key in keys.items():
            if isinstance(key, bool) or not isinstance(key, int):
                raise ValueError(f"key {placeholder!r} is not an int: {key!r}")
            values[placeholder] = str(key)
        texts: Dict[str, str] = {}
        for name, query in self.queries.items():

            def put(match: "re.Match[str]", name: str = name) -> str:
                try:
                    return values[match.group(1)]
                except KeyError:
                    raise ValueError(
                        f"{self.dialect} statement {name!r}: nothing fills "
                        f"{{{match.group(1)}}}"
                    ) from None

            texts[name] = _PLACEHOLDER.sub(put, query.text)
        return Statements(
            self.dialect, texts, {name: q.purpose for name, q in self.queries.items()}
        )


@lru_cache(maxsize=None)
def _loaded(dialect: str, package: str, files: Tuple[str, ...]) -> QuerySet:
    return QuerySet(dialect, package, files)


def load(dialect: str, package: str, files: Tuple[str, ...]) -> QuerySet:
    """The :class:`QuerySet` of ``files`` in ``package`` (parsed once per process)."""
    return _loaded(dialect, package, files)
