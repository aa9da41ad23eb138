"""DFlash, DSpark and DFlash2 drafts rigged against a `targets.write_target` fixture.

The draft shares the target's token embeddings and LM head (`ctx_other`), whose layout is
`rig.Layout`'s.  Its single layer has two attention heads of n_embd dimensions each:

* head 1 carries the anchor to the mask slots: only mask rows have a query (read off the MASK
  coordinate) and only token rows a key (off the TOKEN coordinate), both on the head's last
  dimension -- the RoPE pair that turns slowest, so the score hardly depends on the distance
  inside a block; injected feature rows get no key (the encoder writes nothing on the TOKEN
  coordinate).  Its value is the anchor's identity, added to the mask rows' residual stream:
  every mask slot predicts succ[id_last].
* head 2 has no query at all, so it averages every cached row uniformly -- the injected target
  features above all (the encoder writes them on the FEATURE coordinates, which tokens leave
  empty) -- and adds a random projection of that average to the identity coordinates: the
  drafts depend on the features, and at some steps the context moves a slot's choice.

DFlash reads slots 1..n: its first token is succ[id_last] (right wherever the target did not
drift), the later ones repeat it (wrong), so steps accept 0 or 1 tokens.  DSpark's Markov head
biases slot i towards succ[slot i-1's choice], so its block follows the successor map as far as
the target does; its confidence head passes about two slots in three at p_min 0.6.  DFlash2
adds conv kernels that pass the hidden state through and a random selector over the slots'
top-k candidates.
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from ..inspect import FINAL_INPUT_ARCHS
from ..writer import DraftShape, write_draft
from .rig import MASK_C, SPECIAL_TOKENS, TOKEN_C
from .targets import TargetFixture

__all__ = ["DRAFT_KINDS", "write_rigged_draft", "default_target_layers"]

DRAFT_KINDS = ("dflash", "dspark", "dflash2")


def default_target_layers(fx: TargetFixture) -> list[int]:
    """Three extracted layers spread over the trunk; on archs that expose the final norm's input
    (nemotron_h), the last id is n_layer itself."""
    top = fx.n_layer if fx.arch in FINAL_INPUT_ARCHS else fx.n_layer - 1
    return sorted({1, max(1, top // 2), top})


def write_rigged_draft(path: str, fx: TargetFixture, kind: str = "dflash", *, block_size: int = 8,
                       target_layers: Optional[Sequence[int]] = None, seed: int = 0, anchor_gain: float = 2.0,
                       feature_gain: float = 5.0, markov_gain: float = 30.0, markov_rank: int = 64,
                       draft_vocab: int = 0) -> str:
    """Write a rigged draft of `kind` ("dflash", "dspark", "dflash2") for the fixture `fx`.

    As llama.cpp's converter writes drafts for such targets: degenerate M-RoPE sections
    [head_dim/2, 0, 0, 0] for an M-RoPE target (qwen35, qwen35moe), a sliding window on the draft
    layer for a sliding-window target (muse-glimmer, gemma4).  `draft_vocab` > 0: a
    reduced-vocabulary draft, its own LM head over that many target tokens (the target's head rows
    for them, so it still follows the successor map where the successor is among them) and `d2t`."""
    if kind not in DRAFT_KINDS:
        raise ValueError(f"kind must be one of {', '.join(DRAFT_KINDS)}, not {kind!r}")
    layout, e = fx.rig.layout, fx.n_embd
    layers = list(target_layers) if target_layers is not None else default_target_layers(fx)
    rng = np.random.default_rng(seed)
    n_vocab = fx.rig.token_embd.shape[0]
    hd, n_ff = e, 64
    extra: dict[str, object] = {}
    if fx.arch in ("qwen35", "qwen35moe"):
        extra["dflash.rope.dimension_sections"] = [hd // 2, 0, 0, 0]
    if fx.swa_window:
        extra["dflash.attention.sliding_window"] = fx.swa_window
        extra["dflash.attention.sliding_window_pattern"] = [True]
    shape = DraftShape(n_embd=e, n_layer=1, n_head=2, n_head_kv=2, n_ff=n_ff, block_size=block_size,
                       target_layers=layers, head_size=hd, extra_keys=extra,
                       markov_rank=markov_rank if kind == "dspark" else 0, confidence_head=kind == "dspark")
    d2t = None
    if draft_vocab:
        # a random subset of the ordinary tokens: where the successor is not among them, the
        # draft proposes another token (a rejection the full-vocabulary draft would not meet)
        ordinary = np.flatnonzero(fx.rig.succ >= 0)
        d2t = np.sort(rng.permutation(ordinary)[:draft_vocab]).astype(np.int64)
    w: dict[str, np.ndarray] = {}
    ident, feat = layout.ident, layout.feature
    # encoder: the target features land on the FEATURE coordinates only
    fc = np.zeros((e, len(layers) * e), dtype=np.float32)
    fc[feat] = rng.standard_normal((layout.n_feature, len(layers) * e)) / np.sqrt(len(layers) * e)
    w["fc.weight"] = fc
    w["enc.output_norm.weight"] = np.ones(e, dtype=np.float32)
    w["output_norm.weight"] = np.ones(e, dtype=np.float32)
    p = "blk.0."
    u = hd - 1  # the slowest RoPE pair's second dimension, in either pairing convention
    wq = np.zeros((2 * hd, e), dtype=np.float32)
    wq[u, MASK_C] = 1.0
    wk = np.zeros((2 * hd, e), dtype=np.float32)
    wk[u, TOKEN_C] = 1.0
    wv = np.zeros((2 * hd, e), dtype=np.float32)
    idx = np.arange(e)
    wv[idx[ident], idx[ident]] = 1.0  # head 1: the identity coordinates
    wv[hd + idx[feat], idx[feat]] = 1.0  # head 2: the feature coordinates
    wo = np.zeros((e, 2 * hd), dtype=np.float32)
    wo[idx[ident], idx[ident]] = anchor_gain
    mix = rng.standard_normal((layout.n_id, layout.n_feature)) * feature_gain / np.sqrt(layout.n_feature)
    wo[ident, hd + idx[feat]] = mix
    norm = np.ones(hd, dtype=np.float32)
    norm[u] = 3.0  # a sharp anchor score: (3 * 16)^2 / 16 = 144 for n_embd 256
    w[p + "attn_norm.weight"] = np.ones(e, dtype=np.float32)
    w[p + "attn_q.weight"] = wq
    w[p + "attn_k.weight"] = wk
    w[p + "attn_v.weight"] = wv
    w[p + "attn_output.weight"] = wo
    w[p + "attn_q_norm.weight"] = norm
    w[p + "attn_k_norm.weight"] = norm.copy()
    w[p + "ffn_norm.weight"] = np.ones(e, dtype=np.float32)
    w[p + "ffn_gate.weight"] = (rng.standard_normal((n_ff, e)) / np.sqrt(e)).astype(np.float32)
    w[p + "ffn_up.weight"] = (rng.standard_normal((n_ff, e)) / np.sqrt(e)).astype(np.float32)
    w[p + "ffn_down.weight"] = np.zeros((e, n_ff), dtype=np.float32)
    if kind == "dspark":
        # Markov head: bias(slot i) = w2 . w1[prev] peaks at succ[prev]
        codes = rng.standard_normal((n_vocab, markov_rank))
        codes /= np.linalg.norm(codes, axis=1, keepdims=True)
        codes *= np.sqrt(markov_gain)
        codes[list(SPECIAL_TOKENS)] = 0.0
        w2 = np.zeros_like(codes)
        ordinary = fx.rig.succ >= 0
        w2[fx.rig.succ[ordinary]] = codes[ordinary]
        w["markov_w1.weight"] = codes.astype(np.float32)
        w["markov_w2.weight"] = (w2 if d2t is None else w2[d2t]).astype(np.float32)
        # confidence: sigmoid(0.8 + N(0, 1)) from the previous slot's Markov code alone, so about
        # two slots in three pass a p_min of 0.6 whatever the architecture (blocks cut at varied depths)
        conf = np.zeros((1, e + markov_rank), dtype=np.float32)
        conf[0, e:] = rng.standard_normal(markov_rank) / np.sqrt(markov_gain)
        w["conf_proj.weight"] = conf
        w["conf_proj.bias"] = np.full(1, 0.8, dtype=np.float32)
    if d2t is not None:
        w["output.weight"] = fx.rig.output[d2t].copy()
    if kind == "dflash2":
        top_k, rank, kernel, group = 4, 8, 3, 16
        shape.extra_keys = {"dflash.conv_kernel_size": kernel, "dflash.conv_group_size": group,
                            "dflash.selector_rank": rank, "dflash.selector_top_k": top_k}
        for part in ("attn", "ffn"):
            base = np.zeros((2, kernel, e), dtype=np.float32)  # ggml {n_embd, kernel, 2}
            base[:, 0, :] = 1.0  # tap 0 passes the hidden state through, the others add nothing
            w[f"{p}{part}_conv_base"] = base
            w[f"{p}{part}_conv_proj.weight"] = np.zeros((2 * kernel * (e // group), e), dtype=np.float32)
        w["selector_predecessor.weight"] = (rng.standard_normal((n_vocab, rank)) * 0.5).astype(np.float32)
        w["selector_successor.weight"] = (rng.standard_normal((n_vocab, rank)) * 0.5).astype(np.float32)
        w["selector_hidden.weight"] = (rng.standard_normal((rank, e)) * 0.1).astype(np.float32)
    return write_draft(path, shape, w, tokenizer_from=fx.path, mask_token_id=fx.rig.mask_token,
                       name=f"rigged-{kind}-{fx.arch}", d2t=d2t)
