"""Saved contexts on disk (DESIGN.md, "Beyond one process"): ``format`` reads and writes one context file
(safetensors tensors + a JSON manifest, atomic, checksummed, no pickle); ``directory`` is a store of them
keyed by content with a size budget. Knows nothing of methods, HTTP or clusters."""

from .directory import ContextStore, StoredContext
from .format import FORMAT_VERSION, ContextFileError, read_manifest, read_tensors, write_context_file

__all__ = ["ContextStore", "StoredContext", "FORMAT_VERSION", "ContextFileError", "read_manifest", "read_tensors",
           "write_context_file"]
