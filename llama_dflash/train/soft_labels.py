"""The target's next-token distribution (top-k) beside every answer row of a features cache.

A hard label says which token the target chose; its distribution also says how close the
runners-up were, which is more to learn from per row when the data is small (EAGLE-3 and vLLM's
speculators train drafts on the target's probabilities). The cache already holds what it takes
to recompute them cheaply: the input of the deepest tapped layer (for SmolLM2 the last of 30
layers), so only the layers from there on and the head run, in PyTorch — ~1,650 rows/s on a
2-core CPU, over 10x the rate at which llama.cpp generates them there.

Files beside features.f16: `soft_ids.i32` and `soft_logp.f16`, rows x K (target token ids and
their log-probabilities over the whole vocabulary, best first; id -1 on prompt rows, which
never carry a label). Appended one sequence at a time, so an interrupted run resumes.
"""

from __future__ import annotations

import json
import os

import numpy as np

from .data import SOFT_IDS_FILE, SOFT_LOGP_FILE, SOFT_META_FILE, FeatureCache, soft_rows_written

__all__ = ["add_soft_labels"]


def add_soft_labels(root: str, model_path: str, *, top_k: int = 16, device: str = "cpu",
                    progress: bool = True) -> dict:
    """Compute the top-`top_k` next-token log-probabilities of every answer row of the cache in
    `root` (resumes after the rows already written; a different top_k starts over). Needs a
    llama-family target (the PyTorch copy, `torchgen.TorchTarget`). Returns {"rows": answer rows
    computed, "agree": share of them whose top-1 is the recorded greedy choice}."""
    import torch

    from .torchgen import TorchTarget

    if top_k < 1:
        raise ValueError(f"soft-label top-k must be >= 1, not {top_k}")
    cache = FeatureCache(root)
    layers = [int(x) for x in cache.meta["target_layers"]]
    first = max(layers)
    lo = layers.index(first) * int(cache.meta["n_embd"])
    target = TorchTarget(model_path, device)  # refuses architectures it cannot run, before any work
    if target.shape.n_embd != int(cache.meta["n_embd"]) or first >= target.shape.n_layer:
        raise ValueError(f"{root}: the cache was not made from {os.path.basename(model_path)}")
    mpath = os.path.join(root, SOFT_META_FILE)
    ipath, lpath = os.path.join(root, SOFT_IDS_FILE), os.path.join(root, SOFT_LOGP_FILE)
    k, done = soft_rows_written(root)
    if k != top_k:
        done = 0
    if not done:
        with open(mpath, "w", encoding="utf-8") as f:
            json.dump({"top_k": top_k, "model": os.path.basename(model_path)}, f)
    # keep only whole sequences already written
    starts = [s.offset for s in cache.seqs] + [cache.n_rows]
    done = max([o for o in starts if o <= done], default=0)
    for path, size in ((ipath, 4), (lpath, 2)):
        with open(path, "ab") as f:
            f.truncate(done * top_k * size)
    todo = [s for s in cache.seqs if s.offset >= done]
    stats = {"rows": 0, "agree": 0.0}
    agree = 0
    bar = None
    if progress and todo:
        from tqdm import tqdm

        bar = tqdm(total=sum(len(s.tokens) for s in todo), desc="soft labels", unit="row", dynamic_ncols=True)
    try:
        with open(ipath, "ab") as fi, open(lpath, "ab") as fl:
            for i, s in enumerate(cache.seqs):
                if s.offset < done:
                    continue
                n = len(s.tokens)
                ids = np.full((n, top_k), -1, dtype=np.int32)
                logp = np.zeros((n, top_k), dtype=np.float16)
                a = max(0, s.prompt_len - 1)  # rows whose next token is an answer token
                if a < n - 1:
                    x = torch.from_numpy(np.array(cache.features[s.offset:s.offset + n, lo:lo + target.shape.n_embd]))
                    logits = target.logits_from_layer(x, first, torch.arange(a, n - 1))
                    top = torch.log_softmax(logits.float(), dim=-1).topk(min(top_k, logits.shape[-1]), dim=-1)
                    kk = top.indices.shape[-1]
                    ids[a:n - 1, :kk] = top.indices.cpu().numpy()
                    logp[a:n - 1, :kk] = top.values.cpu().numpy()
                    agree += int((ids[a:n - 1, 0] == cache.greedy_next(i)[a:]).sum())
                    stats["rows"] += n - 1 - a
                fi.write(ids.tobytes())
                fl.write(logp.tobytes())
                if bar is not None:
                    bar.update(n)
    finally:
        if bar is not None:
            bar.close()
    stats["agree"] = agree / max(1, stats["rows"])
    return stats
