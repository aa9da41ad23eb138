"""Shape-faithful tiny targets of the preview's own architectures, with a rigged direct path.

`write_target(path, arch)` writes a random model of `arch` with the tensor names, shapes and
metadata llama.cpp's loader for that architecture asks for (read in `src/models/<arch>.cpp` of the
llama.cpp that llama-cpp-python 0.3.36 vendors; checked against the files its own
`test-llama-archs -o` writes, tests/test_arch_fixtures.py):

* ``qwen35``: gated delta-net layers beside gated full-attention layers (every second layer),
  interleaved M-RoPE, and with ``mtp=True`` one MTP (nextn) block after the trunk;
* ``qwen35moe``: the same with a mixture-of-experts FFN and a gated shared expert;
* ``muse-glimmer``: interleaved sliding-window attention with an output gate and sandwich norms;
* ``nemotron_h``: Mamba-2, attention and ReLU^2 FFN layers, no RoPE (layer ids up to n_layer
  can be extracted);
* ``gemma4``: interleaved sliding-window / full attention with per-kind head sizes, sandwich
  norms, proportional RoPE frequencies and a final logit soft-cap;
* ``llama`` (not one of the preview's, `EXTRA_ARCHS`): plain attention layers, the target of the
  classic-draft and EAGLE-3 fixtures (`ar_drafts.py`).

Token embeddings and LM head follow `rig.make_rig` (the direct path continues t with succ[t]);
every layer's output is scaled by `drift`, which sets how often the context pulls the target off
the successor map.  The tokenizer is `writer.tiny_vocab`'s.  Everything is F32.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np

from ..writer import add_tiny_tokenizer, tiny_vocab
from .rig import Rig, make_rig

__all__ = ["ARCHS", "EXTRA_ARCHS", "MTP_ARCHS", "TargetFixture", "write_target"]

ARCHS = ("qwen35", "qwen35moe", "muse-glimmer", "nemotron_h", "gemma4")
#: further architectures `write_target` writes (not the preview's own)
EXTRA_ARCHS = ("llama",)
#: architectures whose fixture can carry an MTP (nextn) block that our engine drives
MTP_ARCHS = ("qwen35", "qwen35moe")

#: default drift per architecture: the target leaves the successor map at some steps, not most
#: (measured with tests/test_arch_fixtures.py's drift check)
DRIFT = {"qwen35": 0.6, "qwen35moe": 0.75, "muse-glimmer": 1.1, "nemotron_h": 0.55, "gemma4": 0.85, "llama": 0.5}


@dataclass(frozen=True)
class TargetFixture:
    """A written fixture: its path, architecture, trunk depth and rig."""

    path: str
    arch: str
    n_layer: int  # trunk layers (MTP blocks excluded)
    n_embd: int
    mtp_layers: int
    rig: Rig
    swa_window: int = 0
    rig_seed: int = 101  # make_rig's seed: another model rigged with it has the same successor map


class _Init:
    """Random tensors in numpy layout (rows = output features; ggml shapes are the reverse)."""

    def __init__(self, rng: np.random.Generator, drift: float):
        self.rng = rng
        self.drift = drift

    def proj(self, rows: int, cols: int, gain: float = 1.0) -> np.ndarray:
        """An input-side projection: unit gain per output feature."""
        return (self.rng.standard_normal((rows, cols)) * gain / np.sqrt(cols)).astype(np.float32)

    def out(self, rows: int, cols: int) -> np.ndarray:
        """A projection back into the residual stream: scaled by the drift."""
        return self.proj(rows, cols, self.drift * 4.0)

    def vec(self, n: int, value: float = 1.0) -> np.ndarray:
        return np.full(n, value, dtype=np.float32)

    def normal(self, *shape: int, scale: float = 1.0) -> np.ndarray:
        return (self.rng.standard_normal(shape) * scale).astype(np.float32)


def write_target(path: str, arch: str, *, n_layer: Optional[int] = None, mtp: bool = False,
                 drift: Optional[float] = None, seed: int = 0, context_length: int = 4096,
                 swa_window: int = 24, head_gain: float = 1.0) -> TargetFixture:
    """Write a tiny rigged target of `arch` (see the module docstring) and describe it."""
    if arch not in _BUILDERS:
        raise ValueError(f"arch must be one of {', '.join(_BUILDERS)}, not {arch!r}")
    if mtp and arch not in MTP_ARCHS:
        raise ValueError(f"the {arch} fixture has no MTP block (only {', '.join(MTP_ARCHS)})")
    import gguf

    n_embd = 128 if arch == "gemma4" else 256
    n_layer = n_layer or {"nemotron_h": 4, "gemma4": 5}.get(arch, 4)
    n_vocab = len(tiny_vocab()[0])
    rng = np.random.default_rng(seed)
    # gemma scales its input embeddings by sqrt(n_embd): the stored rows are that much smaller
    amp = 1.0 / np.sqrt(n_embd) if arch == "gemma4" else 1.0
    rig = make_rig(n_vocab, n_embd, seed=seed + 101, head_gain=head_gain, amp=amp)
    init = _Init(rng, DRIFT[arch] if drift is None else drift)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    w = gguf.GGUFWriter(path, arch)
    w.add_name(f"tiny-rigged-{arch}-{seed}")
    w.add_context_length(context_length)
    w.add_embedding_length(n_embd)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(10000.0)
    w.add_vocab_size(n_vocab)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    add_tiny_tokenizer(w)
    w.add_mask_token_id(rig.mask_token)
    tensors: dict[str, np.ndarray] = {
        "token_embd.weight": rig.token_embd,
        "output_norm.weight": init.vec(n_embd),
        "output.weight": rig.output,
    }
    n_mtp = 1 if mtp else 0
    _BUILDERS[arch](w, tensors, init, n_embd=n_embd, n_layer=n_layer, n_mtp=n_mtp, swa_window=swa_window)
    for name, arr in tensors.items():
        w.add_tensor(name, np.ascontiguousarray(arr, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    window = swa_window if arch in ("muse-glimmer", "gemma4") else 0
    return TargetFixture(path, arch, n_layer, n_embd, n_mtp, rig, window, seed + 101)


# ---- building blocks ------------------------------------------------------------------------------

def _attention(t: dict, init: _Init, p: str, n_embd: int, n_head: int, n_kv: int, hd: int, *,
               gated_q: bool = False, qk_norm: bool = True, v: bool = True) -> None:
    """q/k/v/o projections (q twice as wide when it carries the output gate) and q/k norms."""
    t[p + "attn_q.weight"] = init.proj(hd * n_head * (2 if gated_q else 1), n_embd)
    t[p + "attn_k.weight"] = init.proj(hd * n_kv, n_embd)
    if v:
        t[p + "attn_v.weight"] = init.proj(hd * n_kv, n_embd)
    t[p + "attn_output.weight"] = init.out(n_embd, hd * n_head)
    if qk_norm:
        t[p + "attn_q_norm.weight"] = init.vec(hd)
        t[p + "attn_k_norm.weight"] = init.vec(hd)


def _swiglu(t: dict, init: _Init, p: str, n_embd: int, n_ff: int) -> None:
    t[p + "ffn_gate.weight"] = init.proj(n_ff, n_embd)
    t[p + "ffn_up.weight"] = init.proj(n_ff, n_embd)
    t[p + "ffn_down.weight"] = init.out(n_embd, n_ff)


def _moe(t: dict, init: _Init, p: str, n_embd: int, n_expert: int, n_ff_exp: int, n_ff_shexp: int) -> None:
    """Routed experts (separate gate/up tensors) plus a sigmoid-gated shared expert."""
    t[p + "ffn_gate_inp.weight"] = init.proj(n_expert, n_embd)
    t[p + "ffn_gate_exps.weight"] = np.stack([init.proj(n_ff_exp, n_embd) for _ in range(n_expert)])
    t[p + "ffn_up_exps.weight"] = np.stack([init.proj(n_ff_exp, n_embd) for _ in range(n_expert)])
    t[p + "ffn_down_exps.weight"] = np.stack([init.out(n_embd, n_ff_exp) for _ in range(n_expert)])
    t[p + "ffn_gate_inp_shexp.weight"] = init.proj(1, n_embd)[0]
    _swiglu_named(t, init, p, n_embd, n_ff_shexp, "_shexp")


def _swiglu_named(t: dict, init: _Init, p: str, n_embd: int, n_ff: int, suffix: str) -> None:
    t[p + f"ffn_gate{suffix}.weight"] = init.proj(n_ff, n_embd)
    t[p + f"ffn_up{suffix}.weight"] = init.proj(n_ff, n_embd)
    t[p + f"ffn_down{suffix}.weight"] = init.out(n_embd, n_ff)


def _nextn(t: dict, init: _Init, p: str, rig: Optional[Rig], n_embd: int) -> None:
    """An MTP block's input fusion: eh_proj reads [enorm(embedding of x_p), hnorm(h_{p-1})].

    The embedding half passes through (identity) and the hidden half is a small random
    projection, so the head predicts succ[x_p] and the target's hidden state nudges it."""
    eh = np.zeros((n_embd, 2 * n_embd), dtype=np.float32)  # ggml {2*n_embd, n_embd}
    eh[:, :n_embd] = np.eye(n_embd, dtype=np.float32)
    eh[:, n_embd:] = init.proj(n_embd, n_embd, init.drift)
    t[p + "nextn.eh_proj.weight"] = eh
    t[p + "nextn.enorm.weight"] = init.vec(n_embd)
    t[p + "nextn.hnorm.weight"] = init.vec(n_embd)
    t[p + "nextn.shared_head_norm.weight"] = init.vec(n_embd)


