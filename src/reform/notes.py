"""The warnings reform itself gives, as classes, so that callers (and the test suite) can tell them apart:
each says how an input will be run, where the user may want to do otherwise. The command line prints them
as one ``note:`` line each; the test suite turns any it does not expect into an error (pyproject.toml)."""

from __future__ import annotations


class ReformWarning(UserWarning):
    """Any warning reform gives."""


class PlainPromptWarning(ReformWarning):
    """The model has no chat template (a base model): questions are asked as plain text."""


class GuessedHeadsWarning(ReformWarning):
    """No embedding-head preset for the model: REFORM's retrieval heads are guessed, not selected."""


class PastWindowWarning(ReformWarning):
    """A method that reads the whole input is run past the model's window: expect garbage."""
