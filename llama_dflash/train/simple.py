"""A small plain llama distilled from the target, for llama.cpp's `draft-simple` (a separate
autoregressive draft model with the target's vocabulary).

It computes what llama.cpp's `llama` graph computes for the exported file: token embeddings,
per layer RMSNorm -> q/k/v ("normal" rope on adjacent pairs at each position) -> causal
attention -> wo -> residual -> RMSNorm -> SwiGLU -> residual, then the output norm and the head.
Weights live in GGUF layout (q/k rows as llama.cpp's converter stores them for that rope), so a
target layer copies in unchanged.

Start (`init_from_target`): the target's token embeddings and head (frozen: the draft keeps the
target's vocabulary and meaning of its hidden states), its output norm, and N of its layers
spread over the depth (first and last included) -- a shallow copy of the target that already
writes the target's kind of text, which distillation then adapts. `random_layers` starts the
layers from random weights instead.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from .arwriter import SimpleShape
from .eagle3 import rope_norm
from .model import RMSNorm

__all__ = ["SimpleDraft", "simple_shape_from_target", "spread_layers", "init_from_target"]


class _Layer(nn.Module):
    def __init__(self, s: SimpleShape):
        super().__init__()
        e, hd = s.n_embd, s.head_dim
        self.attn_norm = RMSNorm(e, s.rms_eps)
        self.wq = nn.Linear(e, s.n_head * hd, bias=False)
        self.wk = nn.Linear(e, s.n_head_kv * hd, bias=False)
        self.wv = nn.Linear(e, s.n_head_kv * hd, bias=False)
        self.wo = nn.Linear(s.n_head * hd, e, bias=False)
        self.ffn_norm = RMSNorm(e, s.rms_eps)
        self.gate = nn.Linear(e, s.n_ff, bias=False)
        self.up = nn.Linear(e, s.n_ff, bias=False)
        self.down = nn.Linear(s.n_ff, e, bias=False)
        for lin in (self.wq, self.wk, self.wv, self.gate, self.up):
            nn.init.normal_(lin.weight, std=1.0 / math.sqrt(lin.in_features))
        for lin in (self.wo, self.down):
            nn.init.normal_(lin.weight, std=0.3 / math.sqrt(lin.in_features))


class SimpleDraft(nn.Module):
    def __init__(self, shape: SimpleShape, tok_embd: np.ndarray, head: np.ndarray,
                 vocab: Optional[np.ndarray] = None):
        """`tok_embd` / `head`: the target's (frozen, exported with the draft; `head is tok_embd`
        for a tied target). `vocab` (sorted target ids): the training loss covers those rows of the
        head only (much cheaper steps); the exported draft keeps the whole head."""
        super().__init__()
        self.shape = s = shape
        if int(tok_embd.shape[1]) != s.n_embd:
            raise ValueError(f"the target's embeddings are {tok_embd.shape[1]} wide, the draft {s.n_embd}")
        emb = torch.from_numpy(np.ascontiguousarray(tok_embd, dtype=np.float32))
        self.register_buffer("tok_embd", emb, persistent=False)
        self.tied = head is tok_embd
        self.register_buffer("full_head", emb if self.tied else torch.from_numpy(np.ascontiguousarray(head, dtype=np.float32)),
                             persistent=False)
        self.register_buffer("d2t", None, persistent=False)
        self.register_buffer("_t2d", None, persistent=False)
        if vocab is not None:
            vocab = np.asarray(vocab, dtype=np.int64)
            self.register_buffer("d2t", torch.from_numpy(vocab), persistent=False)
            t2d = np.full(len(tok_embd), -100, dtype=np.int64)
            t2d[vocab] = np.arange(len(vocab))
            self.register_buffer("_t2d", torch.from_numpy(t2d), persistent=False)
            self.register_buffer("head", self.full_head[torch.from_numpy(vocab)].clone(), persistent=False)
        else:
            self.register_buffer("head", self.full_head, persistent=False)
        self.layers = nn.ModuleList([_Layer(s) for _ in range(s.n_layer)])
        self.output_norm = RMSNorm(s.n_embd, s.rms_eps)
        rms = float(self.head.pow(2).mean().sqrt())
        with torch.no_grad():
            self.output_norm.weight.fill_(1.0 / max(1e-6, rms * math.sqrt(s.n_embd)))

    def head_rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Target token ids (-100: none) -> rows of the training head (-100 outside its vocabulary)."""
        if self._t2d is None:
            return ids
        return torch.where(ids >= 0, self._t2d[ids.clamp_min(0)], torch.full_like(ids, -100))

    def logits(self, prenorm: torch.Tensor) -> torch.Tensor:
        """Logits over the training head's rows of pre-norm states [..., E]."""
        return self.output_norm(prenorm) @ self.head.T

    def to_target_ids(self, rows: torch.Tensor) -> torch.Tensor:
        return rows if self.d2t is None else self.d2t[rows]

    @torch.no_grad()
    def draft_ids(self, prenorm: torch.Tensor) -> torch.Tensor:
        """The token the exported draft proposes after each pre-norm state [..., E]: the argmax over
        the whole head it is exported with (a reduced training vocabulary does not restrict it)."""
        return (self.output_norm(prenorm) @ self.full_head.T).argmax(-1)

    def forward(self, tokens: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """Pre-norm states [N, L, E] of tokens [N, L] at positions 0..L-1 (valid [N, L]: real rows)."""
        s = self.shape
        N, L = tokens.shape
        dev = tokens.device
        pos = torch.arange(L, device=dev).expand(N, L)
        mask = torch.ones(L, L, dtype=torch.bool, device=dev).tril()[None] & valid[:, None, :]
        mask = (mask | torch.eye(L, dtype=torch.bool, device=dev)[None])[:, None]  # padding rows: no empty softmax
        x = F.embedding(tokens, self.tok_embd)
        rep = s.n_head // s.n_head_kv
        for l in self.layers:
            h = l.attn_norm(x)
            q = rope_norm(l.wq(h).unflatten(-1, (s.n_head, s.head_dim)), pos, s.rope_theta)
            k = rope_norm(l.wk(h).unflatten(-1, (s.n_head_kv, s.head_dim)), pos, s.rope_theta)
            v = l.wv(h).unflatten(-1, (s.n_head_kv, s.head_dim))
            k, v = k.repeat_interleave(rep, dim=2), v.repeat_interleave(rep, dim=2)
            a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask)
            x = x + l.wo(a.transpose(1, 2).flatten(-2))
            hf = l.ffn_norm(x)
            x = x + l.down(F.silu(l.gate(hf)) * l.up(hf))
        return x

    def gguf_parameters(self) -> dict[str, torch.Tensor]:
        """The trained tensors under their GGUF names (llama.cpp's `llama` architecture)."""
        w: dict[str, torch.Tensor] = {"output_norm.weight": self.output_norm.weight}
        for i, l in enumerate(self.layers):
            p = f"blk.{i}."
            w.update({p + "attn_norm.weight": l.attn_norm.weight, p + "attn_q.weight": l.wq.weight,
                      p + "attn_k.weight": l.wk.weight, p + "attn_v.weight": l.wv.weight,
                      p + "attn_output.weight": l.wo.weight, p + "ffn_norm.weight": l.ffn_norm.weight,
                      p + "ffn_gate.weight": l.gate.weight, p + "ffn_up.weight": l.up.weight,
                      p + "ffn_down.weight": l.down.weight})
        return w

    def export_weights(self) -> dict[str, np.ndarray]:
        """Every tensor of the GGUF as float32 numpy: the embeddings, the head unless tied, the layers."""
        out = {"token_embd.weight": self.tok_embd.detach().cpu().numpy()}
        out.update({name: t.detach().cpu().float().numpy() for name, t in self.gguf_parameters().items()})
        if not self.tied:
            out["output.weight"] = self.full_head.detach().cpu().numpy()
        return out


