"""What the training loop optimises for the autoregressive drafts: batches, losses and the
held-out proxy of an EAGLE-3 head (training-time test over whole sequences) and of a plain
llama draft (teacher-forced next-token distillation). `trainer.train` takes either as its
`objective`; the DFlash/DSpark block objective lives in trainer.py.

Labels are the target's greedy choices (`FeatureCache.greedy_next`), optionally mixed with the
target's top-K distribution (`distill`), as for the block drafts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from .data import FeatureCache

__all__ = ["Eagle3Objective", "SimpleObjective", "make_ttt_batch", "make_lm_batch", "ar_proxy_acceptance",
           "soft_cross_entropy"]


def soft_cross_entropy(model, log_probs: torch.Tensor, ids: torch.Tensor, logp: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """CE of log-probabilities [R, V] over the model's head rows against the target's top-K
    distribution (ids [R, K], -1 none; logp [R, K]) renormalised over what the head can say;
    returns (ce [R], has [R]: rows with any such entry)."""
    rows = model.head_rows(ids)
    ok = rows >= 0
    has = ok.any(-1)
    q = torch.softmax(logp.float().masked_fill(~ok, float("-inf")), dim=-1)
    q = torch.where(has[:, None], q, torch.zeros_like(q))
    return -(q * log_probs.gather(-1, rows.clamp_min(0))).sum(-1), has


def _mixed_ce(model, prenorm: torch.Tensor, labels: torch.Tensor, soft, distill: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(per-row loss, keep mask) for pre-norm rows [R, E] and target-id labels [R]."""
    lab = model.head_rows(labels)
    keep = lab >= 0
    log_probs = torch.log_softmax(model.logits(prenorm[keep]).float(), dim=-1)
    ce = F.nll_loss(log_probs, lab[keep], reduction="none")
    if distill > 0 and soft is not None:
        sce, has = soft_cross_entropy(model, log_probs, soft[0][keep], soft[1][keep])
        ce = torch.where(has, (1 - distill) * ce + distill * sce, ce)
    return ce, keep


def _gather_rows(cache: FeatureCache, rows: np.ndarray, valid: np.ndarray):
    """Feature rows [N, L, W] for cache row ids `rows` (padding zeroed): on the cache's device
    when it holds them (`FeatureCache.to_device`), else from the host memmap."""
    if cache.device_features is not None:
        dev = cache.device_features.device
        return cache.device_features[torch.from_numpy(rows).to(dev)].float() * torch.from_numpy(valid).to(dev)[..., None]
    feats = np.asarray(cache.features[rows.reshape(-1)], dtype=np.float32).reshape(rows.shape + (cache.width,))
    feats[~valid] = 0
    return torch.from_numpy(feats)


def _soft_rows(cache: FeatureCache, src: np.ndarray):
    """The target's top-K (ids, log-probs) at cache rows `src` (-1: none) -> tensors [..., K]."""
    sid, slp = cache.soft
    have = src >= 0
    ids = np.full(src.shape + (sid.shape[1],), -1, dtype=np.int64)
    logp = np.zeros(src.shape + (sid.shape[1],), dtype=np.float32)
    ids[have] = sid[src[have]]
    logp[have] = slp[src[have]]
    return torch.from_numpy(ids), torch.from_numpy(logp)


