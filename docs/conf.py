"""Sphinx configuration of the ptb_fence documentation (``python -m sphinx -W docs docs/_build``)."""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
# Build from the checkout even when the package is not installed (a plain clone).
sys.path.insert(0, os.path.abspath(os.path.join(HERE, "..")))
# Small local extensions: the CLI, the option table and the capability table, rendered from
# the code.
sys.path.insert(0, os.path.join(HERE, "_ext"))

import ptb_fence  # noqa: E402

project = "ptb_fence"
author = "ptb_fence developers"
release = ptb_fence.__version__
version = release

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.intersphinx",
    "sphinx.ext.doctest",
    "ptb_fence_cli",
    "ptb_fence_options",
    "ptb_fence_capabilities",
]

# Google-style docstrings, as python-telegram-bot writes them.
napoleon_google_docstring = True
napoleon_numpy_docstring = False
# "Attributes:" sections become fields, so a property documented there is not described twice.
napoleon_use_ivar = True
autodoc_member_order = "bysource"
autodoc_typehints = "description"
# The reference pages name the members a user calls: no page lists every member by default.
autodoc_default_options = {"show-inheritance": True}
# Optional imports that a docs build need not have.
autodoc_mock_imports = ["prometheus_client"]


def _inventory(name: str) -> str:
    return os.path.join(HERE, "_inventories", f"{name}.inv")


# No network at build time (CI has none): each project's inventory is a local file written by
# docs/_inventories/make.py, and the links go to the upstream URL.
intersphinx_mapping = {
    "python": ("https://docs.python.org/3", _inventory("python")),
    "telegram": ("https://docs.python-telegram-bot.org/en/v22.x", _inventory("telegram")),
    "psycopg2": ("https://www.psycopg.org/docs", _inventory("psycopg2")),
    "sqlalchemy": ("https://docs.sqlalchemy.org/en/20", _inventory("sqlalchemy")),
}

# Names in type hints that autodoc cannot resolve to a documented target (third-party types
# and private helpers) are not errors of this reference.
nitpicky = False

# The link check follows the site's own references only: -W already fails on a broken
# :doc: or :ref:, and CI has no network for the external ones.
linkcheck_ignore = [r"https?://.*"]

exclude_patterns = ["_build", "_inventories", "_ext"]
html_theme = "furo"
html_title = f"ptb_fence {release}"
html_short_title = "ptb_fence"
html_theme_options = {
    "navigation_with_keys": True,
}
