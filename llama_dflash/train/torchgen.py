"""Training data made by a PyTorch copy of the target, hundreds of sequences per step on a GPU.

Why: llama.cpp's MultiGenerator answers a handful of sequences per decode, ~130 tokens/s on a
2-core CPU, so a 90-minute budget holds ~300k training tokens. On a GPU the same target in
PyTorch answers a few hundred prompts at once; the draft then trains on ten times the data in the
same time. The copy is rebuilt from the target GGUF's own (dequantized) weights and reads the
same layer inputs llama.cpp hands the draft, so a draft trained on either backend runs the same;
the values differ only by llama.cpp's quantized-matmul rounding, and a greedy answer can take
another branch where two tokens are nearly tied.

`TorchGenerator.run` has MultiGenerator's interface (Jobs in, Results out). A batch is answered
with a KV cache over left-padded prompts; then one causal pass over prompt + answer (right-padded)
gives the features of every row, the last answer token's too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from .multigen import Job, Result, greedy_rows

__all__ = ["TORCH_ARCHS", "TorchTarget", "TorchGenerator"]

#: architectures whose GGUF layout this module runs (attention + SwiGLU, rope on adjacent pairs)
TORCH_ARCHS = ("llama",)


@dataclass(frozen=True)
class _Shape:
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    head_dim: int
    rope_base: float
    rms_eps: float
    n_vocab: int


def _rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


class TorchTarget:
    """A llama-family target rebuilt from its GGUF: forward passes with layer-input taps and an
    optional KV cache. Weights are dequantized to float32 on `device`."""

    def __init__(self, path: str, device: torch.device | str = "cpu"):
        from gguf import GGUFReader

        from ..inspect import read_gguf
        from .draftfile import dequantize_tensor

        info = read_gguf(path)
        arch = info.get("general.architecture")
        if arch not in TORCH_ARCHS:
            raise ValueError(f"{path}: the PyTorch data backend runs {', '.join(TORCH_ARCHS)} targets, not {arch!r}; "
                             "use --data-backend llama.cpp")
        if info.get(f"{arch}.rope.scaling.type") not in (None, "none"):
            raise ValueError(f"{path}: rope scaling is not supported by the PyTorch data backend; "
                             "use --data-backend llama.cpp")
        n_head = int(info.get(f"{arch}.attention.head_count"))
        n_head_kv = int(info.get(f"{arch}.attention.head_count_kv") or n_head)
        self.device = torch.device(device)
        tensors = {t.name: t for t in GGUFReader(path, "r").tensors}

        def w(name: str) -> torch.Tensor:
            if name not in tensors:
                raise ValueError(f"{path}: tensor {name} is missing")
            return torch.from_numpy(dequantize_tensor(tensors[name])).to(self.device)

        self.emb = w("token_embd.weight")
        self.head = w("output.weight") if "output.weight" in tensors else self.emb
        self.out_norm = w("output_norm.weight")
        n_embd = int(self.emb.shape[1])
        self.shape = _Shape(n_embd=n_embd, n_layer=info.n_layer, n_head=n_head, n_head_kv=n_head_kv,
                            head_dim=n_embd // n_head, rope_base=float(info.get(f"{arch}.rope.freq_base") or 10000.0),
                            rms_eps=float(info.get(f"{arch}.attention.layer_norm_rms_epsilon") or 1e-5),
                            n_vocab=int(self.emb.shape[0]))
        rope_dims = int(info.get(f"{arch}.rope.dimension_count") or self.shape.head_dim)
        if rope_dims != self.shape.head_dim:
            raise ValueError(f"{path}: partial rope ({rope_dims} of {self.shape.head_dim} dims) is not supported "
                             "by the PyTorch data backend; use --data-backend llama.cpp")
        self.layers = []
        for i in range(self.shape.n_layer):
            p = f"blk.{i}."
            qkv = torch.cat([w(p + "attn_q.weight"), w(p + "attn_k.weight"), w(p + "attn_v.weight")], dim=0)
            gate_up = torch.cat([w(p + "ffn_gate.weight"), w(p + "ffn_up.weight")], dim=0)
            self.layers.append(dict(attn_norm=w(p + "attn_norm.weight"), qkv=qkv, wo=w(p + "attn_output.weight"),
                                    ffn_norm=w(p + "ffn_norm.weight"), gate_up=gate_up, down=w(p + "ffn_down.weight")))
        hd = self.shape.head_dim
        self._inv_freq = (self.shape.rope_base ** (-torch.arange(0, hd, 2, dtype=torch.float64) / hd)).float().to(self.device)

    def _rope(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """llama.cpp's 'normal' rope: rotate adjacent pairs (x0, x1) by pos * base^(-2i/d).
        x [B, H, T, D], pos [B, T]."""
        ang = pos.to(torch.float32)[:, None, :, None] * self._inv_freq  # [B, 1, T, D/2]
        cos, sin = torch.cos(ang), torch.sin(ang)
        x0, x1 = x[..., 0::2], x[..., 1::2]
        return torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1).flatten(-2)

    def new_cache(self, batch: int, length: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        s = self.shape
        z = lambda: torch.zeros(batch, s.n_head_kv, length, s.head_dim, device=self.device)  # noqa: E731
        return [(z(), z()) for _ in range(s.n_layer)]

    def _layer(self, L: dict, x: torch.Tensor, pos: torch.Tensor, amask: torch.Tensor,
               cache: Optional[tuple[torch.Tensor, torch.Tensor]], col: int) -> torch.Tensor:
        """One transformer layer on x [B, T, E]; amask [B, 1, g*T, K] (g query heads per KV head)."""
        s = self.shape
        B, T = x.shape[:2]
        g = s.n_head // s.n_head_kv
        h = _rms_norm(x, L["attn_norm"], s.rms_eps)
        q, k, v = (h @ L["qkv"].T).split([s.n_head * s.head_dim, s.n_head_kv * s.head_dim,
                                          s.n_head_kv * s.head_dim], dim=-1)
        q = self._rope(q.view(B, T, s.n_head, s.head_dim).transpose(1, 2), pos)
        k = self._rope(k.view(B, T, s.n_head_kv, s.head_dim).transpose(1, 2), pos)
        v = v.view(B, T, s.n_head_kv, s.head_dim).transpose(1, 2)
        if cache is not None:
            kc, vc = cache
            kc[:, :, col:col + T] = k
            vc[:, :, col:col + T] = v
            k, v = kc[:, :, :col + T], vc[:, :, :col + T]
        # grouped-query attention: the g query heads sharing a KV head become g*T query rows
        qg = q.reshape(B, s.n_head_kv, g * T, s.head_dim)
        a = F.scaled_dot_product_attention(qg, k, v, attn_mask=amask)
        a = a.reshape(B, s.n_head, T, s.head_dim).transpose(1, 2).reshape(B, T, s.n_head * s.head_dim)
        x = x + a @ L["wo"].T
        h = _rms_norm(x, L["ffn_norm"], s.rms_eps)
        gate, up = (h @ L["gate_up"].T).chunk(2, dim=-1)
        return x + (F.silu(gate) * up) @ L["down"].T

    @torch.no_grad()
    def logits_from_layer(self, x: torch.Tensor, first: int, rows: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Logits of one sequence from the input of layer `first` at every position (x [T, E], causal,
        positions 0..T-1): what a layer-input tap of the last layers is enough to recompute. Only
        the positions `rows` when given (the head is most of the cost)."""
        T, dev = x.shape[0], self.device
        g = self.shape.n_head // self.shape.n_head_kv
        pos = torch.arange(T, device=dev)[None]
        causal = torch.ones(T, T, dtype=torch.bool, device=dev).tril()
        amask = causal[None, None, None].expand(1, 1, g, T, T).reshape(1, 1, g * T, T)
        h = x[None].to(dev, torch.float32)
        for L in self.layers[first:]:
            h = self._layer(L, h, pos, amask, None, 0)
        h = h[0] if rows is None else h[0, rows.to(dev)]
        return _rms_norm(h, self.out_norm, self.shape.rms_eps) @ self.head.T

    @torch.no_grad()
    def forward(self, tokens: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor, *,
                cache: Optional[list] = None, col: int = 0, taps: Sequence[int] = (),
                head: str = "all") -> tuple[Optional[torch.Tensor], list[torch.Tensor]]:
        """tokens, pos [B, T]; mask [B, T, K] (True: query may read key), K = col + T with a cache
        (the new keys are written at columns col..col+T-1), else K = T. head: "all" rows' logits,
        the "last" row's, or "none" (only the taps are read: the layers past the deepest tap are
        skipped). Returns (logits or None, the inputs of the layers in `taps`, each [B, T, n_embd])."""
        s = self.shape
        B, T = tokens.shape
        g = s.n_head // s.n_head_kv
        x = self.emb[tokens]
        want = {int(t): k for k, t in enumerate(taps)}
        feats: list[Optional[torch.Tensor]] = [None] * len(taps)
        amask = mask[:, None, None, :, :].expand(B, 1, g, T, mask.shape[-1]).reshape(B, 1, g * T, mask.shape[-1])
        deepest = max(want) if want and head == "none" else None
        for i, L in enumerate(self.layers):
            if i in want:
                feats[want[i]] = x
            if deepest is not None and i >= deepest:
                break
            x = self._layer(L, x, pos, amask, None if cache is None else cache[i], col)
        if head == "none":
            return None, feats
        if head == "last":
            x = x[:, -1:]
        return _rms_norm(x, self.out_norm, s.rms_eps) @ self.head.T, feats


