"""One module per long-context method (layer 3 of docs/architecture.md, "Where a method's logic lives"):
a class named after its paper with a ``Config`` dataclass of options, registered by name; the engine
policies they build live in ``reform.engine.policies``."""

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

# What `reform ask FILE` and `reform encode` run when no --method is given: REFORM+RAG (REFORM §4.4) with
# dense and BM25 passage scores, max-pooled as REFORM pools its own, which gathered the evidence of real
# documents where REFORM's gather alone missed it (docs/methods.md, "Documents"). Text given by other means
# keeps REFORM.
DOCUMENTS_METHOD = ("reform+rag", {"retriever": "dense+bm25", "pool_passages": True})

# Earlier names, kept for code that imports them: a method class is named after its paper (docs/architecture.md).
H2OMethod, TOVAMethod, InfiniPotMethod, InfLLMMethod, Streaming = H2O, TOVA, InfiniPot, InfLLM, StreamingLLM

__all__ = ["DOCUMENTS_METHOD", "REGISTRY", "Answer", "CachedMethod", "Context", "Method", "OptionError", "Full", "Reform",
           "ReformConfig", "ReformRag", "ReformRagConfig", "Truncate", "TruncateConfig", "StreamingLLM",
           "StreamingConfig", "H2O", "H2OConfig", "TOVA", "TOVAConfig", "RagBM25", "RagDense", "RagConfig",
           "InfiniPot", "InfiniPotConfig", "InfLLM", "InfLLMConfig", "ILRe", "ILReConfig", "ReAttention",
           "ReAttentionConfig", "H2OMethod", "TOVAMethod", "InfiniPotMethod", "InfLLMMethod", "Streaming"]
