"""DFlash and DSpark speculative decoding for GGUF models on llama-cpp-python."""

from .config import SpecConfig, SpeculativeType, TargetConfig
from .engine import GenerationResult, LlamaDFlashDecoding, OrdinaryDecoding
from .errors import DFlashError, GGUFFileError, IncompatibleModelError, UnsupportedTargetError
from .sampling import SamplingParams
from .stats import SpecStats

__version__ = "0.1.0"


def __getattr__(name: str):
    # the llama_cpp.Llama subclass is imported on first use only
    if name == "Llama":
        from .highlevel import Llama

        return Llama
    raise AttributeError(f"module 'llama_dflash' has no attribute {name!r}")


__all__ = [
    "Llama",
    "SpecConfig",
    "SpeculativeType",
    "TargetConfig",
    "LlamaDFlashDecoding",
    "OrdinaryDecoding",
    "GenerationResult",
    "SamplingParams",
    "SpecStats",
    "DFlashError",
    "GGUFFileError",
    "IncompatibleModelError",
    "UnsupportedTargetError",
]