def _sample(logits: torch.Tensor, temps: torch.Tensor, top_p: torch.Tensor,
            gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens, argmax): greedy rows where the temperature is 0, else softmax(logits / T) cut to the
    top-p mass; the argmax of every row is returned too (the sampled answers' training labels)."""
    greedy = logits.argmax(-1)
    hot = temps > 0
    if not bool(hot.any()):
        return greedy, greedy
    z = logits[hot].float() / temps[hot, None]
    sz, order = z.sort(dim=-1, descending=True)
    p = sz.softmax(-1)
    cut = (p.cumsum(-1) - p) >= top_p[hot, None]  # keep the smallest prefix whose mass reaches top_p
    cut[:, 0] = False  # and always the most likely token
    p = p.masked_fill(cut, 0.0)
    pick = torch.multinomial(p / p.sum(-1, keepdim=True), 1, generator=gen).squeeze(-1)
    out = greedy.clone()
    out[hot] = order.gather(-1, pick[:, None]).squeeze(-1)
    return out, greedy


class TorchGenerator:
    """Answers Jobs `batch` at a time on a TorchTarget; MultiGenerator's interface (see module doc).

    Sampled answers (T > 0) draw from one generator per batch, seeded by the batch's job seeds:
    reproducible for the same job list, not independent of which jobs share a batch."""

    def __init__(self, target: TorchTarget, target_layers: Sequence[int], eog: Iterable[int], *,
                 batch: int = 256, n_ctx_seq: int = 1024):
        if batch < 1:
            raise ValueError(f"batch must be >= 1, not {batch}")
        bad = [x for x in target_layers if not 0 <= int(x) < target.shape.n_layer]
        if bad:
            raise ValueError(f"target layers {bad} out of range 0..{target.shape.n_layer - 1}")
        self.target = target
        self.layers = tuple(int(x) for x in target_layers)
        self.width = len(self.layers) * target.shape.n_embd
        self.eog = torch.tensor(sorted(set(int(t) for t in eog)) or [-1], device=target.device)
        self.batch = batch
        self.n_ctx_seq = n_ctx_seq
        self.decodes = 0

    def close(self) -> None:
        """Nothing to release (tensors go with the object); MultiGenerator's interface."""

    def run(self, jobs: Iterable[Job], on_step: Optional[Callable[[int], None]] = None) -> Iterator[Result]:
        """Yield a Result per job, `batch` jobs at a time (jobs are drawn lazily, batch by batch)."""
        it = iter(jobs)
        while True:
            chunk = []
            for j in it:
                chunk.append(j)
                if len(chunk) == self.batch:
                    break
            if not chunk:
                return
            yield from self._run_batch(chunk, on_step)

    def _clip(self, job: Job) -> Job:
        limit = self.n_ctx_seq - job.max_new_tokens - 1
        if limit < 1:
            raise ValueError(f"max_new_tokens {job.max_new_tokens} leaves no room in n_ctx_seq {self.n_ctx_seq}")
        if not job.tokens:
            raise ValueError("a job has no prompt tokens")
        return Job(list(job.tokens)[:limit], job.max_new_tokens, job.temperature, job.seed, job.top_p, job.tag)

    @torch.no_grad()
    def _answer(self, jobs: list[Job], on_step) -> list[tuple[list[int], bool, list[int]]]:
        """Answer tokens per job (an end-of-generation token included), whether it stopped on one,
        and the argmax of the logits each answer token was drawn from."""
        t, dev = self.target, self.target.device
        B = len(jobs)
        plen = torch.tensor([len(j.tokens) for j in jobs], device=dev)
        P = int(plen.max())
        max_new = torch.tensor([j.max_new_tokens for j in jobs], device=dev)
        N = int(max_new.max())
        K = P + N
        toks = torch.zeros(B, P, dtype=torch.long, device=dev)
        for b, j in enumerate(jobs):
            toks[b, P - len(j.tokens):] = torch.tensor(j.tokens, dtype=torch.long)
        cols = torch.arange(K, device=dev)
        pad = (P - plen)[:, None]
        valid = cols[None, :] >= pad  # [B, K]: pads (left of each prompt) are never read
        pos = (cols[None, :P] - pad).clamp_min(0)
        causal = cols[None, :P, None] >= cols[None, None, :P]
        own = torch.eye(P, dtype=torch.bool, device=dev)[None]  # a pad row reads itself, never NaN
        mask = (causal & valid[:, None, :P]) | own
        cache = t.new_cache(B, K)
        logits, _ = t.forward(toks, pos, mask, cache=cache, col=0, head="last")
        temps = torch.tensor([float(j.temperature) for j in jobs], device=dev)
        top_p = torch.tensor([float(j.top_p) for j in jobs], device=dev)
        gen = torch.Generator(device=dev)
        gen.manual_seed(hash(tuple(int(j.seed) for j in jobs)) & 0x7FFFFFFF)
        out = torch.zeros(B, N, dtype=torch.long, device=dev)
        best = torch.zeros(B, N, dtype=torch.long, device=dev)
        n_out = torch.zeros(B, dtype=torch.long, device=dev)
        live = torch.ones(B, dtype=torch.bool, device=dev)
        stopped = torch.zeros(B, dtype=torch.bool, device=dev)
        cur_pos = plen.clone()
        for step in range(N):
            nxt, best[:, step] = _sample(logits[:, -1], temps, top_p, gen)
            out[:, step] = nxt
            n_out += live.long()
            is_eog = torch.isin(nxt, self.eog)
            stopped |= live & is_eog
            live &= ~is_eog & (n_out < max_new)
            self.decodes += 1
            if on_step is not None:
                on_step(B)
            if step + 1 == N or not bool(live.any()):
                break
            col = P + step
            m = valid[:, None, :col + 1]
            logits, _ = t.forward(nxt[:, None], cur_pos[:, None], m, cache=cache, col=col, head="last")
            cur_pos += 1
        out_l, n_l, st_l, best_l = out.tolist(), n_out.tolist(), stopped.tolist(), best.tolist()
        return [(out_l[b][:n_l[b]], bool(st_l[b]), best_l[b][:n_l[b]]) for b in range(B)]

    @torch.no_grad()
    def _features(self, seqs: list[list[int]]) -> list[np.ndarray]:
        """Layer inputs of every row of each sequence: one causal pass over the right-padded batch."""
        t, dev = self.target, self.target.device
        B, L = len(seqs), max(len(s) for s in seqs)
        toks = torch.zeros(B, L, dtype=torch.long, device=dev)
        for b, s in enumerate(seqs):
            toks[b, :len(s)] = torch.tensor(s, dtype=torch.long)
        cols = torch.arange(L, device=dev)
        pos = cols[None, :].expand(B, L)
        mask = (cols[:, None] >= cols[None, :])[None].expand(B, L, L)
        _, feats = t.forward(toks, pos, mask, taps=self.layers, head="none")
        allf = torch.cat(feats, dim=-1).to(torch.float16).cpu().numpy()
        return [allf[b, :len(s)] for b, s in enumerate(seqs)]

    def _run_batch(self, jobs: list[Job], on_step) -> Iterator[Result]:
        jobs = [self._clip(j) for j in jobs]
        answers = self._answer(jobs, on_step)
        seqs = [list(j.tokens) + a for j, (a, _, _) in zip(jobs, answers)]
        feats = self._features(seqs)
        for j, (a, st, best), f in zip(jobs, answers, feats):
            yield Result(job=j, answer=a, features=f, stopped=st, greedy=greedy_rows(len(j.tokens), len(f), best))
