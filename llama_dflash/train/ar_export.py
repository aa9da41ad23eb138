"""Export of the autoregressive drafts (EAGLE-3 heads, plain llama drafts) to GGUF and their
top-1 parity against llama.cpp running the exported file (llamacpp_ref.py)."""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import torch

from .eagle3 import Eagle3Model
from .simple import SimpleDraft

__all__ = ["export_ar", "parity_ar", "load_ar_weights"]


def export_ar(model, path: str, *, target_path: str, name: str, weight_type: str = "f32") -> str:
    """Write `model` (Eagle3Model -> architecture eagle3, SimpleDraft -> llama) to `path`."""
    from .arwriter import write_eagle3, write_simple

    if isinstance(model, Eagle3Model):
        return write_eagle3(path, model.shape, model.export_weights(), tokenizer_from=target_path, name=name,
                            weight_type=weight_type)
    if isinstance(model, SimpleDraft):
        return write_simple(path, model.shape, model.export_weights(), tokenizer_from=target_path, name=name,
                            weight_type=weight_type)
    raise TypeError(f"not an autoregressive draft: {type(model).__name__}")


def load_ar_weights(model, draft_path: str) -> int:
    """`--init-from-draft` for the autoregressive drafts: copy the trained tensors of a draft GGUF of
    the same shape (any weight type) into `model`; returns how many were copied."""
    from .draftfile import read_draft_tensors

    tensors = read_draft_tensors(draft_path)
    ours = model.gguf_parameters()
    missing = sorted(n for n in ours if n not in tensors)
    wrong = [f"{n} {tuple(tensors[n].shape)} vs {tuple(ours[n].shape)}" for n in sorted(ours)
             if n in tensors and tuple(np.shape(tensors[n])) != tuple(ours[n].shape)]
    if missing or wrong:
        raise ValueError(f"--init-from-draft {draft_path}: not a draft of this run's shape "
                         f"({'; '.join(wrong[:3]) or 'no ' + ', '.join(missing[:3])})")
    if isinstance(model, Eagle3Model) and "output.weight" in tensors:
        theirs = tensors.get("d2t")
        ours_ids = model.d2t.cpu().numpy() if model.d2t is not None else np.arange(model.head.shape[0])
        their_ids = np.arange(len(tensors["output.weight"])) if theirs is None else np.asarray(theirs)
        if len(ours_ids) != len(their_ids) or not np.array_equal(ours_ids, their_ids):
            raise ValueError(f"--init-from-draft {draft_path}: its head covers other tokens than this run's "
                             "(another --train-vocab or data)")
    with torch.no_grad():
        for n, p in ours.items():
            p.copy_(torch.from_numpy(np.array(tensors[n], dtype=np.float32)))
    return len(ours)


def parity_ar(model, draft_path: str, target_path: str, sequences: Sequence[tuple[np.ndarray, np.ndarray]], *,
              anchors_per_seq: int = 4, n_read: int = 4, seed: int = 0, n_threads: Optional[int] = None) -> dict:
    """Top-1 agreement between llama.cpp running `draft_path` and the PyTorch model.

    EAGLE-3: chains of n_read draft tokens from random seeds over the same target features, as the
    C++ driver drafts them; also the largest difference of the chains' pre-norm states while the
    two agree. Plain drafts: the greedy next token after every row, teacher-forced.
    sequences: (tokens [L], features [L, W]) pairs (features float32)."""
    from .llamacpp_ref import Eagle3Reference, SimpleReference

    rng = np.random.default_rng(seed)
    model = model.to("cpu").eval()
    n_ctx = max(64, max(len(t) for t, _ in sequences) + n_read + 8)
    agree = total = 0
    state_diff = 0.0
    if isinstance(model, Eagle3Model):
        with Eagle3Reference(target_path, draft_path, n_ctx=n_ctx, n_threads=n_threads) as ref:
            for toks, feats in sequences:
                L = len(toks)
                if L < 3:
                    continue
                seeds = rng.choice(np.arange(0, L - 1), size=min(anchors_per_seq, L - 1), replace=False)
                f = torch.from_numpy(np.ascontiguousarray(feats, dtype=np.float32))
                for c in sorted(int(x) for x in seeds):
                    a, ha = ref.chain(feats, toks, c, n_read)
                    b, hb = model.chain(f, toks, c, n_read)
                    same = 0
                    while same < n_read and a[same] == b[same]:
                        same += 1
                    agree += sum(x == y for x, y in zip(a, b))
                    total += n_read
                    if same:
                        state_diff = max(state_diff, float(np.abs(ha[:same] - hb[:same].numpy()).max()))
        return {"agreement": agree / total if total else 0.0, "slots": total, "state_max_abs_diff": state_diff}
    if isinstance(model, SimpleDraft):
        with SimpleReference(draft_path, n_ctx=n_ctx, n_threads=n_threads) as ref:
            for toks, _ in sequences:
                a = ref.argmax([int(t) for t in toks])
                with torch.no_grad():
                    t = torch.as_tensor(np.asarray(toks, dtype=np.int64))[None]
                    b = model.draft_ids(model(t, torch.ones_like(t, dtype=torch.bool))[0]).tolist()
                agree += sum(x == y for x, y in zip(a, b))
                total += len(a)
        return {"agreement": agree / total if total else 0.0, "slots": total}
    raise TypeError(f"not an autoregressive draft: {type(model).__name__}")
