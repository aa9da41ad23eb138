"""Export to a draft GGUF, parity against llama.cpp, and acceptance evaluation through the engine."""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import torch

from ..writer import write_draft
from .model import DraftModel

__all__ = ["export_draft", "parity_check", "evaluate_acceptance"]


def export_draft(model: DraftModel, path: str, *, target_path: str, mask_token_id: int,
                 name: str = "dflash-draft", vocab: Optional[Sequence[int]] = None, weight_type: str = "f32") -> str:
    """Write the trained draft; `vocab` (target ids) gives it a reduced LM head with `d2t`."""
    weights = model.export_weights()
    d2t = None
    if vocab is not None:
        from .draftfile import reduce_head

        if model.d2t is not None:  # trained against a reduced head: its rows (and markov_w2's) are in d2t order
            weights["output.weight"] = model.head.detach().cpu().float().numpy()
            weights["d2t"] = model.d2t.cpu().numpy()
        weights = reduce_head(weights, vocab, target_path)
        d2t = weights.pop("d2t")
    return write_draft(path, model.shape, weights, tokenizer_from=target_path, mask_token_id=mask_token_id,
                       name=name, d2t=d2t, weight_type=weight_type)


def _engine(target_path: str, draft_path: str, n_max: int, n_threads: Optional[int], n_ctx: int):
    from ..config import SpecConfig, TargetConfig
    from ..engine import LlamaDFlashDecoding

    return LlamaDFlashDecoding(TargetConfig(model=target_path, n_ctx=n_ctx, n_threads=n_threads),
                               SpecConfig(draft_model=draft_path, draft_n_max=n_max))


def parity_check(model: DraftModel, draft_path: str, target_path: str, sequences: Sequence[tuple[np.ndarray, np.ndarray]],
                 *, anchors_per_seq: int = 4, seed: int = 0, n_threads: Optional[int] = None,
                 vocab: Optional[Sequence[int]] = None) -> dict:
    """Top-1 agreement between llama.cpp (the engine's DFlashProposer: inject features, decode a
    block, argmax; DSpark's Markov chain included) and the PyTorch model on the same features,
    over every block slot the algorithm reads. `vocab`: the draft's reduced vocabulary (d2t).
    DSpark drafts with a confidence head also report the largest confidence difference.

    sequences: (tokens [L], features [L, W]) pairs; features are used as float32 on both sides.
    """
    from .. import _bindings as ext

    B = model.shape.block_size
    first = model.first_slot
    n_read = B - first
    rng = np.random.default_rng(seed)
    n_ctx = max(64, max(len(t) for t, _ in sequences) + B + 8)
    eng = _engine(target_path, draft_path, n_read, n_threads, n_ctx)
    voc = None if vocab is None else torch.as_tensor(np.asarray(vocab, dtype=np.int64))
    agree = total = 0
    conf_diff = 0.0
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
            ll_out, ll_conf = [], []
            for a in anchors:
                a = int(a)
                if a > injected:
                    prop.inject(feats[injected:a], injected)
                    injected = a
                ll_out.append(prop.propose(int(toks[a]), a, n_read))
                if model.conf_proj is not None:
                    c = ext.llama_get_embeddings_nextn(prop.ctx.ptr)
                    ll_conf.append(None if c is None else [float(c[i * prop.n_embd]) for i in range(n_read)])
            with torch.no_grad():
                f = torch.from_numpy(feats)[None]
                valid = torch.ones(1, L, dtype=torch.bool)
                bt = torch.full((1, len(anchors), B), int(eng.draft_info.mask_token_id), dtype=torch.long)
                bt[0, :, 0] = torch.as_tensor([int(toks[int(a)]) for a in anchors])
                hid = model(f, valid, bt, torch.as_tensor(anchors, dtype=torch.long)[None], return_hidden=True)
                pt, _, conf = model.greedy_chain(hid[0, :, first:], bt[0, :, 0], voc)
            for m, ll_toks in enumerate(ll_out):
                for j, tok in enumerate(ll_toks):
                    total += 1
                    agree += int(tok == int(pt[m, j]))
                total += n_read - len(ll_toks)  # missing slots count as disagreement
                if conf is not None and ll_conf and ll_conf[m] is not None:
                    conf_diff = max(conf_diff, float(np.abs(np.asarray(ll_conf[m]) - conf[m].numpy()).max()))
    finally:
        eng.close()
    out = {"agreement": agree / total if total else 0.0, "slots": total}
    if model.conf_proj is not None:
        out["confidence_max_abs_diff"] = conf_diff
    return out


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
        "accepted_per_step": round(total.accepted_per_step, 4),  # draft tokens accepted per step
        "tau": round(total.tau, 4),  # tokens per step: accepted drafts + the target's own token
        "mean_accepted_length": round(total.mean_accepted_length, 4),  # tau (llama-cpp-python's name)
        "acceptance_rate": round(total.acceptance_rate, 4),
        "generated_tokens": total.generated_tokens,
        "verification_steps": total.verification_steps,
        "tokens_per_second": round(total.tokens_per_second, 2),
    }
