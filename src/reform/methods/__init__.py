from .base import REGISTRY, Answer, Context, Method
from .full import Full
from .reform import Reform, ReformConfig

__all__ = ["REGISTRY", "Answer", "Context", "Method", "Full", "Reform", "ReformConfig"]
