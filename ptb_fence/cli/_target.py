"""StoreTarget: the ``--store`` URL of the command line, parsed, masked and connectable."""

from __future__ import annotations

import math
import os
import re
import sqlite3
import urllib.parse
from typing import Any, Dict, FrozenSet, Optional, Set

from ptb_fence.cli._errors import Refused, StoreFailure
from ptb_fence.cli._format import one_line

__all__ = ["StoreTarget"]

_SQLITE_PREFIX = "sqlite:///"
_POSTGRES_SCHEMES = ("postgresql", "postgres")
# SQLAlchemy names the driver after a "+" (postgresql+psycopg2://, sqlite+pysqlite:///): the
# command line connects with psycopg2 or sqlite3 whatever driver the application uses
_DRIVER = re.compile(r"^(postgresql|postgres|sqlite)\+[A-Za-z0-9_]+(?=://)", re.IGNORECASE)
# the keywords of a libpq key=value connection string that make it one (not a file path)
_KEYWORD_DSN = re.compile(r"^\s*(host|hostaddr|port|dbname|user|password|service|sslmode)\s*=")
_CONNECT_TIMEOUT = 10
_KV_SECRET = re.compile(r"((?:ssl)?password\s*=\s*)('(?:[^'\\]|\\.)*'|[^&\s]+)", re.IGNORECASE)


def _secrets(url: str) -> FrozenSet[str]:
    """Every spelling of a password found in ``url`` (raw, unquoted, percent-encoded)."""
    found: Set[str] = set()
    try:
        parts = urllib.parse.urlsplit(url)
        if parts.password:
            found.add(parts.password)
    except ValueError:
        pass
    match = re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://[^/?#@]*?:([^/?#]*)@", url)
    if match and match.group(1):
        found.add(match.group(1))
    for kv in _KV_SECRET.finditer(url):
        found.add(kv.group(2))
        found.add(kv.group(2).strip("'"))
    try:
        import psycopg2.extensions

        parsed = psycopg2.extensions.parse_dsn(url)
        for key in ("password", "sslpassword"):
            if parsed.get(key):
                found.add(parsed[key])
    except Exception:
        pass
    for value in list(found):
        found.add(urllib.parse.unquote(value))
        found.add(urllib.parse.quote(value, safe=""))
    return frozenset(value for value in found if value)


_SQLITE_HEADER = b"SQLite format 3\x00"


def _require_sqlite_header(path: str) -> None:
    """Refuse a non-empty file that does not start with SQLite's magic header (exit 2)."""
    try:
        with open(path, "rb") as file:
            head = file.read(len(_SQLITE_HEADER))
    except OSError as exc:
        raise StoreFailure(f"cannot read {path}: {exc.strerror or exc}") from None
    if head and head != _SQLITE_HEADER:
        raise Refused(
            f"{path} is not a SQLite database (its first bytes are not SQLite's header): "
            "check --store"
        )


def _looks_like_path(text: str) -> bool:
    """A bare file path, not a libpq ``key=value`` DSN nor any URL (those may hold secrets)."""
    return (
        "://" not in text
        and not any(c.isspace() or c in "=@?&'\"" for c in text)
        and bool(re.fullmatch(r"[\w./~+-]+", text))
    )


