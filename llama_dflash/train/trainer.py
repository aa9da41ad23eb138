"""Training loop: random anchors per sequence, CE with position decay, AdamW + warm-up + cosine,
gradient clipping, resumable checkpoints, tqdm progress with loss and first-slot accuracy."""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np
import torch
import torch.nn.functional as F

from .data import FeatureCache
from .device import Dist, autocast, param_checksum
from .model import DraftModel

__all__ = ["TrainConfig", "make_batch", "block_loss", "train", "pick_mask_token", "decay_gamma", "EarlyStop",
           "BlockObjective"]


@dataclass
class TrainConfig:
    steps: int = 1000
    lr: float = 1e-3
    batch_size: int = 8  # sequences per step
    anchors_per_seq: int = 8
    warmup: float = 0.05
    weight_decay: float = 0.01
    clip: float = 1.0
    gamma: float = 0.0  # position-decay; 0: from the block size
    max_context: int = 1024
    checkpoint_every: int = 100
    seed: int = 0
    amp: bool = True  # bf16 autocast where the device supports it (CUDA)
    eval_every: int = 0  # held-out proxy evaluation every N steps (0: never); keeps the best weights
    patience: int = 0  # stop after this many evaluations without improvement (0: never stop early)
    max_seconds: float = 0.0  # stop training after this many seconds of this run (0: no limit)
    distill: float = 0.0  # weight of the target's distribution in each slot's loss (needs cache.soft)


def decay_gamma(block_size: int) -> float:
    """The DFlash paper's decay constants (7 for 16, 5 for 10, 4 for 8), interpolated."""
    return {16: 7.0, 10: 5.0, 8: 4.0}.get(block_size, max(1.0, block_size / 2.0))


def pick_mask_token(tokens: tuple[str, ...], used: set[int], reserved: set[int]) -> Optional[int]:
    """An existing special token of the vocabulary (`<...>`, not a byte token) unused by the data."""
    best = None
    for i, t in enumerate(tokens[:4096]):
        if i in used or i in reserved:
            continue
        if len(t) > 2 and t.startswith("<") and t.endswith(">") and not t.startswith("<0x"):
            if t in ("<mask>", "<|mask|>", "[MASK]"):
                return i
            best = i
    return best