# ---- architectures --------------------------------------------------------------------------------

def _qwen35(w, t: dict, init: _Init, *, n_embd: int, n_layer: int, n_mtp: int, moe: bool = False, **_) -> None:
    """Qwen3.5/3.6 (src/models/qwen35.cpp, qwen35moe.cpp)."""
    arch = "qwen35moe" if moe else "qwen35"
    n_head, n_kv, hd = 4, 2, 64
    d_state, n_k_heads, n_v_heads, d_conv = 64, 2, 4, 4  # gated delta net: head dims == state size
    key_dim, value_dim = d_state * n_k_heads, d_state * n_v_heads
    n_ff, n_expert, n_ff_exp, n_ff_shexp = 384, 4, 128, 128
    w.add_block_count(n_layer + n_mtp)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_rope_dimension_count(hd)
    w.add_rope_dimension_sections([11, 11, 10, 0])
    w.add_uint32(f"{arch}.full_attention_interval", 2)
    w.add_ssm_conv_kernel(d_conv)
    w.add_ssm_inner_size(value_dim)
    w.add_ssm_state_size(d_state)
    w.add_ssm_time_step_rank(n_v_heads)
    w.add_ssm_group_count(n_k_heads)
    if n_mtp:
        w.add_uint32(f"{arch}.nextn_predict_layers", n_mtp)
    if moe:
        w.add_expert_count(n_expert)
        w.add_expert_used_count(2)
        w.add_expert_feed_forward_length(n_ff_exp)
        w.add_expert_shared_feed_forward_length(n_ff_shexp)

    def ffn(p: str) -> None:
        if moe:
            _moe(t, init, p, n_embd, n_expert, n_ff_exp, n_ff_shexp)
        else:
            _swiglu(t, init, p, n_embd, n_ff)

    for i in range(n_layer):
        p = f"blk.{i}."
        t[p + "attn_norm.weight"] = init.vec(n_embd)
        t[p + "post_attention_norm.weight"] = init.vec(n_embd)
        if (i + 1) % 2:  # gated delta net
            t[p + "attn_qkv.weight"] = init.proj(2 * key_dim + value_dim, n_embd)
            t[p + "attn_gate.weight"] = init.proj(value_dim, n_embd)
            t[p + "ssm_conv1d.weight"] = init.normal(2 * key_dim + value_dim, d_conv, scale=0.5)
            t[p + "ssm_dt.bias"] = init.vec(n_v_heads, 0.5)
            t[p + "ssm_a"] = -np.abs(init.normal(n_v_heads, scale=1.0)) - 0.1
            t[p + "ssm_beta.weight"] = init.proj(n_v_heads, n_embd)
            t[p + "ssm_alpha.weight"] = init.proj(n_v_heads, n_embd)
            t[p + "ssm_norm.weight"] = init.vec(d_state)
            t[p + "ssm_out.weight"] = init.out(n_embd, value_dim)
        else:  # gated full attention
            _attention(t, init, p, n_embd, n_head, n_kv, hd, gated_q=True)
        ffn(p)
    for i in range(n_layer, n_layer + n_mtp):
        p = f"blk.{i}."
        t[p + "attn_norm.weight"] = init.vec(n_embd)
        t[p + "post_attention_norm.weight"] = init.vec(n_embd)
        _attention(t, init, p, n_embd, n_head, n_kv, hd, gated_q=True)
        ffn(p)
        _nextn(t, init, p, None, n_embd)


