"""``python -m ptb_fence.conformance``: the conformance check of a shipped store.

It is the same as ``ptb-fence check``, with the same options and exit status ``1`` on violations.
It runs on scratch files or tables, never on your table.
To check a custom store, call :func:`ptb_fence.conformance.check_update_store` from your tests.
"""

from __future__ import annotations

import sys

from ptb_fence.cli import main


if __name__ == "__main__":
    sys.exit(int(main(["check", *sys.argv[1:]]) or 0))