def make_ttt_batch(cache: FeatureCache, idx: Sequence[int], steps: int, max_context: int = 1024,
                   soft: bool = False, n_seeds: int = 0, rng: Optional[np.random.Generator] = None):
    """Whole sequences for the training-time test: features [N, L, W], tokens [N, L], valid [N, L],
    labels [N, L] (target ids: the greedy choice after row p + 1, what step k at position p predicts
    for every k), ok [N, steps, L] (whether step k at p has a label: its chain seed c = p - k lies at
    or after the row before the last prompt token, the label exists, and the chain's fed tokens
    t_{c+2}..t_{p+1} are the target's greedy choices -- a greedy chain never sees a sampled detour);
    with `n_seeds` also seeds [N, n_seeds], chain seeds drawn with `rng` among each sequence's
    answer rows (`Eagle3Model.ttt_chains`); with `soft` (and `cache.soft`) the target's top-K behind
    each label, [N, L, K] twice, last."""
    items = []
    for i in idx:
        sq = cache.seqs[i]
        L = min(len(sq.tokens), max_context)
        if L >= 3:
            items.append((sq.tokens[:L].astype(np.int64), sq.offset, sq.prompt_len, cache.greedy_next(i)[:L - 1]))
    if not items:
        raise ValueError("no sequence of at least 3 tokens in the batch")
    N, Lmax = len(items), max(max(len(it[0]) for it in items), steps + 2)
    rows = np.zeros((N, Lmax), dtype=np.int64)
    tokens = np.zeros((N, Lmax), dtype=np.int64)
    valid = np.zeros((N, Lmax), dtype=bool)
    labels = np.full((N, Lmax), -100, dtype=np.int64)
    ok = np.zeros((N, steps, Lmax), dtype=bool)
    src = np.full((N, Lmax), -1, dtype=np.int64)
    seeds = np.zeros((N, n_seeds), dtype=np.int64)
    for n, (toks, offset, plen, choice) in enumerate(items):
        L = len(toks)
        rows[n, :L] = offset + np.arange(L)
        tokens[n, :L] = toks
        valid[n, :L] = True
        p = np.arange(L - 2)  # positions with a label choice[p + 1]
        labels[n, :L - 2] = choice[1:L - 1]
        src[n, :L - 2] = offset + p + 1
        off_path = np.concatenate([[0], np.cumsum(toks[1:] != choice)])  # off_path[q]: detours among rows < q
        c_min = max(0, plen - 2)
        for k in range(steps):
            c = p - k
            good = c >= c_min
            # fed tokens t_{c+2}..t_{p+1} are greedy choices: no detour at rows c+1..p
            cc = np.clip(c + 1, 0, L - 1)
            good &= (off_path[p + 1] - off_path[cc]) == 0
            ok[n, k, :L - 2] = good
        if n_seeds:
            hi = min(L - 3, Lmax - 1 - steps)  # the last seed with a label; its chain's fed tokens exist
            seeds[n] = rng.integers(min(c_min, hi), hi + 1, size=n_seeds)
    t = torch.from_numpy
    feats = _gather_rows(cache, rows, valid)
    out = (feats, t(tokens), t(valid), t(labels), t(ok))
    if n_seeds:
        out = out + (t(seeds),)
    if soft and cache.soft is not None:
        out = out + _soft_rows(cache, src)
    return out


def make_lm_batch(cache: FeatureCache, idx: Sequence[int], max_context: int = 1024, soft: bool = False):
    """Teacher-forced next-token batches for a plain draft: tokens [N, L], valid [N, L], labels
    [N, L] (the target's greedy choice after row p, on answer rows p >= prompt length - 1), and
    with `soft` the target's top-K there ([N, L, K] twice). Sampled detours stay in the context: the
    label of every row is still what the target would choose after it."""
    items = []
    for i in idx:
        sq = cache.seqs[i]
        L = min(len(sq.tokens), max_context)
        if L >= 2:
            items.append((sq.tokens[:L].astype(np.int64), sq.offset, sq.prompt_len, cache.greedy_next(i)[:L - 1]))
    if not items:
        raise ValueError("no sequence of at least 2 tokens in the batch")
    N, Lmax = len(items), max(len(it[0]) for it in items)
    tokens = np.zeros((N, Lmax), dtype=np.int64)
    valid = np.zeros((N, Lmax), dtype=bool)
    labels = np.full((N, Lmax), -100, dtype=np.int64)
    src = np.full((N, Lmax), -1, dtype=np.int64)
    for n, (toks, offset, plen, choice) in enumerate(items):
        L = len(toks)
        tokens[n, :L] = toks
        valid[n, :L] = True
        a = max(0, plen - 1)
        labels[n, a:L - 1] = choice[a:]
        src[n, a:L - 1] = offset + np.arange(a, L - 1)
    t = torch.from_numpy
    out = (t(tokens), t(valid), t(labels))
    if soft and cache.soft is not None:
        out = out + _soft_rows(cache, src)
    return out


def _step_weights(steps: int, gamma: float, device) -> torch.Tensor:
    return torch.exp(-torch.arange(steps, dtype=torch.float32, device=device) / gamma)


