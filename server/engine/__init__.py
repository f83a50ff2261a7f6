"""The reference engine: paged KV cache, continuous batching, chunked prefill, prefix caching.

Public surface: `EngineConfig`, `LLMEngine`, `SamplingParams`, `RequestOutput`,
`StepOutput`. Everything else is internal to the package.
"""

from .config import EngineConfig
from .llm_engine import LLMEngine
from .outputs import RequestOutput, StepOutput
from .sampling import SamplingParams

__all__ = ["EngineConfig", "LLMEngine", "RequestOutput", "SamplingParams", "StepOutput"]
