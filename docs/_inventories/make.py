"""Write the small intersphinx inventories the docs build reads instead of the network.

The docs are built with ``-W`` in CI, and CI has no network. Intersphinx would fetch each
project's ``objects.inv`` at build time: offline, it warns and the build fails. So the build
reads local inventories, written by this script from the installed packages' public names and
each project's documented URL pattern. ``docs/conf.py`` points ``intersphinx_mapping`` at the
upstream URL and these files, so links still go to the upstream pages.

Run it again after upgrading python-telegram-bot, psycopg2 or SQLAlchemy::

    python docs/_inventories/make.py

The files use Sphinx's inventory format version 2 (a header, then zlib-compressed lines of
``name domain:role priority uri display-name``).
"""

from __future__ import annotations

import builtins
import importlib
import inspect
import sys
import zlib
from pathlib import Path
from typing import Dict, Iterable, List, Tuple

HERE = Path(__file__).resolve().parent

# (name, role, uri) rows of one inventory
Rows = List[Tuple[str, str, str]]

# Standard-library modules whose names ptb_fence's docs and docstrings refer to.
PYTHON_MODULES = (
    "argparse", "asyncio", "collections.abc", "concurrent.futures", "contextlib", "dataclasses",
    "datetime", "enum", "json", "logging", "os", "pathlib", "pickle", "socket", "sqlite3",
    "threading", "time", "typing", "http.server", "wsgiref.simple_server",
)

# SQLAlchemy 2.x: the documented classes and functions ptb_fence's users meet, by page.
SQLALCHEMY_PAGES: Dict[str, Tuple[str, Tuple[str, ...]]] = {
    "sqlalchemy.engine": ("core/connections.html", ("Engine", "Connection", "Transaction")),
    "sqlalchemy": ("core/engines.html", ("create_engine",)),
    "sqlalchemy.orm": ("orm/session_api.html", ("Session", "sessionmaker")),
    "sqlalchemy.ext.asyncio": (
        "orm/extensions/asyncio.html",
        ("AsyncSession", "AsyncEngine", "AsyncConnection", "create_async_engine"),
    ),
    "sqlalchemy.schema": ("core/metadata.html", ("MetaData", "Table", "Column")),
    "sqlalchemy.pool": ("core/pooling.html", ("Pool", "QueuePool", "NullPool")),
}

# psycopg2: module-level names on module.html, classes on their own pages, as its docs have them.
PSYCOPG2_PAGES: Dict[str, Tuple[str, Tuple[str, ...]]] = {
    "psycopg2": (
        "module.html",
        ("connect", "Error", "Warning", "InterfaceError", "DatabaseError", "DataError",
         "OperationalError", "IntegrityError", "InternalError", "ProgrammingError",
         "NotSupportedError"),
    ),
    "psycopg2.pool": (
        "pool.html",
        ("AbstractConnectionPool", "SimpleConnectionPool", "ThreadedConnectionPool"),
    ),
    "psycopg2.errors": ("errors.html", ("LockNotAvailable", "SerializationFailure",
                                        "UniqueViolation", "UndefinedTable")),
    "psycopg2.extensions": ("extensions.html", ("connection", "cursor", "ISOLATION_LEVEL_AUTOCOMMIT")),
}


def role_of(obj: object) -> str:
    """The Python-domain role an object is documented under."""
    if inspect.isclass(obj):
        return "py:exception" if issubclass(obj, BaseException) else "py:class"
    if inspect.isroutine(obj):
        return "py:function"
    return "py:data"


def python_rows() -> Rows:
    """Builtins and the listed standard-library modules, as docs.python.org has them."""
    rows: Rows = [("None", "py:data", "library/constants.html#None"),
                  ("True", "py:data", "library/constants.html#True"),
                  ("False", "py:data", "library/constants.html#False")]
    for name, obj in vars(builtins).items():
        if name.startswith("_") or name in ("None", "True", "False"):
            continue
        if inspect.isclass(obj) and issubclass(obj, BaseException):
            rows.append((name, "py:exception", f"library/exceptions.html#{name}"))
        elif inspect.isclass(obj) or inspect.isroutine(obj):
            rows.append((name, "py:class" if inspect.isclass(obj) else "py:function",
                         f"library/functions.html#{name}"))
    for module_name in PYTHON_MODULES:
        module = importlib.import_module(module_name)
        page = f"library/{module_name}.html"
        rows.append((module_name, "py:module", f"{page}#module-{module_name}"))
        names = getattr(module, "__all__", None) or [n for n in vars(module) if not n.startswith("_")]
        for name in names:
            obj = getattr(module, name, None)
            if obj is None or inspect.ismodule(obj):
                continue
            rows.append((f"{module_name}.{name}", role_of(obj), f"{page}#{module_name}.{name}"))
    return rows


