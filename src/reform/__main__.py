"""``reform`` (the console script) and ``python -m reform``. A Ctrl-C while the commands load ends the process
at once with one line and exit status 130, as a Ctrl-C later does (``cli/common.py``), not a traceback
(docs/architecture.md, "The command line")."""

from __future__ import annotations

import os
import signal
import sys


def _interrupted_while_starting(signum, frame) -> None:
    sys.stderr.write("interrupted (Ctrl-C) while starting: nothing was done\n")
    sys.stderr.flush()
    os._exit(130)                 # nothing is open or half-written yet


def main() -> None:
    previous = signal.getsignal(signal.SIGINT)
    if previous is not signal.SIG_IGN:          # a Ctrl-C someone chose to ignore stays ignored
        signal.signal(signal.SIGINT, _interrupted_while_starting)
    from .cli.main import app
    signal.signal(signal.SIGINT, previous)
    app()


if __name__ == "__main__":
    main()