def _qwen35moe(w, t: dict, init: _Init, **kw) -> None:
    _qwen35(w, t, init, moe=True, **kw)


def _muse_glimmer(w, t: dict, init: _Init, *, n_embd: int, n_layer: int, swa_window: int, **_) -> None:
    """Muse-Glimmer (src/models/muse-glimmer.cpp): every second layer sliding-window."""
    n_head, n_kv, hd, n_ff = 4, 2, 64, 384
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_sliding_window(swa_window)
    w.add_array("muse-glimmer.attention.sliding_window_pattern", [bool(i % 2 == 0) for i in range(n_layer)])
    w.add_logit_scale(1.0)
    w.add_final_logit_softcapping(30.0)
    for i in range(n_layer):
        p = f"blk.{i}."
        t[p + "attn_norm.weight"] = init.vec(n_embd)
        _attention(t, init, p, n_embd, n_head, n_kv, hd)
        t[p + "attn_gate.weight"] = init.proj(hd * n_head, n_embd)
        # sandwich norms: the post-norms set each sub-layer's share of the residual stream
        t[p + "post_attention_norm.weight"] = init.vec(n_embd, init.drift)
        t[p + "ffn_norm.weight"] = init.vec(n_embd)
        _swiglu(t, init, p, n_embd, n_ff)
        t[p + "post_ffw_norm.weight"] = init.vec(n_embd, init.drift)


