"""Sphinx configuration of the ptb_fence API reference (``python -m sphinx -W docs docs/_build``)."""

import os
import sys

# Build from the checkout even when the package is not installed (a plain clone).
sys.path.insert(0, os.path.abspath(".."))

import ptb_fence  # noqa: E402

project = "ptb_fence"
author = "ptb_fence developers"
release = ptb_fence.__version__
version = release

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.intersphinx",
]

# Google-style docstrings, as python-telegram-bot writes them.
napoleon_google_docstring = True
napoleon_numpy_docstring = False
# "Attributes:" sections become fields, so a property documented there is not described twice.
napoleon_use_ivar = True
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "show-inheritance": True}
# Optional imports that a docs build need not have.
autodoc_mock_imports = ["prometheus_client"]

# No network at build time: intersphinx inventories are not fetched, references stay plain text.
intersphinx_mapping: dict = {}

# Names in type hints that autodoc cannot resolve to a documented target (third-party types
# and private helpers) are not errors of this reference.
nitpicky = False

exclude_patterns = ["_build"]
html_theme = "alabaster"
html_title = f"ptb_fence {release}"