def make_batch(cache: FeatureCache, idx: list[int], block: int, n_anchors: int, mask_id: int,
               rng: np.random.Generator, max_context: int = 1024, anchor_first: bool = False,
               soft: bool = False):
    """Features [N, L, W] (on the cache's device after `FeatureCache.to_device`, else the host), valid [N, L], block tokens [N, M, B], anchors [N, M], labels [N, M, B]
    (target token ids, -100 where there is none; `DraftModel.head_rows` maps them to a reduced head);
    with `soft` (and `cache.soft`) also the target's top-K distribution behind each label: ids
    [N, M, B, K] (-1: none) and log-probabilities [N, M, B, K].

    Block slot j at position a+j predicts the token at a+j (DFlash, slot 0 unlabelled), or with
    `anchor_first` (DSpark) the token at a+j+1. The label of position p is the target's greedy
    choice after row p-1 (`FeatureCache.greedy_next`; the cached token itself in greedy answers), and
    only while the block's earlier cached tokens are greedy choices too: in a sampled answer, slots
    after a sampled token that greedy decoding would not have chosen get no label, because a greedy
    chain from the anchor would never reach that context."""
    items = []
    for i in idx:
        sq = cache.seqs[i]
        L = min(len(sq.tokens), max_context)
        toks = sq.tokens[:L]
        lo = min(max(1, sq.prompt_len), L - 2)
        hi = L - 2
        if hi < 1:
            continue
        anchors = rng.integers(max(1, lo), hi + 1, size=n_anchors)
        items.append((toks, sq.offset, anchors, cache.greedy_next(i)[:L - 1]))
    N, Lmax, W = len(items), max(len(it[0]) for it in items), cache.width
    on_device = cache.device_features is not None
    feats = None if on_device else np.zeros((N, Lmax, W), dtype=np.float32)
    rows = np.zeros((N, Lmax), dtype=np.int64)
    valid = np.zeros((N, Lmax), dtype=bool)
    btoks = np.full((N, n_anchors, block), mask_id, dtype=np.int64)
    labels = np.full((N, n_anchors, block), -100, dtype=np.int64)
    anc = np.zeros((N, n_anchors), dtype=np.int64)
    src = np.full((N, n_anchors, block), -1, dtype=np.int64)  # the cache row whose next token each label is
    shift = 1 if anchor_first else 0
    for n, (toks, offset, anchors, choice) in enumerate(items):
        L = len(toks)
        on_path = toks[1:] == choice  # the cached token after row i is the greedy choice there
        if on_device:
            rows[n, :L] = offset + np.arange(L)
        else:
            feats[n, :L] = cache.features[offset:offset + L]
        valid[n, :L] = True
        anc[n] = anchors
        for m, a in enumerate(anchors):
            btoks[n, m, 0] = toks[a]
            for j in range(1 - shift, block):
                p = a + j + shift
                if p >= L or (p - 1 > a and not on_path[p - 2]):
                    break
                labels[n, m, j] = choice[p - 1]
                src[n, m, j] = offset + p - 1
    extra = ()
    if soft and cache.soft is not None:
        sid, slp = cache.soft
        have = src >= 0
        ids = np.full(src.shape + (sid.shape[1],), -1, dtype=np.int64)
        logp = np.zeros(src.shape + (sid.shape[1],), dtype=np.float32)
        ids[have] = sid[src[have]]
        logp[have] = slp[src[have]]
        extra = (torch.from_numpy(ids), torch.from_numpy(logp))
    t = torch.from_numpy
    if on_device:  # gathered where the rows live; padding rows are zeroed as on the host path
        dev = cache.device_features.device
        f = cache.device_features[t(rows).to(dev)].float() * t(valid).to(dev)[..., None]
        return (f, t(valid), t(btoks), t(anc), t(labels)) + extra
    return (t(feats), t(valid), t(btoks), t(anc), t(labels)) + extra


