"""The ordinary-versus-speculative benchmark (`llama-dflash bench`)."""

from .runner import BenchConfig, BenchResult, ModeResult, RunResult, run_benchmark

__all__ = ["BenchConfig", "BenchResult", "ModeResult", "RunResult", "run_benchmark"]
