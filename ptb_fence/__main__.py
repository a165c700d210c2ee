"""``python -m ptb_fence``: ``demo`` runs the offline demo. Other commands are the CLI."""

from __future__ import annotations

import sys

from ptb_fence.cli import main as cli_main


def main() -> int:
    """Dispatch ``python -m ptb_fence <command>``."""
    argv = sys.argv[1:]
    if argv[:1] == ["demo"]:
        from ptb_fence._demo import main as demo_main

        return demo_main(argv[1:])
    if not argv or argv[0] in ("-h", "--help"):
        print(
            "python -m ptb_fence demo [--updates N] [--chats N]\n"
            "    the offline demo: a fenced PTB bot over SQLite survives a pause past its lease\n"
            "    and a SIGKILL; nothing lost, nothing written twice\n"
            "python -m ptb_fence <command> ...\n"
            "    the operator command line (also installed as ptb-fence):\n"
        )
    return int(cli_main(argv) or 0)


if __name__ == "__main__":
    sys.exit(main())
