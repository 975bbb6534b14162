"""Full attention: the whole prompt through the model at once; the reference every method approaches."""

from __future__ import annotations

from .base import Method, register


@register
class Full(Method):
    """Plain generation over the whole input (only possible inside the model's window)."""

    name = "full"
