"""``python -m ptb_fence.chaos``: see :mod:`ptb_fence.chaos`."""

import sys

from ptb_fence.chaos._runner import main

if __name__ == "__main__":
    sys.exit(main())