class StoreTarget:
    """Where a command works: a SQLite file or a PostgreSQL database, from a ``--store`` URL.

    The URL is one of these:

    - ``sqlite:///relative/path.db`` or ``sqlite:////absolute/path.db``. The path is
      everything after ``sqlite:///``, as in SQLAlchemy.
    - A plain path to an existing file, taken as SQLite.
    - A ``postgresql://`` / ``postgres://`` libpq URI.
    - A libpq keyword string (``host=db dbname=bot user=bot``).

    A SQLAlchemy URL's driver is dropped (``postgresql+psycopg2://`` is ``postgresql://``).
    So an application's own setting can be passed as it is.
    The password of a DSN never appears in :attr:`display` or in messages passed through
    :meth:`redact`.

    Args:
        url (:obj:`str`): The ``--store`` value.

    Raises:
        ptb_fence.cli._errors.Refused: The URL is empty, has an unknown scheme or no path.
    """

    __slots__ = ("_secrets", "display", "dsn", "kind", "path", "schema")

    def __init__(self, url: str) -> None:
        self._secrets: FrozenSet[str] = frozenset()
        self.dsn: Optional[str] = None
        self.path: Optional[str] = None
        # PostgreSQL: the schema of --table schema.table (connections get it as search_path)
        self.schema: Optional[str] = None
        if not isinstance(url, str) or not url.strip():
            raise Refused(
                "no store given: pass --store sqlite:///path/to.db or --store "
                "postgresql://user@host/db (or set PTB_FENCE_STORE)"
            )
        url = _DRIVER.sub(lambda m: m.group(1), url.strip())
        self._secrets = _secrets(url)
        scheme = url.split(":", 1)[0].lower() if ":" in url else ""
        if scheme == "sqlite":
            if not url.startswith(_SQLITE_PREFIX) or len(url) == len(_SQLITE_PREFIX):
                raise Refused(
                    f"invalid SQLite store URL {url!r}: write sqlite:///relative/path.db or "
                    "sqlite:////absolute/path.db"
                )
            raw = url[len(_SQLITE_PREFIX):]
            if raw == ":memory:":
                raise Refused("sqlite:///:memory: has no rows to inspect; name a database file")
            self.kind = "sqlite"
            self.path = os.path.abspath(raw)
            self.display = url
        elif scheme in _POSTGRES_SCHEMES:
            self.kind = "postgresql"
            self.dsn = url
            self.display = self._mask(url)
            self._check_dsn()
        elif "://" not in url and _KEYWORD_DSN.match(url):
            self.kind = "postgresql"
            self.dsn = url
            self.display = self.redact(_KV_SECRET.sub(lambda m: m.group(1) + "***", url))
            self._check_dsn()
        elif _looks_like_path(url) and os.path.isfile(url):
            # a plain path to an existing file: the SQLite file it names
            self.kind = "sqlite"
            self.path = os.path.abspath(url)
            self.display = _SQLITE_PREFIX + url
        else:
            # never echo the URL itself: it may hold a password
            prefix = url.split("://", 1)[0] if "://" in url else ""
            if re.fullmatch(r"[A-Za-z][A-Za-z0-9+.-]*", prefix):
                what = f"unknown store URL scheme {prefix + '://'!r}"
            else:
                what = "the store URL has no scheme"
                if _looks_like_path(url):  # a path holds no password: safe to echo
                    raise Refused(
                        f"{what} and no file {url!r} exists: for a SQLite file write "
                        f"--store {_SQLITE_PREFIX}{url} (or a postgresql:// DSN)"
                    )
            raise Refused(
                f"{what}: use --store sqlite:///path/to.db, a postgresql:// DSN or a libpq "
                "keyword string (host=... dbname=...)"
            )

    # -- secrets ---------------------------------------------------------------------------
    def _mask(self, url: str) -> str:
        try:
            parts = urllib.parse.urlsplit(url)
            netloc = parts.netloc
            if parts.password is not None and "@" in netloc:
                userinfo, host = netloc.rsplit("@", 1)
                user = userinfo.split(":", 1)[0]
                netloc = f"{user}:***@{host}"
            query = _KV_SECRET.sub(lambda m: m.group(1) + "***", parts.query)
            masked = urllib.parse.urlunsplit(
                (parts.scheme, netloc, parts.path, query, parts.fragment)
            )
        except ValueError:
            masked = url.split("://", 1)[0] + "://***"
        return self.redact(masked)

    def redact(self, text: Any) -> str:
        """``text`` with every spelling of the DSN's password replaced by ``***``."""
        out = str(text)
        for secret in sorted(self._secrets, key=len, reverse=True):
            out = out.replace(secret, "***")
        return out

    def _check_dsn(self) -> None:
        import psycopg2
        import psycopg2.extensions

        assert self.dsn is not None
        problem: Optional[str] = None
        try:
            psycopg2.extensions.parse_dsn(self.dsn)
        except psycopg2.Error as exc:
            problem = self.redact(one_line(exc))
        if problem is not None:
            # a quoted fragment of an unparsable DSN may be part of a password: quote nothing
            problem = re.sub(r'"[^"]*"', '"…"', problem)
            raise Refused(f"invalid PostgreSQL DSN {self.display}: {problem}")

    # -- connections -----------------------------------------------------------------------
    @property
    def is_sqlite(self) -> bool:
        """:obj:`bool`: Whether the target is a SQLite file."""
        return self.kind == "sqlite"

    def connect_sqlite(self, timeout: Optional[float] = None) -> sqlite3.Connection:
        """Open the existing SQLite file in autocommit mode. It never creates one.

        Args:
            timeout (:obj:`float`, optional): Seconds to wait for a lock held by a writer
                (default 10).

        Raises:
            ptb_fence.cli._errors.Refused: The file does not exist.
            ptb_fence.cli._errors.StoreFailure: It cannot be opened.
        """
        assert self.path is not None
        if os.path.isdir(self.path):
            raise Refused(
                f"{self.path} is a directory, not a SQLite database: name the database file "
                "in --store (sqlite:///path/to/file.db)"
            )
        if not os.path.isfile(self.path):
            raise Refused(
                f"no SQLite database at {self.path}: check --store (sqlite:///relative.db or "
                "sqlite:////absolute.db); ptb-fence does not create databases"
            )
        _require_sqlite_header(self.path)
        uri = "file:" + urllib.parse.quote(self.path) + "?mode=rw"
        wait = 10.0 if timeout is None else timeout
        try:
            # timeout= is SQLite's busy timeout
            conn = sqlite3.connect(uri, uri=True, timeout=wait, isolation_level=None)
        except sqlite3.Error as exc:
            raise StoreFailure(f"cannot open the SQLite database {self.path}: {exc}") from None
        return conn

    def connect_postgres(self, timeout: Optional[float] = None) -> Any:
        """Open a psycopg2 connection (transactions on, ``connect_timeout`` 10 s by default).

        Args:
            timeout (:obj:`float`, optional): The ``connect_timeout`` in seconds, used even when
                the DSN sets one. libpq's minimum is 2 s. By default it is the DSN's, else 10 s.

        Raises:
            ptb_fence.cli._errors.StoreFailure: The server cannot be reached. The message never
                contains the password.
        """
        import psycopg2
        import psycopg2.extensions

        assert self.dsn is not None
        kwargs: Dict[str, Any] = {}
        if timeout is not None:
            # Whole seconds only. libpq takes anything below 2 as 2.
            kwargs["connect_timeout"] = max(2, math.ceil(timeout))
        elif "connect_timeout" not in psycopg2.extensions.parse_dsn(self.dsn):
            kwargs["connect_timeout"] = _CONNECT_TIMEOUT
        if self.schema is not None:
            from ptb_fence.stores.postgres._connections import search_path_option

            options = psycopg2.extensions.parse_dsn(self.dsn).get("options")
            kwargs["options"] = search_path_option(options, self.schema)
        failure: Optional[str] = None
        try:
            return psycopg2.connect(self.dsn, **kwargs)
        except psycopg2.Error as exc:
            failure = self.redact(one_line(exc))
        raise StoreFailure(f"cannot connect to PostgreSQL at {self.display}: {failure}")

    def __repr__(self) -> str:
        return f"StoreTarget({self.display!r})"
