"""DFlash and DSpark speculative decoding for GGUF models on llama-cpp-python."""

from .config import SpecConfig, TargetConfig
from .engine import GenerationResult, LlamaDFlashDecoding, OrdinaryDecoding
from .errors import DFlashError, GGUFFileError, IncompatibleModelError, UnsupportedTargetError
from .sampling import SamplingParams
from .stats import SpecStats

__version__ = "0.1.0"

__all__ = [
    "SpecConfig",
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
