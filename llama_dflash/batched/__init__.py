"""Many sequences in one target context (continuous batching), for `llama-dflash serve --parallel N`."""

from .engine import BatchedEngine, EngineClosed, SeqStats, Sequence_, physical_cores

__all__ = ["BatchedEngine", "EngineClosed", "SeqStats", "Sequence_", "physical_cores"]
