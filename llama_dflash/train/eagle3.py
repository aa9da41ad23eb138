"""A PyTorch EAGLE-3 head that computes exactly what llama.cpp's `eagle3` graph computes
(src/models/eagle3.cpp) when driven as `common_speculative_impl_draft_eagle3` drives it.

Encoder (one row per target position p): g_p = fc([low_p; mid_p; high_p]) -- the inputs of three
target layers, concatenated in `target_layers` order (optionally RMS-normed first,
`norm_before_fc`).

Decoder (one layer), row at RoPE position P fed the pair (t_{P+1}, g_P):
    x = [input_norm(tok_embd[t_{P+1}]); hidden_norm(g_P)]        (2 * n_embd wide)
    q, k, v = wq x, wk x, wv x; llama.cpp's "normal" rope (adjacent pairs) at P; causal attention
    h = g_P (or hidden_norm(g_P) with norm_before_residual) + wo(attn)
    h = h + down(silu(gate(ffn_norm h)) * up(ffn_norm h))          -> the pre-norm state
    logits = head(output_norm(h)) (own head rows, `d2t` for a reduced vocabulary)
The pre-norm state of a draft row is the g of the next row: drafting from a seed (t_{c+1}, g_c)
at c feeds (d_1, h_c) at c+1, (d_2, h_{c+1}) at c+2, ... while the cache holds the pairs
(t_{p+1}, g_p) of every position p < c.

Training-time test (`Eagle3Model.ttt`): step 0 runs the decoder on every position at once with
the target's g; step k feeds each position the pre-norm output of step k-1 at the position before,
so step k at position p is the k-th draft row of the chain seeded at c = p - k. Its keys are the
step-0 rows at positions <= c plus the chain's own rows of steps 1..k (one per step), which is
what llama.cpp's cache holds when it computes that row. With the cached tokens as the chain's
inputs, every row whose chain was right so far equals the runtime's row exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from .model import RMSNorm

__all__ = ["Eagle3Shape", "Eagle3Model", "rope_norm", "EAGLE3_TARGET_LAYERS"]

#: llama.cpp's eagle3 graph reads exactly three target layers
EAGLE3_TARGET_LAYERS = 3


def rope_norm(x: torch.Tensor, pos: torch.Tensor, theta: float) -> torch.Tensor:
    """llama.cpp's "normal" rope (LLAMA_ROPE_TYPE_NORM, what the eagle3 and llama graphs use):
    rotate adjacent pairs (x0, x1), (x2, x3), ... by pos * theta^(-2i/d). x [..., T, H, D], pos [..., T]."""
    d = x.shape[-1]
    inv = theta ** (-torch.arange(0, d, 2, dtype=torch.float64, device=x.device) / d)
    ang = pos.to(torch.float64)[..., None] * inv  # [..., T, D/2]
    cos, sin = ang.cos().float()[..., None, :], ang.sin().float()[..., None, :]
    x0, x1 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1).flatten(-2)


@dataclass
class Eagle3Shape:
    """Hyper-parameters of an EAGLE-3 head. n_embd is the draft's hidden size; the decoder reads
    the target's token embeddings, so it must equal the target's n_embd here."""

    n_embd: int
    n_head: int
    n_head_kv: int
    n_ff: int
    target_layers: Sequence[int]
    target_hidden: int = 0  # 0: n_embd
    rms_eps: float = 1e-6
    rope_theta: float = 10000.0
    context_length: int = 2048
    head_size: int = 0  # 0: n_embd // n_head
    norm_before_fc: bool = False
    norm_before_residual: bool = False

    def __post_init__(self) -> None:
        if len(self.target_layers) != EAGLE3_TARGET_LAYERS:
            raise ValueError(f"an EAGLE-3 head reads exactly {EAGLE3_TARGET_LAYERS} target layers, "
                             f"not {len(self.target_layers)}")
        if self.n_head % self.n_head_kv:
            raise ValueError(f"n_head {self.n_head} is not a multiple of n_head_kv {self.n_head_kv}")
        if self.head_dim % 2:
            raise ValueError(f"rope needs an even head size, not {self.head_dim}")

    @property
    def head_dim(self) -> int:
        return self.head_size or self.n_embd // self.n_head

    @property
    def hidden_target(self) -> int:
        return self.target_hidden or self.n_embd

    @property
    def n_feat(self) -> int:
        return EAGLE3_TARGET_LAYERS * self.hidden_target


class Eagle3Model(nn.Module):
    def __init__(self, shape: Eagle3Shape, tok_embd: np.ndarray, head: np.ndarray,
                 vocab: Optional[np.ndarray] = None):
        """`tok_embd` / `head`: the target's (frozen; the GGUF has no token_embd, llama.cpp reads
        the target's through ctx_other). `vocab` (sorted target ids): the head keeps those rows
        only (exported as `output.weight` + `d2t`); otherwise the whole head is exported."""
        super().__init__()
        self.shape = s = shape
        e, hd = s.n_embd, s.head_dim
        if int(tok_embd.shape[1]) != e:
            raise ValueError(f"the target's embeddings are {tok_embd.shape[1]} wide, the head {e}")
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
        self.register_buffer("tok_embd", torch.from_numpy(np.ascontiguousarray(tok_embd)), persistent=False)
        self.register_buffer("head", torch.from_numpy(np.ascontiguousarray(head, dtype=np.float32)), persistent=False)
        self.enc_norm = RMSNorm(s.n_feat, s.rms_eps) if s.norm_before_fc else None
        self.fc = nn.Linear(s.n_feat, e, bias=False)
        self.input_norm = RMSNorm(e, s.rms_eps)  # GGUF blk.0.attn_norm: the token embedding's
        self.hidden_norm = RMSNorm(e, s.rms_eps)  # GGUF blk.0.attn_norm_2: g's
        self.wq = nn.Linear(2 * e, s.n_head * hd, bias=False)
        self.wk = nn.Linear(2 * e, s.n_head_kv * hd, bias=False)
        self.wv = nn.Linear(2 * e, s.n_head_kv * hd, bias=False)
        self.wo = nn.Linear(s.n_head * hd, e, bias=False)
        self.ffn_norm = RMSNorm(e, s.rms_eps)
        self.gate = nn.Linear(e, s.n_ff, bias=False)
        self.up = nn.Linear(e, s.n_ff, bias=False)
        self.down = nn.Linear(s.n_ff, e, bias=False)
        self.output_norm = RMSNorm(e, s.rms_eps)
        for lin in (self.fc, self.wq, self.wk, self.wv, self.gate, self.up):
            nn.init.normal_(lin.weight, std=1.0 / math.sqrt(lin.in_features))
        for lin in (self.wo, self.down):
            nn.init.normal_(lin.weight, std=0.3 / math.sqrt(lin.in_features))
        # logits of unit scale at the start: the target's head rows can be long
        rms = float(self.head.pow(2).mean().sqrt())
        with torch.no_grad():
            self.output_norm.weight.fill_(1.0 / max(1e-6, rms * math.sqrt(e)))

    # ---- what the trainer shares with the other drafts ------------------------------------------
    def head_rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Target token ids (-100: none) -> rows of this head (-100 outside a reduced vocabulary)."""
        if self._t2d is None:
            return ids
        return torch.where(ids >= 0, self._t2d[ids.clamp_min(0)], torch.full_like(ids, -100))

    def logits(self, prenorm: torch.Tensor) -> torch.Tensor:
        """Head logits (over the head's rows) of pre-norm states [..., E]."""
        return self.output_norm(prenorm) @ self.head.T

    def to_target_ids(self, rows: torch.Tensor) -> torch.Tensor:
        return rows if self.d2t is None else self.d2t[rows]

    @torch.no_grad()
    def draft_ids(self, prenorm: torch.Tensor) -> torch.Tensor:
        """The target token llama.cpp drafts from each pre-norm state [..., E] (argmax, via d2t)."""
        return self.to_target_ids(self.logits(prenorm).argmax(-1))

    # ---- the graph ------------------------------------------------------------------------------
    def encode(self, features: torch.Tensor) -> torch.Tensor:
        """g rows [..., E] of target feature rows [..., 3 * target_hidden]."""
        x = features if self.enc_norm is None else self.enc_norm(features)
        return self.fc(x)

    def _qkv(self, tokens: torch.Tensor, g: torch.Tensor, pos: torch.Tensor):
        """Decoder inputs (tokens [N, T], g [N, T, E]) at positions pos [N, T] -> q [N, T, H, D],
        k, v [N, T, Hkv, D] and the residual [N, T, E]."""
        s = self.shape
        gn = self.hidden_norm(g)
        x = torch.cat([self.input_norm(F.embedding(tokens, self.tok_embd)), gn], dim=-1)
        q = rope_norm(self.wq(x).unflatten(-1, (s.n_head, s.head_dim)), pos, s.rope_theta)
        k = rope_norm(self.wk(x).unflatten(-1, (s.n_head_kv, s.head_dim)), pos, s.rope_theta)
        v = self.wv(x).unflatten(-1, (s.n_head_kv, s.head_dim))
        return q, k, v, (gn if s.norm_before_residual else g)

    def _finish(self, attn: torch.Tensor, resid: torch.Tensor) -> torch.Tensor:
        """attn [N, T, H, D] -> the layer's pre-norm output [N, T, E]."""
        h = resid + self.wo(attn.flatten(-2))
        hf = self.ffn_norm(h)
        return h + self.down(F.silu(self.gate(hf)) * self.up(hf))

    def _expand_kv(self, t: torch.Tensor) -> torch.Tensor:
        """[N, T, Hkv, D] -> [N, T, H, D]: query head h reads KV head h // (H / Hkv), as ggml broadcasts."""
        return t.repeat_interleave(self.shape.n_head // self.shape.n_head_kv, dim=2)

    def ttt(self, features: torch.Tensor, tokens: torch.Tensor, valid: torch.Tensor, steps: int) -> list[torch.Tensor]:
        """Training-time test over whole sequences: the pre-norm outputs [N, L, E] of steps 0..steps-1.

        features [N, L, 3 * target_hidden] (row p: the target's layer inputs at position p),
        tokens [N, L] (the cached tokens; row p is fed tokens[p + 1]), valid [N, L] (real rows).
        Step k at position p is the k-th draft row of the chain seeded at p - k (module docstring);
        rows whose chain would start before position 0 or leave the sequence are computed but
        meaningless (no label reaches them)."""
        s = self.shape
        N, L = tokens.shape
        dev = tokens.device
        nxt = torch.cat([tokens[:, 1:], torch.zeros_like(tokens[:, :1])], dim=1)
        pos = torch.arange(L, device=dev).expand(N, L)
        scale = 1.0 / math.sqrt(s.head_dim)
        g = self.encode(features)
        idx = torch.arange(L, device=dev)
        keys0 = valid[:, None, None, :]  # [N, 1, 1, L]
        ks: list[torch.Tensor] = []
        vs: list[torch.Tensor] = []
        outs: list[torch.Tensor] = []
        hidden = g
        for k in range(steps):
            if k:
                hidden = torch.cat([torch.zeros_like(outs[-1][:, :1]), outs[-1][:, :-1]], dim=1)
            q, kk, vv, resid = self._qkv(nxt, hidden, pos)
            ks.append(self._expand_kv(kk))
            vs.append(self._expand_kv(vv))
            qh = q.transpose(1, 2)  # [N, H, L, D]
            # step-0 keys at positions <= p - k (the chain's seed and what the cache held before it)
            sc0 = (qh @ ks[0].transpose(1, 2).transpose(-1, -2)) * scale  # [N, H, L, L]
            ok0 = (idx[None, :] <= idx[:, None] - k)[None, None] & keys0
            if k == 0:
                ok0 = ok0 | torch.eye(L, dtype=torch.bool, device=dev)[None, None]  # padding rows: no empty softmax
            parts = [sc0.masked_fill(~ok0, float("-inf"))]
            shifted_v = []
            for j in range(1, k + 1):  # the chain's own row of step j sits at p - (k - j)
                d = k - j
                kj = ks[j].transpose(1, 2)  # [N, H, L, D]
                vj = vs[j].transpose(1, 2)
                if d:
                    kj = torch.cat([torch.zeros_like(kj[:, :, :d]), kj[:, :, :-d]], dim=2)
                    vj = torch.cat([torch.zeros_like(vj[:, :, :d]), vj[:, :, :-d]], dim=2)
                sj = (qh * kj).sum(-1, keepdim=True) * scale  # [N, H, L, 1]
                if d:
                    sj = sj.masked_fill((idx < d)[None, None, :, None], float("-inf"))
                parts.append(sj)
                shifted_v.append(vj)
            w = torch.softmax(torch.cat(parts, dim=-1).float(), dim=-1).to(qh.dtype)
            a = w[..., :L] @ vs[0].transpose(1, 2)  # [N, H, L, D]
            for j, vj in enumerate(shifted_v):
                a = a + w[..., L + j:L + j + 1] * vj
            outs.append(self._finish(a.transpose(1, 2), resid))
        return outs

    def ttt_chains(self, features: torch.Tensor, tokens: torch.Tensor, valid: torch.Tensor, seeds: torch.Tensor,
                   steps: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The training-time test for chosen chains only: step 0 over every position (its rows are
        every chain's context), steps 1..steps-1 only for the chains seeded at `seeds` [N, M] --
        the rows `ttt` computes at (seed + k), for a fraction of the cost on long sequences.

        Returns (step-0 pre-norm outputs [N, L, E], chain outputs [N, M, steps - 1, E]); seeds must
        satisfy seed + steps <= L - 1 (the fed token t_{seed+k+1} exists)."""
        s = self.shape
        N, L = tokens.shape
        M = seeds.shape[1]
        dev = tokens.device
        nxt = torch.cat([tokens[:, 1:], torch.zeros_like(tokens[:, :1])], dim=1)
        pos = torch.arange(L, device=dev).expand(N, L)
        scale = 1.0 / math.sqrt(s.head_dim)
        q, k0, v0, resid = self._qkv(nxt, self.encode(features), pos)
        K0, V0 = self._expand_kv(k0).transpose(1, 2), self._expand_kv(v0).transpose(1, 2)  # [N, H, L, D]
        causal = torch.ones(L, L, dtype=torch.bool, device=dev).tril()[None] & valid[:, None, :]
        mask = (causal | torch.eye(L, dtype=torch.bool, device=dev)[None])[:, None]
        a = F.scaled_dot_product_attention(q.transpose(1, 2), K0, V0, attn_mask=mask)
        out0 = self._finish(a.transpose(1, 2), resid)
        if steps <= 1:
            return out0, out0.new_zeros(N, M, 0, s.n_embd)
        ctx_ok = (torch.arange(L, device=dev)[None, None, :] <= seeds[:, :, None]) & valid[:, None, :]  # [N, M, L]
        ctx_ok = ctx_ok[:, None]  # [N, 1, M, L]
        batch_ix = torch.arange(N, device=dev)[:, None]
        hidden = out0[batch_ix, seeds]  # [N, M, E]: the seed rows' outputs feed step 1
        ks: list[torch.Tensor] = []
        vs: list[torch.Tensor] = []
        outs = []
        for k in range(1, steps):
            p = seeds + k
            qk, kk, vk, rk = self._qkv(nxt[batch_ix, p], hidden, p)
            ks.append(self._expand_kv(kk).transpose(1, 2))  # [N, H, M, D]
            vs.append(self._expand_kv(vk).transpose(1, 2))
            qh = qk.transpose(1, 2)  # [N, H, M, D]
            sc0 = ((qh @ K0.transpose(-1, -2)) * scale).masked_fill(~ctx_ok, float("-inf"))  # [N, H, M, L]
            own = torch.stack([(qh * kj).sum(-1) for kj in ks], dim=-1) * scale  # [N, H, M, k]
            w = torch.softmax(torch.cat([sc0, own], dim=-1).float(), dim=-1).to(qh.dtype)
            att = w[..., :L] @ V0 + (w[..., L:, None] * torch.stack(vs, dim=-2)).sum(-2)  # [N, H, M, D]
            hidden = self._finish(att.transpose(1, 2), rk)
            outs.append(hidden)
        return out0, torch.stack(outs, dim=2)

    @torch.no_grad()
    def chain(self, features: torch.Tensor, tokens: Sequence[int], c: int, n: int) -> tuple[list[int], torch.Tensor]:
        """What llama.cpp drafts from the seed (tokens[c + 1], g_c) at position c, one row at a time
        with its own tokens: (n draft target ids, their pre-norm states [n, E]). features [>= c + 1, W]."""
        dev = self.fc.weight.device
        f = features[: c + 1].to(dev, torch.float32)[None]
        toks = torch.as_tensor([int(t) for t in tokens[1:c + 2]], dtype=torch.long, device=dev)[None]
        g = self.encode(f)
        pos = torch.arange(c + 1, device=dev)[None]
        q, k, v, resid = self._qkv(toks, g, pos)
        K, V = self._expand_kv(k), self._expand_kv(v)
        causal = torch.ones(c + 1, c + 1, dtype=torch.bool, device=dev).tril()
        a = F.scaled_dot_product_attention(q.transpose(1, 2), K.transpose(1, 2), V.transpose(1, 2), attn_mask=causal)
        h = self._finish(a.transpose(1, 2), resid)[:, -1:]  # the seed's row
        out, states = [], []
        for i in range(n):
            d = self.draft_ids(h[0, 0])
            out.append(int(d))
            states.append(h[0, 0])
            if i + 1 == n:
                break
            q, k, v, resid = self._qkv(d.view(1, 1), h, torch.tensor([[c + 1 + i]], device=dev))
            K, V = torch.cat([K, self._expand_kv(k)], dim=1), torch.cat([V, self._expand_kv(v)], dim=1)
            a = F.scaled_dot_product_attention(q.transpose(1, 2), K.transpose(1, 2), V.transpose(1, 2))
            h = self._finish(a.transpose(1, 2), resid)
        return out, torch.stack(states)

    # ---- export --------------------------------------------------------------------------------
    def gguf_parameters(self) -> dict[str, torch.Tensor]:
        """The trained tensors under their GGUF names (llama.cpp's `eagle3` architecture)."""
        w: dict[str, torch.Tensor] = {"fc.weight": self.fc.weight}
        if self.enc_norm is not None:
            w["enc.output_norm.weight"] = self.enc_norm.weight
        w.update({
            "output_norm.weight": self.output_norm.weight,
            "blk.0.attn_norm.weight": self.input_norm.weight,
            "blk.0.attn_norm_2.weight": self.hidden_norm.weight,
            "blk.0.attn_q.weight": self.wq.weight,
            "blk.0.attn_k.weight": self.wk.weight,
            "blk.0.attn_v.weight": self.wv.weight,
            "blk.0.attn_output.weight": self.wo.weight,
            "blk.0.ffn_norm.weight": self.ffn_norm.weight,
            "blk.0.ffn_gate.weight": self.gate.weight,
            "blk.0.ffn_up.weight": self.up.weight,
            "blk.0.ffn_down.weight": self.down.weight,
        })
        return w

    def export_weights(self) -> dict[str, np.ndarray]:
        """Every tensor of the GGUF as float32 numpy (the head included; `d2t` as int64 when reduced)."""
        out = {name: t.detach().cpu().float().numpy() for name, t in self.gguf_parameters().items()}
        out["output.weight"] = self.head.detach().cpu().float().numpy()
        if self.d2t is not None:
            out["d2t"] = self.d2t.detach().cpu().numpy().astype(np.int64)
        return out
