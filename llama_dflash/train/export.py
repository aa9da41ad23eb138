"""Export to a draft GGUF, parity against llama.cpp, and acceptance evaluation through the engine."""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import torch

from ..writer import DraftShape, write_draft
from .model import DraftModel

__all__ = ["export_draft", "parity_check", "evaluate_acceptance"]


def export_draft(model: DraftModel, path: str, *, target_path: str, mask_token_id: int,
                 name: str = "dflash-draft") -> str:
    return write_draft(path, model.shape, model.export_weights(), tokenizer_from=target_path,
                       mask_token_id=mask_token_id, name=name)


def _engine(target_path: str, draft_path: str, n_max: int, n_threads: Optional[int], n_ctx: int):
    from ..config import SpecConfig, TargetConfig
    from ..engine import LlamaDFlashDecoding

    return LlamaDFlashDecoding(TargetConfig(model=target_path, n_ctx=n_ctx, n_threads=n_threads),
                               SpecConfig(draft_model=draft_path, draft_n_max=n_max))


def parity_check(model: DraftModel, draft_path: str, target_path: str, sequences: Sequence[tuple[np.ndarray, np.ndarray]],
                 *, anchors_per_seq: int = 4, seed: int = 0, n_threads: Optional[int] = None) -> dict:
    """Top-1 agreement between llama.cpp (the engine's DFlashProposer: inject features, decode a
    block, argmax) and the PyTorch model on the same features, over all block slots 1..B-1.

    sequences: (tokens [L], features [L, W]) pairs; features are used as float32 on both sides.
    """
    B = model.shape.block_size
    rng = np.random.default_rng(seed)
    n_ctx = max(64, max(len(t) for t, _ in sequences) + B + 8)
    eng = _engine(target_path, draft_path, B - 1, n_threads, n_ctx)
    agree = total = 0
    try:
        prop = eng._dflash
        for toks, feats in sequences:
            feats = np.ascontiguousarray(feats, dtype=np.float32)
            L = len(toks)
            if L < 3:
                continue
            anchors = np.sort(rng.choice(np.arange(1, L - 1), size=min(anchors_per_seq, L - 2), replace=False))
            prop.clear()
            injected = 0
            ll_out = []
            for a in anchors:
                a = int(a)
                if a > injected:
                    prop.inject(feats[injected:a], injected)
                    injected = a
                ll_out.append(prop.propose(int(toks[a]), a, B - 1))
            with torch.no_grad():
                f = torch.from_numpy(feats)[None]
                valid = torch.ones(1, L, dtype=torch.bool)
                bt = torch.full((1, len(anchors), B), int(eng.draft_info.mask_token_id), dtype=torch.long)
                bt[0, :, 0] = torch.as_tensor([int(toks[int(a)]) for a in anchors])
                logits = model(f, valid, bt, torch.as_tensor(anchors, dtype=torch.long)[None])
                pt = logits[0, :, 1:].argmax(-1).numpy()
            for m, ll_toks in enumerate(ll_out):
                for j, tok in enumerate(ll_toks):
                    total += 1
                    agree += int(tok == pt[m, j])
                total += (B - 1) - len(ll_toks)  # missing slots count as disagreement
    finally:
        eng.close()
    return {"agreement": agree / total if total else 0.0, "slots": total}


def evaluate_acceptance(target_path: str, draft_path: str, prompts: Sequence[list[int]], *, max_new_tokens: int,
                        n_max: int, n_threads: Optional[int] = None, n_ctx: int = 2048, temperature: float = 0.0) -> dict:
    """Acceptance per draft position and mean accepted length through LlamaDFlashDecoding."""
    from ..sampling import SamplingParams
    from ..stats import SpecStats

    eng = _engine(target_path, draft_path, n_max, n_threads, n_ctx)
    total = SpecStats()
    try:
        for p in prompts:
            res = eng.generate(p, max_new_tokens, SamplingParams(temperature=temperature))
            total.merge(res.stats)
    finally:
        eng.close()
    return {
        "acceptance_per_position": [round(x, 4) for x in total.acceptance_per_position],
        "mean_accepted_length": round(total.mean_accepted_length, 4),
        "acceptance_rate": round(total.acceptance_rate, 4),
        "generated_tokens": total.generated_tokens,
        "verification_steps": total.verification_steps,
        "tokens_per_second": round(total.tokens_per_second, 2),
    }
