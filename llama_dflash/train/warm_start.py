"""Start training from an existing draft GGUF (`--init-from-draft`): continue a shipped or earlier
draft on new data instead of starting from random weights.

Why: a GPU session may be short (minutes); starting from the previous session's draft keeps what
it learnt. Any weight type loads (q4_0 is dequantized, so training also recovers its rounding).
The draft must have the model's shape (layers, heads, block size, target layers, Markov rank);
its vocabulary may differ from the new training vocabulary: DSpark's `markov_w2` rows are matched
by target token id, rows of tokens new to the vocabulary start at zero (plain DFlash for them).
"""

from __future__ import annotations

import numpy as np
import torch

from .model import DraftModel

__all__ = ["init_from_draft"]


def init_from_draft(model: DraftModel, draft_path: str, target_path: str) -> dict:
    """Copy the draft's trained weights into `model`; returns {"tensors": copied, "markov_rows": matched}."""
    from ..inspect import validate_files
    from .draftfile import read_draft_tensors

    _, info = validate_files(target_path, draft_path)  # a clear error for a draft of another target
    s = model.shape
    if tuple(info.target_layers) != tuple(s.target_layers) or info.block_size != s.block_size:
        raise ValueError(f"--init-from-draft {draft_path}: block size {info.block_size}, target layers "
                         f"{list(info.target_layers)}; this run trains block size {s.block_size}, target layers "
                         f"{list(s.target_layers)}")
    tensors = read_draft_tensors(draft_path)
    theirs = tensors.get("d2t")
    ours_by_name = model.gguf_parameters()
    wanted = {n for n in ours_by_name if n != "markov_w2.weight"}  # markov_w2: matched by token below
    missing = sorted(n for n in wanted if n not in tensors)
    if missing:
        raise ValueError(f"--init-from-draft {draft_path}: no {', '.join(missing[:4])} (another algorithm or "
                         "layer count than this run)")
    wrong = [f"{n} {tuple(tensors[n].shape)} vs {tuple(ours_by_name[n].shape)}" for n in sorted(wanted)
             if tuple(np.shape(tensors[n])) != tuple(ours_by_name[n].shape)]
    extra = sorted(n for n in tensors if n.startswith("blk.") and n not in ours_by_name)
    if wrong or extra:
        raise ValueError(f"--init-from-draft {draft_path}: its shape differs from this run's "
                         f"({'; '.join(wrong[:3]) or 'more layers: ' + ', '.join(extra[:2])})")
    with torch.no_grad():
        for name in wanted:
            ours_by_name[name].copy_(torch.from_numpy(np.array(tensors[name], dtype=np.float32)))
        matched = 0
        if model.markov_w2 is not None and "markov_w2.weight" in tensors:
            src = np.asarray(tensors["markov_w2.weight"], dtype=np.float32)
            src_ids = np.arange(src.shape[0]) if theirs is None else np.asarray(theirs, dtype=np.int64)
            row_of = {int(t): i for i, t in enumerate(src_ids)}
            ours = (model.d2t.cpu().numpy() if model.d2t is not None
                    else np.arange(model.markov_w2.shape[0]))
            model.markov_w2.zero_()
            for r, t in enumerate(ours):
                i = row_of.get(int(t))
                if i is not None:
                    model.markov_w2[r] = torch.from_numpy(src[i])
                    matched += 1
    return {"tensors": len(wanted), "markov_rows": matched}