def _soft_ce(model: DraftModel, log_probs: torch.Tensor, ids: torch.Tensor, logp: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Cross-entropy of the draft's log-probabilities [R, V] against the target's top-K
    distribution (ids [R, K] target ids, -1 none; logp [R, K]), renormalised over the entries the
    head can say; returns (ce [R], has [R] bool: rows with any such entry)."""
    rows = model.head_rows(ids)
    ok = rows >= 0
    has = ok.any(-1)
    q = torch.softmax(logp.float().masked_fill(~ok, float("-inf")), dim=-1)
    q = torch.where(has[:, None], q, torch.zeros_like(q))  # rows with nothing in the head: no term
    return -(q * log_probs.gather(-1, rows.clamp_min(0))).sum(-1), has


def block_loss(model: DraftModel, batch, gamma: float, conf_weight: float = 1.0,
               distill: float = 0.0) -> tuple[torch.Tensor, float, int]:
    """Weighted CE over the slots the algorithm reads (the k-th read slot weighted exp(-k/gamma));
    returns loss, first-slot accuracy and the number of first-slot labels.

    DSpark: the Markov bias uses the true previous token (teacher forcing); the confidence head
    learns, by BCE on detached inputs, whether each slot of the greedy chain llama.cpp runs would
    be accepted (that slot and every earlier one right). Labels are target ids; tokens outside
    a reduced head are not trained on but still condition the Markov head of the next slot.

    With `distill` in (0, 1] and the target's distributions in the batch (`make_batch(soft=True)`),
    each slot's loss is (1 - distill) * CE(greedy label) + distill * CE(target distribution)."""
    feats, valid, btoks, anc, labels = batch[:5]
    first = model.first_slot
    hid = model(feats, valid, btoks, anc, return_hidden=True)[:, :, first:]  # [N, M, S, E]
    ids = labels[:, :, first:]
    lab = model.head_rows(ids)
    S = lab.shape[-1]
    w = torch.exp(-torch.arange(S, dtype=torch.float32, device=lab.device) / gamma).expand_as(lab)
    keep = lab >= 0
    prev = None
    if model.is_dspark:
        # slot k's previous token: the anchor's, then the labels before it
        prev = torch.cat([btoks[:, :, :1], ids[..., :-1].clamp_min(0)], dim=-1)
    logits = model.logits(hid[keep], None if prev is None else prev[keep])
    log_probs = torch.log_softmax(logits.float(), dim=-1)  # once, for the label and the distribution
    ce = F.nll_loss(log_probs, lab[keep], reduction="none")
    if distill > 0 and len(batch) == 7:
        sce, has = _soft_ce(model, log_probs, batch[5][:, :, first:][keep], batch[6][:, :, first:][keep])
        ce = torch.where(has, (1 - distill) * ce + distill * sce, ce)
    ww = w[keep]
    loss = (ce * ww).sum() / ww.sum().clamp_min(1e-6)
    with torch.no_grad():
        first_keep = keep[..., 0]
        n1 = int(first_keep.sum())
        acc = 0.0
        if n1:
            p1 = None if prev is None else prev[..., 0][first_keep]
            pred = model.logits(hid[..., 0, :][first_keep], p1).argmax(-1)
            acc = float((pred == lab[..., 0][first_keep]).float().mean())
    if model.conf_proj is not None and n1:
        toks, chain_prev, _ = model.greedy_chain(hid.detach(), btoks[:, :, 0])
        accepted = torch.cumprod((toks == ids).to(torch.float32), dim=-1)
        z = model.confidence(hid.detach(), chain_prev)
        bce = F.binary_cross_entropy_with_logits(z[keep].float(), accepted[keep])
        loss = loss + conf_weight * bce
    return loss, acc, n1


@dataclass
class BlockObjective:
    """The DFlash/DSpark objective: random anchors per sequence, a block per anchor (`make_batch`),
    position-decayed CE over the slots the algorithm reads (`block_loss`). `train` uses it unless
    given another objective (objectives.py: EAGLE-3, plain drafts): anything with
    `batch(cache, idx, rng)` and `loss(model, batch) -> (loss, first-slot accuracy, labels)`."""

    mask_id: int
    block: int
    anchors_per_seq: int
    gamma: float
    max_context: int = 1024
    anchor_first: bool = False
    distill: float = 0.0

    @classmethod
    def for_model(cls, model: DraftModel, cfg: "TrainConfig", mask_id: int) -> "BlockObjective":
        block = model.shape.block_size
        return cls(mask_id, block, cfg.anchors_per_seq, cfg.gamma or decay_gamma(block), cfg.max_context,
                   anchor_first=model.first_slot == 0, distill=cfg.distill)

    def batch(self, cache: FeatureCache, idx: list[int], rng: np.random.Generator):
        return make_batch(cache, idx, self.block, self.anchors_per_seq, self.mask_id, rng, self.max_context,
                          anchor_first=self.anchor_first, soft=self.distill > 0)

    def loss(self, model: DraftModel, batch) -> tuple[torch.Tensor, float, int]:
        return block_loss(model, batch, self.gamma, distill=self.distill)


def _check_resumable(ckpt_path: str, saved: dict, model: torch.nn.Module) -> None:
    """A checkpoint resumes only the draft it was written for: another kind or shape of draft is a
    clear error naming what differs (load_state_dict would raise a wall of missing keys)."""
    want = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    have = {k: tuple(v.shape) for k, v in saved.items()}
    if want == have:
        return
    diff = [f"{k} is missing" for k in want if k not in have][:2]
    diff += [f"{k} is not in this draft" for k in have if k not in want][:2]
    diff += [f"{k} is {have[k]}, this draft's {want[k]}" for k in want if k in have and have[k] != want[k]][:2]
    raise ValueError(f"{ckpt_path} holds the checkpoint of another draft ({'; '.join(diff[:3])}): delete it to "
                     f"train this one from the start, or pass another --workdir")


def _best_path(ckpt_path: str) -> str:
    root, ext = os.path.splitext(ckpt_path)
    return root + ".best" + (ext or ".pt")


@dataclass
class EarlyStop:
    """Best held-out score so far and how many evaluations have passed without beating it."""

    patience: int = 0
    best: float = float("-inf")
    best_step: int = -1
    bad: int = 0
    last_step: int = -1
    history: list = None

    def __post_init__(self):
        if self.history is None:
            self.history = []

    def update(self, step: int, score: float, metrics: Optional[dict] = None) -> bool:
        """Record an evaluation; True when it is a new best."""
        self.last_step = step
        self.history.append({"step": step, "score": score, **({} if metrics is None else
                                                               {k: v for k, v in metrics.items() if k != "mean_accepted"})})
        if score > self.best:
            self.best, self.best_step, self.bad = score, step, 0
            return True
        self.bad += 1
        return False

    @property
    def should_stop(self) -> bool:
        return self.patience > 0 and self.bad >= self.patience

    def to_dict(self) -> dict:
        return {"best": self.best, "best_step": self.best_step, "bad": self.bad, "last_step": self.last_step,
                "history": self.history}

    @classmethod
    def from_dict(cls, d: Optional[dict], patience: int) -> "EarlyStop":
        if not d:
            return cls(patience)
        return cls(patience, d["best"], d["best_step"], d["bad"], d.get("last_step", -1), list(d.get("history", [])))


def _lr_at(step: int, cfg: TrainConfig, seconds: float = 0.0) -> float:
    """Linear warm-up, then cosine to 10%; with a time limit the schedule follows whichever of
    steps and seconds is further along, so a time-limited run still ends at the low rate."""
    warm = max(1, int(cfg.warmup * cfg.steps))
    warm_frac = (step + 1) / warm
    if cfg.max_seconds and cfg.warmup > 0:  # a time-limited run warms up for its share of the time too
        warm_frac = max(warm_frac, seconds / (cfg.warmup * cfg.max_seconds))
    if warm_frac < 1.0:
        return cfg.lr * warm_frac
    p = (step - warm) / max(1, cfg.steps - warm)
    if cfg.max_seconds:
        p = max(p, seconds / cfg.max_seconds)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, p))))


