"""The library version (recorded in saved contexts and eval configs)."""

__version__ = "0.1.0"
