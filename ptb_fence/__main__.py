"""``python -m ptb_fence``: ``demo`` runs the offline demo; other commands are the CLI."""

from __future__ import annotations

import sys


def main() -> int:
    """Dispatch ``python -m ptb_fence <command>``."""
    argv = sys.argv[1:]
    if argv[:1] == ["demo"]:
        from ptb_fence._demo import main as demo_main

        return demo_main(argv[1:])
    try:
        from ptb_fence.cli import main as cli_main
    except ImportError:
        print("usage: python -m ptb_fence demo [--updates N] [--chats N]", file=sys.stderr)
        return 2
    return int(cli_main(argv) or 0)


if __name__ == "__main__":
    sys.exit(main())
