"""The ``reform`` command line (layer 7 of docs/architecture.md, "The command line"): ``common`` holds what
every command shares, each command is a module over it, ``main`` registers them; the console script is
``reform.__main__``."""
