"""A fast held-out acceptance measure in PyTorch, for picking checkpoints during training.

On cached GREEDY sequences the target's continuation after any answer position a is the cached
tokens themselves, so the chain the engine would accept from a draft anchored at a is known
without running the target: the draft's greedy chain (slot j predicts the token at a+1+j) is
accepted up to its first mismatch. Per-position acceptance = mean over anchors of the cumulative
product of slot matches, which is the engine's per-position acceptance at greedy decoding when
the PyTorch draft and llama.cpp agree (parity) — averaged over every answer position rather than
only the positions where the engine happens to draft.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from .data import FeatureCache
from .model import DraftModel

__all__ = ["proxy_acceptance"]


@torch.no_grad()
def proxy_acceptance(model: DraftModel, cache: FeatureCache, ids: Sequence[int], *, mask_id: int, n_read: int = 4,
                     stride: int = 1, max_anchors: int = 64, max_context: int = 1024) -> dict:
    """{"acceptance_per_position": [n_read], "mean_accepted": sum of them, "anchors": count}
    over the answer positions (every `stride`-th) of the cached sequences `ids`."""
    B, first = model.shape.block_size, model.first_slot
    n_read = min(n_read, B - first)
    dev = next(model.parameters()).device
    was_training = model.training
    model.eval()
    hits = np.zeros(n_read)
    n = 0
    try:
        for i in ids:
            toks, feats, plen = cache.get(i)
            L = min(len(toks), max_context)
            anchors = np.arange(max(1, plen), L - n_read, stride)
            if len(anchors) == 0:
                continue
            f = torch.from_numpy(np.asarray(feats[:L], dtype=np.float32))[None].to(dev)
            valid = torch.ones(1, L, dtype=torch.bool, device=dev)
            t = torch.as_tensor(np.asarray(toks[:L], dtype=np.int64), device=dev)
            for s in range(0, len(anchors), max_anchors):
                a = torch.as_tensor(anchors[s:s + max_anchors], dtype=torch.long, device=dev)
                bt = torch.full((1, len(a), B), int(mask_id), dtype=torch.long, device=dev)
                bt[0, :, 0] = t[a]
                hid = model(f, valid, bt, a[None], return_hidden=True)[0, :, first:first + n_read]
                pred = model.greedy_chain(hid, bt[0, :, 0])[0]  # [M, n_read] target ids
                true = t[a[:, None] + 1 + torch.arange(n_read, device=dev)]
                acc = torch.cumprod((pred == true).to(torch.float64), dim=-1)
                hits += acc.sum(0).cpu().numpy()
                n += len(a)
    finally:
        model.train(was_training)
    per = hits / max(1, n)
    return {"acceptance_per_position": [round(float(x), 4) for x in per], "mean_accepted": float(per.sum()),
            "anchors": n}
