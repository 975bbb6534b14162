"""One module per long-context method (layer 3 of docs/architecture.md, "Where a method's logic lives"):
a class named after its paper with a ``Config`` dataclass of options and, when it evicts, its policy,
registered by name; the policies several methods share live in ``reform.engine.policies``. Adding a
method is its module and one import line here."""

from .base import REGISTRY, Answer, CachedMethod, Context, Method
from .full import Full
from .h2o import H2OConfig, H2O
from .ilre import ILRe, ILReConfig
from .infinipot import InfiniPotConfig, InfiniPot
from .infllm import InfLLMConfig, InfLLM
from .options import OptionError
from .rag import RagBM25, RagConfig, RagDense
from .reattention import ReAttention, ReAttentionConfig
from .reform import Reform, ReformConfig
from .reform_rag import ReformRag, ReformRagConfig
from .streaming import StreamingConfig, StreamingLLM
from .tova import TOVAConfig, TOVA
from .truncate import Truncate, TruncateConfig

# What documents are encoded with when no method is named (`reform ask FILE`, `reform encode`, `reform serve`,
# `Pipeline`): REFORM+RAG (REFORM §4.4) with dense and BM25 passage scores, max-pooled as REFORM pools its
# own, which gathered the evidence of real documents where REFORM's gather alone missed it (docs/methods.md,
# "Documents"). Text that is not a document keeps REFORM.
DOCUMENTS_METHOD = ("reform+rag", {"retriever": "dense+bm25", "pool_passages": True})

__all__ = ["DOCUMENTS_METHOD", "REGISTRY", "Answer", "CachedMethod", "Context", "Method", "OptionError", "Full", "Reform",
           "ReformConfig", "ReformRag", "ReformRagConfig", "Truncate", "TruncateConfig", "StreamingLLM",
           "StreamingConfig", "H2O", "H2OConfig", "TOVA", "TOVAConfig", "RagBM25", "RagDense", "RagConfig",
           "InfiniPot", "InfiniPotConfig", "InfLLM", "InfLLMConfig", "ILRe", "ILReConfig", "ReAttention",
           "ReAttentionConfig"]
