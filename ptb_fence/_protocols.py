"""The store contract's earlier home: every name of :mod:`ptb_fence.contract`, for code that
still imports from here."""

from ptb_fence.contract import *  # noqa: F401,F403
from ptb_fence.contract import __all__  # noqa: F401