def simple_shape_from_target(info, n_layer: int) -> SimpleShape:
    """A draft of `n_layer` layers with the target's width, heads, FFN, rope base and norm eps
    (so target layers copy in); `info`: the target's `inspect.read_gguf` result."""
    from .target_init import target_attention_shape

    arch = info.get("general.architecture")
    a = target_attention_shape(info)
    key_len = info.get(f"{arch}.attention.key_length")
    n_embd = int(info.n_embd)
    return SimpleShape(n_embd=n_embd, n_layer=n_layer, n_head=a["n_head"], n_head_kv=a["n_head_kv"], n_ff=a["n_ff"],
                       rms_eps=float(info.get(f"{arch}.attention.layer_norm_rms_epsilon") or 1e-5),
                       rope_theta=a["rope_theta"], context_length=int(info.n_ctx_train or 2048),
                       head_size=int(key_len) if key_len and int(key_len) != n_embd // a["n_head"] else 0)


def spread_layers(n_target_layers: int, n: int) -> list[int]:
    """n target layer ids spread over the depth, first and last included."""
    if n >= n_target_layers:
        return list(range(n_target_layers))
    if n == 1:
        return [n_target_layers - 1]
    return sorted({int(round(i * (n_target_layers - 1) / (n - 1))) for i in range(n)})


def init_from_target(model: SimpleDraft, target_path: str, layers: Sequence[int]) -> None:
    """Copy target layers `layers` (one per draft layer, GGUF layout as stored) and the target's
    output norm into the draft."""
    from gguf import GGUFReader

    from .draftfile import dequantize_tensor

    if len(layers) != len(model.layers):
        raise ValueError(f"{len(layers)} target layers for {len(model.layers)} draft layers")
    tensors = {t.name: t for t in GGUFReader(target_path, "r").tensors}
    names = {"attn_norm": "attn_norm", "attn_q": "wq", "attn_k": "wk", "attn_v": "wv", "attn_output": "wo",
             "ffn_norm": "ffn_norm", "ffn_gate": "gate", "ffn_up": "up", "ffn_down": "down"}
    with torch.no_grad():
        for dst, src in zip(model.layers, layers):
            for gname, attr in names.items():
                key = f"blk.{int(src)}.{gname}.weight"
                if key not in tensors:
                    raise ValueError(f"{target_path}: no {key} (not a plain llama layer)")
                w = torch.from_numpy(dequantize_tensor(tensors[key]))
                p = getattr(dst, attr).weight
                if tuple(w.shape) != tuple(p.shape):
                    raise ValueError(f"{key} is {tuple(w.shape)}, the draft's {tuple(p.shape)}")
                p.copy_(w)
        if "output_norm.weight" in tensors:
            model.output_norm.weight.copy_(torch.from_numpy(dequantize_tensor(tensors["output_norm.weight"])))
