"""``reform``: the command line's entry point. The commands live in their own modules over ``common``;
importing them here registers them (docs/architecture.md, "cli")."""

from __future__ import annotations

import typer

from ..version import __version__
from . import ask, bench, encode, models, serve  # noqa: F401  (register `reform ask|demo|bench|encode|models|serve`)
from .common import app
from .eval import app as eval_app
from .heads import app as heads_app
from .library import app as library_app


def _print_version(asked: bool) -> None:
    if asked:
        typer.echo(f"reform {__version__}")
        raise typer.Exit()


@app.callback()
def _options(version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                          help="Print reform's version and exit.")) -> None:
    pass


app.add_typer(heads_app, name="heads")
app.add_typer(eval_app, name="eval")
app.add_typer(library_app, name="library")

__all__ = ["app", "main"]


def main():
    app()


if __name__ == "__main__":
    main()