def _class_rows(qualified: str, cls: type, uri: str) -> Rows:
    rows: Rows = [(qualified, role_of(cls), f"{uri}#{qualified}")]
    for member, value in vars(cls).items():
        if member.startswith("_"):
            continue
        if inspect.isfunction(value) or isinstance(value, (staticmethod, classmethod)):
            rows.append((f"{qualified}.{member}", "py:method", f"{uri}#{qualified}.{member}"))
        elif isinstance(value, property):
            rows.append((f"{qualified}.{member}", "py:property", f"{uri}#{qualified}.{member}"))
    return rows


def telegram_rows() -> Rows:
    """python-telegram-bot: one page per class (``telegram.ext.application.html``)."""
    rows: Rows = []
    for module_name in ("telegram", "telegram.ext", "telegram.error", "telegram.request"):
        module = importlib.import_module(module_name)
        rows.append((module_name, "py:module", f"{module_name}.html#module-{module_name}"))
        for name in module.__all__:
            obj = getattr(module, name)
            qualified = f"{module_name}.{name}"
            if module_name == "telegram.error":
                rows.append((qualified, role_of(obj), f"telegram.error.html#{qualified}"))
            elif inspect.isclass(obj):
                rows += _class_rows(qualified, obj, f"{qualified.lower()}.html")
    return rows


def sqlalchemy_rows() -> Rows:
    """SQLAlchemy: anchors are the fully qualified names on each topic page."""
    rows: Rows = []
    for module_name, (page, names) in SQLALCHEMY_PAGES.items():
        module = importlib.import_module(module_name)
        for name in names:
            obj = getattr(module, name)
            qualified = f"{module_name}.{name}"
            if inspect.isclass(obj):
                rows += _class_rows(qualified, obj, page)
            else:
                rows.append((qualified, role_of(obj), f"{page}#{qualified}"))
    return rows


def psycopg2_rows() -> Rows:
    """psycopg2: module names anchored with their module, its classes by their short name."""
    rows: Rows = []
    for module_name, (page, names) in PSYCOPG2_PAGES.items():
        module = importlib.import_module(module_name)
        for name in names:
            obj = getattr(module, name)
            qualified = f"{module_name}.{name}"
            anchor = name if module_name == "psycopg2.extensions" and inspect.isclass(obj) else qualified
            rows.append((qualified, role_of(obj), f"{page}#{anchor}"))
    return rows


def write(path: Path, project: str, version: str, rows: Iterable[Tuple[str, str, str]]) -> int:
    """Write ``rows`` as an inventory of ``project``; return how many entries it has."""
    unique = sorted(set(rows))
    header = (
        "# Sphinx inventory version 2\n"
        f"# Project: {project}\n"
        f"# Version: {version}\n"
        "# The remainder of this file is compressed using zlib.\n"
    ).encode()
    body = "".join(f"{name} {role} 1 {uri} -\n" for name, role, uri in unique).encode()
    path.write_bytes(header + zlib.compress(body, 9))
    return len(unique)


def main() -> None:
    """Write the four inventories next to this script."""
    import psycopg2
    import sqlalchemy
    import telegram

    python_version = f"{sys.version_info.major}.{sys.version_info.minor}"
    made = {
        "python.inv": write(HERE / "python.inv", "Python", python_version, python_rows()),
        "telegram.inv": write(HERE / "telegram.inv", "python-telegram-bot",
                              telegram.__version__, telegram_rows()),
        "psycopg2.inv": write(HERE / "psycopg2.inv", "psycopg2",
                              psycopg2.__version__.split()[0], psycopg2_rows()),
        "sqlalchemy.inv": write(HERE / "sqlalchemy.inv", "SQLAlchemy",
                                sqlalchemy.__version__, sqlalchemy_rows()),
    }
    for name, count in made.items():
        print(f"{name}: {count} entries")


if __name__ == "__main__":
    main()
