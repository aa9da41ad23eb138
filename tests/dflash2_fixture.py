"""Test-only writer of DFlash2 drafts: a DFlash draft plus the conv and selector tensors.

The tensor set is the one llama.cpp's `src/models/dflash.cpp` loads when `selector_hidden.weight`
is present, under the names its converter gives the Hugging Face DFlash2 tensors
(`model.layers.{i}.attention_conv.base_kernel` -> `blk.{i}.attn_conv_base`, ...,
`model.candidate_selector.predecessor_codebook` -> `selector_predecessor.weight`), with the four
`dflash.*` keys the converter writes from `dflash_config`.  numpy shapes are the reverse of ggml's.
"""

from __future__ import annotations

import numpy as np

from llama_dflash.inspect import read_gguf
from llama_dflash.writer import DraftShape, _default_mask, evenly_spread_layers, random_draft_weights, write_draft


def dflash2_weights(n_embd: int, n_vocab: int, n_layer: int, *, top_k: int, rank: int, kernel: int, group: int,
                    seed: int, selector_scale: float) -> dict[str, np.ndarray]:
    """The DFlash2-only tensors: per-layer conv kernels, and the selector's two codebooks and gate."""
    if n_embd % group:
        raise ValueError(f"conv group size {group} must divide n_embd {n_embd}")
    if n_embd < top_k * (top_k + 1):
        raise ValueError(f"n_embd {n_embd} too small for a selector lattice of top_k {top_k}")
    rng = np.random.default_rng(seed)
    projected = 2 * kernel * (n_embd // group)  # (in/out side) x taps x groups

    def normal(*shape: int, scale: float) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    w: dict[str, np.ndarray] = {}
    for i in range(n_layer):
        for part in ("attn", "ffn"):
            base = normal(2, kernel, n_embd, scale=0.1)  # ggml {n_embd, kernel, 2}
            base[:, 0, :] += 1.0  # tap 0 (the position itself) passes the hidden state through
            w[f"blk.{i}.{part}_conv_base"] = base
            w[f"blk.{i}.{part}_conv_proj.weight"] = normal(projected, n_embd, scale=0.02)  # {n_embd, projected}
    w["selector_predecessor.weight"] = normal(n_vocab, rank, scale=selector_scale)  # ggml {rank, n_vocab}
    w["selector_successor.weight"] = normal(n_vocab, rank, scale=selector_scale)
    w["selector_hidden.weight"] = normal(rank, n_embd, scale=0.3)  # ggml {n_embd, rank}
    return w


def write_dflash2_draft(path: str, target_path: str, *, block_size: int = 8, top_k: int = 4, rank: int = 8,
                        kernel: int = 3, group: int = 16, n_layer: int = 1, seed: int = 0,
                        selector_scale: float = 1.0, with_embeddings: bool = False) -> str:
    """A random DFlash2 draft for `target_path` (shares its embeddings and head unless with_embeddings)."""
    target = read_gguf(target_path)
    n_head = next(h for h in (8, 4, 2, 1) if target.n_embd % h == 0 and (target.n_embd // h) % 2 == 0)
    shape = DraftShape(
        n_embd=target.n_embd, n_layer=n_layer, n_head=n_head, n_head_kv=max(1, n_head // 2),
        block_size=block_size, target_layers=evenly_spread_layers(target.n_layer),
        extra_keys={
            "dflash.conv_kernel_size": kernel,
            "dflash.conv_group_size": group,
            "dflash.selector_rank": rank,
            "dflash.selector_top_k": top_k,
        },
    )
    weights = random_draft_weights(shape, target.n_vocab, seed=seed, with_embeddings=with_embeddings)
    weights.update(dflash2_weights(target.n_embd, target.n_vocab, n_layer, top_k=top_k, rank=rank, kernel=kernel,
                                   group=group, seed=seed + 1, selector_scale=selector_scale))
    return write_draft(path, shape, weights, tokenizer_from=target_path, mask_token_id=_default_mask(target),
                       name="random-dflash2")
