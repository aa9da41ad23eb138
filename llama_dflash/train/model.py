"""A PyTorch DFlash draft that computes exactly what llama.cpp's `dflash` graph computes
(src/models/dflash.cpp), with the target's token embeddings and output head frozen.

Context path (feature injection): fused = RMSNorm_enc(fc(features)); per draft layer
K = rope(k_norm(wk(fused))), V = wv(fused).  Block path: x = tok_embd[tokens]; per layer
h = attn_norm(x); q/k/v from h with per-head RMS q_norm/k_norm, NEOX rope; non-causal attention of
the block over [context K/V at positions < anchor; block K/V]; wo; residual; ffn_norm; SwiGLU;
residual.  Then output_norm and the target's head.

DSpark (shape.markov_rank > 0, src/models/dflash.cpp `build_dspark_markov_head`): the logits of
block slot i get a Markov bias `markov_w2 @ markov_w1[prev_i]`, prev_0 the anchor token and
prev_i the argmax of slot i-1 (in training: the true previous token); the optional confidence
head is `sigmoid(conf_proj . [output_norm(x_i); markov_w1[prev_i]] + b)`.
"""

from __future__ import annotations

import math
from typing import Optional

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from ..writer import DraftShape
from .draftfile import load_target_head

__all__ = ["DraftModel", "load_target_head", "rope_neox"]


