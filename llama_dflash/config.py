"""Configuration dataclasses: what the user asks for, validated before any model is loaded."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

__all__ = ["SpecConfig", "TargetConfig", "ALGORITHMS", "ROLLBACK_MODES", "FLASH_ATTN_MODES"]

ALGORITHMS = ("auto", "dflash", "dspark")
ROLLBACK_MODES = ("auto", "native", "checkpoint")
FLASH_ATTN_MODES = ("auto", "on", "off")


def _check_int(name: str, value: object, minimum: int, maximum: Optional[int] = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer, not {value!r}")
    if value < minimum or (maximum is not None and value > maximum):
        bound = f">= {minimum}" if maximum is None else f"in {minimum}..{maximum}"
        raise ValueError(f"{name} must be {bound}, not {value}")


@dataclass
class SpecConfig:
    """How to draft: which draft file, which algorithm, how many tokens and how picky.

    `draft_n_max` is clamped to what the draft's block can yield (with a warning) once the
    draft file is known; see `LlamaDFlashDecoding`.
    """

    draft_model: str
    algorithm: str = "auto"
    draft_n_max: int | str = 7  # or "auto": adaptive length, the draft's block as the ceiling
    draft_n_min: int = 0
    draft_p_min: float = 0.0
    # the draft's top candidates picked by a top-k sampler inside its graph: True, False, or "auto"
    # (only where the draft runs on a GPU: on the CPU reading the rows costs less, 2.1 vs 3.1 ms per
    # 5-row block of the default draft, bench/draft_cost.py)
    backend_sampling: bool | str = "auto"
    draft_n_gpu_layers: int = -1
    draft_n_threads: Optional[int] = None
    # recurrent/hybrid targets: "auto", "native" (n_rs_seq snapshots) or "checkpoint" (see rewind)
    rollback: str = "auto"

    @property
    def adaptive(self) -> bool:
        return self.draft_n_max == "auto"

    def __post_init__(self) -> None:
        if not isinstance(self.draft_model, (str, os.PathLike)) or not os.fspath(self.draft_model):
            raise ValueError(f"draft_model must be a path to a draft GGUF, not {self.draft_model!r}")
        self.draft_model = os.fspath(self.draft_model)
        if self.algorithm not in ALGORITHMS:
            raise ValueError(f"algorithm must be one of {', '.join(ALGORITHMS)}, not {self.algorithm!r}")
        if self.draft_n_max != "auto":
            if isinstance(self.draft_n_max, str):
                raise ValueError(f"draft_n_max must be an integer >= 1 or 'auto', not {self.draft_n_max!r}")
            _check_int("draft_n_max", self.draft_n_max, 1)
        _check_int("draft_n_min", self.draft_n_min, 0)
        if self.draft_n_max != "auto" and self.draft_n_min > self.draft_n_max:
            raise ValueError(
                f"draft_n_min ({self.draft_n_min}) must not exceed draft_n_max ({self.draft_n_max})"
            )
        if isinstance(self.draft_p_min, bool) or not isinstance(self.draft_p_min, (int, float)):
            raise ValueError(f"draft_p_min must be a number in [0, 1], not {self.draft_p_min!r}")
        if not 0.0 <= float(self.draft_p_min) <= 1.0:
            raise ValueError(f"draft_p_min must be in [0, 1], not {self.draft_p_min}")
        self.draft_p_min = float(self.draft_p_min)
        if not isinstance(self.backend_sampling, bool) and self.backend_sampling != "auto":
            raise ValueError(f"backend_sampling must be True, False or 'auto', not {self.backend_sampling!r}")
        _check_int("draft_n_gpu_layers", self.draft_n_gpu_layers, -1)
        if self.rollback not in ROLLBACK_MODES:
            raise ValueError(f"rollback must be one of {', '.join(ROLLBACK_MODES)}, not {self.rollback!r}")
        if self.draft_n_threads is not None:
            _check_int("draft_n_threads", self.draft_n_threads, 1)


@dataclass
class TargetConfig:
    """How to load the target model and size its context."""

    model: str
    n_ctx: int = 2048
    n_batch: int = 512
    n_ubatch: int = 512
    n_threads: Optional[int] = None
    n_gpu_layers: int = -1
    seed: int = 0
    verbose: bool = False
    repack: Optional[bool] = None  # llama.cpp CPU weight repacking; None: off on AMX CPUs (crashes there)
    flash_attn: str = "auto"  # "auto" (llama.cpp's default), "on" or "off"

    def __post_init__(self) -> None:
        if not isinstance(self.model, (str, os.PathLike)) or not os.fspath(self.model):
            raise ValueError(f"model must be a path to a target GGUF, not {self.model!r}")
        self.model = os.fspath(self.model)
        _check_int("n_ctx", self.n_ctx, 16)
        _check_int("n_batch", self.n_batch, 1)
        _check_int("n_ubatch", self.n_ubatch, 1)
        if self.n_ubatch > self.n_batch:
            raise ValueError(f"n_ubatch ({self.n_ubatch}) must not exceed n_batch ({self.n_batch})")
        if self.n_threads is not None:
            _check_int("n_threads", self.n_threads, 1)
        _check_int("n_gpu_layers", self.n_gpu_layers, -1)
        if self.flash_attn not in FLASH_ATTN_MODES:
            raise ValueError(f"flash_attn must be one of {', '.join(FLASH_ATTN_MODES)}, not {self.flash_attn!r}")
