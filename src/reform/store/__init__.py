"""Saved contexts on disk (layer 1 of docs/architecture.md, "Beyond one process"): ``format`` reads and writes one context file
(safetensors tensors + a JSON manifest, atomic, checksummed, no pickle); ``directory`` is a store of them
keyed by content with a size budget, in a local folder or at any fsspec URL. Knows nothing of methods,
HTTP or clusters."""

from .directory import ContextStore, StoredContext, open_filesystem
from .format import (FORMAT_VERSION, ContextFileError, read_manifest, read_manifest_bytes, read_tensors,
                     write_context_file)

__all__ = ["ContextStore", "StoredContext", "open_filesystem", "FORMAT_VERSION", "ContextFileError",
           "read_manifest", "read_manifest_bytes", "read_tensors", "write_context_file"]