class RMSNorm(nn.Module):
    def __init__(self, n: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope_neox(x: torch.Tensor, pos: torch.Tensor, theta: float) -> torch.Tensor:
    """NEOX rotary embedding (rotate halves) over the last dim; x [..., T, H, D], pos [..., T]."""
    d = x.shape[-1]
    half = d // 2
    inv = theta ** (-torch.arange(0, half, dtype=torch.float32, device=x.device) * 2.0 / d)
    ang = pos.to(torch.float32)[..., None] * inv  # [..., T, half]
    cos, sin = ang.cos()[..., None, :], ang.sin()[..., None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class Layer(nn.Module):
    def __init__(self, s: DraftShape):
        super().__init__()
        e, hd = s.n_embd, s.head_dim
        self.attn_norm = RMSNorm(e, s.rms_eps)
        self.wq = nn.Linear(e, s.n_head * hd, bias=False)
        self.wk = nn.Linear(e, s.n_head_kv * hd, bias=False)
        self.wv = nn.Linear(e, s.n_head_kv * hd, bias=False)
        self.wo = nn.Linear(s.n_head * hd, e, bias=False)
        self.q_norm = RMSNorm(hd, s.rms_eps)
        self.k_norm = RMSNorm(hd, s.rms_eps)
        self.ffn_norm = RMSNorm(e, s.rms_eps)
        self.gate = nn.Linear(e, s.ff, bias=False)
        self.up = nn.Linear(e, s.ff, bias=False)
        self.down = nn.Linear(s.ff, e, bias=False)


class DraftModel(nn.Module):
    def __init__(self, shape: DraftShape, tok_embd: np.ndarray, head: np.ndarray,
                 vocab: Optional[np.ndarray] = None):
        """`vocab` (sorted target ids): train against those rows of the head only (a reduced
        draft vocabulary, exported with the same ids as `d2t`); logits are then over vocab rows.
        DSpark's `markov_w1` stays over the whole target vocabulary (its input is the previous
        target token) and `markov_w2` covers the head rows, as llama.cpp reads them with `d2t`."""
        super().__init__()
        self.shape = s = shape
        self.register_buffer("d2t", None, persistent=False)
        self.register_buffer("_t2d", None, persistent=False)
        n_target_vocab = int(tok_embd.shape[0])
        if vocab is not None:
            vocab = np.asarray(vocab, dtype=np.int64)
            head = head[vocab]
            self.register_buffer("d2t", torch.from_numpy(vocab), persistent=False)
            t2d = np.full(n_target_vocab, -100, dtype=np.int64)
            t2d[vocab] = np.arange(len(vocab))
            self.register_buffer("_t2d", torch.from_numpy(t2d), persistent=False)
        e = s.n_embd
        self.fc = nn.Linear(len(s.target_layers) * e, e, bias=False)
        self.enc_norm = RMSNorm(e, s.rms_eps)
        self.layers = nn.ModuleList([Layer(s) for _ in range(s.n_layer)])
        self.output_norm = RMSNorm(e, s.rms_eps)
        emb = torch.from_numpy(np.ascontiguousarray(tok_embd))
        self.register_buffer("tok_embd", emb, persistent=False)
        self.register_buffer("head", emb if head is tok_embd else torch.from_numpy(np.ascontiguousarray(head)),
                             persistent=False)
        for lin in [self.fc] + [m for l in self.layers for m in (l.wq, l.wk, l.wv, l.wo, l.gate, l.up, l.down)]:
            nn.init.normal_(lin.weight, std=1.0 / math.sqrt(lin.in_features))
        # start with logits of unit scale: the target's head rows can be long
        rms = float(self.head.pow(2).mean().sqrt())
        with torch.no_grad():
            self.output_norm.weight.fill_(1.0 / max(1e-6, rms * math.sqrt(e)))
        for l in self.layers:
            nn.init.normal_(l.wo.weight, std=0.3 / math.sqrt(l.wo.in_features))
            nn.init.normal_(l.down.weight, std=0.3 / math.sqrt(l.down.in_features))
        self.markov_w1 = self.markov_w2 = self.conf_proj = None
        if s.markov_rank > 0:
            r = s.markov_rank
            self.markov_w1 = nn.Parameter(torch.randn(n_target_vocab, r) / math.sqrt(r))
            self.markov_w2 = nn.Parameter(torch.zeros(self.head.shape[0], r))  # starts as plain DFlash
            if s.confidence_head:
                self.conf_proj = nn.Linear(e + r, 1)
                nn.init.zeros_(self.conf_proj.weight)
                nn.init.zeros_(self.conf_proj.bias)

    @property
    def is_dspark(self) -> bool:
        return self.markov_w1 is not None

    @property
    def first_slot(self) -> int:
        """First block slot the algorithm reads: 0 for anchor-first DSpark, else 1."""
        return 0 if self.is_dspark and self.shape.sample_from_anchor else 1

    def logits(self, hid: torch.Tensor, prev: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Head logits of hidden rows [..., E]; DSpark adds the Markov bias of tokens `prev` [...]."""
        out = hid @ self.head.T
        if self.is_dspark and prev is not None:
            out = out + F.embedding(prev, self.markov_w1) @ self.markov_w2.T
        return out

    def confidence(self, hid: torch.Tensor, prev: torch.Tensor) -> torch.Tensor:
        """DSpark confidence logit (before the sigmoid) of hidden rows [..., E] after tokens prev."""
        return self.conf_proj(torch.cat([hid, F.embedding(prev, self.markov_w1)], dim=-1))[..., 0]

    @torch.no_grad()
    def greedy_chain(self, hid: torch.Tensor, anchor_tokens: torch.Tensor,
                     vocab: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
        """What llama.cpp drafts from block hidden rows hid [..., S, E] (the read slots) and the
        anchors' tokens [...]: argmax tokens [..., S], the prev token of every slot [..., S] and,
        with a confidence head, the confidences [..., S]. DSpark chains each slot's argmax into
        the next slot's Markov bias; `vocab` (target ids) restricts the argmax (reduced drafts)."""
        S = hid.shape[-2]
        prev = anchor_tokens
        toks, prevs = [], []
        for i in range(S):
            lg = self.logits(hid[..., i, :], prev if self.is_dspark else None)
            if self.d2t is not None:
                t = self.d2t[lg.argmax(-1)]
            elif vocab is not None:
                t = vocab[lg[..., vocab].argmax(-1)]
            else:
                t = lg.argmax(-1)
            toks.append(t)
            prevs.append(prev)
            prev = t
        toks_t, prev_t = torch.stack(toks, -1), torch.stack(prevs, -1)
        conf = torch.sigmoid(self.confidence(hid, prev_t)) if self.conf_proj is not None else None
        return toks_t, prev_t, conf

    def head_rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Target token ids (-100: no label) -> rows of this draft's head (-100 outside a reduced
        vocabulary): the labels the head is trained against."""
        if self._t2d is None:
            return ids
        return torch.where(ids >= 0, self._t2d[ids.clamp_min(0)], torch.full_like(ids, -100))

    # ---- pieces --------------------------------------------------------------------------
    def context_kv(self, features: torch.Tensor, pos: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """features [N, Lc, n_ids*E], pos [N, Lc] -> per layer (K, V) [N, Lc, Hkv, D]."""
        s = self.shape
        fused = self.enc_norm(self.fc(features))
        out = []
        for l in self.layers:
            k = l.wk(fused).unflatten(-1, (s.n_head_kv, s.head_dim))
            v = l.wv(fused).unflatten(-1, (s.n_head_kv, s.head_dim))
            k = rope_neox(l.k_norm(k), pos, s.rope_theta)
            out.append((k, v))
        return out

    def forward(
        self,
        features: torch.Tensor,  # [N, Lc, n_ids*E]
        ctx_valid: torch.Tensor,  # [N, Lc] bool: real context rows
        block_tokens: torch.Tensor,  # [N, M, B] token ids
        anchors: torch.Tensor,  # [N, M] anchor positions
        return_hidden: bool = False,
    ) -> torch.Tensor:
        """Logits [N, M, B, n_vocab] of M blocks per sequence; block m sees context rows < anchor m."""
        s = self.shape
        N, Lc = features.shape[:2]
        M, B = block_tokens.shape[1:]
        ctx_pos = torch.arange(Lc, device=features.device).expand(N, Lc)
        kv = self.context_kv(features, ctx_pos)
        bpos = anchors[..., None] + torch.arange(B, device=features.device)  # [N, M, B]
        bpos = bpos.reshape(N, M * B)
        # mask [N, 1, M*B, Lc + M*B]: context rows before the anchor, and the block's own rows
        ctx_ok = (ctx_pos[:, None, :] < anchors[:, :, None]) & ctx_valid[:, None, :]  # [N, M, Lc]
        ctx_ok = ctx_ok.repeat_interleave(B, dim=1)  # [N, M*B, Lc]
        blk_id = torch.arange(M, device=features.device).repeat_interleave(B)
        blk_ok = (blk_id[:, None] == blk_id[None, :]).expand(N, M * B, M * B)
        mask = torch.cat([ctx_ok, blk_ok], dim=-1)[:, None]
        x = F.embedding(block_tokens.reshape(N, M * B), self.tok_embd)
        rep = s.n_head // s.n_head_kv
        for l, (ck, cv) in zip(self.layers, kv):
            h = l.attn_norm(x)
            q = rope_neox(l.q_norm(l.wq(h).unflatten(-1, (s.n_head, s.head_dim))), bpos, s.rope_theta)
            k = rope_neox(l.k_norm(l.wk(h).unflatten(-1, (s.n_head_kv, s.head_dim))), bpos, s.rope_theta)
            v = l.wv(h).unflatten(-1, (s.n_head_kv, s.head_dim))
            K = torch.cat([ck, k], dim=1).repeat_interleave(rep, dim=2)  # [N, Lc+MB, H, D]
            V = torch.cat([cv, v], dim=1).repeat_interleave(rep, dim=2)
            a = F.scaled_dot_product_attention(q.transpose(1, 2), K.transpose(1, 2), V.transpose(1, 2),
                                               attn_mask=mask)  # [N, H, MB, D]
            x = x + l.wo(a.transpose(1, 2).flatten(-2))
            hf = l.ffn_norm(x)
            x = x + l.down(F.silu(l.gate(hf)) * l.up(hf))
        hid = self.output_norm(x)
        if return_hidden:
            return hid.reshape(N, M, B, -1)
        return (hid @ self.head.T).reshape(N, M, B, -1)

    # ---- export --------------------------------------------------------------------------
    def gguf_parameters(self) -> dict[str, torch.Tensor]:
        """The trained tensors under their draft-GGUF names (llama.cpp's `dflash` graph), in file
        order; the one mapping export and `--init-from-draft` share."""
        w = {"fc.weight": self.fc.weight, "enc.output_norm.weight": self.enc_norm.weight,
             "output_norm.weight": self.output_norm.weight}
        for i, l in enumerate(self.layers):
            p = f"blk.{i}."
            w[p + "attn_norm.weight"] = l.attn_norm.weight
            w[p + "attn_q.weight"] = l.wq.weight
            w[p + "attn_k.weight"] = l.wk.weight
            w[p + "attn_v.weight"] = l.wv.weight
            w[p + "attn_output.weight"] = l.wo.weight
            w[p + "attn_q_norm.weight"] = l.q_norm.weight
            w[p + "attn_k_norm.weight"] = l.k_norm.weight
            w[p + "ffn_norm.weight"] = l.ffn_norm.weight
            w[p + "ffn_gate.weight"] = l.gate.weight
            w[p + "ffn_up.weight"] = l.up.weight
            w[p + "ffn_down.weight"] = l.down.weight
        if self.is_dspark:
            w["markov_w1.weight"] = self.markov_w1
            w["markov_w2.weight"] = self.markov_w2
            if self.conf_proj is not None:
                w["conf_proj.weight"] = self.conf_proj.weight
                w["conf_proj.bias"] = self.conf_proj.bias
        return w

    def export_weights(self) -> dict[str, np.ndarray]:
        return {name: t.detach().cpu().float().numpy() for name, t in self.gguf_parameters().items()}