def train(model: torch.nn.Module, cache: FeatureCache, cfg: TrainConfig, *, mask_id: Optional[int] = None,
          train_ids: list[int], ckpt_path: Optional[str] = None, progress: bool = True,
          device: Optional[torch.device] = None, dist: Optional[Dist] = None,
          evaluate: Optional[Callable[[torch.nn.Module], dict]] = None, objective=None) -> dict:
    """Train in place on `device` (default: where the model is); resumes from ckpt_path when it
    exists. With `dist` (several processes) every rank draws its own batches and the gradients are
    averaged, so all ranks keep the same weights; only rank 0 writes checkpoints and progress.

    With `evaluate` (a held-out measure returning {"mean_accepted": ...}) and cfg.eval_every, the
    best weights so far are kept (`<ckpt>.best.pt`), training stops after cfg.patience evaluations
    without improvement, and the model ends with the best weights. Returns a summary dict
    (losses averaged over the ranks).

    `objective` (default: `BlockObjective` for a DFlash/DSpark `DraftModel`, which needs `mask_id`)
    makes the batches and the loss."""
    if cfg.distill > 0 and cache.soft is None:
        raise ValueError("distill > 0 needs the target's distributions in the cache: run "
                         "soft_labels.add_soft_labels on it first")
    dist = dist or Dist()
    device = device or next(model.parameters()).device
    model.to(device)
    if objective is None:
        if mask_id is None:
            raise ValueError("the block objective needs the draft's mask token id")
        objective = BlockObjective.for_model(model, cfg, mask_id)
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=cfg.lr, betas=(0.9, 0.95))
    start = 0
    seconds0 = 0.0  # training time of earlier (interrupted) runs
    es = EarlyStop(cfg.patience)
    if ckpt_path and os.path.isfile(ckpt_path):
        ck = torch.load(ckpt_path, map_location=device, weights_only=False)
        _check_resumable(ckpt_path, ck["model"], model)
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["opt"])
        start = int(ck["step"])
        seconds0 = float(ck.get("seconds", 0.0))
        es = EarlyStop.from_dict(ck.get("early_stop"), cfg.patience)
    dist.broadcast_params(params)
    rng = np.random.default_rng([cfg.seed, start, dist.rank])
    best_path = _best_path(ckpt_path) if ckpt_path else None
    best_state = None

    def save(step: int) -> None:
        if ckpt_path and dist.main:
            tmp = ckpt_path + ".tmp"
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step,
                        "early_stop": es.to_dict(), "seconds": seconds0 + time.time() - t0}, tmp)
            os.replace(tmp, ckpt_path)

    def run_eval(step: int) -> bool:
        """Evaluate, keep the best weights; True when training should stop."""
        nonlocal best_state
        model.eval()
        m = evaluate(model)
        model.train()
        improved = es.update(step, float(m["mean_accepted"]), m)
        if improved:
            best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
            if best_path and dist.main:
                torch.save({"model": best_state, "step": step, "metrics": m}, best_path + ".tmp")
                os.replace(best_path + ".tmp", best_path)
        if bar is not None:
            bar.write(f"step {step}: held-out acceptance {', '.join(f'{x:.3f}' for x in m['acceptance_per_position'])}"
                      f" mean accepted {m['mean_accepted']:.3f} (best {es.best:.3f} at step {es.best_step})")
        return es.should_stop

    bar = None
    if progress and dist.main and start < cfg.steps:
        from tqdm import tqdm

        bar = tqdm(total=cfg.steps, initial=start, desc="train", unit="step", dynamic_ncols=True)
    ema_loss, ema_acc = None, None
    losses: list[float] = []
    t0 = time.time()
    model.train()
    stopped = ""
    if es.should_stop:
        stopped = "early stop"
    for step in range(start, cfg.steps):
        if stopped:
            break
        if cfg.max_seconds and seconds0 + time.time() - t0 > cfg.max_seconds:
            stopped = "time limit"
            if evaluate is not None and cfg.eval_every and es.last_step != step:
                run_eval(step)
            save(step)
            break
        for g in opt.param_groups:
            g["lr"] = lr = _lr_at(step, cfg, seconds0 + time.time() - t0)
        idx = list(rng.choice(train_ids, size=min(cfg.batch_size, len(train_ids)), replace=False))
        batch = objective.batch(cache, idx, rng)
        batch = tuple(t.to(device, non_blocking=True) for t in batch)
        with autocast(device, cfg.amp):
            loss, acc, _ = objective.loss(model, batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        dist.average_grads(params)
        torch.nn.utils.clip_grad_norm_(params, cfg.clip)
        opt.step()
        lv = dist.mean(float(loss.detach()), device)
        acc = dist.mean(acc, device)
        losses.append(lv)
        ema_loss = lv if ema_loss is None else 0.95 * ema_loss + 0.05 * lv
        ema_acc = acc if ema_acc is None else 0.95 * ema_acc + 0.05 * acc
        if bar is not None:
            bar.update(1)
            bar.set_postfix(loss=f"{ema_loss:.3f}", acc1=f"{ema_acc:.3f}", lr=f"{lr:.1e}")
        if evaluate is not None and cfg.eval_every and (step + 1) % cfg.eval_every == 0:
            if run_eval(step + 1):
                stopped = "early stop"
                save(step + 1)
                continue
        if cfg.checkpoint_every and (step + 1) % cfg.checkpoint_every == 0:
            save(step + 1)
    if not stopped:
        if evaluate is not None and cfg.eval_every and es.last_step != cfg.steps:
            run_eval(cfg.steps)
        save(cfg.steps)
    if bar is not None:
        bar.close()
    if evaluate is not None and es.best_step >= 0:
        if best_state is None and best_path and os.path.isfile(best_path):
            best_state = torch.load(best_path, map_location=device, weights_only=False)["model"]
        if best_state is not None:
            model.load_state_dict(best_state)
    model.eval()
    head = losses[: max(1, len(losses) // 10)]
    tail = losses[-max(1, len(losses) // 10):]
    return {"steps": cfg.steps, "loss": ema_loss, "first_slot_acc": ema_acc, "seconds": time.time() - t0,
            "loss_start": float(np.mean(head)) if losses else None, "loss_end": float(np.mean(tail)) if losses else None,
            "world_size": dist.world, "device": str(device), "stopped": stopped or "steps",
            "best_step": es.best_step, "best_mean_accepted": es.best if es.best_step >= 0 else None,
            "evals": es.history,
            "rank_checksums": dist.gather_floats(param_checksum(params), device)}