@dataclass
class Eagle3Objective:
    """EAGLE-3's training-time test: step 0 over every position, then `steps - 1` more steps of
    `chains` chains per sequence seeded at random answer rows (`Eagle3Model.ttt_chains`; 0: every
    position, `Eagle3Model.ttt`, which costs `steps` full passes). The loss is the mean CE of each
    step, step k weighted exp(-k / gamma) (gamma 0: steps / 2, at least 1)."""

    steps: int = 4
    gamma: float = 0.0
    distill: float = 0.0
    max_context: int = 1024
    chains: int = 0

    def batch(self, cache: FeatureCache, idx: Sequence[int], rng: Optional[np.random.Generator]):
        return make_ttt_batch(cache, idx, self.steps, self.max_context, soft=self.distill > 0,
                              n_seeds=self.chains, rng=rng if rng is not None else np.random.default_rng(0))

    def loss(self, model, batch) -> tuple[torch.Tensor, float, int]:
        feats, tokens, valid, labels, ok = batch[:5]
        rest = list(batch[5:])
        seeds = rest.pop(0) if self.chains else None
        soft = tuple(rest[:2]) if len(rest) >= 2 else None
        w = _step_weights(self.steps, self.gamma or max(1.0, self.steps / 2), labels.device)
        if seeds is None:
            rows = [(h, ok[:, k], labels, soft) for k, h in enumerate(model.ttt(feats, tokens, valid, self.steps))]
        else:
            out0, chains = model.ttt_chains(feats, tokens, valid, seeds, self.steps)
            rows = [(out0, ok[:, 0], labels, soft)]
            b = torch.arange(seeds.shape[0], device=seeds.device)[:, None]
            for k in range(1, self.steps):
                p = seeds + k
                sk = None if soft is None else (soft[0][b, p], soft[1][b, p])
                rows.append((chains[:, :, k - 1], ok[:, k][b, p], labels[b, p], sk))
        total = torch.zeros((), device=labels.device)
        norm = torch.zeros((), device=labels.device)
        acc, n1 = 0.0, 0
        for k, (h, m, lab, sk) in enumerate(rows):
            ce, keep = _mixed_ce(model, h[m], lab[m], None if sk is None else (sk[0][m], sk[1][m]), self.distill)
            if ce.numel():
                total = total + w[k] * ce.mean()
                norm = norm + w[k]
            if k == 0 and ce.numel():
                with torch.no_grad():
                    pred = model.logits(h[m][keep]).argmax(-1)
                    acc = float((pred == model.head_rows(lab[m][keep])).float().mean())
                    n1 = int(keep.sum())
        return total / norm.clamp_min(1e-6), acc, n1


@dataclass
class SimpleObjective:
    """Teacher-forced distillation of the target's next-token choice on answer rows."""

    distill: float = 0.0
    max_context: int = 1024

    def batch(self, cache: FeatureCache, idx: Sequence[int], rng: np.random.Generator):
        return make_lm_batch(cache, idx, self.max_context, soft=self.distill > 0)

    def loss(self, model, batch) -> tuple[torch.Tensor, float, int]:
        tokens, valid, labels = batch[:3]
        soft = None
        h = model(tokens, valid)
        m = labels >= 0
        if len(batch) >= 5:
            soft = (batch[3][m], batch[4][m])
        ce, keep = _mixed_ce(model, h[m], labels[m], soft, self.distill)
        loss = ce.mean() if ce.numel() else h.sum() * 0.0
        with torch.no_grad():
            n = int(keep.sum())
            acc = float((model.logits(h[m][keep]).argmax(-1) == model.head_rows(labels[m][keep])).float().mean()) if n else 0.0
        return loss, acc, n


@torch.no_grad()
def ar_proxy_acceptance(model, cache: FeatureCache, ids: Sequence[int], *, n_read: int = 4, stride: int = 1,
                        max_context: int = 1024) -> dict:
    """Held-out acceptance of an EAGLE-3 head or a plain draft on cached GREEDY sequences, as the
    block drafts' `proxy.proxy_acceptance` measures it: from every `stride`-th answer anchor a (the
    last verified token sits at a), the draft's chain of n_read tokens is accepted up to its first
    mismatch with the cached continuation. One teacher-forced pass gives the whole chain: while a
    chain is right its fed tokens are the cached ones (EAGLE-3: the training-time test's step k;
    a plain draft: row a + k)."""
    from .eagle3 import Eagle3Model

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
            t = torch.as_tensor(np.asarray(toks[:L], dtype=np.int64), device=dev)[None]
            valid = torch.ones(1, L, dtype=torch.bool, device=dev)
            a = torch.as_tensor(anchors, device=dev)
            if isinstance(model, Eagle3Model):
                f = torch.from_numpy(np.asarray(feats[:L], dtype=np.float32))[None].to(dev)
                outs = model.ttt(f, t, valid, n_read)
                # chain seeded at c = a - 1: step k sits at c + k and predicts the token at a + 1 + k
                preds = torch.stack([model.draft_ids(outs[k][0, a - 1 + k]) for k in range(n_read)], dim=-1)
            else:
                h = model(t, valid)[0]
                pred = model.draft_ids(h)  # row p predicts the token at p + 1
                preds = torch.stack([pred[a + k] for k in range(n_read)], dim=-1)
            true = t[0, a[:, None] + 1 + torch.arange(n_read, device=dev)]
            hits += torch.cumprod((preds == true).to(torch.float64), dim=-1).sum(0).cpu().numpy()
            n += len(anchors)
    finally:
        model.train(was_training)
    per = hits / max(1, n)
    return {"acceptance_per_position": [round(float(x), 4) for x in per], "mean_accepted": float(per.sum()),
            "anchors": n}
