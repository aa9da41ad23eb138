"""Start a draft from the target's own last layer instead of random weights (`--init-from-target`).

Why: the draft has to learn a language model from a few hundred thousand tokens. The target's last
layer already maps its deep residual stream to next-token predictions, and the draft's context
path reads exactly that stream (the input of the last target layer is one of the injected
features). So the draft layer starts as the target's last layer, `fc` passes that feature through,
the encoder norm is that layer's attention norm and the output norm is the target's: the context
keys and values are then the target's own (up to the draft's per-head q/k norms). Training adapts
the block path from there.

llama.cpp's converter stores a Llama-style target's q/k rows interleaved for its "normal" rope;
the draft uses NEOX rope (rotate halves), so those rows are put back in halves order here.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from .draftfile import dequantize_tensor
from .model import DraftModel

__all__ = ["INTERLEAVED_ROPE_ARCHS", "target_attention_shape", "target_layer_weights", "init_from_target", "last_feature"]

#: target architectures whose GGUF q/k rows are permuted for llama.cpp's interleaved rope
INTERLEAVED_ROPE_ARCHS = frozenset({"llama", "mistral", "granite", "smollm3"})


def _halves_order(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo the converter's per-head interleave: rows (0, d/2, 1, d/2+1, ...) -> (0, 1, ..., d-1)."""
    rows, cols = w.shape
    d = rows // n_head
    return np.ascontiguousarray(w.reshape(n_head, d // 2, 2, cols).swapaxes(1, 2).reshape(rows, cols))


def target_attention_shape(info) -> dict:
    """The target's heads, KV heads, feed-forward width and rope base (DraftShape keywords), which
    a draft copying its layers must share. `info`: the target's `inspect.read_gguf` result."""
    arch = info.get("general.architecture")
    n_head = int(info.get(f"{arch}.attention.head_count"))
    return dict(n_head=n_head, n_head_kv=int(info.get(f"{arch}.attention.head_count_kv") or n_head),
                n_ff=int(info.get(f"{arch}.feed_forward_length")),
                rope_theta=float(info.get(f"{arch}.rope.freq_base") or 10000.0))


def target_layer_weights(path: str, layer: int) -> dict[str, np.ndarray]:
    """Dequantized float32 weights of target layer `layer` plus `output_norm.weight`, q/k rows in
    halves (NEOX) order. Keys: attn_norm, attn_q, attn_k, attn_v, attn_output, ffn_norm, ffn_gate,
    ffn_up, ffn_down, output_norm."""
    from gguf import GGUFReader

    from ..inspect import read_gguf

    info = read_gguf(path)
    tensors = {t.name: t for t in GGUFReader(path, "r").tensors}
    p = f"blk.{layer}."
    names = ["attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down"]
    missing = [p + n + ".weight" for n in names if p + n + ".weight" not in tensors]
    if missing or "output_norm.weight" not in tensors:
        raise ValueError(f"{path}: cannot start the draft from layer {layer}: missing {missing or ['output_norm.weight']}")
    out = {n: dequantize_tensor(tensors[p + n + ".weight"]) for n in names}
    out["output_norm"] = dequantize_tensor(tensors["output_norm.weight"])
    if info.get("general.architecture") in INTERLEAVED_ROPE_ARCHS:
        shape = target_attention_shape(info)
        out["attn_q"] = _halves_order(out["attn_q"], shape["n_head"])
        out["attn_k"] = _halves_order(out["attn_k"], shape["n_head_kv"])
    return out


def init_from_target(model: DraftModel, target_path: str, target_layer: int, feature_index: int,
                     noise: float = 0.02, seed: int = 0) -> None:
    """Copy target layer `target_layer` into every draft layer; `fc` passes feature block
    `feature_index` (the one holding that layer's input) through, small noise on the others."""
    s = model.shape
    w = target_layer_weights(target_path, target_layer)
    e = s.n_embd
    expect = {"attn_q": (s.n_head * s.head_dim, e), "attn_k": (s.n_head_kv * s.head_dim, e),
              "attn_v": (s.n_head_kv * s.head_dim, e), "attn_output": (e, s.n_head * s.head_dim),
              "ffn_gate": (s.ff, e), "ffn_up": (s.ff, e), "ffn_down": (e, s.ff)}
    for name, shp in expect.items():
        if w[name].shape != shp:
            raise ValueError(f"draft shape {shp} of {name} differs from target layer {target_layer}'s "
                             f"{w[name].shape}: give the draft the target's heads and feed-forward width")
    n_ids = len(s.target_layers)
    if not 0 <= feature_index < n_ids:
        raise ValueError(f"feature index {feature_index} outside 0..{n_ids - 1}")
    g = torch.Generator().manual_seed(seed)
    t = lambda a: torch.tensor(np.asarray(a, dtype=np.float32))  # noqa: E731
    with torch.no_grad():
        fc = torch.randn(e, n_ids * e, generator=g) * (noise / np.sqrt(n_ids * e))
        fc[:, feature_index * e:(feature_index + 1) * e] += torch.eye(e)
        model.fc.weight.copy_(fc)
        model.enc_norm.weight.copy_(t(w["attn_norm"]))
        model.output_norm.weight.copy_(t(w["output_norm"]))
        for layer in model.layers:
            layer.attn_norm.weight.copy_(t(w["attn_norm"]))
            layer.wq.weight.copy_(t(w["attn_q"]))
            layer.wk.weight.copy_(t(w["attn_k"]))
            layer.wv.weight.copy_(t(w["attn_v"]))
            layer.wo.weight.copy_(t(w["attn_output"]))
            layer.ffn_norm.weight.copy_(t(w["ffn_norm"]))
            layer.gate.weight.copy_(t(w["ffn_gate"]))
            layer.up.weight.copy_(t(w["ffn_up"]))
            layer.down.weight.copy_(t(w["ffn_down"]))
            layer.q_norm.weight.fill_(1.0)
            layer.k_norm.weight.fill_(1.0)


def last_feature(target_layers: Sequence[int]) -> tuple[int, int]:
    """(target layer to copy, index of its input among the features): the deepest injected layer."""
    idx = int(np.argmax(np.asarray(target_layers)))
    return int(target_layers[idx]), idx