def _nemotron_h(w, t: dict, init: _Init, *, n_embd: int, n_layer: int, **_) -> None:
    """Nemotron-H (src/models/nemotron-h.cpp): a Mamba-2 layer where head_count_kv and
    feed_forward_length are both 0, attention where only the FFN length is 0, else a ReLU^2 FFN.
    Layers: attention, mamba, FFN, mamba, (attention, ...) -- layer 0 attention, as llama.cpp derives
    the default head size from layer 0's head count."""
    n_head, n_kv, hd, n_ff = 4, 2, 64, 384
    d_inner, d_state, n_group, n_ssm_head, d_conv = 2 * n_embd, 32, 2, 8, 4
    kinds = [("attn", "mamba", "ffn", "mamba")[i % 4] for i in range(n_layer)]
    w.add_block_count(n_layer)
    w.add_feed_forward_length([n_ff if k == "ffn" else 0 for k in kinds])
    w.add_head_count([n_head if k == "attn" else 0 for k in kinds])
    w.add_head_count_kv([n_kv if k == "attn" else 0 for k in kinds])
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_layer_norm_eps(1e-6)
    w.add_ssm_conv_kernel(d_conv)
    w.add_ssm_inner_size(d_inner)
    w.add_ssm_state_size(d_state)
    w.add_ssm_time_step_rank(n_ssm_head)
    w.add_ssm_group_count(n_group)
    for i, kind in enumerate(kinds):
        p = f"blk.{i}."
        t[p + "attn_norm.weight"] = init.vec(n_embd)
        if kind == "mamba":
            conv_dim = d_inner + 2 * n_group * d_state
            t[p + "ssm_in.weight"] = init.proj(2 * d_inner + 2 * n_group * d_state + n_ssm_head, n_embd)
            t[p + "ssm_conv1d.weight"] = init.normal(conv_dim, d_conv, scale=0.5)
            t[p + "ssm_conv1d.bias"] = init.vec(conv_dim, 0.0)
            t[p + "ssm_dt.bias"] = init.vec(n_ssm_head, 0.5)
            t[p + "ssm_a"] = (-np.abs(init.normal(n_ssm_head, scale=1.0)) - 0.1).reshape(n_ssm_head, 1)
            t[p + "ssm_d"] = init.vec(n_ssm_head, 1.0).reshape(n_ssm_head, 1)
            t[p + "ssm_norm.weight"] = init.vec(d_inner).reshape(n_group, d_inner // n_group)
            t[p + "ssm_out.weight"] = init.out(n_embd, d_inner)
        elif kind == "attn":
            _attention(t, init, p, n_embd, n_head, n_kv, hd, qk_norm=False)
        else:
            t[p + "ffn_up.weight"] = init.proj(n_ff, n_embd)
            t[p + "ffn_down.weight"] = init.out(n_embd, n_ff)


def _gemma4(w, t: dict, init: _Init, *, n_embd: int, n_layer: int, swa_window: int, **_) -> None:
    """Gemma 4 (src/models/gemma4.cpp): sliding-window layers with one head size, every fifth
    layer full attention with another (and the shared proportional RoPE frequencies), sandwich
    norms; no per-layer embeddings, no shared-KV layers, no experts."""
    n_head, n_kv, hd_swa, hd_full, n_ff = 2, 1, 64, 128, 192
    is_swa = [(i + 1) % 5 != 0 for i in range(n_layer)]
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    w.add_key_length(hd_full)
    w.add_value_length(hd_full)
    w.add_rope_dimension_count(hd_full)
    w.add_uint32("gemma4.rope.dimension_count_swa", hd_swa)
    w.add_uint32("gemma4.attention.key_length_swa", hd_swa)
    w.add_uint32("gemma4.attention.value_length_swa", hd_swa)
    w.add_sliding_window(swa_window)
    w.add_array("gemma4.attention.sliding_window_pattern", is_swa)
    w.add_uint32("gemma4.attention.shared_kv_layers", 0)
    w.add_uint32("gemma4.embedding_length_per_layer_input", 0)
    w.add_float32("gemma4.rope.freq_base_swa", 10000.0)
    w.add_final_logit_softcapping(30.0)
    have_freqs = False
    for i in range(n_layer):
        p = f"blk.{i}."
        hd = hd_swa if is_swa[i] else hd_full
        t[p + "attn_norm.weight"] = init.vec(n_embd)
        _attention(t, init, p, n_embd, n_head, n_kv, hd)
        t[p + "post_attention_norm.weight"] = init.vec(n_embd, init.drift)
        if not is_swa[i] and not have_freqs:
            t["rope_freqs.weight"] = init.vec(hd_full // 2)
            have_freqs = True
        t[p + "ffn_norm.weight"] = init.vec(n_embd)
        _swiglu(t, init, p, n_embd, n_ff)
        t[p + "post_ffw_norm.weight"] = init.vec(n_embd, init.drift)


def _llama(w, t: dict, init: _Init, *, n_embd: int, n_layer: int, **_) -> None:
    """Llama (src/models/llama.cpp): RMS-normed attention and SwiGLU layers, RoPE over whole heads."""
    n_head, n_kv, hd, n_ff = 4, 2, 64, 384
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    w.add_rope_dimension_count(hd)
    for i in range(n_layer):
        p = f"blk.{i}."
        t[p + "attn_norm.weight"] = init.vec(n_embd)
        _attention(t, init, p, n_embd, n_head, n_kv, hd, qk_norm=False)
        t[p + "ffn_norm.weight"] = init.vec(n_embd)
        _swiglu(t, init, p, n_embd, n_ff)


_BUILDERS: dict[str, Callable[..., None]] = {
    "llama": _llama,
    "qwen35": _qwen35,
    "qwen35moe": _qwen35moe,
    "muse-glimmer": _muse_glimmer,
    "nemotron_h": _nemotron_h,
    "gemma4": _gemma4,
}
