"""GGUF files of the autoregressive drafts: an EAGLE-3 head (architecture `eagle3`, llama.cpp's
src/models/eagle3.cpp) and a small plain llama for `draft-simple`.

Why separate from `writer.write_draft`: that one knows the `dflash` contract only. The keys here
are the ones llama.cpp's loader reads for these architectures and that its converter writes from
the Hugging Face layouts (`hf_export.py`), so a file made either way loads the same.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping

import numpy as np

from ..writer import copy_tokenizer_fields, tensor_payload

__all__ = ["write_eagle3", "write_simple", "SimpleShape"]


def _finish(w, weights: Mapping[str, np.ndarray], weight_type: str) -> None:
    for name, arr in weights.items():
        if name == "d2t":
            continue
        data, raw = tensor_payload(arr, weight_type)
        w.add_tensor(name, data, raw_dtype=raw)
    if "d2t" in weights:
        w.add_tensor("d2t", np.ascontiguousarray(weights["d2t"], dtype=np.int64))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_eagle3(path: str, shape, weights: Mapping[str, np.ndarray], *, tokenizer_from: str,
                 name: str = "eagle3-draft", weight_type: str = "f32") -> str:
    """Write an EAGLE-3 head (`eagle3.Eagle3Shape`, tensors of `Eagle3Model.export_weights`) that
    llama.cpp loads as architecture `eagle3`; the vocabulary is the target's (`tokenizer_from`)."""
    import gguf

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    w = gguf.GGUFWriter(path, "eagle3")
    w.add_name(name)
    w.add_context_length(shape.context_length)
    w.add_embedding_length(shape.n_embd)
    w.add_block_count(1)
    w.add_feed_forward_length(shape.n_ff)
    w.add_head_count(shape.n_head)
    w.add_head_count_kv(shape.n_head_kv)
    w.add_key_length(shape.head_dim)
    w.add_value_length(shape.head_dim)
    w.add_layer_norm_rms_eps(shape.rms_eps)
    w.add_rope_freq_base(shape.rope_theta)
    w.add_rope_dimension_count(shape.head_dim)
    w.add_array("eagle3.target_layers", [int(x) for x in shape.target_layers])
    w.add_uint32("eagle3.target_hidden_size", int(shape.hidden_target))
    w.add_bool("eagle3.norm_before_residual", bool(shape.norm_before_residual))
    w.add_bool("eagle3.norm_before_fc", bool(shape.norm_before_fc))
    n_vocab = copy_tokenizer_fields(w, tokenizer_from)
    if n_vocab:
        w.add_vocab_size(n_vocab)
    _finish(w, weights, weight_type)
    return path


@dataclass
class SimpleShape:
    """Hyper-parameters of a plain llama draft (the target's vocabulary and hidden size; `tied`:
    no own `output.weight`, the token embeddings are the head)."""

    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    n_ff: int
    rms_eps: float = 1e-5
    rope_theta: float = 10000.0
    context_length: int = 2048
    head_size: int = 0  # 0: n_embd // n_head
    tied: bool = True

    def __post_init__(self) -> None:
        if self.n_head % self.n_head_kv:
            raise ValueError(f"n_head {self.n_head} is not a multiple of n_head_kv {self.n_head_kv}")

    @property
    def head_dim(self) -> int:
        return self.head_size or self.n_embd // self.n_head


def write_simple(path: str, shape: SimpleShape, weights: Mapping[str, np.ndarray], *, tokenizer_from: str,
                 name: str = "simple-draft", weight_type: str = "f32") -> str:
    """Write a small llama (tensors `token_embd`, `output_norm`, `output` unless tied, `blk.N.*`)
    with the target's tokenizer: what `draft-simple` loads (llama.cpp's vocabulary rule holds by
    construction: the same tokens, BOS/EOS and flags)."""
    import gguf

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    w = gguf.GGUFWriter(path, "llama")
    w.add_name(name)
    w.add_context_length(shape.context_length)
    w.add_embedding_length(shape.n_embd)
    w.add_block_count(shape.n_layer)
    w.add_feed_forward_length(shape.n_ff)
    w.add_head_count(shape.n_head)
    w.add_head_count_kv(shape.n_head_kv)
    w.add_layer_norm_rms_eps(shape.rms_eps)
    w.add_rope_freq_base(shape.rope_theta)
    w.add_rope_dimension_count(shape.head_dim)
    if shape.head_size:
        w.add_key_length(shape.head_dim)
        w.add_value_length(shape.head_dim)
    n_vocab = copy_tokenizer_fields(w, tokenizer_from)
    if n_vocab:
        w.add_vocab_size(n_vocab)
    _finish(w, weights, weight_type)
    return path
