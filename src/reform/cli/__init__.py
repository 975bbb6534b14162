"""The ``reform`` command line (layer 7 of docs/architecture.md, "The command line"): ``common`` holds what
every command shares, each command is a module over it, ``main`` registers them."""

from __future__ import annotations

import sys


def main() -> None:
    """The ``reform`` console script. Loading the commands imports torch (seconds on a small machine); a
    Ctrl-C in that time is a one-line exit 130, like a Ctrl-C later, not Python's traceback."""
    try:
        from .main import app
    except KeyboardInterrupt:
        print("interrupted (Ctrl-C) while starting: nothing was done", file=sys.stderr)
        sys.exit(130)
    app()
