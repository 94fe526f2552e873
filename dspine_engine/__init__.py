"""dspine_engine: parallel speculative decoding with DSpine drafters, on our own kernels.

    from dspine_engine import Engine, SamplingParams
    engine = Engine()                       # SmolLM2-135M-Instruct, autoregressive
    engine = Engine(draft="default")        # + the shipped DSpine drafter
    print(engine.generate("Hello!", SamplingParams(max_tokens=64))[0].text)
"""
from .engine.config import EngineConfig
from .engine.engine import Engine, EngineStats
from .engine.handles import RequestHandle
from .engine.kv_cache import KVCacheFullError
from .engine.outputs import GenerationResult, RequestOutput, RequestStats
from .engine.sampling import SamplingParams
from .distributed import TensorParallelError

__all__ = ["Engine", "EngineConfig", "EngineStats", "SamplingParams", "GenerationResult",
           "RequestHandle", "RequestOutput", "RequestStats", "KVCacheFullError",
           "TensorParallelError"]
__version__ = "0.1.0"
