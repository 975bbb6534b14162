"""``reform`` (the console script) and ``python -m reform``. Loading the commands imports torch (seconds on a
small machine), so it happens here, inside a guard: a Ctrl-C in that time is a one-line exit 130, like a
Ctrl-C later, not Python's traceback (docs/architecture.md, "The command line")."""

from __future__ import annotations

import sys


def main() -> None:
    try:
        from .cli.main import app
    except KeyboardInterrupt:
        print("interrupted (Ctrl-C) while starting: nothing was done", file=sys.stderr)
        sys.exit(130)
    app()


if __name__ == "__main__":
    main()
