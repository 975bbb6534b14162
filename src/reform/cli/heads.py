"""``reform heads ...``: find and inspect embedding heads."""

from __future__ import annotations

import typer

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Find and inspect REFORM's embedding heads.")
