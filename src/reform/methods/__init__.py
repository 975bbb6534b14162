from .base import REGISTRY, Answer, CachedMethod, Context, Method
from .full import Full
from .h2o import H2OConfig, H2OMethod
from .ilre import ILRe, ILReConfig
from .infinipot import InfiniPotConfig, InfiniPotMethod
from .infllm import InfLLMConfig, InfLLMMethod
from .options import OptionError
from .rag import RagBM25, RagConfig, RagDense
from .reattention import ReAttention, ReAttentionConfig
from .reform import Reform, ReformConfig
from .reform_rag import ReformRag, ReformRagConfig
from .streaming import Streaming, StreamingConfig
from .tova import TOVAConfig, TOVAMethod
from .truncate import Truncate, TruncateConfig

__all__ = ["REGISTRY", "Answer", "CachedMethod", "Context", "Method", "OptionError", "Full", "Reform",
           "ReformConfig", "ReformRag", "ReformRagConfig", "Truncate", "TruncateConfig", "Streaming",
           "StreamingConfig", "H2OMethod", "H2OConfig", "TOVAMethod", "TOVAConfig", "RagBM25", "RagDense",
           "RagConfig", "InfiniPotMethod", "InfiniPotConfig",
           "InfLLMMethod", "InfLLMConfig"]
